// CUDA TBE backward, phase 3 (after CUB's sort and unique-by-key): run lengths and the work lists of
// the row kernels, in key order.
#pragma once

#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <cstdint>

#include "core/cuda/pdl.cuh"
#include "tbe/cuda/backward/tbe_backward_params.cuh"

namespace embscale {
namespace cuda {
namespace tbe_bwd {

// The work lists in key order, built in two passes over the same split of the unique rows into
// contiguous ranges, one per block (kClassifyBlocks at most): tally counts each range's listed rows
// and hot-row slots; place writes them at the range's base (the tallies of the ranges before it) plus
// their rank within the range (a block scan per tile of rows). Lists: the block path's work list
// (block rows and hot-row slots), the hot rows (for the combine) and, when the lane groups take the
// rows of at most group_max_lookups lookups, the longer warp rows. Key order matters for speed only
// (each row has one owner whatever the order): the row kernels walk their lists in order, so the rows
// they work on at once are from one or two tables, whose gradient rows then stay in L2 (with atomic
// appends in one pass, rows of ~10 tables at once read their gradient rows at ~40% L2 hit under Zipf
// lookups).
constexpr int kClassifyBlocks = 1024;

struct ClassTally {
  uint32_t block, hot, slots, warp;
};
struct ClassTallySum {
  __device__ __forceinline__ ClassTally operator()(const ClassTally& a, const ClassTally& b) const {
    return ClassTally{a.block + b.block, a.hot + b.hot, a.slots + b.slots, a.warp + b.warp};
  }
};

// Range [first, end) of unique rows of this block.
__device__ __forceinline__ void classify_range(uint32_t runs, uint32_t* first, uint32_t* end) {
  const uint32_t per = (runs + gridDim.x - 1) / gridDim.x;
  const uint64_t a = static_cast<uint64_t>(per) * blockIdx.x;
  *first = static_cast<uint32_t>(a < runs ? a : runs);
  *end = static_cast<uint32_t>(a + per < runs ? a + per : runs);
}

// A unique row's list membership from its key and run length (all zeros for the sentinel run and for
// the rows the warp kernel finds by walking the unique rows).
__device__ __forceinline__ ClassTally classify_row(const ClassifyParams& p, int64_t key, uint32_t len) {
  ClassTally t{0, 0, 0, 0};
  if (key == p.total_rows) return t;
  if (len <= static_cast<uint32_t>(p.max_warp_segment)) {
    t.warp = p.group_max_lookups > 0 && len > static_cast<uint32_t>(p.group_max_lookups) ? 1 : 0;
  } else if (len <= static_cast<uint32_t>(p.max_block_segment)) {
    t.block = 1;
  } else {
    t.hot = 1;
    t.slots = (len + kSuperChunk - 1) / kSuperChunk;
  }
  return t;
}

// Pass 1: run_lengths of the block's rows from consecutive run starts (the encode step writes each
// run's key and start), and tally[b] = block b's counts; the totals go to the counters. Dense mode
// also writes unique_rows and num_unique here. K: the key type (instantiated by tbe_backward.cu only).
template <typename K>
__global__ void __launch_bounds__(kRowThreads) tbe_backward_classify_tally_kernel(const ClassifyParams p, ClassTally* tally) {
  using Reduce = cub::BlockReduce<ClassTally, kRowThreads>;
  __shared__ typename Reduce::TempStorage reduce;
  allow_dependent_launch();  // the place kernel waits for this one before it reads anything
  const K* keys = static_cast<const K*>(p.unique_keys);
  const uint32_t runs = p.counters[kNumRuns];
  // Broken offsets (skip and warn modes): no row is updated, and dense mode outputs no row.
  const bool disabled = rows_disabled(p.skip_report);
  if (blockIdx.x == 0 && threadIdx.x == 0 && p.dense) {
    const bool sentinel_last = runs > 0 && static_cast<int64_t>(keys[runs - 1]) == p.total_rows;
    *p.num_unique_out = disabled ? 0 : static_cast<int64_t>(runs) - (sentinel_last ? 1 : 0);
  }
  if (disabled) return;
  uint32_t first = 0, end = 0;
  classify_range(runs, &first, &end);
  ClassTally mine{0, 0, 0, 0};
  for (uint32_t u = first + threadIdx.x; u < end; u += blockDim.x) {
    const uint32_t start = p.run_starts[u];
    const uint32_t stop = u + 1 < runs ? p.run_starts[u + 1] : static_cast<uint32_t>(p.num_indices);
    p.run_lengths[u] = stop - start;
    const int64_t key = static_cast<int64_t>(keys[u]);
    if (key == p.total_rows) continue;
    if (p.dense) p.unique_rows_out[u] = key;
    mine = ClassTallySum()(mine, classify_row(p, key, stop - start));
  }
  const ClassTally total = Reduce(reduce).Reduce(mine, ClassTallySum());
  if (threadIdx.x == 0) {
    tally[blockIdx.x] = total;
    if (total.block != 0) atomicAdd(p.counters + kBlockCount, total.block);
    if (total.hot != 0) atomicAdd(p.counters + kHotCount, total.hot);
    if (total.slots != 0) atomicAdd(p.counters + kSlotCount, total.slots);
    if (total.warp != 0) atomicAdd(p.counters + kWarpCount, total.warp);
  }
}

// Pass 2 (same grid): block b's rows at the sum of the tallies of blocks 0..b-1 plus their rank.
template <typename K>
__global__ void __launch_bounds__(kRowThreads) tbe_backward_classify_place_kernel(const ClassifyParams p,
                                                                                  const ClassTally* tally) {
  using Reduce = cub::BlockReduce<ClassTally, kRowThreads>;
  using Scan = cub::BlockScan<ClassTally, kRowThreads>;
  __shared__ union {
    typename Reduce::TempStorage reduce;
    typename Scan::TempStorage scan;
  } tmp;
  __shared__ ClassTally base_sh;
  grid_dependency_wait();  // the tally kernel's lengths and tallies
  allow_dependent_launch();
  if (rows_disabled(p.skip_report)) return;
  const K* keys = static_cast<const K*>(p.unique_keys);
  const uint32_t runs = p.counters[kNumRuns];
  uint32_t first = 0, end = 0;
  classify_range(runs, &first, &end);
  // Nothing to place (the ranges of uniform lookups, say, hold only warp rows the lane groups take).
  const ClassTally own = tally[blockIdx.x];
  if (first >= end || (own.block | own.hot | own.warp) == 0) return;
  ClassTally before{0, 0, 0, 0};
  for (uint32_t b = threadIdx.x; b < blockIdx.x; b += blockDim.x) before = ClassTallySum()(before, tally[b]);
  before = Reduce(tmp.reduce).Reduce(before, ClassTallySum());
  if (threadIdx.x == 0) base_sh = before;
  __syncthreads();
  ClassTally base = base_sh;
  for (uint32_t tile = first; tile < end; tile += blockDim.x) {
    const uint32_t u = tile + threadIdx.x;
    const ClassTally mine =
        u < end ? classify_row(p, static_cast<int64_t>(keys[u]), p.run_lengths[u]) : ClassTally{0, 0, 0, 0};
    // (also orders tmp's reuse)
    if (!__syncthreads_or((mine.block | mine.hot | mine.warp) != 0)) continue;
    ClassTally rank, count;
    Scan(tmp.scan).ExclusiveScan(mine, rank, ClassTally{0, 0, 0, 0}, ClassTallySum(), count);
    if (mine.warp != 0) p.warp_list[base.warp + rank.warp] = u;
    // work list: the block rows and hot-row slots before this row, in key order
    const uint32_t w = base.block + rank.block + base.slots + rank.slots;
    if (mine.block != 0) p.work_list[w] = u | kWholeRow;
    if (mine.hot != 0) {
      const uint32_t h = base.hot + rank.hot, s0 = base.slots + rank.slots;
      p.hot_list[h] = u;
      p.hot_base[h] = s0;
      for (uint32_t s = 0; s < mine.slots; ++s) {
        p.slot_row[s0 + s] = u;
        p.slot_super[s0 + s] = s;
        p.work_list[w + s] = s0 + s;
      }
    }
    base = ClassTallySum()(base, count);
  }
}

}  // namespace tbe_bwd
}  // namespace cuda
}  // namespace embscale
