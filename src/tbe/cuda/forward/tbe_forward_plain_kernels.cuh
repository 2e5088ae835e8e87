// CUDA table-batched embedding forward: the two plain kernels. A call is plain when it pools (sum or
// mean), has no per-sample weights, every table has at most 2^32 rows, and its lookups and bags count
// below 2^31 (forward_plan.h decides on the host). Such a call needs none of the general form's weights
// and 64-bit positions, and when every feature also takes one kind of walk, a kernel holding only that
// walk runs it, its registers alone setting the occupancy (docs/tbe_forward_cuda.md, "Plain kernels").
// Each kernel has an unchecked form (bounds checks off) and a checked one (kCheck: skip, warn and error
// modes, with the bags kernel's records: invalid indices dropped and counted or the first one kept,
// decreasing offsets kept, MEAN over the valid lookups):
//
//  * tbe_forward_warp_kernel: every feature's rows take a whole warp of 16-byte vectors (17 or more:
//    fp32 D >= 68, fp16/bf16 D >= 136, multiples of 4 / 8). The warp loads up to 32 of the bag's indices
//    at once, one per lane, and broadcasts each with a shuffle (the general walk has every lane load
//    every index), and the bag's last, partial step keeps all its row loads in flight too.
//  * tbe_forward_vector_kernel: every feature reads 16-byte vectors, one a lane a pass (rows of any
//    width but the 33..63 vectors the bags kernel takes two a lane; the general walk's plain form,
//    tbe_forward_feature with kPlain, alone).
//
// The choice and the bags each lane group walks: forward_plan.h (plan_launch).
//
// Same grid, same bags per lane, same sums in the same order as the bags kernel: the results are
// bit-identical to it.
#pragma once

#include <type_traits>

#include "core/cuda/lanes.cuh"
#include "tbe/cuda/forward/tbe_forward_kernels.cuh"

