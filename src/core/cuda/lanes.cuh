// The device's lane backend (core/lanes.h): every shuffle, ballot and warp reduction of the kernels goes
// through Warp, whose lane count is ArchTraits::kWarpSize (32 on NVIDIA and RDNA, 64 on CDNA). On NVIDIA
// these are the *_sync intrinsics with the mask and width the kernels always passed, so the machine code
// is what it was; on AMD (HIP) the wavefront-wide intrinsics, whose lanes are those of the group that
// calls them (every caller is converged: a full warp or a whole lane group).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/arch_traits.cuh"
#include "core/lanes.h"

namespace embscale {
namespace cuda {

template <int kLanes>
struct DeviceLanes : LaneShape<kLanes> {
  using Mask = typename LaneShape<kLanes>::Mask;
  static constexpr Mask kFull = LaneShape<kLanes>::kFull;

  static __device__ __forceinline__ int lane() { return static_cast<int>(threadIdx.x) & (kLanes - 1); }

  template <typename T>
  static __device__ __forceinline__ T shfl(T v, int src, int width = kLanes, Mask m = kFull) {
#if defined(__HIP_PLATFORM_AMD__)
    (void)m;
    return __shfl(v, src, width);
#else
    return __shfl_sync(m, v, src, width);
#endif
  }
  template <typename T>
  static __device__ __forceinline__ T shfl_xor(T v, int offset, int width = kLanes, Mask m = kFull) {
#if defined(__HIP_PLATFORM_AMD__)
    (void)m;
    return __shfl_xor(v, offset, width);
#else
    return __shfl_xor_sync(m, v, offset, width);
#endif
  }
  static __device__ __forceinline__ Mask ballot(bool p, Mask m = kFull) {
#if defined(__HIP_PLATFORM_AMD__)
    (void)m;
    return static_cast<Mask>(__ballot(p));
#else
    return __ballot_sync(m, p);
#endif
  }
  template <int L>
  static __device__ __forceinline__ typename LaneMaskOf<(L > 32 ? 64 : 32)>::type group_ballot(bool p) {
    return lane_group_ballot<DeviceLanes, L>(p);
  }
  static __device__ __forceinline__ void sync() {
#if !defined(__HIP_PLATFORM_AMD__)
    __syncwarp();
#endif
  }
  // Max / or over the warp: one instruction from sm_80 on, else xor shuffles.
  static __device__ __forceinline__ uint32_t reduce_max(uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return __reduce_max_sync(kFull, v);
#else
    return lane_max_by_shuffles<DeviceLanes>(v);
#endif
  }
  static __device__ __forceinline__ uint32_t reduce_or(uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    return __reduce_or_sync(kFull, v);
#else
    return lane_or_by_shuffles<DeviceLanes>(v);
#endif
  }
};

// The warp of the architecture being compiled, and its lane mask.
using Warp = DeviceLanes<ArchTraits::kWarpSize>;
using LaneMask = Warp::Mask;

}  // namespace cuda
}  // namespace embscale
