// Host-side launch plumbing shared by the FP8 ops: cached device facts, the head/body/tail split of a
// range, and one launch function that adds the thread-block-cluster and programmatic-dependent-launch
// attributes and checks the launch. Kernels live in the fp8_*.cuh headers; dispatch in fp8_*.cu.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "cuda/check.cuh"
#include "cuda/fp8_common.cuh"
#include "embscale/fp8.h"

namespace embscale {
namespace cuda {

// Streaming multiprocessors of the current device (cudaDeviceGetAttribute once per device).
int sm_count();
// Compute capability major of the current device (cached); cluster launch and griddepcontrol need 9+.
int cc_major();
// Programmatic dependent launch: on for sm_90+, off when EMBSCALE_CUDA_PDL=0 (read once).
bool pdl_enabled();

// Splits [0, n) of an input `in` of in_size-byte elements into scalar head, 16-byte vector body and
// scalar tail. With an output `out` (out_size-byte elements, may be null), the body is used only when
// `out` at the body's first element is aligned to min(16, elements per vector * out_size) bytes, so
// both sides can use wide accesses at the same element positions; otherwise everything is scalar.
RangeSplit make_split(const void* in, size_t in_size, int64_t n, const void* out, size_t out_size);

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Largest cluster (16 non-portable, else 8) with which `kernel` at `threads` threads per block can be
// resident, or 0 without cluster support. Cached per device for each kernel.
template <typename Kernel>
int cluster_size_for(Kernel kernel, int threads) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices];  // 0: not asked yet; -1: no clusters; else the size
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) {
    cudaGetLastError();
    return 0;
  }
  const int known = cache[dev].load(std::memory_order_relaxed);
  if (known != 0) return known > 0 ? known : 0;
  int result = -1;
  if (cc_major() >= 9) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    cudaGetLastError();
    for (int c : {16, 8}) {
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
      if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) == cudaSuccess && clusters >= 1) {
        result = c;
        break;
      }
      cudaGetLastError();
    }
  }
  cache[dev].store(result, std::memory_order_relaxed);
  return result > 0 ? result : 0;
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
  EMBSCALE_RETURN_IF_ERROR(cuda_status(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), what));
  EMBSCALE_CHECK_LAUNCH(what);
  return Status::Ok();
}

// Tag for one launch of a grid amax kernel (fp8_amax.cuh): a process-wide counter that skips 0.
uint32_t next_launch_token();
// The grid amax paths use 64-bit atomics on the workspace: it must be 8-byte aligned.
Status check_amax_workspace(const void* ws, const char* op);

// ---- amax launch shared by amax, quantize_current_scaling and (through its own kernels) the
// activation fusion. The workspace may hold anything on entry (fp8_amax.cuh).
enum class AmaxPath { kCluster, kAtomic, kTwoStage };
AmaxPath choose_amax_path(AmaxAlgo algo, int64_t bytes, bool cluster_available);
size_t amax_grid_workspace_bytes(AmaxPath path);
// The grid (number of blocks) the atomic / two-stage kernels use for `nvec` 16-byte vectors.
int amax_grid_blocks(int64_t nvec);

Status launch_amax(cudaStream_t stream, const TensorView& x, float* amax, int32_t* nonfinite_flag,
                   const float* noop_flag, AmaxAlgo algo, void* ws);
size_t launch_amax_workspace_bytes(const TensorView& x, AmaxAlgo algo);

}  // namespace cuda
}  // namespace embscale
