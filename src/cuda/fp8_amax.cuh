// amax kernels: max |x| over a whole tensor in ONE launch, with no memset.
//
// Three ways to combine per-block maxima, all exact (max over magnitude bits, see fp8_common.cuh), so
// every path returns bit-identical amax and flag:
//  * cluster   (small inputs): one thread-block cluster (16 or 8 blocks of 1024 threads on sm_90) reads
//                the whole input; blocks combine through distributed shared memory and rank 0 writes
//                the result. No workspace, no atomics: the launch is the whole cost.
//  * atomic    (grid): a grid sized to the SMs streams the input; each block does one atomic max of its
//                maximum into the workspace accumulator, then takes a ticket; the block that takes the
//                last ticket copies the accumulator to *amax and resets the workspace.
//  * two_stage (grid): each block writes its maximum to its own workspace slot, then takes a ticket;
//                the last block reduces the slots in a fixed order and resets the ticket.
// The output is written by a plain store from exactly one block, so it needs no initialisation.
//
// Workspace contract for the grid paths: any content on entry (see the layout below); one workspace must
// not be used by two ops running concurrently (on different streams). The noop flag skips the op before
// the workspace is touched.
//
// Ordering: a block publishes its maximum (atomic or L2 store), fences, then takes a ticket; the last
// ticket therefore sees every maximum. Slots are read through L2 (ld.cg) because L1 is not coherent.
#pragma once

#include <cooperative_groups.h>

#include "cuda/fp8_common.cuh"

