// Programmatic dependent launch (sm_90+): a kernel launched with programmatic stream serialization may
// be scheduled while the previous kernel in the stream is still running. griddepcontrol.wait blocks
// until the previous kernel (the prerequisite grid) has completed and its memory operations are
// visible; griddepcontrol.launch_dependents lets the next kernel be scheduled before this one ends.
// Both are no-ops when the launch has no such dependency.
#pragma once

namespace embscale {
namespace cuda {

// On for sm_90+, off when EMBSCALE_CUDA_PDL=0 (read once); defined in fp8_launch.cu.
bool pdl_enabled();

__device__ __forceinline__ void grid_dependency_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_dependent_launch() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace cuda
}  // namespace embscale
