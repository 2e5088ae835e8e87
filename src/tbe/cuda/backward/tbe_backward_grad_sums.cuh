// CUDA TBE backward: a unique row's gradient summed over its sorted lookups in the canonical order
// (tbe_backward_kernels.cuh), by one warp (WarpGrad), one block (BlockGrad) or from the superchunk
// partials of a hot row (CombineGrad). Each provider gives update_row the lane's kVec columns of a pass.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/cuda/arch_traits.cuh"
#include "tbe/cuda/backward/tbe_backward_io.cuh"
#include "tbe/cuda/backward/tbe_backward_params.cuh"

namespace embscale {
namespace cuda {
namespace tbe_bwd {

// Where lookup (sorted position q) reads its gradient row, and its scale.
struct LookupMeta {
  int64_t grad_off;  // element offset of the row's first column in grad_output (incl. feature column)
  float scale;       // 1 (SUM), psw (weighted) or 1/count rounded once (MEAN), as the CPU backend
};

__device__ __forceinline__ LookupMeta meta_of(const RowParams& p, uint32_t v, uint32_t item) {
  LookupMeta m;
  if (p.sequence) {
    m.grad_off = static_cast<int64_t>(v) * p.grad_stride;
  } else {
    const uint32_t f = item / static_cast<uint32_t>(p.batch_size);
    const int64_t b = static_cast<int64_t>(item) - static_cast<int64_t>(f) * p.batch_size;
    m.grad_off = b * p.grad_stride + p.output_offsets[f];
  }
  m.scale = 1.0f;
  if (p.contrib == kContribWeighted) m.scale = __ldg(p.psw + v);
  else if (p.contrib == kContribMean) m.scale = __fdiv_rn(1.0f, static_cast<float>(p.bag_count[item]));
  return m;
}

__device__ __forceinline__ LookupMeta lookup_meta(const RowParams& p, int64_t q) {
  const uint32_t v = p.vals_sorted[q];
  return meta_of(p, v, p.vals_are_items ? v : p.bag_of[v]);
}

// One chunk (n <= kChunk lookups from sorted position first) summed by one warp, lane's kVec columns
// of pass `pass`, in lookup order from 0: out[k] = ((0 + c_0) + c_1) + ...
// pre: the meta of lookup `first` when the caller already has it (saves a dependent load chain).
// kScaled: lookups carry a scale (weighted, MEAN); without one (plain SUM, scale 1) the multiply and its
// shuffle are left out: 1 * x is exact, so the sums are the same bits. kAccess: the rows' vector access.
template <typename G, bool kScaled, VecAccess kAccess>
__device__ __forceinline__ void warp_chunk_sum_as(const RowParams& p, int64_t first, int n, int col, int ncols,
                                                  float* out, const LookupMeta* pre) {
  const int lane = static_cast<int>(threadIdx.x) & (ArchTraits::kWarpSize - 1);
  LookupMeta mine{0, 1.0f};
  if (lane < n) mine = (pre != nullptr && lane == 0) ? *pre : lookup_meta(p, first + lane);
  const G* grad = static_cast<const G*>(p.grad_output);
#pragma unroll
  for (int k = 0; k < kVec; ++k) out[k] = 0.0f;
  const bool vec = p.g_vec != 0;
  for (int j0 = 0; j0 < n; j0 += kUnroll) {
    float x[kUnroll][kVec];
    float sc[kUnroll];
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      // Lookups past n read the chunk's first row (present), so the loads carry no predicate.
      const int src = j0 + j < n ? j0 + j : 0;
      const int64_t off = Warp::shfl(mine.grad_off, src);
      sc[j] = kScaled ? Warp::shfl(mine.scale, src) : 1.0f;
      load_vec<G, true, kAccess>(grad + off + col, vec, ncols, x[j]);  // ncols == 0: zeros, no access
    }
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      if (j0 + j < n) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) out[k] = __fadd_rn(out[k], kScaled ? __fmul_rn(sc[j], x[j][k]) : x[j][k]);
      }
    }
  }
}

template <typename G, VecAccess kAccess>
__device__ __forceinline__ void warp_chunk_sum(const RowParams& p, int64_t first, int n, int col, int ncols,
                                               float* out, const LookupMeta* pre = nullptr) {
  if (p.contrib == kContribPlain) warp_chunk_sum_as<G, false, kAccess>(p, first, n, col, ncols, out, pre);
  else warp_chunk_sum_as<G, true, kAccess>(p, first, n, col, ncols, out, pre);
}

