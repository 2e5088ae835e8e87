// amax kernels: max |x| over a whole tensor. No path keeps state between calls, so there is no
// workspace protocol to get wrong (no tags, tickets or compare-and-swap loops).
//
// Three ways to combine per-block maxima, all exact (max over magnitude bits, see fp8_common.cuh), so
// every path returns bit-identical amax and flag:
//  * cluster   (small inputs, kAuto only): one thread-block cluster (16, else 8 blocks of 1024 threads on
//                sm_90) reads the whole input; blocks combine through distributed shared memory and rank 0
//                writes the result. One launch, no workspace, no atomics.
//  * atomic    (grid): amax_init_kernel (one thread) writes *amax = 0 and *flag = 0; then a grid of one
//                resident wave streams the input and each block does ONE native atomicMax of its maximum's
//                bits on *amax (non-negative floats order like their bits as unsigned integers) and, only
//                if it saw inf/NaN, one atomicOr on the flag. Two launches, no workspace. Mid-size
//                inputs without a noop flag zero them with memsets instead (Fp8Policy).
//  * two_stage (grid): each block stores its maximum (bits | nonfinite << 31) in its own workspace slot,
//                then amax_reduce_slots_kernel (one block) reduces the slots in a fixed order and writes
//                amax and flag. Two launches; workspace = the slots, any content on entry.
// Every launch after the first is a programmatic dependent launch: it waits (griddepcontrol.wait) for
// its predecessor to complete before it touches global memory, so x may be produced by the previous
// kernel in the stream and the init / slots are complete when read.
//
// A workspace must not be used by two ops running concurrently (on different streams). The noop flag
// skips every kernel of the op before anything is written.
#pragma once

#include <cooperative_groups.h>

#include "fp8/cuda/fp8_common.cuh"
#include "fp8/cuda/fp8_policy.cuh"

