// CPU backend of fp8.h (fp8/fp8_backend.h, namespace cpu): OpenMP threads over a fixed contiguous
// split of the elements, simple loops the compiler vectorises plus an explicit SIMD fp8 cast
// (fp8/cpu/fp8_cast_simd.h), numerics from core/numerics.h and core/scaling.h so the results are the
// CUDA backend's.
//
// Determinism: every output element is written by exactly one thread, and amax is a max, which is
// exact and order-independent, so results do not depend on the thread count. Both amax algorithms
// are the same code here (a per-thread maximum, then a serial maximum over threads) and need no
// workspace. Scalars (amax, scale, flags, noop) are host pointers.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "fp8/fp8_backend.h"
#include "fp8/activation.h"
#include "core/dispatch.h"
#include "core/numerics.h"
#include "core/scaling.h"
#include "fp8/cpu/fp8_cast_simd.h"

namespace embscale {
namespace cpu {
namespace {

// Below this many elements per thread a parallel region costs more than it saves.
constexpr int64_t kMinPerThread = 1 << 15;

int thread_count(const Context& ctx, int64_t work) {
  const int64_t avail = ctx.num_threads > 0 ? ctx.num_threads : omp_get_max_threads();
  const int64_t useful = std::max<int64_t>(1, work / kMinPerThread);
  return static_cast<int>(std::max<int64_t>(1, std::min(avail, useful)));
}

// Runs f(begin, end, thread) over [0, n) split into equal contiguous blocks, one per thread.
template <typename F>
void parallel_blocks(int threads, int64_t n, const F& f) {
  if (threads <= 1) {
    f(int64_t{0}, n, 0);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num();
    const int nt = omp_get_num_threads();
    f(n / nt * t + std::min<int64_t>(t, n % nt), n / nt * (t + 1) + std::min<int64_t>(t + 1, n % nt), t);
  }
}

bool skip(const float* noop_flag) { return noop_flag != nullptr && *noop_flag == 1.0f; }

// ---- amax on the bits ----
// For a non-NaN value, the magnitude bits (sign cleared) order exactly like |value|, so the maximum
// is taken as an unsigned integer maximum, which vectorises without any floating-point compares.
// NaN magnitudes lie above the infinity pattern: they are excluded from the maximum (TE's fmaxf
// skips them) but still raise the non-finite flag, as does infinity. -0 clears to +0.
template <typename T> struct MagBits;
template <> struct MagBits<float> { using U = uint32_t; static constexpr U kMask = 0x7fffffffu, kInf = 0x7f800000u; };
template <> struct MagBits<fp16_t> { using U = uint16_t; static constexpr U kMask = 0x7fffu, kInf = 0x7c00u; };
template <> struct MagBits<bf16_t> { using U = uint16_t; static constexpr U kMask = 0x7fffu, kInf = 0x7f80u; };

struct AmaxPartial {
  uint32_t finite_or_inf_max = 0;  // magnitude bits, NaN excluded
  uint32_t any_max = 0;            // magnitude bits, NaN included
};

template <typename T>
AmaxPartial mag_max(const T* x, int64_t begin, int64_t end) {
  using U = typename MagBits<T>::U;
  const unsigned char* p = reinterpret_cast<const unsigned char*>(x);
  U fm = 0, am = 0;
  for (int64_t i = begin; i < end; ++i) {
    U u;
    std::memcpy(&u, p + i * sizeof(U), sizeof(U));
    const U a = static_cast<U>(u & MagBits<T>::kMask);
    am = std::max(am, a);
    const U keep = static_cast<U>(-static_cast<U>(a <= MagBits<T>::kInf));  // all ones unless NaN
    fm = std::max(fm, static_cast<U>(a & keep));
  }
  return {fm, am};
}

template <typename T>
float mag_bits_to_float(uint32_t bits) {
  T v;
  const auto narrow = static_cast<typename MagBits<T>::U>(bits);
  std::memcpy(&v, &narrow, sizeof(v));
  return to_float(v);
}

template <typename T>
void amax_typed(const Context& ctx, const T* x, int64_t n, float* amax, int32_t* nonfinite_flag) {
  const int threads = thread_count(ctx, n);
  std::vector<AmaxPartial> parts(threads);
  parallel_blocks(threads, n, [&](int64_t b, int64_t e, int t) { parts[t] = mag_max(x, b, e); });
  AmaxPartial r;
  for (const AmaxPartial& p : parts) {
    r.finite_or_inf_max = std::max(r.finite_or_inf_max, p.finite_or_inf_max);
    r.any_max = std::max(r.any_max, p.any_max);
  }
  *amax = mag_bits_to_float<T>(r.finite_or_inf_max);
  if (nonfinite_flag) *nonfinite_flag = r.any_max >= MagBits<T>::kInf ? 1 : 0;
}

Status amax_any(const Context& ctx, const TensorView& x, float* amax, int32_t* nonfinite_flag) {
  return dispatch_float(x.dtype, "x", [&](auto tx) {
    using Ti = typename decltype(tx)::type;
    amax_typed(ctx, static_cast<const Ti*>(x.data), x.numel(), amax, nonfinite_flag);
  });
}

// ---- input decoding ----
// fp16 -> fp32 through a 64K-entry table filled by the shared fp16_to_float (its branches on subnormal
// and inf/NaN inputs would otherwise keep the hot loops scalar); fp32 and bf16 decode inline.
struct Fp16Decoder {
  float v[1 << 16];
  Fp16Decoder() {
    for (uint32_t h = 0; h < (1u << 16); ++h) v[h] = fp16_to_float(static_cast<uint16_t>(h));
  }
};
const float* fp16_table() {
  static const Fp16Decoder dec;
  return dec.v;
}

// Decodes x[0, n) into out.
template <typename Ti>
__attribute__((always_inline)) inline void decode_chunk(const Ti* x, int n, float* out) {
  if constexpr (std::is_same<Ti, fp16_t>::value) {
    const float* t = fp16_table();
    for (int j = 0; j < n; ++j) out[j] = t[x[j].bits];
  } else {
    for (int j = 0; j < n; ++j) out[j] = to_float(x[j]);
  }
}

// ---- element-wise casts ----
// y[i] = fp8(to_float(x[i]) * s) for i < n: the SIMD cast (fp8_cast_simd.h, AVX2 or SSE4.1) on fp32
// and bf16 inputs, fp16 decoded through its table in chunks first; the few remaining elements go
// through the shared scalar cast.
template <typename F8>
int64_t encode_simd(const float* x, float s, F8* y, int64_t n) {
  uint8_t* out = reinterpret_cast<uint8_t*>(y);
  return fp8simd::use_avx2() ? fp8simd::encode_avx2<F8>(x, s, out, n) : fp8simd::encode_sse<F8>(x, s, out, n);
}
template <typename F8>
int64_t encode_simd(const bf16_t* x, float s, F8* y, int64_t n) {
  uint8_t* out = reinterpret_cast<uint8_t*>(y);
  return fp8simd::use_avx2() ? fp8simd::encode_avx2<F8>(x, s, out, n) : fp8simd::encode_sse<F8>(x, s, out, n);
}
template <typename F8>
int64_t encode_simd(const fp16_t* x, float s, F8* y, int64_t n) {
  constexpr int kChunk = 256;
  alignas(64) float v[kChunk];
  int64_t i = 0;
  for (; i + kChunk <= n; i += kChunk) {
    decode_chunk(x + i, kChunk, v);
    encode_simd(v, s, y + i, kChunk);
  }
  return i;
}

template <typename Ti, typename F8>
void encode_range(const Ti* x, float s, F8* y, int64_t n) {
  for (int64_t i = encode_simd(x, s, y, n); i < n; ++i) y[i] = from_float<F8>(to_float(x[i]) * s);
}

// Below this many elements a cast runs on one thread: the parallel region's start-up costs more than
// the split saves. Measured on a 2-core machine: at 2^16 elements two threads already win (bf16
// quantize at 60% of the memcpy bandwidth against 39% on one thread).
constexpr int64_t kMinParallelCast = 1 << 15;

int cast_thread_count(const Context& ctx, int64_t n) { return n < kMinParallelCast ? 1 : thread_count(ctx, n); }

template <typename Ti, typename F8>
void quantize_typed(const Context& ctx, const Ti* x, float s, F8* y, int64_t n) {
  parallel_blocks(cast_thread_count(ctx, n), n, [&](int64_t b, int64_t e, int) { encode_range(x + b, s, y + b, e - b); });
}

Status quantize_any(const Context& ctx, const TensorView& x, float s, const TensorView& y) {
  return dispatch_float(x.dtype, "x", [&](auto tx) {
    return dispatch_fp8(y.dtype, "y", [&](auto ty) {
      using Ti = typename decltype(tx)::type;
      using F8 = typename decltype(ty)::type;
      quantize_typed(ctx, static_cast<const Ti*>(x.data), s, static_cast<F8*>(y.data), y.numel());
    });
  });
}

// An fp8 input has only 256 values: their fp32 values are tabulated once per format, and each call
// forms from_float<To>(value * s) for all 256 codes (kept per thread while the scale repeats); the hot
// loop is then byte-indexed loads, 8 codes per 64-bit read.
template <typename F8>
const float* fp8_values() {
  static const struct Values {
    float v[256];
    Values() {
      for (int c = 0; c < 256; ++c) v[c] = to_float(F8{static_cast<uint8_t>(c)});
    }
  } values;
  return values.v;
}

template <typename F8, typename To>
const To* dequantize_table(float s) {
  struct Table {
    uint32_t scale_bits = 0;
    bool valid = false;
    To lut[256];
  };
  static thread_local Table t;
  const uint32_t sb = float_bits(s);
  if (!t.valid || t.scale_bits != sb) {
    const float* v = fp8_values<F8>();
    for (int c = 0; c < 256; ++c) t.lut[c] = from_float<To>(v[c] * s);
    t.scale_bits = sb;
    t.valid = true;
  }
  return t.lut;
}

template <typename To>
void dequantize_range(const uint8_t* codes, const To* lut, To* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, codes + i, 8);
    for (int k = 0; k < 8; ++k) x[i + k] = lut[(w >> (8 * k)) & 0xffu];
  }
  for (; i < n; ++i) x[i] = lut[codes[i]];
}

template <typename F8, typename To>
void dequantize_typed(const Context& ctx, const uint8_t* codes, float s, To* x, int64_t n) {
  const To* lut = dequantize_table<F8, To>(s);
  parallel_blocks(cast_thread_count(ctx, n), n, [&](int64_t b, int64_t e, int) { dequantize_range(codes + b, lut, x + b, e - b); });
}


// ---- activation + amax ----
template <Activation kAct, typename Ti, typename To>
void activation_amax_typed(const Context& ctx, const Ti* x, To* y, int64_t n, float* amax, int32_t* nonfinite_flag) {
  const int threads = thread_count(ctx, n);
  std::vector<float> part_max(threads, 0.0f);
  std::vector<int32_t> part_nonfinite(threads, 0);
  parallel_blocks(threads, n, [&](int64_t b, int64_t e, int t) {
    float m = 0.0f;
    int32_t nf = 0;
    for (int64_t i = b; i < e; ++i) {
      const To v = from_float<To>(activation_f<kAct>(to_float(x[i])));
      y[i] = v;
      const float stored = to_float(v);  // amax of y as stored, so a later quantize sees the same value
      m = std::max(m, amax_term(stored));
      nf |= is_finite_f(stored) ? 0 : 1;
    }
    part_max[t] = m;
    part_nonfinite[t] = nf;
  });
  float m = 0.0f;
  int32_t nf = 0;
  for (int t = 0; t < threads; ++t) {
    m = std::max(m, part_max[t]);
    nf |= part_nonfinite[t];
  }
  *amax = m;
  if (nonfinite_flag) *nonfinite_flag = nf;
}

template <Activation kAct>
Status activation_amax_act(const Context& ctx, const TensorView& x, const TensorView& y, float* amax, int32_t* flag) {
  return dispatch_float(x.dtype, "x", [&](auto tx) {
    return dispatch_float(y.dtype, "y", [&](auto ty) {
      using Ti = typename decltype(tx)::type;
      using To = typename decltype(ty)::type;
      activation_amax_typed<kAct>(ctx, static_cast<const Ti*>(x.data), static_cast<To*>(y.data), y.numel(), amax, flag);
    });
  });
}

// ---- cast + transpose ----
// 64 x 64 tiles: a tile of x is read row by row (contiguous), quantized into y row by row (the SIMD
// cast) and copied into a local transposed tile, which is then written to yt as 64-byte rows, one full cache line each, so no
// partially written line of yt is evicted and re-read. Threads own whole bands of 64 rows of x.
constexpr int64_t kTile = 64;

template <typename Ti, typename F8>
void cast_transpose_typed(const Context& ctx, const Ti* x, float s, F8* y, F8* yt, int64_t rows, int64_t cols) {
  const int64_t bands = (rows + kTile - 1) / kTile;
  const int threads = thread_count(ctx, rows * cols);
  parallel_blocks(threads, bands, [&](int64_t b0, int64_t b1, int) {
    alignas(64) F8 tile[kTile][kTile];
    for (int64_t band = b0; band < b1; ++band) {
      const int64_t r0 = band * kTile, nr = std::min(kTile, rows - r0);
      for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
        const int64_t nc = std::min(kTile, cols - c0);
        for (int64_t r = 0; r < nr; ++r) {
          const Ti* xr = x + (r0 + r) * cols + c0;
          F8* yr = y + (r0 + r) * cols + c0;
          encode_range(xr, s, yr, nc);
          for (int64_t c = 0; c < nc; ++c) tile[c][r] = yr[c];
        }
        for (int64_t c = 0; c < nc; ++c) std::memcpy(yt + (c0 + c) * rows + r0, tile[c], static_cast<size_t>(nr) * sizeof(F8));
      }
    }
  });
}


}  // namespace

