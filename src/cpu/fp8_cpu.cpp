// CPU backend of fp8.h (api/fp8_backend.h, namespace cpu): OpenMP threads over a fixed contiguous
// split of the elements, simple loops the compiler vectorises, numerics from common/numerics.h and
// common/scaling.h so the results are the CUDA backend's.
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

#include "api/fp8_backend.h"
#include "common/activation.h"
#include "common/numerics.h"
#include "common/scaling.h"

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

void amax_any(const Context& ctx, const TensorView& x, float* amax, int32_t* nonfinite_flag) {
  const int64_t n = x.numel();
  switch (x.dtype) {
    case DType::kF32: return amax_typed(ctx, static_cast<const float*>(x.data), n, amax, nonfinite_flag);
    case DType::kF16: return amax_typed(ctx, static_cast<const fp16_t*>(x.data), n, amax, nonfinite_flag);
    default: return amax_typed(ctx, static_cast<const bf16_t*>(x.data), n, amax, nonfinite_flag);
  }
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

// ---- fp8 encoding through a table ----
// The fp8 code of an fp32 value depends only on its sign, its top 12 magnitude bits (the exponent and
// 4 mantissa bits, which hold the kept fp8 bits and the round bit in every normal and subnormal fp8
// binade of both formats) and on whether any of the 19 lower bits is set (the sticky bit of
// round-to-nearest-even). A table over those 13 bits, each entry produced by the shared
// from_float<F8> on one representative input, therefore reproduces the shared cast exactly for all
// 2^32 inputs (checked exhaustively for e4m3 and e5m2), and the hot loop has no branches.
template <typename F8>
struct Fp8Encoder {
  uint8_t mag[1 << 13];
  Fp8Encoder() {
    for (uint32_t idx = 0; idx < (1u << 13); ++idx)
      mag[idx] = from_float<F8>(bits_float(((idx >> 1) << 19) | (idx & 1u))).bits;
  }
  // Table index of v (sign dropped).
  static uint32_t index(float v) {
    const uint32_t a = float_bits(v) & 0x7fffffffu;
    return ((a >> 19) << 1) | static_cast<uint32_t>((a & 0x7ffffu) != 0u);
  }
  static uint8_t sign(float v) { return static_cast<uint8_t>((float_bits(v) >> 24) & 0x80u); }
  F8 operator()(float v) const { return F8{static_cast<uint8_t>(mag[index(v)] | sign(v))}; }

  // y[i] = fp8(to_float(x[i]) * s) for i < n. In chunks: the products and table indices are formed in
  // a loop the compiler vectorises, then the byte lookups run as a short scalar loop.
  template <typename Ti>
  void encode_scaled(const Ti* x, float s, F8* y, int64_t n) const {
    constexpr int kChunk = 64;
    int64_t i = 0;
    for (; i + kChunk <= n; i += kChunk) encode_chunk<kChunk>(x + i, s, y + i, kChunk);
    if (i < n) encode_chunk<kChunk>(x + i, s, y + i, static_cast<int>(n - i));
  }

  template <int kChunk, typename Ti>
  __attribute__((always_inline)) inline void encode_chunk(const Ti* x, float s, F8* y, int m) const {
    float v[kChunk];
    uint32_t idx[kChunk];
    uint8_t sgn[kChunk];
    decode_chunk(x, m, v);
    for (int j = 0; j < m; ++j) {
      const float p = v[j] * s;
      idx[j] = index(p);
      sgn[j] = sign(p);
    }
    for (int j = 0; j < m; ++j) y[j] = F8{static_cast<uint8_t>(mag[idx[j]] | sgn[j])};
  }
};

template <typename F8>
const Fp8Encoder<F8>& fp8_encoder() {
  static const Fp8Encoder<F8> enc;
  return enc;
}

// ---- element-wise casts ----
// y = fp8(to_float(x) * s): one fp32 product, then the fp8 rounding.
template <typename Ti, typename F8>
void quantize_typed(const Context& ctx, const Ti* x, float s, F8* y, int64_t n) {
  const Fp8Encoder<F8>& enc = fp8_encoder<F8>();
  parallel_blocks(thread_count(ctx, n), n, [&](int64_t b, int64_t e, int) {
    enc.encode_scaled(x + b, s, y + b, e - b);
  });
}

template <typename Ti>
void quantize_from(const Context& ctx, const Ti* x, float s, const TensorView& y) {
  if (y.dtype == DType::kF8E4M3) return quantize_typed(ctx, x, s, static_cast<fp8e4m3_t*>(y.data), y.numel());
  return quantize_typed(ctx, x, s, static_cast<fp8e5m2_t*>(y.data), y.numel());
}

void quantize_any(const Context& ctx, const TensorView& x, float s, const TensorView& y) {
  switch (x.dtype) {
    case DType::kF32: return quantize_from(ctx, static_cast<const float*>(x.data), s, y);
    case DType::kF16: return quantize_from(ctx, static_cast<const fp16_t*>(x.data), s, y);
    default: return quantize_from(ctx, static_cast<const bf16_t*>(x.data), s, y);
  }
}

// An fp8 input has only 256 values, so each call first tabulates from_float<To>(float(code) * s) for
// all of them with the shared conversions; the hot loop is then a byte-indexed load.
template <typename F8, typename To>
void dequantize_typed(const Context& ctx, const uint8_t* codes, float s, To* x, int64_t n) {
  To lut[256];
  for (int c = 0; c < 256; ++c) lut[c] = from_float<To>(to_float(F8{static_cast<uint8_t>(c)}) * s);
  parallel_blocks(thread_count(ctx, n), n, [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) x[i] = lut[codes[i]];
  });
}

