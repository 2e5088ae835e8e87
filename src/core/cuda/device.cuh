// Facts about the current CUDA device, queried once per device and cached, for every capability's
// launchers: SM count, compute capability, threads per SM, and per-kernel occupancy (resident blocks,
// largest co-resident cluster).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace embscale {
namespace cuda {

// Streaming multiprocessors of the current device (cudaDeviceGetAttribute once per device).
int sm_count();
// Compute capability major of the current device (cached); cluster launch and griddepcontrol need 9+.
int cc_major();
// The architecture the library's device code running on the current device was compiled for, as
// 10 * major + minor (cached): 90 for sm_90a machine code on an H200, 80 where only compute_80 PTX
// was built and the driver compiled it for a newer GPU.
int code_arch();
// Thread-block clusters and programmatic dependent launch are usable: the device has them (9.0+) and
// the code running on it was compiled with them (the __CUDA_ARCH__ >= 900 branches).
bool sm90_features();

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Threads one SM can hold (cached per device).
int max_threads_per_sm();

// Blocks of kernel fn resident on one SM at `threads` threads (no dynamic shared memory), from the
// occupancy API on every call, for launches whose block size is chosen at run time (at least 1; a
// failed query is cleared and counts as 1). resident_wave_blocks below caches it per kernel instead.
int blocks_per_sm(const void* fn, int threads);

// Per-device cache of one integer per kernel instantiation: kKernel is a template argument, so every
// instantiation (every dtype) gets its own cache. compute() runs once per device.
template <auto kKernel, class Compute>
int per_kernel_cached(Compute&& compute) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices];  // 0: not asked yet; -1: "none"; else the value
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) {
    cudaGetLastError();
    return 0;
  }
  const int known = cache[dev].load(std::memory_order_relaxed);
  if (known != 0) return known > 0 ? known : 0;
  const int v = compute();
  cache[dev].store(v > 0 ? v : -1, std::memory_order_relaxed);
  return v > 0 ? v : 0;
}

// Largest cluster (16 non-portable, else the portable 8) with which kKernel at `threads` threads per
// block can be resident, or 0 without cluster support. The non-portable attribute is set on this very
// instantiation before its occupancy is queried (a size allowed for one instantiation says nothing
// about another). Cached per device and kernel.
template <auto kKernel>
int cluster_size_for(int threads) {
  return per_kernel_cached<kKernel>([threads]() -> int {
    if (!sm90_features()) return -1;
#if defined(__HIP_PLATFORM_AMD__)
    (void)threads;
    return -1;  // no thread-block clusters on AMD
#else
    const bool nonportable = cudaFuncSetAttribute(kKernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) ==
                             cudaSuccess;
    cudaGetLastError();
    for (int c : {16, 8}) {
      if (c > 8 && !nonportable) continue;
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(c);
      cfg.blockDim = dim3(threads);
      cudaLaunchAttribute attr;
      attr.id = cudaLaunchAttributeClusterDimension;
      attr.val.clusterDim.x = c;
      attr.val.clusterDim.y = 1;
      attr.val.clusterDim.z = 1;
      cfg.attrs = &attr;
      cfg.numAttrs = 1;
      int clusters = 0;
      if (cudaOccupancyMaxActiveClusters(&clusters, kKernel, &cfg) == cudaSuccess && clusters >= 1) return c;
      cudaGetLastError();
    }
    return -1;
#endif
  });
}

// Blocks of kKernel (at `threads` threads, no dynamic shared memory) resident on the whole device at
// once: SMs x blocks per SM from the occupancy API. Cached per device and kernel; at least 1.
template <auto kKernel>
int resident_wave_blocks(int threads) {
  const int per_sm = per_kernel_cached<kKernel>([threads]() -> int {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kKernel, threads, 0) != cudaSuccess || b < 1) {
      cudaGetLastError();
      b = 1;
    }
    return b;
  });
  return std::max(1, per_sm) * sm_count();
}

}  // namespace cuda
}  // namespace embscale
