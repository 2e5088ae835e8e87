// Architecture facts used by the kernels, in one place: a wave64 port is a new traits entry, not a
// fork of each kernel. The lane count is a compile-time constant of the build: 32 for NVIDIA; on AMD
// the build's wavefront size (EMBSCALE_HIP_LANES: 64 for CDNA such as gfx90a, 32 for RDNA such as
// gfx1030), which CMake derives from the targets and which host and device code share. The warp-level
// primitives over it are core/cuda/lanes.cuh.
#pragma once

namespace embscale {
namespace cuda {

#if defined(__HIP_PLATFORM_AMD__) && !defined(EMBSCALE_HIP_LANES)
#error "EMBSCALE_HIP_LANES (the targets' wavefront size) is set by CMake for the HIP build"
#endif
#if defined(EMBSCALE_HIP_LANES)
#if defined(__HIP_DEVICE_COMPILE__) && defined(__AMDGCN_WAVEFRONT_SIZE) && __AMDGCN_WAVEFRONT_SIZE != EMBSCALE_HIP_LANES
#error "a HIP build compiles targets of one wavefront size (EMBSCALE_HIP_LANES)"
#endif
struct ArchTraits {
  static constexpr int kWarpSize = EMBSCALE_HIP_LANES;
  static constexpr int kVectorBytes = 16;        // widest single global load/store per thread
  static constexpr int kMaxThreadsPerBlock = 1024;
};
#else
struct ArchTraits {
  static constexpr int kWarpSize = 32;
  static constexpr int kVectorBytes = 16;        // widest single global load/store per thread
  static constexpr int kMaxThreadsPerBlock = 1024;
};
#endif

}  // namespace cuda
}  // namespace embscale