namespace embscale {
namespace cuda {

namespace cg = cooperative_groups;

// ---- tunables (the lead tunes these from H200 measurements) --------------------------------------
constexpr int kAmaxGridThreads = 512;      // threads per block of the grid paths
constexpr int kAmaxGridBlocksPerSm = 2;    // grid = SMs x this (one resident wave)
constexpr int kAmaxUnroll = 4;             // 16-byte loads in flight per thread
constexpr int kClusterThreads = 1024;      // threads per block of the cluster paths
// kAuto uses the single-cluster path up to this many input bytes, the atomic grid path above.
constexpr int64_t kAmaxClusterMaxBytes = int64_t(1) << 20;

// ---- workspace layout ----------------------------------------------------------------------------
// Two 64-bit words, each tagged in its high half with the launch's token (a host counter, never 0):
//   ticket = token << 32 | blocks finished so far
//   acc    = token << 32 | max magnitude bits << 1 | nonfinite      (atomic path)
// then, at byte 256, one 32-bit slot per block (two-stage path): max bits | nonfinite << 31.
// A word whose tag is not the running launch's token counts as empty, so the workspace may hold
// anything on entry (CUB's convention: no zero-fill needed); the last block resets both words to 0 so a
// replayed CUDA graph (same token) starts from empty again. Updates are compare-and-swap loops; a block
// whose maximum cannot raise acc skips the write.
constexpr int kWsTicket = 0;
constexpr int kWsAcc = 1;
constexpr size_t kWsHeaderBytes = 256;

struct AmaxOutputs {
  float* amax;              // [1]
  int32_t* nonfinite_flag;  // [1] or null
  void* ws;                 // grid paths: header + [gridDim.x] slots; cluster path: unused
  uint32_t token;           // grid paths: tag of this launch, != 0
};

__device__ __forceinline__ unsigned long long* ws_word(const AmaxOutputs& o, int w) {
  return static_cast<unsigned long long*>(o.ws) + w;
}
__device__ __forceinline__ uint32_t* ws_slots(const AmaxOutputs& o) {
  return reinterpret_cast<uint32_t*>(static_cast<char*>(o.ws) + kWsHeaderBytes);
}

// Adds one finished block to the ticket; returns how many blocks (this one included) have finished.
__device__ __forceinline__ uint32_t take_ticket(unsigned long long* ticket, uint32_t token) {
  unsigned long long cur = __ldcg(ticket);
  while (true) {
    const unsigned long long next =
        (cur >> 32) == token ? cur + 1 : (static_cast<unsigned long long>(token) << 32 | 1ull);
    const unsigned long long prev = atomicCAS(ticket, cur, next);
    if (prev == cur) return static_cast<uint32_t>(next);
    cur = prev;
  }
}

// Raises acc to include (bits, nonfinite): the atomic max of the atomic path.
__device__ __forceinline__ void acc_max(unsigned long long* acc, uint32_t token, uint32_t bits, uint32_t nonfinite) {
  const unsigned long long tag = static_cast<unsigned long long>(token) << 32;
  unsigned long long cur = __ldcg(acc);
  while (true) {
    const uint32_t low = (cur >> 32) == token ? static_cast<uint32_t>(cur) : 0u;
    const uint32_t want = max(low >> 1, bits) << 1 | ((low | nonfinite) & 1u);
    if ((cur >> 32) == token && want == low) return;  // nothing to raise
    const unsigned long long prev = atomicCAS(acc, cur, tag | want);
    if (prev == cur) return;
    cur = prev;
  }
}

// The block total r (valid in every thread) is combined across the grid; the last block writes.
template <bool kTwoStage>
__device__ __forceinline__ void finish_grid(AmaxPartial r, const AmaxOutputs& o) {
  __shared__ uint32_t s_last;
  if (threadIdx.x == 0) {
    if (kTwoStage) {
      __stcg(&ws_slots(o)[blockIdx.x], r.bits | (r.nonfinite << 31));
    } else {
      acc_max(ws_word(o, kWsAcc), o.token, r.bits, r.nonfinite);
    }
    __threadfence();
    s_last = take_ticket(ws_word(o, kWsTicket), o.token) == gridDim.x ? 1u : 0u;
  }
  __syncthreads();
  if (s_last == 0) return;
  __threadfence();
  AmaxPartial total{0u, 0u};
  if (kTwoStage) {
    // Fixed traversal (thread t takes slots t, t + blockDim, ...), then the block reduction.
    AmaxPartial p{0u, 0u};
    for (uint32_t b = threadIdx.x; b < gridDim.x; b += blockDim.x) {
      const uint32_t v = __ldcg(&ws_slots(o)[b]);
      p.bits = max(p.bits, v & 0x7fffffffu);
      p.nonfinite |= v >> 31;
    }
    total = block_reduce_amax(p);
  } else if (threadIdx.x == 0) {
    const unsigned long long acc = atomicExch(ws_word(o, kWsAcc), 0ull);
    const uint32_t low = (acc >> 32) == o.token ? static_cast<uint32_t>(acc) : 0u;
    total = AmaxPartial{low >> 1, low & 1u};
  }
  if (threadIdx.x == 0) {
    atomicExch(ws_word(o, kWsTicket), 0ull);
    *o.amax = bits_float(total.bits);
    if (o.nonfinite_flag != nullptr) *o.nonfinite_flag = total.nonfinite != 0 ? 1 : 0;
  }
}

// Combines the block totals of one cluster; every block receives the cluster total. Call
// cluster_done_reading() afterwards and cluster_wait_before_exit() before the block exits, so no block
// leaves while a peer may still read its shared memory.
__device__ __forceinline__ AmaxPartial cluster_reduce_amax(AmaxPartial r) {
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
  stream_scalars(p.split, start, stride,
                 [&](int64_t i) { acc.add_bits(elem_bits(load_elem<T>(p.x, i, p.split.in_aligned))); });
  return acc.result();
}

template <typename T, bool kTwoStage>
__device__ __forceinline__ void amax_grid_body(const AmaxParams& p) {
  if (kernel_prologue_skip(p.noop_flag)) return;
  const int64_t start = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const AmaxPartial r = block_reduce_amax(amax_thread_partial<T, kAmaxUnroll>(p, start, stride));
  finish_grid<kTwoStage>(r, p.out);
}

template <typename T>
__global__ void __launch_bounds__(kAmaxGridThreads) amax_atomic_kernel(AmaxParams p) {
  amax_grid_body<T, false>(p);
}

template <typename T>
__global__ void __launch_bounds__(kAmaxGridThreads) amax_two_stage_kernel(AmaxParams p) {
  amax_grid_body<T, true>(p);
}

// Launched as exactly one cluster (gridDim.x == cluster size).
template <typename T>
__global__ void __launch_bounds__(kClusterThreads, 1) amax_cluster_kernel(AmaxParams p) {
  if (kernel_prologue_skip(p.noop_flag)) return;
  const int64_t start = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const AmaxPartial r = block_reduce_amax(amax_thread_partial<T, kAmaxUnroll>(p, start, stride));
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