// Chunk groups. A row of D <= kPassCols / 2 columns needs ceil(D / kVec) lanes for a pass, so a warp
// summing one chunk at a time (warp_chunk_sum) leaves most of its lanes idle on short rows (24 of 32 at
// D = 32). With whole vectors (VecAccess::kWhole) the warp instead sums 32 / L chunks side by side, each
// on its own group of L lanes (chunk_group_lanes): lane gl of group sg holds columns gl * kVec.. of
// chunk sg. Each chunk is summed with the same operations in the same order as warp_chunk_sum, so the
// partials are the same bits, and the callers add them in chunk order as before.
constexpr int kMaxChunkGroupCols = kPassCols / 2;

// Lanes per chunk group for rows of D columns: 4, 8 or 16; 0 for rows wider than kMaxChunkGroupCols.
__device__ __forceinline__ int chunk_group_lanes(int D) {
  return D <= 4 * kVec ? 4 : D <= 8 * kVec ? 8 : D <= kMaxChunkGroupCols ? 16 : 0;
}

// One chunk (n <= kChunk lookups from sorted position first; n = 0: none) summed by this lane's group of
// kLanes lanes, the lane's kVec columns of a row of D (<= kMaxChunkGroupCols) columns, as
// warp_chunk_sum_as. n_max: the largest n of the warp's groups (warp-uniform), which bounds the loop.
template <typename G, bool kScaled, int kLanes>
__device__ __forceinline__ void group_chunk_sum_as(const RowParams& p, int64_t first, int n, int n_max, int D,
                                                   float* out) {
  static_assert(ArchTraits::kWarpSize % kLanes == 0 && kLanes * kVec <= kPassCols && kLanes % kUnroll == 0, "chunk group");
  const int lane = static_cast<int>(threadIdx.x) & (ArchTraits::kWarpSize - 1);
  const int gl = lane % kLanes;
  const int base = lane - gl;  // the group's first lane
  const int col = gl * kVec;
  const int ncols = n > 0 && col < D ? kVec : 0;  // whole vectors: D is a multiple of kVec
  // Rounds of kLanes lookups: lane gl holds the meta of the round's lookup gl (cur) and of the next
  // round's (nxt, loaded while this round's gradient rows are).
  LookupMeta cur{0, 1.0f};
  if (gl < n) cur = lookup_meta(p, first + gl);
  // Lookups past n re-read the chunk's first row (present when n > 0), so the loads carry no predicate.
  const int64_t off0 = Warp::shfl(cur.grad_off, base);
  const G* grad = static_cast<const G*>(p.grad_output);
#pragma unroll
  for (int k = 0; k < kVec; ++k) out[k] = 0.0f;
  for (int q0 = 0; q0 < n_max; q0 += kLanes) {
    LookupMeta nxt{0, 1.0f};
    if (q0 + kLanes + gl < n) nxt = lookup_meta(p, first + q0 + kLanes + gl);
#pragma unroll
    for (int r0 = 0; r0 < kLanes; r0 += kUnroll) {
      if (q0 + r0 >= n_max) break;
      float x[kUnroll][kVec];
      float sc[kUnroll];
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        int64_t off = Warp::shfl(cur.grad_off, base + r0 + j);
        sc[j] = kScaled ? Warp::shfl(cur.scale, base + r0 + j) : 1.0f;
        if (q0 + r0 + j >= n) off = off0;
        load_vec<G, true, VecAccess::kWhole>(grad + off + col, true, ncols, x[j]);  // ncols == 0: no access
      }
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        if (q0 + r0 + j < n) {
#pragma unroll
          for (int k = 0; k < kVec; ++k)
            out[k] = __fadd_rn(out[k], kScaled ? __fmul_rn(sc[j], x[j][k]) : x[j][k]);
        }
      }
    }
    cur = nxt;
  }
}

template <typename G, int kLanes>
__device__ __forceinline__ void group_chunk_sum(const RowParams& p, int64_t first, int n, int n_max, int D, float* out) {
  if (p.contrib == kContribPlain) group_chunk_sum_as<G, false, kLanes>(p, first, n, n_max, D, out);
  else group_chunk_sum_as<G, true, kLanes>(p, first, n, n_max, D, out);
}

// Lookups of chunk c of a segment of n lookups (0 past its end).
__device__ __forceinline__ int chunk_lookups(int64_t n, int64_t c) {
  const int64_t left = n - c * kChunk;
  return left <= 0 ? 0 : (left < kChunk ? static_cast<int>(left) : kChunk);
}

