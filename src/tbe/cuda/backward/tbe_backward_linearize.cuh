// CUDA TBE backward, phase 1: lookups to (key, value) pairs for the sort, with the bounds checks.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/arch_traits.cuh"
#include "tbe/cuda/backward/tbe_backward_params.cuh"
#include "tbe/cuda/bounds_check.cuh"

namespace embscale {
namespace cuda {
namespace tbe_bwd {

template <typename I>
__device__ __forceinline__ int64_t load_index_bwd(const I* p) {
  return static_cast<int64_t>(__ldg(p));
}

// grid = ceil(T*B / kLinearizeItems), block = kLinearizeItems. Block x owns bags [x*256, x*256+256) and
// the lookups between their first and last offsets (block 0 also those before offsets[0], the last
// block those after offsets[T*B]: they belong to no bag and get the sentinel key). Reads and writes are
// coalesced: a lookup finds its bag in shared memory, from a table of every lookup's bag that the
// bags' threads fill when the block's offsets are non-decreasing and span at most kLinearizeSpan
// lookups (one shared load per lookup), else by binary search in the offsets.
template <typename K, typename I>
__global__ void __launch_bounds__(kLinearizeItems) tbe_backward_linearize_kernel(const LinearizeParams p) {
  __shared__ int64_t off[kLinearizeItems + 1];
  __shared__ int cnt[kLinearizeItems];
  __shared__ int16_t bag_at[kLinearizeSpan];
  __shared__ unsigned long long skipped;
  const I* offsets = static_cast<const I*>(p.offsets);
  const I* indices = static_cast<const I*>(p.indices);
  const int64_t N = p.num_indices;
  const int64_t B = p.batch_size;
  const int64_t item0 = static_cast<int64_t>(blockIdx.x) * kLinearizeItems;
  const int nitems = static_cast<int>(p.num_items - item0 < kLinearizeItems ? p.num_items - item0 : kLinearizeItems);
  const bool check = p.check != tbe_bounds::kCheckOff;
  const int tid = static_cast<int>(threadIdx.x);
  for (int k = tid; k <= nitems; k += blockDim.x) {
    int64_t o = static_cast<int64_t>(offsets[item0 + k]);
    if (check && k < nitems) {
      const int64_t next = static_cast<int64_t>(offsets[item0 + k + 1]);
      if (next < o) tbe_bounds::record_min_position(p.scratch + tbe_bounds::kBadOffsetKey, item0 + k + 1);
    }
    off[k] = o < 0 ? 0 : (o > N ? N : o);  // clamped: nothing outside [0, N) is ever read
  }
  if (tid < kLinearizeItems) cnt[tid] = 0;
  if (tid == 0) skipped = 0;
  __syncthreads();
  const int64_t lo = blockIdx.x == 0 ? 0 : off[0];
  const int64_t hi = item0 + nitems == p.num_items ? N : off[nitems];
  // The bag table: bag k covers [off[k], off[k+1]); [lo, off[0]) gets -1 and [off[nitems], hi) nitems.
  bool sorted = true;
  for (int k = tid; k < nitems; k += blockDim.x) sorted = sorted && off[k] <= off[k + 1];
  const bool table = __syncthreads_and(sorted) && hi - lo <= kLinearizeSpan;
  if (table) {
    for (int k = tid - 1; k <= nitems; k += blockDim.x) {
      const int64_t a = k < 0 ? lo : off[k], b = k < nitems ? off[k + 1] : hi;
      for (int64_t i = a; i < b; ++i) bag_at[i - lo] = static_cast<int16_t>(k);
    }
    __syncthreads();
  }
  unsigned my_skipped = 0;
  const auto linearize_one = [&](int64_t i, int64_t idx) {
    // bag k: the last k with off[k] <= i (k = -1 or k = nitems: no bag)
    int k;
    if (table) {
      k = bag_at[i - lo];
    } else {
      int a = 0, b = nitems + 1;  // off[a-1] <= i < off[b] over the virtual bounds
      while (a < b) {
        const int m = (a + b) >> 1;
        if (off[m] <= i) a = m + 1; else b = m;
      }
      k = a - 1;
    }
    K key = static_cast<K>(p.total_rows);
    int64_t item = 0;
    if (k >= 0 && k < nitems) {
      item = item0 + k;
      const int f = static_cast<int>(item / B);
      const int64_t E = p.num_rows[f];
      const bool in_range = static_cast<uint64_t>(idx) < static_cast<uint64_t>(E);
      const bool ok = !check || in_range;
      if (ok) {
        // Off mode trusts the indices but clamps an invalid one into its table, so no row outside the
        // tables is ever updated (its values are unspecified, as the forward's).
        key = static_cast<K>(p.row_offsets[f] + (in_range ? idx : E - 1));
        if (p.mean) atomicAdd(&cnt[k], 1);
      } else if (p.check == tbe_bounds::kCheckError) {
        tbe_bounds::record_min_position(p.scratch + tbe_bounds::kBadIndexKey, i);
      } else {
        ++my_skipped;
      }
    }
    static_cast<K*>(p.keys_in)[i] = key;
    p.vals_in[i] = static_cast<uint32_t>(p.vals_are_items ? item : i);
    if (!p.vals_are_items) p.bag_of[i] = key == static_cast<K>(p.total_rows) ? kNoBag : static_cast<uint32_t>(item);
  };
  // kLinearizeLoads lookups per thread at a time, their indices loaded first (every i in [lo, hi) is a
  // valid position, bag or not).
  const int64_t step = blockDim.x;
  for (int64_t i0 = lo + tid; i0 < hi; i0 += kLinearizeLoads * step) {
    int64_t idx[kLinearizeLoads];
#pragma unroll
    for (int u = 0; u < kLinearizeLoads; ++u) idx[u] = i0 + u * step < hi ? load_index_bwd(indices + i0 + u * step) : 0;
#pragma unroll
    for (int u = 0; u < kLinearizeLoads; ++u)
      if (i0 + u * step < hi) linearize_one(i0 + u * step, idx[u]);
  }
  if (p.check == tbe_bounds::kCheckSkip && my_skipped != 0) atomicAdd(&skipped, static_cast<unsigned long long>(my_skipped));
  __syncthreads();
  if (p.mean)
    for (int k = tid; k < nitems; k += blockDim.x) p.bag_count[item0 + k] = cnt[k];
  if (tid == 0 && skipped != 0) atomicAdd(reinterpret_cast<unsigned long long*>(p.scratch + tbe_bounds::kSkipCount), skipped);
}

}  // namespace tbe_bwd
}  // namespace cuda
}  // namespace embscale
