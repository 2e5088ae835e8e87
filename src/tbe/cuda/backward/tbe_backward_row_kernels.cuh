// CUDA TBE backward, phase 4: the row kernels (warp rows with or without lane groups, the block path's
// work list, the hot-row combine), each unique row updated by exactly one owner.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/arch_traits.cuh"
#include "core/cuda/pdl.cuh"
#include "tbe/cuda/backward/tbe_backward_grad_sums.cuh"
#include "tbe/cuda/backward/tbe_backward_lane_groups.cuh"
#include "tbe/cuda/backward/tbe_backward_params.cuh"
#include "tbe/cuda/backward/tbe_backward_update.cuh"

namespace embscale {
namespace cuda {
namespace tbe_bwd {

// What the warp-row kernels broadcast of one row of a 32-row batch.
struct BatchRow {
  RowInfo r;
  LookupMeta first;  // meta of the row's first lookup
  int64_t start;     // first sorted position of the row's segment
  int64_t len;       // lookups in the segment
};

// Warp per row: persistent warps walk the unique rows directly, 32 consecutive rows at a time (or the
// warp list, see below), each warp taking its next batch from a counter (kGroupNext / kWarpNext; the
// first batch by warp index), so the batches in flight stay a narrow window of consecutive rows in
// key order whatever their lengths, and the window's gradient rows stay in L2 (with a fixed
// grid-stride split, fast and slow warps drifted apart and the rows in flight spread over many tables).
// Lane j first loads row j's run, key, first lookup and table
// (coalesced, all chains of the batch in flight at once);
// then the warp updates the batch's short rows one after the other with that metadata broadcast, so
// a row costs one round trip (its gradient, weight and state loads together) plus the reductions.
// kRows > 0 (host-chosen: group_shape, with kSlots slots per pass): the rows of at most group_max_lookups
// lookups, kRows at a time on the warp's lane groups (group_update_row for the call's optimizer kOpt); the
// longer warp-path rows are left to a second launch with kRows = 0
// (two kernels rather than both paths in one: the whole-warp path's registers made the lane-group path
// spill). kRows = 0: the rows longer than group_max_lookups, one at a time on the whole warp; kSlots and kOpt
// unused (0, kNone). kAccess: the rows' vector access (always kWhole for the lane groups).
template <typename W, typename G, int kRows, int kSlots, OptimizerType kOpt, VecAccess kAccess>
__global__ void __launch_bounds__(kRowThreads,
                                  (kRows > 0 ? group_rows_min_blocks<W, kRows, opt::elementwise_state_buffers(kOpt)>()
                                             : kWarpRowsMinBlocks))
    tbe_backward_warp_rows_kernel(const RowParams p) {
  // The next row kernel works on other rows: it may start as this one's blocks finish (launch_kernel);
  // each waits for its predecessor before it completes. The first one waits for classify first.
  if (p.wait_at_start) grid_dependency_wait();
  allow_dependent_launch();
  if (rows_disabled(p.skip_report)) {
    grid_dependency_wait();
    return;
  }
  const int lane = static_cast<int>(threadIdx.x) & (ArchTraits::kWarpSize - 1);
  // kRows == 0 after the lane groups: the rows they leave are listed by classify (warp_list, key order)
  // and the warps walk that list one row at a time; otherwise the warps walk the unique rows, 32 at a
  // time, or kWideWalkRows for the one-row lane groups over rows of at least kWideWalkMinDim columns.
  // The rows in flight (warps x batch, consecutive in key order) set how many gradient rows L2 must
  // hold for their reuse. The next batch is taken from the counter when this one starts, so the
  // atomic's latency is hidden.
  const bool listed = kRows == 0 && p.group_max_lookups > 0;
  const int64_t runs = p.counters[kNumRuns];
  const int64_t count = listed ? static_cast<int64_t>(p.counters[kWarpCount]) : runs;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kRowThreads / ArchTraits::kWarpSize);
  const int64_t batch =
      listed ? 1 : (kRows == 1 && p.max_dim >= kWideWalkMinDim ? kWideWalkRows : ArchTraits::kWarpSize);
  uint32_t* const next_batch = p.counters + (kRows > 0 ? kGroupNext : kWarpNext);
  // Lane groups of several rows (kRows >= 2: rows of up to 256 columns) with fp32 weights: see below.
  // Measured there only: fp16/bf16 rows are compute-bound, and with the second loop compiled in, the
  // one-row-per-warp lane groups (257..512 columns) ran slower under uniform lookups.
  constexpr bool kRepeatPath = kRows >= 2 && sizeof(W) == sizeof(float);
  const bool repeats = kRepeatPath && runs * kRepeatLookups < p.num_indices;
  int64_t u0 = (static_cast<int64_t>(blockIdx.x) * (kRowThreads / ArchTraits::kWarpSize) +
                threadIdx.x / ArchTraits::kWarpSize) * batch;
  while (u0 < count) {
    int64_t after = u0 + warps * batch;
    if (lane == 0) after = warps * batch + atomicAdd(next_batch, static_cast<uint32_t>(batch));
    const bool in = lane < batch && u0 + lane < count;
    const int64_t u = !listed ? u0 + lane : (in ? static_cast<int64_t>(p.warp_list[u0 + lane]) : 0);
    bool mine = false;
    int64_t key = 0, wbase = 0;
    uint32_t start = 0, len = 0;
    int D = 0;
    LookupMeta first{0, 1.0f};
    if (in) {
      key = unique_key(p, u);
      len = p.run_lengths[u];
      const bool ours = kRows > 0 ? len <= static_cast<uint32_t>(p.group_max_lookups)
                                  : len > static_cast<uint32_t>(p.group_max_lookups);
      if (key != p.total_rows && len <= static_cast<uint32_t>(p.max_warp_segment) && ours) {
        mine = true;
        start = p.run_starts[u];
        const uint32_t v = p.vals_sorted[start];
        const uint32_t item = p.vals_are_items ? v : p.bag_of[v];
        const int f = static_cast<int>(item / static_cast<uint32_t>(p.batch_size));
        D = p.dims[f];
        wbase = p.weight_offsets[f] + (key - p.row_offsets[f]) * D;
        first = meta_of(p, v, item);
      }
    }
    LaneMask todo = Warp::ballot(mine);
    // Row src of the batch, broadcast from its lane to the whole warp.
    const auto batch_row = [&](int src) {
      BatchRow b;
      b.r.u = listed ? Warp::shfl(u, src) : u0 + src;
      b.r.key = Warp::shfl(key, src);
      b.r.wbase = Warp::shfl(wbase, src);
      b.r.D = Warp::shfl(D, src);
      b.first.grad_off = Warp::shfl(first.grad_off, src);
      b.first.scale = Warp::shfl(first.scale, src);
      b.start = Warp::shfl(start, src);
      b.len = Warp::shfl(len, src);
      return b;
    };
    if constexpr (kRows > 0) {
      static_assert(valid_group_shape<kRows, kSlots>(), "lane-group shape");
      constexpr int kLanes = ArchTraits::kWarpSize / kRows;
      const int grp = lane / kLanes, gl = lane % kLanes;
      const LaneMask gmask = group_mask<kLanes>(grp);
      if (!kRepeatPath || !repeats) {
        // kRows rows at a time: group grp takes the grp-th remaining row of the batch.
        LaneMask short_rows = todo;
        while (short_rows != 0) {
          // Warp::nth_lane(short_rows, grp), written out: called, nvcc schedules the kernel differently.
          LaneMask t = short_rows;
          for (int i = 0; i < grp; ++i) t &= t - 1;
          const int j = t != 0 ? Warp::ffs(t) - 1 : -1;
#pragma unroll
          for (int i = 0; i < kRows; ++i) short_rows &= short_rows - 1;
          const BatchRow b = batch_row(j < 0 ? 0 : j);
          if (j >= 0) group_update_row<W, G, kRows, kSlots, kOpt>(p, b.r, b.start, b.len, b.first, gl, gmask);
        }
      } else if constexpr (kRepeatPath) {
        // Rows repeat (more than kRepeatLookups lookups per unique row on average, as under Zipf
        // lookups): the gradient rows mostly hit L2 and a round waits on latency, not bandwidth. The
        // lane groups share the warp's instruction stream, so a round lasts as long as its longest
        // row's chain of dependent gradient loads (the first lookup, then two more per step): the rows
        // are taken by length class (1 lookup, 2..3, 4..8, 9..group_max_lookups), so that short rows do not
        // wait for long ones, and the row each group takes next round has its weights, state and first
        // gradient row prefetched into L2 during this one. (Uniform lookups, ~1 per row, are
        // bandwidth-bound: both were measured slower there.)
        const LaneMask single = Warp::ballot(mine && len == 1);
        const LaneMask pair = Warp::ballot(mine && len >= 2 && len <= 3);
        const LaneMask few = Warp::ballot(mine && len >= 4 && len <= 8);
        RowOrder order{{single, pair, few, todo & ~(single | pair | few)}};
        while (!order.empty()) {
          const int j = order.nth(grp);
          const int jn = order.nth(grp + kRows);
          const BatchRow b = batch_row(j < 0 ? 0 : j);
          const BatchRow n = batch_row(jn < 0 ? 0 : jn);
          if (jn >= 0) group_prefetch_row<W, G, kRows, kSlots, kOpt>(p, n.r, n.first.grad_off, gl);
#pragma unroll
          for (int i = 0; i < kRows; ++i) order.pop();
          if (j >= 0) group_update_row<W, G, kRows, kSlots, kOpt>(p, b.r, b.start, b.len, b.first, gl, gmask);
        }
      }
    }
    if constexpr (kRows == 0) while (todo != 0) {
      const int j = Warp::ffs(todo) - 1;
      todo &= todo - 1;
      const BatchRow b = batch_row(j);
      update_row<W>(p, b.r, WarpGrad<G, kAccess>{b.start, b.len, b.r.D, b.first}, true);
    }
    u0 = Warp::shfl(after, 0);
  }
  grid_dependency_wait();
}

// The block path's work list: block rows and hot-row superchunk slots, in key order (classify), one
// kernel for both so that the rows of one table, long and hot, run at the same time and read their
// gradient rows through L2 together. Persistent blocks take the list's items in order from a counter
// (kBlockNext; the first one by block index), one item ahead. Two blocks of kMaxBlockThreads fit an SM
// (<= 64 registers a thread): left to choose, ptxas gave some instantiations 128 registers, half the
// resident warps, and those ran slower (docs/tbe_backward_cuda.md, History).
template <typename W, typename G, VecAccess kAccess>
__global__ void __launch_bounds__(kMaxBlockThreads, 2) tbe_backward_block_work_kernel(const RowParams p) {
  __shared__ SuperSmem sm;
  __shared__ int64_t next_item[2];
  if (p.wait_at_start) grid_dependency_wait();
  allow_dependent_launch();
  if (rows_disabled(p.skip_report)) {
    grid_dependency_wait();
    return;
  }
  const uint32_t count = p.counters[kBlockCount] + p.counters[kSlotCount];
  const bool writer = threadIdx.x < ArchTraits::kWarpSize;
  int parity = 0;
  for (int64_t i = blockIdx.x; i < count;) {
    if (threadIdx.x == 0)
      next_item[parity] = gridDim.x + atomicAdd(p.counters + kBlockNext, 1u);
    const uint32_t item = p.work_list[i];
    if (item & kWholeRow) {
      // a block row: its whole segment (at most max_block_segment lookups) and the update
      const int64_t u = item & ~kWholeRow;
      const RowInfo r = row_info(p, u);
      const BlockGrad<G, kAccess> g{&sm, static_cast<int64_t>(p.run_starts[u]), static_cast<int64_t>(p.run_lengths[u]), r.D};
      update_row<W>(p, r, g, writer);
      __syncthreads();
    } else {
      // a hot-row slot: its superchunk's sum (all passes) to partials[slot]
      const int64_t slot = item;
      const int64_t u = p.slot_row[slot];
      const int64_t s = p.slot_super[slot];
      const RowInfo r = row_info(p, u);
      const int64_t len = p.run_lengths[u];
      const int64_t first = static_cast<int64_t>(p.run_starts[u]) + s * kSuperChunk;
      const int64_t n = len - s * kSuperChunk < kSuperChunk ? len - s * kSuperChunk : kSuperChunk;
      const int passes = (r.D + kPassCols - 1) / kPassCols;
      for (int pass = 0; pass < passes; ++pass) {
        block_super_sum<G, kAccess>(p, sm, first, n, pass, r.D, sm.total, false);
        for (int t = static_cast<int>(threadIdx.x); t < kPassCols; t += blockDim.x) {
          const int col = pass * kPassCols + t;
          if (col < r.D) p.partials[slot * p.max_dim + col] = sm.total[t];
        }
        __syncthreads();
      }
    }
    // Both branches end on a block barrier after thread 0 wrote next_item[parity]; the slot is written
    // again two items later, after the next item's barriers.
    i = next_item[parity];
    parity ^= 1;
  }
  grid_dependency_wait();
}

// Multi-block combine: a warp per hot row adds its partials in order and applies the optimizer.
template <typename W, VecAccess kAccess>
__global__ void __launch_bounds__(kRowThreads) tbe_backward_hot_combine_kernel(const RowParams p) {
  grid_dependency_wait();  // the block-path kernel's partials; every row kernel before it is complete
  // The work counters of the row kernels, ready for the next rows phase.
  if (blockIdx.x == 0 && threadIdx.x < kNumSchedCounters) p.counters[kFirstSchedCounter + threadIdx.x] = 0;
  if (rows_disabled(p.skip_report)) return;
  const uint32_t count = p.counters[kHotCount];
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kRowThreads / ArchTraits::kWarpSize);
  for (int64_t h = static_cast<int64_t>(blockIdx.x) * (kRowThreads / ArchTraits::kWarpSize) +
                   threadIdx.x / ArchTraits::kWarpSize;
       h < count; h += warps) {
    const int64_t u = p.hot_list[h];
    const RowInfo r = row_info(p, u);
    const int64_t len = p.run_lengths[u];
    const CombineGrad<kAccess> g{static_cast<int64_t>(p.hot_base[h]), (len + kSuperChunk - 1) / kSuperChunk, r.D};
    update_row<W>(p, r, g, true);
  }
}

}  // namespace tbe_bwd
}  // namespace cuda
}  // namespace embscale
