// The one set of wide global loads and stores of the CUDA kernels: kBytes (2, 4, 8 or 16) bytes as
// 32-bit words in one instruction (or fp32 values as floats), with the cache behaviour a parameter, and
// the exact conversion of loaded fp32/fp16/bf16 words to fp32. The FP8 kernels, the TBE forward and the TBE backward all load
// and store through these, so a cache hint is chosen by name at the call and one PTX form exists for each.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/numerics.h"

namespace embscale {
namespace cuda {

// How a load uses the caches (PTX cache operators).
enum class LoadHint {
  kReadOnly,      // ld.global.nc (__ldg): the data is read-only for the kernel's lifetime
  kReadOnlyNoL1,  // ld.global.nc.L1::no_allocate: as kReadOnly, and the line is not kept in L1 (4 bytes
                  // and up; a 2-byte load is kReadOnly)
  kStreaming,     // ld.global.cs (__ldcs): read once, evict-first, so it does not push reused data out
};

// How a store uses the caches.
enum class StoreHint {
  kDefault,    // st.global: write-back
  kStreaming,  // st.global.cs (__stcs): written once and not read again by the kernel, evict-first
};

// kBytes of data as 32-bit words (one word, its low half used, for 2 bytes).
template <int kBytes>
struct Words {
  static_assert(kBytes == 2 || kBytes == 4 || kBytes == 8 || kBytes == 16, "a wide access is 2, 4, 8 or 16 bytes");
  uint32_t w[kBytes >= 4 ? kBytes / 4 : 1];
};

namespace vec_detail {

template <LoadHint H, typename V>
__device__ __forceinline__ V ld(const V* p) {
  if constexpr (H == LoadHint::kStreaming) {
    return __ldcs(p);
  } else {
    return __ldg(p);
  }
}

template <StoreHint H, typename V>
__device__ __forceinline__ void st(V* p, V v) {
  if constexpr (H == StoreHint::kStreaming) {
    __stcs(p, v);
  } else {
    *p = v;
  }
}

}  // namespace vec_detail

// kBytes from p, which is aligned to kBytes.
template <int kBytes, LoadHint H = LoadHint::kReadOnly>
__device__ __forceinline__ Words<kBytes> load_words(const void* p) {
  Words<kBytes> r;
#if defined(__HIP_PLATFORM_AMD__)
  // AMD: no load that skips L1 allocation; kReadOnlyNoL1 is a read-only load.
  if constexpr (false) {
#else
  if constexpr (H == LoadHint::kReadOnlyNoL1 && kBytes == 16) {
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.w[0]), "=r"(r.w[1]), "=r"(r.w[2]), "=r"(r.w[3])
        : "l"(p));
  } else if constexpr (H == LoadHint::kReadOnlyNoL1 && kBytes == 8) {
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(r.w[0]), "=r"(r.w[1]) : "l"(p));
  } else if constexpr (H == LoadHint::kReadOnlyNoL1 && kBytes == 4) {
    asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(r.w[0]) : "l"(p));
#endif
  } else {
    constexpr LoadHint kH = H == LoadHint::kStreaming ? LoadHint::kStreaming : LoadHint::kReadOnly;
    if constexpr (kBytes == 16) {
      const uint4 v = vec_detail::ld<kH>(static_cast<const uint4*>(p));
      r.w[0] = v.x;
      r.w[1] = v.y;
      r.w[2] = v.z;
      r.w[3] = v.w;
    } else if constexpr (kBytes == 8) {
      const uint2 v = vec_detail::ld<kH>(static_cast<const uint2*>(p));
      r.w[0] = v.x;
      r.w[1] = v.y;
    } else if constexpr (kBytes == 4) {
      r.w[0] = vec_detail::ld<kH>(static_cast<const unsigned int*>(p));
    } else {
      r.w[0] = vec_detail::ld<kH>(static_cast<const unsigned short*>(p));
    }
  }
  return r;
}

template <int kBytes>
__device__ __forceinline__ Words<kBytes> zero_words() {
  Words<kBytes> r;
#pragma unroll
  for (int i = 0; i < (kBytes >= 4 ? kBytes / 4 : 1); ++i) r.w[i] = 0u;
  return r;
}