namespace embscale {
namespace cuda {
namespace tbe_fwd {

// One feature's bags on the warp walk: vectors of kBytes, kC of them per lane (2: rows of 33..64 vectors
// in one walk over the bag, else passes of 32 vectors), C::kUnroll lookups a step (halved for kC = 2: as
// many row loads in flight). Positions and items are 32-bit (the plain call's limits).
//
// kCheck: the bounds-checked form (p.check skip or error, as the bags kernel's general form: bags of
// decreasing offsets and the first invalid position recorded in p.scratch, invalid indices dropped and,
// in skip mode, counted, MEAN over the valid ones). Each lane tests its own index against the table
// before the shuffle; a ballot of the valid lanes predicates the adds.
template <typename W, typename O, typename I, int kBytes, int kC, typename C, bool kCheck = false>
__device__ __forceinline__ void tbe_forward_warp_feature(const TbeForwardParams& p, int f, const W* table, int units,
                                                         int tile0, int tiles) {
  constexpr int V = kBytes / static_cast<int>(sizeof(W));  // elements per vector
  constexpr int kU = kC == 2 && C::kUnroll > 1 ? C::kUnroll / 2 : C::kUnroll;
  constexpr int kLanes = Warp::kCount;
  static_assert(kLanes % kU == 0, "a step divides a warp's chunk of indices");
  constexpr int kWarps = C::kBlock / kLanes;
  const I* indices = static_cast<const I*>(p.indices);
  const I* offsets = static_cast<const I*>(p.offsets);
  const int B = static_cast<int>(p.batch_size);
  const int N = static_cast<int>(p.num_indices);
  const uint32_t row_bytes = static_cast<uint32_t>(p.dims[f]) * static_cast<uint32_t>(sizeof(W));
  const int lane = Warp::lane();
  const int warp = static_cast<int>(threadIdx.x) / kLanes;
  O* out = static_cast<O*>(p.output) + p.output_offsets[f];
  const uint64_t E = kCheck ? static_cast<uint64_t>(p.num_rows[f]) : 0;  // checked: the table's rows
  // Bags in 64 bits: B may come close to 2^31, and b + stride must not wrap.
  for (int64_t b = static_cast<int64_t>(tile0) * kWarps + warp; b < B; b += static_cast<int64_t>(tiles) * kWarps) {
    const int item = f * B + static_cast<int>(b);
    // Clamped as in the general walk: broken offsets never read outside the indices.
    const int64_t s64 = static_cast<int64_t>(offsets[item]);
    const int64_t e64 = static_cast<int64_t>(offsets[item + 1]);
    const int start = static_cast<int>(s64 < 0 ? 0 : (s64 > N ? N : s64));
    const int end = static_cast<int>(e64 < start ? start : (e64 > N ? N : e64));
    if (kCheck && e64 < s64 && lane == 0) record_min_position(p.scratch + kBadOffsetKey, item + 1);
    int valid = end - start;  // checked: the lookups with an index in the table
    for (int u0 = 0; u0 < units; u0 += kLanes * kC) {
      float acc[kC][V];
#pragma unroll
      for (int c = 0; c < kC; ++c)
#pragma unroll
        for (int k = 0; k < V; ++k) acc[c][k] = 0.0f;
      // Lane owns vectors u0 + lane and (kC = 2) u0 + lane + kLanes. An idle first vector reads the looked-up
      // row's first vector, an idle second one the lane's first vector again: loads need no predicate.
      const char* col = reinterpret_cast<const char*>(table) + kBytes * (u0 + lane < units ? u0 + lane : 0);
      const uint32_t second = kC == 2 && u0 + lane + kLanes < units ? kBytes * static_cast<uint32_t>(kLanes) : 0u;
      for (int c0 = start, n = 0; c0 < end; c0 += n) {  // chunks of n <= kLanes lookups; c0 never passes end
        n = end - c0 < kLanes ? end - c0 : kLanes;
        // The chunk's indices, one per lane; row 0 past the bag's end (read, then dropped), and checked,
        // row 0 for an invalid index (dropped too). Bit j of `ok`: lookup c0 + j is added.
        uint32_t mine = 0;
        LaneMask ok = 0;
        if constexpr (kCheck) {
          const int64_t idx = lane < n ? load_index(indices + c0 + lane) : 0;
          const bool in_table = static_cast<uint64_t>(idx) < E;
          mine = in_table ? static_cast<uint32_t>(idx) : 0u;
          ok = Warp::ballot(lane < n && in_table);
          const LaneMask bad = Warp::ballot(lane < n && !in_table);
          if (u0 == 0) valid -= Warp::popc(bad);
          if (bad != 0 && p.check == kCheckError && u0 == 0 && lane == 0)
            record_min_position(p.scratch + kBadIndexKey, c0 + Warp::ffs(bad) - 1);
        } else {
          mine = lane < n ? static_cast<uint32_t>(load_index(indices + c0 + lane)) : 0u;
        }
        // kU lookups from j0: every row load, then the adds in index order; only the last step of a
        // chunk may be partial (lookups j0 + j >= n are dropped).
        const auto step = [&](int j0, auto full) {
          constexpr bool kFull = decltype(full)::value;
          Words<kBytes> raw[kU][kC];
#pragma unroll
          for (int j = 0; j < kU; ++j) {
            const char* row = col + static_cast<uint64_t>(Warp::shfl(mine, j0 + j)) * row_bytes;
#pragma unroll
            for (int c = 0; c < kC; ++c) raw[j][c] = load_words<kBytes, LoadHint::kReadOnly>(c == 0 ? row : row + second);
          }
#pragma unroll
          for (int j = 0; j < kU; ++j) {
            if (kCheck ? ((ok >> (j0 + j)) & 1u) != 0 : (kFull || j0 + j < n)) {
#pragma unroll
              for (int c = 0; c < kC; ++c) {
                float x[V];
                words_to_floats<W, kBytes>(raw[j][c], x);
#pragma unroll
                for (int k = 0; k < V; ++k) acc[c][k] = __fadd_rn(acc[c][k], x[k]);
              }
            }
          }
        };
        int j0 = 0;
        for (; j0 + kU <= n; j0 += kU) step(j0, std::true_type{});
        if (j0 < n) step(j0, std::false_type{});
      }
      O* o = out + static_cast<int64_t>(b) * p.out_row_stride;
#pragma unroll
      for (int c = 0; c < kC; ++c) {
        const int uc = u0 + lane + kLanes * c;
        if (uc < units) {
          if (p.pooling == kPoolMean && (kCheck ? valid > 0 : end > start)) {
            const float n = static_cast<float>(kCheck ? valid : end - start);
#pragma unroll
            for (int k = 0; k < V; ++k) acc[c][k] = __fdiv_rn(acc[c][k], n);
          }
          store_out<O, V>(o + static_cast<int64_t>(uc) * V, acc[c]);
        }
      }
    }
    if (kCheck && p.check == kCheckSkip && lane == 0 && valid < end - start)
      atomicAdd(reinterpret_cast<unsigned long long*>(p.scratch + kSkipCount),
                static_cast<unsigned long long>(end - start - valid));
  }
}

// grid = (bag tiles, features); block = C::kBlock. Every feature: rows of 17 or more kBytes vectors (the
// library: 16; dev/ also measures 8), aligned to them. kCheck: the checked walk.
template <typename W, typename O, typename I, typename C, int kBytes = 16, bool kCheck = false>
__global__ void __launch_bounds__(C::kBlock, C::kMinBlocks) tbe_forward_warp_kernel(const TbeForwardParams p) {
  for (int f = static_cast<int>(blockIdx.y); f < p.num_features; f += static_cast<int>(gridDim.y)) {
    const W* table = static_cast<const W*>(p.weights) + p.weight_offsets[f];
    const int units = static_cast<int>(static_cast<int64_t>(p.dims[f]) * static_cast<int64_t>(sizeof(W)) / kBytes);
    if (units > Warp::kCount && units <= 2 * Warp::kCount) {
      tbe_forward_warp_feature<W, O, I, kBytes, 2, C, kCheck>(p, f, table, units, blockIdx.x, gridDim.x);
    } else {
      tbe_forward_warp_feature<W, O, I, kBytes, 1, C, kCheck>(p, f, table, units, blockIdx.x, gridDim.x);
    }
  }
}

// grid = (bag tiles, features); block = C::kBlock. Every feature: 16-byte vectors, one a lane a pass.
// kCheck: the plain form's checked variant (bounds checks skip, warn or error).
template <typename W, typename O, typename I, typename C, bool kCheck = false>
__global__ void __launch_bounds__(C::kBlock, C::kMinBlocks) tbe_forward_vector_kernel(const TbeForwardParams p) {
  for (int f = static_cast<int>(blockIdx.y); f < p.num_features; f += static_cast<int>(gridDim.y)) {
    const W* table = static_cast<const W*>(p.weights) + p.weight_offsets[f];
    const RowPlan plan = kernel_plan(p.dims[f], static_cast<int>(sizeof(W)), reinterpret_cast<uintptr_t>(table), 1);
    tbe_forward_feature<W, O, I, 16, true, C, true, kCheck>(p, f, table, plan, blockIdx.x, gridDim.x);
  }
}

}  // namespace tbe_fwd
}  // namespace cuda
}  // namespace embscale