template <typename To>
void dequantize_to(const Context& ctx, const TensorView& y, float s, To* x) {
  const uint8_t* codes = static_cast<const uint8_t*>(y.data);
  if (y.dtype == DType::kF8E4M3) return dequantize_typed<fp8e4m3_t>(ctx, codes, s, x, y.numel());
  return dequantize_typed<fp8e5m2_t>(ctx, codes, s, x, y.numel());
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

template <Activation kAct, typename Ti>
void activation_amax_from(const Context& ctx, const Ti* x, const TensorView& y, float* amax, int32_t* flag) {
  const int64_t n = y.numel();
  switch (y.dtype) {
    case DType::kF32: return activation_amax_typed<kAct>(ctx, x, static_cast<float*>(y.data), n, amax, flag);
    case DType::kF16: return activation_amax_typed<kAct>(ctx, x, static_cast<fp16_t*>(y.data), n, amax, flag);
    default: return activation_amax_typed<kAct>(ctx, x, static_cast<bf16_t*>(y.data), n, amax, flag);
  }
}

template <Activation kAct>
void activation_amax_act(const Context& ctx, const TensorView& x, const TensorView& y, float* amax, int32_t* flag) {
  switch (x.dtype) {
    case DType::kF32: return activation_amax_from<kAct>(ctx, static_cast<const float*>(x.data), y, amax, flag);
    case DType::kF16: return activation_amax_from<kAct>(ctx, static_cast<const fp16_t*>(x.data), y, amax, flag);
    default: return activation_amax_from<kAct>(ctx, static_cast<const bf16_t*>(x.data), y, amax, flag);
  }
}

// ---- cast + transpose ----
// 64 x 64 tiles: a tile of x is read row by row (contiguous), quantized into y row by row and into a
// local transposed tile, which is then written to yt as 64-byte rows, one full cache line each, so no
// partially written line of yt is evicted and re-read. Threads own whole bands of 64 rows of x.
constexpr int64_t kTile = 64;

template <typename Ti, typename F8>
void cast_transpose_typed(const Context& ctx, const Ti* x, float s, F8* y, F8* yt, int64_t rows, int64_t cols) {
  const Fp8Encoder<F8>& enc = fp8_encoder<F8>();
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
          for (int64_t c = 0; c < nc; ++c) {
            const F8 q = enc(to_float(xr[c]) * s);
            yr[c] = q;
            tile[c][r] = q;
          }
        }
        for (int64_t c = 0; c < nc; ++c) std::memcpy(yt + (c0 + c) * rows + r0, tile[c], static_cast<size_t>(nr) * sizeof(F8));
      }
    }
  });
}

