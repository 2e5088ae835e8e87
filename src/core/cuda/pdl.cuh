// Programmatic dependent launch (sm_90+): a kernel launched with programmatic stream serialization may
// be scheduled while the previous kernel in the stream is still running. griddepcontrol.wait blocks
// until the previous kernel (the prerequisite grid) has completed and its memory operations are
// visible; griddepcontrol.launch_dependents lets the next kernel be scheduled before this one ends.
// Both are no-ops when the launch has no such dependency. launch_kernel below launches that way.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "core/cuda/check.cuh"
#include "embscale/status.h"

namespace embscale {
namespace cuda {

// On where sm90_features() (core/cuda/device.cuh): an sm_90+ device running code compiled for it.
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

// Launches kernel<<<grid, block, 0, stream>>> with a cluster of `cluster` blocks (0: none) and, when
// enabled, programmatic stream serialization; returns a Status naming `what` on failure.
template <typename... Params, typename... Args>
Status launch_kernel(const char* what, void (*kernel)(Params...), dim3 grid, dim3 block, int cluster,
                     cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2];
  unsigned n = 0;
  if (cluster > 0) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = static_cast<unsigned>(cluster);
    attrs[n].val.clusterDim.y = 1;
    attrs[n].val.clusterDim.z = 1;
    ++n;
  }
  if (pdl_enabled()) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attrs;
  cfg.numAttrs = n;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  if (err != cudaSuccess) {
    cudaGetLastError();  // read (clear) it here, so it does not surface in the caller's next launch
    return cuda_status(err, what);
  }
  EMBSCALE_CHECK_LAUNCH(what);
  return Status::Ok();
}

// Launches kernel<<<grid, block, smem, stream>>> as a cooperative grid: every block resident at once, so
// the kernel may synchronise grid-wide (cooperative_groups::this_grid().sync()); the launch fails when
// the grid cannot be resident. With programmatic stream serialization where enabled, as launch_kernel.
// Returns a Status naming `what` on failure (the error is cleared).
template <typename... Params, typename... Args>
Status launch_cooperative_kernel(const char* what, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                 cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2];
  unsigned n = 0;
  attrs[n].id = cudaLaunchAttributeCooperative;
  attrs[n].val.cooperative = 1;
  ++n;
  if (pdl_enabled()) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attrs;
  cfg.numAttrs = n;
  const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return cuda_status(err, what);
  }
  EMBSCALE_CHECK_LAUNCH(what);
  return Status::Ok();
}

}  // namespace cuda
}  // namespace embscale
