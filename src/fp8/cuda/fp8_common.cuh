// Device building blocks shared by the FP8 kernels: 16-byte vector access with a scalar head/tail,
// the max-|x| accumulator, block and cluster reductions, and the programmatic-dependent-launch hooks.
//
// Shape of every streaming kernel: the host splits [0, n) into a scalar head (elements before the first
// 16-byte-aligned address of the input), a body of 16-byte vectors, and a scalar tail (RangeSplit). When
// an output cannot be written with the matching vector width at the same element positions, the whole
// range is scalar: correctness never depends on alignment, only speed does. Indices are 64-bit.
//
// amax is accumulated on the bits: for non-NaN values, |x| orders exactly as its magnitude bits order as
// unsigned integers, so max is exact, order-independent and deterministic, and -0 becomes +0 by
// clearing the sign. NaN magnitudes (above the infinity pattern) are dropped from the max; the largest
// raw magnitude, NaN included, tells whether any element was non-finite.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/numerics.h"
#include "core/scaling.h"
#include "core/cuda/arch_traits.cuh"
#include "core/cuda/lanes.cuh"
#include "core/cuda/pdl.cuh"
#include "core/cuda/vec.cuh"

namespace embscale {
namespace cuda {

using Arch = ArchTraits;

// ---- range split --------------------------------------------------------------------------------
// Elements [0, head) and [tail_begin, n) are scalar; [head, tail_begin) is nvec vectors of
// kVectorBytes of input. With vector == false, head == n and nvec == 0.
struct RangeSplit {
  int64_t n = 0;
  int64_t head = 0;
  int64_t nvec = 0;
  int64_t tail_begin = 0;
  bool in_aligned = true;   // false: the input is not aligned to its element size (byte access)
  bool out_aligned = true;  // the same for the output, when there is one
  __host__ __device__ int64_t num_scalar() const { return head + (n - tail_begin); }
};

// Block blockIdx.x's share of nvec vectors cut into gridDim.x contiguous runs whose sizes differ by at
// most one: vectors [first, first + count).
struct BlockRun {
  int64_t first;
  int64_t count;
};
__device__ __forceinline__ BlockRun block_run(int64_t nvec) {
  const int64_t g = gridDim.x, b = blockIdx.x;
  const int64_t per = nvec / g, rem = nvec % g;
  return {b * per + (b < rem ? b : rem), per + (b < rem ? 1 : 0)};
}

// ---- element access that tolerates any alignment -----------------------------------------------
template <typename T>
__device__ __forceinline__ T load_elem(const void* base, int64_t i, bool aligned) {
  static_assert(sizeof(T) <= 4, "elements are at most 4 bytes");
  if (aligned) {
    T v;
    const T* p = static_cast<const T*>(base) + i;
    if constexpr (sizeof(T) == 4) {
      *reinterpret_cast<uint32_t*>(&v) = __ldg(reinterpret_cast<const unsigned int*>(p));
    } else if constexpr (sizeof(T) == 2) {
      *reinterpret_cast<uint16_t*>(&v) = __ldg(reinterpret_cast<const unsigned short*>(p));
    } else {
      *reinterpret_cast<uint8_t*>(&v) = __ldg(reinterpret_cast<const unsigned char*>(p));
    }
    return v;
  }
  const uint8_t* b = static_cast<const uint8_t*>(base) + i * static_cast<int64_t>(sizeof(T));
  uint32_t u = 0;
#pragma unroll
  for (int k = 0; k < static_cast<int>(sizeof(T)); ++k) u |= static_cast<uint32_t>(b[k]) << (8 * k);
  T v;
  if constexpr (sizeof(T) == 4) {
    *reinterpret_cast<uint32_t*>(&v) = u;
  } else if constexpr (sizeof(T) == 2) {
    *reinterpret_cast<uint16_t*>(&v) = static_cast<uint16_t>(u);
  } else {
    *reinterpret_cast<uint8_t*>(&v) = static_cast<uint8_t>(u);
  }
  return v;
}

template <typename T>
__device__ __forceinline__ void store_elem(void* base, int64_t i, T v, bool aligned) {
  if (aligned) {
    static_cast<T*>(base)[i] = v;
    return;
  }
  uint32_t u = 0;
  if constexpr (sizeof(T) == 4) {
    u = *reinterpret_cast<const uint32_t*>(&v);
  } else if constexpr (sizeof(T) == 2) {
    u = *reinterpret_cast<const uint16_t*>(&v);
  } else {
    u = *reinterpret_cast<const uint8_t*>(&v);
  }
  uint8_t* b = static_cast<uint8_t*>(base) + i * static_cast<int64_t>(sizeof(T));
#pragma unroll
  for (int k = 0; k < static_cast<int>(sizeof(T)); ++k) b[k] = static_cast<uint8_t>(u >> (8 * k));
}

template <typename T>
__device__ __forceinline__ uint32_t elem_bits(T v) {
  if constexpr (sizeof(T) == 4) {
    return *reinterpret_cast<const uint32_t*>(&v);
  } else if constexpr (sizeof(T) == 2) {
    return *reinterpret_cast<const uint16_t*>(&v);
  } else {
    return *reinterpret_cast<const uint8_t*>(&v);
  }
}

// One 16-byte input vector viewed as kN elements of T.
template <typename T>
struct Vec16 {
  static constexpr int kN = Arch::kVectorBytes / static_cast<int>(sizeof(T));
  uint4 raw;
  __device__ __forceinline__ uint32_t word(int w) const {
    return w == 0 ? raw.x : w == 1 ? raw.y : w == 2 ? raw.z : raw.w;
  }
  // Element k as raw bits (k is a compile-time constant after unrolling).
  __device__ __forceinline__ uint32_t bits(int k) const {
    constexpr int kPerWord = 4 / static_cast<int>(sizeof(T));
    const uint32_t w = word(k / kPerWord);
    if constexpr (kPerWord == 1) {
      return w;
    } else {
      constexpr int kShift = 8 * static_cast<int>(sizeof(T));
      return (w >> (kShift * (k % kPerWord))) & ((1u << kShift) - 1u);
    }
  }
  __device__ __forceinline__ T elem(int k) const {
    T v;
    const uint32_t b = bits(k);
    if constexpr (sizeof(T) == 4) {
      *reinterpret_cast<uint32_t*>(&v) = b;
    } else if constexpr (sizeof(T) == 2) {
      *reinterpret_cast<uint16_t*>(&v) = static_cast<uint16_t>(b);
    } else {
      *reinterpret_cast<uint8_t*>(&v) = static_cast<uint8_t>(b);
    }
    return v;
  }
};

// Vector i of a 16-byte aligned body (read-only for the kernel's lifetime).
template <typename T, LoadHint H = LoadHint::kReadOnly>
__device__ __forceinline__ Vec16<T> load_vec(const void* body, int64_t i) {
  const Words<16> r = load_words<16, H>(static_cast<const uint4*>(body) + i);
  Vec16<T> v;
  v.raw = make_uint4(r.w[0], r.w[1], r.w[2], r.w[3]);
  return v;
}

// kN outputs of T packed for one wide store (kN * sizeof(T) bytes: 4, 8, 16, 32 or 64).
template <typename T, int kN>
struct OutPack {
  static constexpr int kBytes = kN * static_cast<int>(sizeof(T));
  static constexpr int kWords = kBytes / 4;
  static_assert(kBytes % 4 == 0, "pack is whole words");
  uint32_t w[kWords];
  __device__ __forceinline__ void set(int k, T v) {
    constexpr int kPerWord = 4 / static_cast<int>(sizeof(T));
    const uint32_t b = elem_bits(v);
    if constexpr (kPerWord == 1) {
      w[k] = b;
    } else {
      constexpr int kShift = 8 * static_cast<int>(sizeof(T));
      const int s = kShift * (k % kPerWord);
      if (k % kPerWord == 0) w[k / kPerWord] = 0;
      w[k / kPerWord] |= b << s;
    }
  }
  // Stores the pack at element offset i * kN of a buffer aligned to min(kBytes, 16).
  template <StoreHint H = StoreHint::kDefault>
  __device__ __forceinline__ void store(void* body, int64_t i) const {
    constexpr int kChunk = kBytes < 16 ? kBytes : 16;  // bytes per store
    using Chunk = std::conditional_t<kChunk == 4, uint32_t, std::conditional_t<kChunk == 8, uint2, uint4>>;
    Chunk* p = static_cast<Chunk*>(body) + i * (kBytes / kChunk);
#pragma unroll
    for (int q = 0; q < kBytes / kChunk; ++q) store_words<kChunk, H>(p + q, w + q * (kChunk / 4));
  }
};

// fp32 value of an input element. fp16 uses the hardware conversion (exact, so identical to the
// software to_float of numerics.h); the other formats use numerics.h directly.
template <typename T>
__device__ __forceinline__ float load_float(T v) {
  if constexpr (std::is_same_v<T, fp16_t>) {
    return __half2float(__ushort_as_half(v.bits));
  } else {
    return to_float(v);
  }
}

// ---- grid-stride traversal ----------------------------------------------------------------------
// Vector body: kUnroll independent 16-byte loads in flight per thread before any is consumed (the
// remainder too, as predicated loads). With reverse, vector i is visited as nvec-1-i (used by a second
// pass so it starts on what the first pass left in L2). proc(vector index, vector) consumes. H: the
// loads' cache hint.
template <typename T, int kUnroll, LoadHint H = LoadHint::kReadOnly, class Proc>
__device__ __forceinline__ void stream_vectors(const void* body, int64_t nvec, int64_t start, int64_t stride,
                                               bool reverse, Proc&& proc) {
  int64_t i = start;
  for (; i + (kUnroll - 1) * stride < nvec; i += kUnroll * stride) {
    Vec16<T> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = i + u * stride;
      v[u] = load_vec<T, H>(body, reverse ? nvec - 1 - j : j);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t j = i + u * stride;
      proc(reverse ? nvec - 1 - j : j, v[u]);
    }
  }
  // Remainder: fewer than kUnroll vectors are left for this thread. Their loads are all issued
  // (predicated) before any is consumed, so the tail keeps several loads in flight instead of
  // running up to kUnroll - 1 dependent round trips. Same indices, same order as one at a time.
  if constexpr (kUnroll > 1) {
    if (i < nvec) {
      Vec16<T> v[kUnroll - 1];
#pragma unroll
      for (int u = 0; u < kUnroll - 1; ++u) {
        const int64_t j = i + u * stride;
        v[u].raw = make_uint4(0u, 0u, 0u, 0u);
        if (j < nvec) v[u] = load_vec<T, H>(body, reverse ? nvec - 1 - j : j);
      }
#pragma unroll
      for (int u = 0; u < kUnroll - 1; ++u) {
        const int64_t j = i + u * stride;
        if (j < nvec) proc(reverse ? nvec - 1 - j : j, v[u]);
      }
    }
  }
}

// Scalar head and tail: f(element index).
template <class F>
__device__ __forceinline__ void stream_scalars(const RangeSplit& s, int64_t start, int64_t stride, F&& f) {
  const int64_t ns = s.num_scalar();
  for (int64_t k = start; k < ns; k += stride) f(k < s.head ? k : s.tail_begin + (k - s.head));
}

// ---- max |x| accumulator ------------------------------------------------------------------------
// Result of a partial reduction: bits of a non-negative, non-NaN float, and whether any element seen
// was inf or NaN.
struct AmaxPartial {
  uint32_t bits;
  uint32_t nonfinite;
};

template <typename T>
struct MagAcc;

template <>
struct MagAcc<float> {
  uint32_t m = 0;    // max magnitude bits over non-NaN elements
  uint32_t raw = 0;  // max magnitude bits over all elements (NaN included)
  __device__ __forceinline__ void add_bits(uint32_t b) {
    const uint32_t a = b & 0x7fffffffu;
    raw = max(raw, a);
    m = max(m, a > 0x7f800000u ? 0u : a);
  }
  __device__ __forceinline__ void add_word(uint32_t w) { add_bits(w); }
  template <typename V>
  __device__ __forceinline__ void add_vec(const V& v) {
    add_bits(v.raw.x);
    add_bits(v.raw.y);
    add_bits(v.raw.z);
    add_bits(v.raw.w);
  }
  __device__ __forceinline__ AmaxPartial result() const { return {m, raw >= 0x7f800000u ? 1u : 0u}; }
};

// 16-bit formats: two magnitudes per 32-bit word, maxed with the SIMD video instructions.
template <uint32_t kInf, typename T>
struct MagAcc16 {
  uint32_t m = 0;
  uint32_t raw = 0;
  __device__ __forceinline__ void add_word(uint32_t w) {
    const uint32_t a = w & 0x7fff7fffu;
    raw = __vmaxu2(raw, a);
    const uint32_t nan_mask = __vcmpgtu2(a, kInf | (kInf << 16));  // 0xffff in each NaN half
    m = __vmaxu2(m, a & ~nan_mask);
  }
  __device__ __forceinline__ void add_bits(uint32_t b) { add_word(b & 0xffffu); }
  template <typename V>
  __device__ __forceinline__ void add_vec(const V& v) {
    add_word(v.raw.x);
    add_word(v.raw.y);
    add_word(v.raw.z);
    add_word(v.raw.w);
  }
  __device__ __forceinline__ AmaxPartial result() const {
    const uint32_t m16 = max(m & 0xffffu, m >> 16);
    const uint32_t r16 = max(raw & 0xffffu, raw >> 16);
    T v;
    *reinterpret_cast<uint16_t*>(&v) = static_cast<uint16_t>(m16);
    return {float_bits(to_float(v)), r16 >= kInf ? 1u : 0u};
  }
};
template <>
struct MagAcc<bf16_t> : MagAcc16<0x7f80u, bf16_t> {};
template <>
struct MagAcc<fp16_t> : MagAcc16<0x7c00u, fp16_t> {};

// Adds the scalar head and tail elements of x (split as s), this thread's from start by stride, to acc.
template <typename T>
__device__ __forceinline__ void add_scalars(MagAcc<T>& acc, const void* x, const RangeSplit& s, int64_t start,
                                            int64_t stride) {
  stream_scalars(s, start, stride, [&](int64_t i) { acc.add_bits(elem_bits(load_elem<T>(x, i, s.in_aligned))); });
}

// ---- reductions ---------------------------------------------------------------------------------
// Max / or over the warp (core/cuda/lanes.cuh: one instruction from sm_80 on, else xor shuffles).
__device__ __forceinline__ uint32_t warp_max_u32(uint32_t v) { return Warp::reduce_max(v); }
__device__ __forceinline__ uint32_t warp_or_u32(uint32_t v) { return Warp::reduce_or(v); }

// Max/or over the block; the result is valid in every thread. Starts and ends with a barrier so it
// may be called repeatedly. blockDim.x is a multiple of the warp size.
__device__ __forceinline__ AmaxPartial block_reduce_amax(AmaxPartial p) {
  __shared__ uint32_t s_bits[Arch::kMaxThreadsPerBlock / Arch::kWarpSize];
  __shared__ uint32_t s_nf[Arch::kMaxThreadsPerBlock / Arch::kWarpSize];
  const int lane = threadIdx.x % Arch::kWarpSize;
  const int warp = threadIdx.x / Arch::kWarpSize;
  const int nwarps = blockDim.x / Arch::kWarpSize;
  p.bits = warp_max_u32(p.bits);
  p.nonfinite = warp_or_u32(p.nonfinite);
  __syncthreads();
  if (lane == 0) {
    s_bits[warp] = p.bits;
    s_nf[warp] = p.nonfinite;
  }
  __syncthreads();
  const MaxOr<Warp> m = lane_combine_warps<Warp>(s_bits, s_nf, nwarps, lane);
  AmaxPartial r{m.max, m.any};
  __syncthreads();
  return r;
}

// ---- no-op flag and programmatic dependent launch -----------------------------------------------
// Every kernel is launched (on sm_90+) with programmatic stream serialization: it may be scheduled
// while the previous kernel in the stream finishes, so before touching global memory it waits for
// that kernel to complete and flush (griddepcontrol.wait; a no-op when there is no such dependency).
// It then allows its own successor to be scheduled early; the successor waits the same way, so
// early scheduling never exposes partial results.
// (grid_dependency_wait and allow_dependent_launch: core/cuda/pdl.cuh)
// Call first in every kernel: returns true when the op must be skipped. Uniform across the grid, so
// ticket counters and cluster barriers stay consistent.
__device__ __forceinline__ bool kernel_prologue_skip(const float* noop_flag) {
  grid_dependency_wait();
  allow_dependent_launch();
  return noop_flag != nullptr && *noop_flag == 1.0f;
}

}  // namespace cuda
}  // namespace embscale