Status amax_workspace_size(const TensorView&, const AmaxOptions&, size_t* bytes) {
  *bytes = 0;
  return Status::Ok();
}

Status amax(const Context& ctx, const TensorView& x, float* amax, const AmaxOptions& opts, void*, size_t) {
  if (skip(opts.noop_flag)) return Status::Ok();
  return amax_any(ctx, x, amax, opts.nonfinite_flag);
}

Status compute_scale(const Context&, const float* amax, float fp8_max_value, const ScaleOptions& opts, float* scale,
                     float* scale_inv, const float* noop_flag) {
  if (skip(noop_flag)) return Status::Ok();
  const float s = scale_from_amax_rule(*amax, fp8_max_value, opts.eps, opts.power_of_2);
  *scale = s;
  *scale_inv = scale_inv_from_scale(s);
  return Status::Ok();
}

Status quantize(const Context& ctx, const TensorView& x, const float* scale, const TensorView& y,
                const float* noop_flag) {
  if (skip(noop_flag)) return Status::Ok();
  return quantize_any(ctx, x, *scale, y);
}

Status dequantize(const Context& ctx, const TensorView& y, const float* scale_inv, const TensorView& x,
                  const float* noop_flag) {
  if (skip(noop_flag)) return Status::Ok();
  const float s = *scale_inv;
  return dispatch_fp8(y.dtype, "y", [&](auto ty) {
    return dispatch_float(x.dtype, "x", [&](auto tx) {
      using F8 = typename decltype(ty)::type;
      using To = typename decltype(tx)::type;
      dequantize_typed<F8>(ctx, static_cast<const uint8_t*>(y.data), s, static_cast<To*>(x.data), y.numel());
    });
  });
}