template <typename Ti>
void cast_transpose_from(const Context& ctx, const Ti* x, float s, const TensorView& y, const TensorView& yt) {
  const int64_t rows = y.shape[0], cols = y.shape[1];
  if (y.dtype == DType::kF8E4M3)
    return cast_transpose_typed(ctx, x, s, static_cast<fp8e4m3_t*>(y.data), static_cast<fp8e4m3_t*>(yt.data), rows, cols);
  return cast_transpose_typed(ctx, x, s, static_cast<fp8e5m2_t*>(y.data), static_cast<fp8e5m2_t*>(yt.data), rows, cols);
}

}  // namespace

Status amax_workspace_size(const TensorView&, const AmaxOptions&, size_t* bytes) {
  *bytes = 0;
  return Status::Ok();
}

Status amax(const Context& ctx, const TensorView& x, float* amax, const AmaxOptions& opts, void*, size_t) {
  if (skip(opts.noop_flag)) return Status::Ok();
  amax_any(ctx, x, amax, opts.nonfinite_flag);
  return Status::Ok();
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
  quantize_any(ctx, x, *scale, y);
  return Status::Ok();
}

Status dequantize(const Context& ctx, const TensorView& y, const float* scale_inv, const TensorView& x,
                  const float* noop_flag) {
  if (skip(noop_flag)) return Status::Ok();
  const float s = *scale_inv;
  switch (x.dtype) {
    case DType::kF32: dequantize_to(ctx, y, s, static_cast<float*>(x.data)); break;
    case DType::kF16: dequantize_to(ctx, y, s, static_cast<fp16_t*>(x.data)); break;
    default: dequantize_to(ctx, y, s, static_cast<bf16_t*>(x.data)); break;
  }
  return Status::Ok();
}

Status quantize_current_scaling_workspace_size(const TensorView&, const CurrentScalingOptions&, size_t* bytes) {
  *bytes = 0;
  return Status::Ok();
}

Status quantize_current_scaling(const Context& ctx, const TensorView& x, const TensorView& y, float* amax,
                                float* scale, float* scale_inv, const CurrentScalingOptions& opts, void*, size_t) {
  if (skip(opts.amax.noop_flag)) return Status::Ok();
  float a = 0.0f;
  amax_any(ctx, x, &a, opts.amax.nonfinite_flag);
  const float fp8_max_value = y.dtype == DType::kF8E4M3 ? kFp8E4M3Max : kFp8E5M2Max;
  const float s = scale_from_amax_rule(a, fp8_max_value, opts.scale.eps, opts.scale.power_of_2);
  quantize_any(ctx, x, s, y);
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
    case Activation::kRelu: activation_amax_act<Activation::kRelu>(ctx, x, y, amax, opts.nonfinite_flag); break;
    case Activation::kGeluTanh: activation_amax_act<Activation::kGeluTanh>(ctx, x, y, amax, opts.nonfinite_flag); break;
    case Activation::kSilu: activation_amax_act<Activation::kSilu>(ctx, x, y, amax, opts.nonfinite_flag); break;
  }
  return Status::Ok();
}

Status cast_transpose(const Context& ctx, const TensorView& x, const float* scale, const TensorView& y,
                      const TensorView& yt, const float* noop_flag) {
  if (skip(noop_flag)) return Status::Ok();
  const float s = *scale;
  switch (x.dtype) {
    case DType::kF32: cast_transpose_from(ctx, static_cast<const float*>(x.data), s, y, yt); break;
    case DType::kF16: cast_transpose_from(ctx, static_cast<const fp16_t*>(x.data), s, y, yt); break;
    default: cast_transpose_from(ctx, static_cast<const bf16_t*>(x.data), s, y, yt); break;
  }
  return Status::Ok();
}

}  // namespace cpu
}  // namespace embscale
