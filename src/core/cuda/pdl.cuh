// Programmatic dependent launch (sm_90+): a kernel launched with programmatic stream serialization may
// be scheduled while the previous kernel in the stream is still running. griddepcontrol.wait blocks
// until the previous kernel (the prerequisite grid) has completed and its memory operations are
// visible; griddepcontrol.launch_dependents lets the next kernel be scheduled before this one ends.
// Both are no-ops when the launch has no such dependency. launch_kernel(_with) below launch that way.
#pragma once

#include <cuda_runtime.h>

#include <string>
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

// How launch_kernel_with launches: a cluster of `cluster` blocks (0: none), `smem` bytes of dynamic shared
// memory (above 48 KiB the caller first raises the kernel's cudaFuncAttributeMaxDynamicSharedMemorySize),
// and whether the grid is cooperative (every block resident at once, so the kernel may
// synchronise grid-wide with cooperative_groups::this_grid().sync(); the launch fails when the grid cannot
// be resident).
struct LaunchShape {
  dim3 grid;
  dim3 block;
  int cluster = 0;
  size_t smem = 0;
  bool cooperative = false;
};

// Launches kernel<<<shape.grid, shape.block, shape.smem, stream>>> with shape's cluster and cooperative
// attributes and, when enabled, programmatic stream serialization; returns a Status naming `what` on
// failure (the error is read and cleared here, so it does not surface in the caller's next launch).
template <typename... Params, typename... Args>
Status launch_kernel_with(const char* what, void (*kernel)(Params...), const LaunchShape& shape, cudaStream_t stream,
                          Args&&... args) {
#if defined(__HIP_PLATFORM_AMD__)
  // AMD: no clusters (cluster_size_for() is 0 there, so none is asked for) and no programmatic
  // dependent launch; a cooperative grid goes through HIP's cooperative launch.
  if (shape.cluster > 0) return Status(StatusCode::kUnsupported, std::string(what) + ": thread-block clusters need an NVIDIA sm_90+ GPU");
  hipError_t err = hipSuccess;
  if (shape.cooperative) {
    void* argv[] = {const_cast<void*>(static_cast<const void*>(&args))...};
    err = hipLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), shape.grid, shape.block, argv,
                                     static_cast<unsigned>(shape.smem), stream);
  } else {
    hipLaunchKernelGGL(kernel, shape.grid, shape.block, static_cast<unsigned>(shape.smem), stream, std::forward<Args>(args)...);
    err = hipGetLastError();
  }
  if (err != hipSuccess) {
    (void)hipGetLastError();
    return cuda_status(err, what);
  }
  return Status::Ok();
#else
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = shape.grid;
  cfg.blockDim = shape.block;
  cfg.dynamicSmemBytes = shape.smem;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[3];
  unsigned n = 0;
  if (shape.cluster > 0) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = static_cast<unsigned>(shape.cluster);
    attrs[n].val.clusterDim.y = 1;
    attrs[n].val.clusterDim.z = 1;
    ++n;
  }
  if (shape.cooperative) {
    attrs[n].id = cudaLaunchAttributeCooperative;
    attrs[n].val.cooperative = 1;
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
    cudaGetLastError();
    return cuda_status(err, what);
  }
  EMBSCALE_CHECK_LAUNCH(what);
  return Status::Ok();
#endif
}

// launch_kernel_with for the common shape: a cluster of `cluster` blocks (0: none), no dynamic shared
// memory, not cooperative.
template <typename... Params, typename... Args>
Status launch_kernel(const char* what, void (*kernel)(Params...), dim3 grid, dim3 block, int cluster,
                     cudaStream_t stream, Args&&... args) {
  LaunchShape shape;
  shape.grid = grid;
  shape.block = block;
  shape.cluster = cluster;
  return launch_kernel_with(what, kernel, shape, stream, std::forward<Args>(args)...);
}

}  // namespace cuda
}  // namespace embscale