Status quantize_current_scaling_workspace_size(const TensorView&, const CurrentScalingOptions&, size_t* bytes) {
  *bytes = 0;
  return Status::Ok();
}

Status quantize_current_scaling(const Context& ctx, const TensorView& x, const TensorView& y, float* amax,
                                float* scale, float* scale_inv, const CurrentScalingOptions& opts, void*, size_t) {
  if (skip(opts.amax.noop_flag)) return Status::Ok();
  float a = 0.0f;
  EMBSCALE_RETURN_IF_ERROR(amax_any(ctx, x, &a, opts.amax.nonfinite_flag));
  const float fp8_max_value = y.dtype == DType::kF8E4M3 ? kFp8E4M3Max : kFp8E5M2Max;
  const float s = scale_from_amax_rule(a, fp8_max_value, opts.scale.eps, opts.scale.power_of_2);
  EMBSCALE_RETURN_IF_ERROR(quantize_any(ctx, x, s, y));
  *amax = a;
  *scale = s;
  *scale_inv = scale_inv_from_scale(s);
  return Status::Ok();
}

Status activation_amax_workspace_size(const TensorView&, const AmaxOptions&, size_t* bytes) {
  *bytes = 0;
  return Status::Ok();
}

Status activation_amax(const Context& ctx, Activation act, const TensorView& x, const TensorView& y, float* amax,
                       const AmaxOptions& opts, void*, size_t) {
  if (skip(opts.noop_flag)) return Status::Ok();
  switch (act) {
    case Activation::kRelu: return activation_amax_act<Activation::kRelu>(ctx, x, y, amax, opts.nonfinite_flag);
    case Activation::kGeluTanh: return activation_amax_act<Activation::kGeluTanh>(ctx, x, y, amax, opts.nonfinite_flag);
    case Activation::kSilu: return activation_amax_act<Activation::kSilu>(ctx, x, y, amax, opts.nonfinite_flag);
  }
  return invalid_argument("act: unknown activation " + std::to_string(static_cast<int>(act)));
}

Status cast_transpose(const Context& ctx, const TensorView& x, const float* scale, const TensorView& y,
                      const TensorView& yt, const float* noop_flag) {
  if (skip(noop_flag)) return Status::Ok();
  const float s = *scale;
  return dispatch_float(x.dtype, "x", [&](auto tx) {
    return dispatch_fp8(y.dtype, "y", [&](auto ty) {
      using Ti = typename decltype(tx)::type;
      using F8 = typename decltype(ty)::type;
      cast_transpose_typed(ctx, static_cast<const Ti*>(x.data), s, static_cast<F8*>(y.data), static_cast<F8*>(yt.data),
                           y.shape[0], y.shape[1]);
    });
  });
}

}  // namespace cpu
}  // namespace embscale
