// CUDA TBE backward: element loads and stores of kVec columns (weights, gradient rows, partials) in
// fp32 registers (the wide accesses through core/cuda/vec.cuh), dtype conversion of single elements, L2
// prefetch and the warp sum in a fixed xor tree.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/numerics.h"
#include "core/cuda/lanes.cuh"
#include "core/cuda/vec.cuh"
#include "tbe/cuda/backward/tbe_backward_params.cuh"

namespace embscale {
namespace cuda {
namespace tbe_bwd {

__device__ __forceinline__ float warp_sum(float v) { return lane_sum<Warp>(v); }

template <typename T>
__device__ __forceinline__ float to_float(T v);
template <>
__device__ __forceinline__ float to_float<float>(float v) { return v; }
// fp16: the hardware conversion (exact, one instruction), as the forward and FP8 kernels use; the
// portable decode of core/numerics.h branches on inf/NaN/subnormal for every element.
template <>
__device__ __forceinline__ float to_float<fp16_t>(fp16_t v) { return __half2float(__ushort_as_half(v.bits)); }
template <>
__device__ __forceinline__ float to_float<bf16_t>(bf16_t v) { return bf16_to_float(v.bits); }

// Asks L2 to fetch the line holding p (no register written, no fault reported).
__device__ __forceinline__ void prefetch_l2(const void* p) {
#if defined(__HIP_PLATFORM_AMD__)
  (void)p;  // no L2 prefetch instruction on AMD: the hint is dropped
#else
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}

// How a call's row vectors of kVec columns are accessed.
//  kByFlag: each vector is read with one wide access when the call's flag (vec) says the rows are
//           kVec-aligned and the vector is whole (n == kVec), else element by element (n < kVec valid).
//  kWhole:  the caller guarantees every vector is whole and aligned or empty (n is kVec or 0): no
//           element-by-element code. The row kernels take it when the host finds every row whole
//           (whole_vecs): the element code around every access costs even when it is never taken
//           (docs/tbe_backward_cuda.md, "Rows and vector access").
enum class VecAccess { kByFlag, kWhole };

// kVec elements from p (n valid of them; the rest read as 0), as kAccess says. ro: the data is
// read-only for the kernel's lifetime (grad_output), so the non-coherent path may be used. Otherwise
// (weights, partials) the data is read once: a streaming load (evict-first), so it does not push
// grad_output rows, which every lookup of a bag reads again, out of L2.
template <typename T, bool kRo, VecAccess kAccess = VecAccess::kByFlag>
__device__ __forceinline__ void load_vec(const T* p, bool vec, int n, float* x) {
  if (kAccess == VecAccess::kWhole ? n > 0 : vec && n == kVec) {
    load_floats<T, kVec, kRo ? LoadHint::kReadOnly : LoadHint::kStreaming>(p, x);
    return;
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    if (kAccess == VecAccess::kByFlag && k < n) {
      if constexpr (sizeof(T) == 4) {
        x[k] = kRo ? __ldg(reinterpret_cast<const float*>(p) + k) : __ldcs(reinterpret_cast<const float*>(p) + k);
      } else {
        const uint16_t b = kRo ? __ldg(reinterpret_cast<const unsigned short*>(p) + k)
                               : __ldcs(reinterpret_cast<const unsigned short*>(p) + k);
        x[k] = to_float<T>(T{b});
      }
    } else {
      x[k] = 0.0f;
    }
  }
}

// Updated weights are written once: streaming stores (evict-first), as load_vec's weight loads.
template <typename W, VecAccess kAccess = VecAccess::kByFlag>
__device__ __forceinline__ void store_weights(W* p, bool vec, int n, const W* v) {
  if (kAccess == VecAccess::kWhole ? n > 0 : vec && n == kVec) {
    if constexpr (sizeof(W) == 4) {
      store_fp32<kVec, StoreHint::kStreaming>(p, v);
    } else {
      uint32_t w[kVec / 2];
#pragma unroll
      for (int k = 0; k < kVec / 2; ++k)
        w[k] = static_cast<uint32_t>(v[2 * k].bits) | (static_cast<uint32_t>(v[2 * k + 1].bits) << 16);
      store_words<kVec * 2, StoreHint::kStreaming>(p, w);
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k)
    if (kAccess == VecAccess::kByFlag && k < n) p[k] = v[k];
}

template <VecAccess kAccess = VecAccess::kByFlag>
__device__ __forceinline__ void store_floats(float* p, bool vec, int n, const float* v) {
  if (kAccess == VecAccess::kWhole ? n > 0 : vec && n == kVec) {
    store_fp32<kVec>(p, v);
    return;
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k)
    if (kAccess == VecAccess::kByFlag && k < n) p[k] = v[k];
}

}  // namespace tbe_bwd
}  // namespace cuda
}  // namespace embscale