// The kBytes / 4 words at w (kBytes 4, 8 or 16) to p, which is aligned to kBytes.
template <int kBytes, StoreHint H = StoreHint::kDefault>
__device__ __forceinline__ void store_words(void* p, const uint32_t* w) {
  static_assert(kBytes == 4 || kBytes == 8 || kBytes == 16, "a wide store is 4, 8 or 16 bytes");
  if constexpr (kBytes == 16) {
    vec_detail::st<H>(static_cast<uint4*>(p), make_uint4(w[0], w[1], w[2], w[3]));
  } else if constexpr (kBytes == 8) {
    vec_detail::st<H>(static_cast<uint2*>(p), make_uint2(w[0], w[1]));
  } else {
    vec_detail::st<H>(static_cast<unsigned int*>(p), w[0]);
  }
}

// ---- fp32 values of loaded words (exact for every float dtype, so the hardware conversions used
// here give the same values as the host-side software conversions of core/numerics.h) ----

// The elements of T in one 32-bit word, low half first.
template <typename T>
__device__ __forceinline__ void word_to_floats(uint32_t w, float* x);
template <>
__device__ __forceinline__ void word_to_floats<float>(uint32_t w, float* x) { x[0] = __uint_as_float(w); }
template <>
__device__ __forceinline__ void word_to_floats<fp16_t>(uint32_t w, float* x) {
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w));  // .x is the low half
  x[0] = f.x;
  x[1] = f.y;
}
template <>
__device__ __forceinline__ void word_to_floats<bf16_t>(uint32_t w, float* x) {
  x[0] = __uint_as_float(w << 16);
  x[1] = __uint_as_float(w & 0xffff0000u);
}

// One 16-bit element held in the low half of h.
template <typename T>
__device__ __forceinline__ float half_word_to_float(uint32_t h);
template <>
__device__ __forceinline__ float half_word_to_float<fp16_t>(uint32_t h) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
}
template <>
__device__ __forceinline__ float half_word_to_float<bf16_t>(uint32_t h) { return __uint_as_float(h << 16); }

// The kBytes / sizeof(T) elements of T in r, as fp32, into x.
template <typename T, int kBytes>
__device__ __forceinline__ void words_to_floats(const Words<kBytes>& r, float* x) {
  if constexpr (kBytes < 4) {
    x[0] = half_word_to_float<T>(r.w[0]);
  } else {
    constexpr int kPerWord = 4 / static_cast<int>(sizeof(T));
#pragma unroll
    for (int i = 0; i < kBytes / 4; ++i) word_to_floats<T>(r.w[i], x + i * kPerWord);
  }
}

// kN elements of T at p (aligned to their kN * sizeof(T) bytes) as fp32, in one load. fp32 data is
// loaded as floats (float4 / float2), not as words, so the compiler sees the same types it would for
// a float4 load written out.
template <typename T, int kN, LoadHint H = LoadHint::kReadOnly>
__device__ __forceinline__ void load_floats(const T* p, float* x) {
  constexpr int kBytes = kN * static_cast<int>(sizeof(T));
  if constexpr (std::is_same_v<T, float> && H != LoadHint::kReadOnlyNoL1 && (kN == 4 || kN == 2)) {
    using V = std::conditional_t<kN == 4, float4, float2>;
    const V v = vec_detail::ld<H>(reinterpret_cast<const V*>(p));
    x[0] = v.x;
    x[1] = v.y;
    if constexpr (kN == 4) {
      x[2] = v.z;
      x[3] = v.w;
    }
  } else {
    words_to_floats<T, kBytes>(load_words<kBytes, H>(p), x);
  }
}

// kN (2 or 4) fp32 values to p (aligned to kN * 4 bytes), in one store of floats (float4 / float2).
template <int kN, StoreHint H = StoreHint::kDefault>
__device__ __forceinline__ void store_fp32(float* p, const float* v) {
  static_assert(kN == 4 || kN == 2, "a wide fp32 store is 2 or 4 values");
  if constexpr (kN == 4) {
    vec_detail::st<H>(reinterpret_cast<float4*>(p), make_float4(v[0], v[1], v[2], v[3]));
  } else {
    vec_detail::st<H>(reinterpret_cast<float2*>(p), make_float2(v[0], v[1]));
  }
}

}  // namespace cuda
}  // namespace embscale
