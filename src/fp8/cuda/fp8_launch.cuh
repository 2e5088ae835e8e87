// Host-side launch plumbing shared by the FP8 ops: the head/body/tail split of a range (cached device
// facts are in core/cuda/device.cuh (the launch function, with the thread-block-cluster and programmatic-dependent-launch
// attributes, is in core/cuda/pdl.cuh). Kernels live in the fp8_*.cuh headers; the dtype dispatch
// (core/dispatch.h) in fp8_*.cu.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/cuda/check.cuh"
#include "core/dispatch.h"
#include "core/cuda/device.cuh"
#include "fp8/cuda/fp8_common.cuh"
#include "fp8/cuda/fp8_policy.cuh"
#include "embscale/fp8.h"

namespace embscale {
namespace cuda {

// Splits [0, n) of an input `in` of in_size-byte elements into scalar head, 16-byte vector body and
// scalar tail. With an output `out` (out_size-byte elements, may be null), the body is used only when
// `out` at the body's first element is aligned to min(16, elements per vector * out_size) bytes, so
// both sides can use wide accesses at the same element positions; otherwise everything is scalar.
RangeSplit make_split(const void* in, size_t in_size, int64_t n, const void* out, size_t out_size);

// ---- amax launch shared by amax, quantize_current_scaling and activation_amax (fp8_amax.cuh) ----
// No path keeps state between calls: kAtomic needs no workspace, kTwoStage one 32-bit slot per grid
// block whose content on entry does not matter.
enum class AmaxPath { kCluster, kAtomic, kTwoStage };
// kAuto: the single-cluster path up to Fp8Policy::kAmaxClusterMaxBytes of input, else kAtomic.
AmaxPath choose_amax_path(AmaxAlgo algo, int64_t bytes, bool cluster_available);
// Workspace of a path: 0, except kTwoStage: one slot for each block the largest grid can have.
size_t amax_grid_workspace_bytes(AmaxPath path);
// Grid of a grid amax kernel: enough blocks to give each thread about Fp8Policy::kAmaxGridVectorsPerThread
// 16-byte vectors (kAmaxMidVectorsPerThread up to kAmaxMidMaxBytes of work), at most the resident wave
// `wave` and at most the slots amax_grid_workspace_bytes provides.
int amax_grid_blocks(int64_t work_vectors, int wave);
// The two-stage workspace holds 32-bit slots: non-null and 4-byte aligned.
Status check_amax_slots(const void* ws, const char* op);
// kAtomic's first launch: one thread zeroes *amax and *nonfinite_flag (after the grid-dependency wait).
// Memsets instead of the kernel for inputs up to Fp8Policy::kAmaxMidMaxBytes (input_bytes) when there is
// no noop flag (a memset cannot honour it).
Status launch_amax_init(cudaStream_t stream, float* amax, int32_t* nonfinite_flag, const float* noop_flag,
                        int64_t input_bytes);
// kTwoStage's last launch: one block reduces `nslots` slots in a fixed order and writes amax and flag.
Status launch_amax_reduce_slots(cudaStream_t stream, const uint32_t* slots, int nslots, float* amax,
                                int32_t* nonfinite_flag, const float* noop_flag);

Status launch_amax(cudaStream_t stream, const TensorView& x, float* amax, int32_t* nonfinite_flag,
                   const float* noop_flag, AmaxAlgo algo, void* ws);
size_t launch_amax_workspace_bytes(const TensorView& x, AmaxAlgo algo);

}  // namespace cuda
}  // namespace embscale