namespace embscale {
namespace cuda {

namespace cg = cooperative_groups;

struct AmaxOutputs {
  float* amax;              // [1]
  int32_t* nonfinite_flag;  // [1] or null
  uint32_t* slots;          // two-stage: [gridDim.x]; runs: [2 * gridDim.x]; atomic: unused
};

// The block total r (valid in every thread) is published by thread 0: one atomic (atomic path, *amax
// and the flag zeroed by amax_init_kernel) or one slot store (two-stage path).
template <bool kTwoStage>
__device__ __forceinline__ void finish_grid(AmaxPartial r, const AmaxOutputs& o) {
  if (threadIdx.x != 0) return;
  if (kTwoStage) {
    o.slots[blockIdx.x] = r.bits | (r.nonfinite << 31);
  } else {
    if (r.bits != 0u) atomicMax(reinterpret_cast<unsigned int*>(o.amax), r.bits);
    if (r.nonfinite != 0u && o.nonfinite_flag != nullptr) atomicOr(o.nonfinite_flag, 1);
  }
}

// Block partials in a workspace of 2 * nblocks words: block b's amax bits at [b], its non-finite flag at
// [nblocks + b] (quantize_current_scaling's resident kernel and runs pair). store_block_partial is
// called by every thread with the block total (thread 0 stores); reduce_block_partials, after every
// block has stored, returns the whole input's partial in every thread (max and or: exact, so every block
// gets the same).
__device__ __forceinline__ void store_block_partial(uint32_t* partials, AmaxPartial r) {
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = r.bits;
    partials[gridDim.x + blockIdx.x] = r.nonfinite;
  }
}
__device__ __forceinline__ AmaxPartial reduce_block_partials(const uint32_t* partials, int nblocks) {
  AmaxPartial all{0u, 0u};
  for (int b = threadIdx.x; b < nblocks; b += blockDim.x) {
    all.bits = max(all.bits, __ldcg(partials + b));
    all.nonfinite |= __ldcg(partials + nblocks + b);
  }
  return block_reduce_amax(all);
}

// amax_init_kernel and amax_reduce_slots_kernel (the grid paths' first and last launches) live in
// fp8_amax.cu behind launch_amax_init / launch_amax_reduce_slots (fp8_launch.cuh).

// Combines the block totals of one cluster; every block receives the cluster total. Call
// cluster_done_reading() afterwards and cluster_wait_before_exit() before the block exits, so no block
// leaves while a peer may still read its shared memory.
// Clusters exist from sm_90 on: below it (sm_80 machine code) cluster_size_for() is 0, so no cluster
// kernel is launched, and one that were would stop with an error instead of a wrong amax. AMD GPUs
// have no clusters: the same.
__device__ __forceinline__ AmaxPartial cluster_reduce_amax(AmaxPartial r) {
#if (defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900) || defined(__HIP_PLATFORM_AMD__)
  __trap();
  return r;
#else
  __shared__ uint32_t s_part[2];
  __shared__ uint32_t s_total[2];
  cg::cluster_group cluster = cg::this_cluster();
  if (threadIdx.x == 0) {
    s_part[0] = r.bits;
    s_part[1] = r.nonfinite;
  }
  cluster.sync();
  if (threadIdx.x < Arch::kWarpSize) {
    uint32_t b = 0u, f = 0u;
    if (threadIdx.x < cluster.num_blocks()) {
      const uint32_t* remote = cluster.map_shared_rank(s_part, threadIdx.x);
      b = remote[0];
      f = remote[1];
    }
    b = warp_max_u32(b);
    f = warp_or_u32(f);
    if (threadIdx.x == 0) {
      s_total[0] = b;
      s_total[1] = f;
    }
  }
  __syncthreads();
  return AmaxPartial{s_total[0], s_total[1]};
#endif
}

__device__ __forceinline__ void cluster_done_reading() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void cluster_wait_before_exit() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

// ---- amax ----------------------------------------------------------------------------------------
struct AmaxParams {
  const void* x;  // [n] fp32/fp16/bf16
  RangeSplit split;
  const float* noop_flag;
  AmaxOutputs out;
};

template <typename T, int kUnroll>
__device__ __forceinline__ AmaxPartial amax_thread_partial(const AmaxParams& p, int64_t start, int64_t stride) {
  MagAcc<T> acc;
  const void* body = static_cast<const char*>(p.x) + p.split.head * static_cast<int64_t>(sizeof(T));
  stream_vectors<T, kUnroll>(body, p.split.nvec, start, stride, false,
                             [&](int64_t, const Vec16<T>& v) { acc.add_vec(v); });
  add_scalars(acc, p.x, p.split, start, stride);
  return acc.result();
}

template <typename T, bool kTwoStage>
__device__ __forceinline__ void amax_grid_body(const AmaxParams& p) {
  if (kernel_prologue_skip(p.noop_flag)) return;  // waits for the previous grid before reading x
  const int64_t start = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const AmaxPartial r = block_reduce_amax(amax_thread_partial<T, Fp8Policy::kAmaxUnroll>(p, start, stride));
  finish_grid<kTwoStage>(r, p.out);
}

template <typename T>
__global__ void __launch_bounds__(Fp8Policy::kAmaxGridThreads) amax_atomic_kernel(AmaxParams p) {
  amax_grid_body<T, false>(p);
}

template <typename T>
__global__ void __launch_bounds__(Fp8Policy::kAmaxGridThreads) amax_two_stage_kernel(AmaxParams p) {
  amax_grid_body<T, true>(p);
}

// quantize_current_scaling's amax pass when its cast takes the same runs on the same grid
// (quantize_from_amax_runs_kernel, fp8_cast.cuh): block b reads the b-th of gridDim.x contiguous runs of
// the vectors (block_run) and stores its partial in the workspace, the bits at slots[b] and the
// non-finite flag at slots[gridDim.x + b] (no atomics, so no kernel first to zero an output; the cast
// reduces the partials).
template <typename T>
__global__ void __launch_bounds__(Fp8Policy::kQcsRunThreads) amax_runs_kernel(AmaxParams p) {
  if (kernel_prologue_skip(p.noop_flag)) return;  // waits for the previous grid before reading x
  const BlockRun run = block_run(p.split.nvec);
  const void* body = static_cast<const char*>(p.x) +
                     (p.split.head + run.first * Vec16<T>::kN) * static_cast<int64_t>(sizeof(T));
  MagAcc<T> acc;
  stream_vectors<T, Fp8Policy::kAmaxUnroll>(body, run.count, threadIdx.x, blockDim.x, false,
                                            [&](int64_t, const Vec16<T>& v) { acc.add_vec(v); });
  add_scalars(acc, p.x, p.split, static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x,
              static_cast<int64_t>(gridDim.x) * blockDim.x);
  store_block_partial(p.out.slots, block_reduce_amax(acc.result()));
}

// Launched as exactly one cluster (gridDim.x == cluster size).
template <typename T>
__global__ void __launch_bounds__(Fp8Policy::kClusterThreads, 1) amax_cluster_kernel(AmaxParams p) {
  if (kernel_prologue_skip(p.noop_flag)) return;
  const int64_t start = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const AmaxPartial r = block_reduce_amax(amax_thread_partial<T, Fp8Policy::kAmaxUnroll>(p, start, stride));
  const AmaxPartial total = cluster_reduce_amax(r);
  cluster_done_reading();
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *p.out.amax = bits_float(total.bits);
    if (p.out.nonfinite_flag != nullptr) *p.out.nonfinite_flag = total.nonfinite != 0 ? 1 : 0;
  }
  cluster_wait_before_exit();
}

}  // namespace cuda
}  // namespace embscale