// Calls f(std::integral_constant<int, L>{}) for the chunk-group width L of rows of D columns and returns
// true; false (nothing called) when the row is too wide for chunk groups.
template <typename F>
__device__ __forceinline__ bool with_chunk_groups(int D, F&& f) {
  switch (chunk_group_lanes(D)) {
    case 4: f(std::integral_constant<int, 4>{}); return true;
    case 8: f(std::integral_constant<int, 8>{}); return true;
    case 16: f(std::integral_constant<int, 16>{}); return true;
    default: return false;
  }
}

// Columns of pass `pass` owned by this lane: first column and how many of its kVec exist.
__device__ __forceinline__ void lane_cols(int pass, int D, int* col, int* ncols) {
  const int lane = static_cast<int>(threadIdx.x) & (ArchTraits::kWarpSize - 1);
  *col = pass * kPassCols + lane * kVec;
  const int left = D - *col;
  *ncols = left <= 0 ? 0 : (left < kVec ? left : kVec);
}

// Warp path: the whole canonical nesting on one warp.
template <typename G, VecAccess kAccessOfRows>
struct WarpGrad {
  static constexpr VecAccess kAccess = kAccessOfRows;
  int64_t start;
  int64_t len;
  int D;
  LookupMeta first;  // meta of lookup `start`
  __device__ void operator()(const RowParams& p, int pass, float* g) const {
    int col, ncols;
    lane_cols(pass, D, &col, &ncols);
    float total[kVec] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t s0 = 0; s0 < len; s0 += kSuperChunk) {
      float sp[kVec] = {0.0f, 0.0f, 0.0f, 0.0f};
      const int64_t s_end = len - s0 < kSuperChunk ? len : s0 + kSuperChunk;
      for (int64_t c0 = s0; c0 < s_end; c0 += kChunk) {
        const int n = static_cast<int>(s_end - c0 < kChunk ? s_end - c0 : kChunk);
        float part[kVec];
        warp_chunk_sum<G, kAccess>(p, start + c0, n, col, ncols, part, c0 == 0 ? &first : nullptr);
#pragma unroll
        for (int k = 0; k < kVec; ++k) sp[k] = __fadd_rn(sp[k], part[k]);
      }
#pragma unroll
      for (int k = 0; k < kVec; ++k) total[k] = __fadd_rn(total[k], sp[k]);
    }
#pragma unroll
    for (int k = 0; k < kVec; ++k) g[k] = total[k];
  }
};

// Shared memory of the block-level superchunk sum: the chunk partials of one superchunk.
struct SuperSmem {
  float part[kChunksPerSuper][kPassCols];
  float total[kPassCols];
};

// block_super_sum for rows of at most kMaxChunkGroupCols columns (one pass): each warp sums kGroups chunks at
// a time on its chunk groups (warp w takes chunks w * kGroups .., then nwarps * kGroups further on).
template <typename G, int kLanes>
__device__ __forceinline__ void block_super_sum_grouped(const RowParams& p, SuperSmem& sm, int64_t first, int64_t n,
                                                        int D, float* sp_out, bool accumulate) {
  constexpr int kGroups = ArchTraits::kWarpSize / kLanes;
  const int warp = static_cast<int>(threadIdx.x) / ArchTraits::kWarpSize;
  const int nwarps = static_cast<int>(blockDim.x) / ArchTraits::kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) & (ArchTraits::kWarpSize - 1);
  const int sg = lane / kLanes, gl = lane % kLanes;
  const int nchunks = static_cast<int>((n + kChunk - 1) / kChunk);
  for (int c0 = warp * kGroups; c0 < nchunks; c0 += nwarps * kGroups) {
    const int c = c0 + sg;
    float part[kVec];
    group_chunk_sum<G, kLanes>(p, first + static_cast<int64_t>(c) * kChunk, chunk_lookups(n, c), chunk_lookups(n, c0),
                               D, part);
    if (c < nchunks)
#pragma unroll
      for (int k = 0; k < kVec; ++k) sm.part[c][gl * kVec + k] = part[k];
  }
  __syncthreads();
  // Columns past the groups' (kLanes * kVec >= D) are not the row's: +0, as the lanes past D give in
  // block_super_sum.
  for (int t = static_cast<int>(threadIdx.x); t < kPassCols; t += blockDim.x) {
    float sp = 0.0f;
    if (t < kLanes * kVec)
      for (int c = 0; c < nchunks; ++c) sp = __fadd_rn(sp, sm.part[c][t]);
    sp_out[t] = accumulate ? __fadd_rn(sp_out[t], sp) : sp;
  }
  __syncthreads();
}

