// Host-side launch plumbing shared by the FP8 ops: cached device facts and the head/body/tail split of a
// range (the launch function, with the thread-block-cluster and programmatic-dependent-launch
// attributes, is in core/cuda/pdl.cuh). Kernels live in the fp8_*.cuh headers; dispatch in fp8_*.cu.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/cuda/check.cuh"
#include "fp8/cuda/fp8_common.cuh"
#include "embscale/fp8.h"

namespace embscale {
namespace cuda {

// Streaming multiprocessors of the current device (cudaDeviceGetAttribute once per device).
int sm_count();
// Compute capability major of the current device (cached); cluster launch and griddepcontrol need 9+.
int cc_major();

// Splits [0, n) of an input `in` of in_size-byte elements into scalar head, 16-byte vector body and
// scalar tail. With an output `out` (out_size-byte elements, may be null), the body is used only when
// `out` at the body's first element is aligned to min(16, elements per vector * out_size) bytes, so
// both sides can use wide accesses at the same element positions; otherwise everything is scalar.
RangeSplit make_split(const void* in, size_t in_size, int64_t n, const void* out, size_t out_size);

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Threads one SM can hold (cached per device).
int max_threads_per_sm();

// Integer tuning override from the environment: the decimal value of `name` if it parses and is >=
// min_value, else def. Callers read it once (function-local static).
int64_t env_int64(const char* name, int64_t def, int64_t min_value);

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
    if (cc_major() < 9) return -1;
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

// ---- amax launch shared by amax, quantize_current_scaling and activation_amax (fp8_amax.cuh) ----
// No path keeps state between calls: kAtomic needs no workspace, kTwoStage one 32-bit slot per grid
// block whose content on entry does not matter.
enum class AmaxPath { kCluster, kAtomic, kTwoStage };
// kAuto: the single-cluster path up to amax_cluster_max_bytes() of input, else kAtomic.
AmaxPath choose_amax_path(AmaxAlgo algo, int64_t bytes, bool cluster_available);
// kAmaxClusterMaxBytes, or EMBSCALE_AMAX_CLUSTER_MAX_BYTES (bytes; 0 disables the cluster path), read once.
int64_t amax_cluster_max_bytes();
// Workspace of a path: 0, except kTwoStage: one slot for each block the largest grid can have.
size_t amax_grid_workspace_bytes(AmaxPath path);
// Grid of a grid amax kernel: enough blocks to give each thread about amax_grid_vectors_per_thread()
// 16-byte vectors, at most the resident wave `wave` and at most the slots amax_grid_workspace_bytes
// provides.
int amax_grid_blocks(int64_t work_vectors, int wave);
// kAmaxGridVectorsPerThread, or EMBSCALE_AMAX_GRID_VPT (>= 1), read once.
int amax_grid_vectors_per_thread();
// How the atomic path initialises *amax and the flag: false (default) the one-thread init kernel;
// true (EMBSCALE_AMAX_INIT=memset, and only when there is no noop flag) cudaMemsetAsync.
bool amax_init_with_memset();
// The two-stage workspace holds 32-bit slots: non-null and 4-byte aligned.
Status check_amax_slots(const void* ws, const char* op);
// kAtomic's first launch: one thread zeroes *amax and *nonfinite_flag (after the grid-dependency wait).
// Memsets instead of the kernel for inputs up to kAmaxMidMaxBytes (input_bytes) or with
// EMBSCALE_AMAX_INIT=memset, when there is no noop flag.
Status launch_amax_init(cudaStream_t stream, float* amax, int32_t* nonfinite_flag, const float* noop_flag,
                        int64_t input_bytes);
// kTwoStage's last launch: one block reduces `nslots` slots in a fixed order and writes amax and flag.
Status launch_amax_reduce_slots(cudaStream_t stream, const uint32_t* slots, int nslots, float* amax,
                                int32_t* nonfinite_flag, const float* noop_flag);

Status launch_amax(cudaStream_t stream, const TensorView& x, float* amax, int32_t* nonfinite_flag,
                   const float* noop_flag, AmaxAlgo algo, void* ws);
size_t launch_amax_workspace_bytes(const TensorView& x, AmaxAlgo algo);

// ---- the one runtime dtype -> template dispatch of the FP8 ops --------------------------------------
// f receives Tag<T> values; `what` names the argument in the error for an unsupported dtype.
template <typename T>
struct Tag {
  using type = T;
};

// f(Tag<float | fp16_t | bf16_t>)
template <class F>
Status dispatch_float(DType dt, const char* what, F&& f) {
  switch (dt) {
    case DType::kF32:
      return f(Tag<float>{});
    case DType::kF16:
      return f(Tag<fp16_t>{});
    case DType::kBF16:
      return f(Tag<bf16_t>{});
    default:
      return unsupported(std::string(what) + ": dtype " + dtype_name(dt) + " is not supported on CUDA");
  }
}

// f(Tag<float type>, Tag<fp8e4m3_t | fp8e5m2_t>)
template <class F>
Status dispatch_float_fp8(DType fdt, DType f8dt, const char* what, F&& f) {
  return dispatch_float(fdt, what, [&](auto tf) -> Status {
    switch (f8dt) {
      case DType::kF8E4M3:
        return f(tf, Tag<fp8e4m3_t>{});
      case DType::kF8E5M2:
        return f(tf, Tag<fp8e5m2_t>{});
      default:
        return unsupported(std::string(what) + ": fp8 dtype " + dtype_name(f8dt) + " is not supported on CUDA");
    }
  });
}

}  // namespace cuda
}  // namespace embscale