// One superchunk (from sorted position first, n lookups) of one pass summed by the whole block: warps
// take chunks round-robin, then thread t adds column t's chunk partials in chunk order into sp[t].
// Returns with sp (in smem, caller-provided) complete and the block synchronised.
template <typename G, VecAccess kAccess>
__device__ __forceinline__ void block_super_sum(const RowParams& p, SuperSmem& sm, int64_t first, int64_t n, int pass,
                                                int D, float* sp_out /* smem [kPassCols] */, bool accumulate) {
  if constexpr (kAccess == VecAccess::kWhole) {
    if (pass == 0 && with_chunk_groups(D, [&](auto lanes) {
          block_super_sum_grouped<G, decltype(lanes)::value>(p, sm, first, n, D, sp_out, accumulate);
        }))
      return;
  }
  const int warp = static_cast<int>(threadIdx.x) / ArchTraits::kWarpSize;
  const int nwarps = static_cast<int>(blockDim.x) / ArchTraits::kWarpSize;
  const int lane = static_cast<int>(threadIdx.x) & (ArchTraits::kWarpSize - 1);
  const int nchunks = static_cast<int>((n + kChunk - 1) / kChunk);
  int col, ncols;
  lane_cols(pass, D, &col, &ncols);
  for (int c = warp; c < nchunks; c += nwarps) {
    const int m = static_cast<int>(n - static_cast<int64_t>(c) * kChunk < kChunk ? n - static_cast<int64_t>(c) * kChunk
                                                                                 : kChunk);
    float part[kVec];
    warp_chunk_sum<G, kAccess>(p, first + static_cast<int64_t>(c) * kChunk, m, col, ncols, part);
#pragma unroll
    for (int k = 0; k < kVec; ++k) sm.part[c][lane * kVec + k] = part[k];
  }
  __syncthreads();
  for (int t = static_cast<int>(threadIdx.x); t < kPassCols; t += blockDim.x) {
    float sp = 0.0f;
    for (int c = 0; c < nchunks; ++c) sp = __fadd_rn(sp, sm.part[c][t]);
    sp_out[t] = accumulate ? __fadd_rn(sp_out[t], sp) : sp;
  }
  __syncthreads();
}

// Block path: every warp of the block calls this with the same pass (it synchronises the block);
// every warp gets the same gradient for its lane's columns.
template <typename G, VecAccess kAccessOfRows>
struct BlockGrad {
  static constexpr VecAccess kAccess = kAccessOfRows;
  SuperSmem* sm;
  int64_t start;
  int64_t len;
  int D;
  __device__ void operator()(const RowParams& p, int pass, float* g) const {
    const int lane = static_cast<int>(threadIdx.x) & (ArchTraits::kWarpSize - 1);
    for (int t = static_cast<int>(threadIdx.x); t < kPassCols; t += blockDim.x) sm->total[t] = 0.0f;
    __syncthreads();
    // total = total + sp per superchunk: block_super_sum with accumulate adds sp to total in place,
    // computing sp from 0 first, so the order is the canonical one.
    for (int64_t s0 = 0; s0 < len; s0 += kSuperChunk) {
      const int64_t n = len - s0 < kSuperChunk ? len - s0 : kSuperChunk;
      block_super_sum<G, kAccess>(p, *sm, start + s0, n, pass, D, sm->total, true);
    }
#pragma unroll
    for (int k = 0; k < kVec; ++k) g[k] = sm->total[lane * kVec + k];
    __syncthreads();
  }
};

// Combine path: a warp adds a hot row's superchunk partials (workspace) in superchunk order.
template <VecAccess kAccessOfRows>
struct CombineGrad {
  static constexpr VecAccess kAccess = kAccessOfRows;
  int64_t base_slot;
  int64_t supers;
  int D;
  __device__ void operator()(const RowParams& p, int pass, float* g) const {
    int col, ncols;
    lane_cols(pass, D, &col, &ncols);
    float total[kVec] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t s = 0; s < supers; ++s) {
      float x[kVec];
      const float* src = p.partials + (base_slot + s) * p.max_dim + col;
      load_vec<float, false, kAccess>(src, (p.max_dim % kVec) == 0, ncols, x);
#pragma unroll
      for (int k = 0; k < kVec; ++k) total[k] = __fadd_rn(total[k], x[k]);
    }
#pragma unroll
    for (int k = 0; k < kVec; ++k) g[k] = total[k];
  }
};

}  // namespace tbe_bwd
}  // namespace cuda
}  // namespace embscale
