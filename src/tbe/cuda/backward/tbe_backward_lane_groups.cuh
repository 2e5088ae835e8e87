// CUDA TBE backward: the lane-group path, several short rows per warp (each on a group of lanes, with
// all of a row's columns in registers), bit-identical to update_row.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/cuda/arch_traits.cuh"
#include "embscale/tbe.h"
#include "tbe/cuda/backward/tbe_backward_grad_sums.cuh"
#include "tbe/cuda/backward/tbe_backward_io.cuh"
#include "tbe/cuda/backward/tbe_backward_params.cuh"
#include "tbe/cuda/backward/tbe_backward_update.cuh"
#include "tbe/optimizer.h"
#include "tbe/optimizer_table.h"
#include "tbe/optimizer_traits.h"
#include "tbe/rounding.h"

namespace embscale {
namespace cuda {
namespace tbe_bwd {

//
//
// A warp updating one short row at a time has one row's loads in flight, so the warp path is bound by
// latency, not bandwidth. When every row fits the path (max_dim <= kGroupMaxCols) and is made of whole,
// aligned vectors of kVec columns (whole_vecs; the lane groups have no element-by-element access,
// VecAccess::kWhole; an optimizer's element-wise state must be as aligned: state_vec), the warp is split
// into R lane groups of
// L = 32 / R lanes, each updating its own row, with the shape chosen per call from the widest row
// (group_shape). Each lane holds its row's columns in registers as V = P x S vectors of kVec columns:
// P passes of update_row's mapping, S slots per pass. Lane gl of a group holds, as vector (pass q, slot
// k), the kVec columns that lane gl + k*L holds in pass q of update_row's mapping (columns q*kPassCols +
// (gl + k*L)*kVec ..). The wide shapes hold whole passes (S = R: every lane of update_row's mapping),
// P = kGroupVecs / R of them: R = 4 up to one pass (128 columns), 2 up to two passes, 1 up to four. The
// narrow shapes hold the first S*L lanes of one pass (P = 1), for short rows: R = 8, S = 2 up to 32
// columns, R = 16, S = 2 up to 16; there the per-row work of a round (row metadata, the reductions) is
// shared by more rows and a lane computes 2 vectors instead of 4. The loads of R rows (weights,
// row-wise and element-wise state, first gradient row) are issued together, and the gradient is summed
// once (no recomputation across sweeps). An element's state (Adam's moments, Adagrad's sum, LARS's
// velocity) is held by the lane holding the element, in the same vectors as its weights; LAMB's trust
// ratio needs no second sweep, the row being in registers.
//
// Every column is summed in the canonical order; the per-lane row sums run over the passes in order,
// exactly as update_row's per-lane sums, and are then reduced along warp_sum's xor tree (group_sum): in
// registers over the slots, then by shuffles within the group. The lanes of update_row's mapping that a
// narrow shape leaves out hold no column of the row (their partial sums are +0), and adding +0 to the
// nonnegative sums of squares changes nothing, so the results are bit-identical to update_row's (and
// hence to the block and multi-block paths) for every shape.

constexpr int kGroupRows = 4;                                    // rows per warp for rows of one pass
constexpr int kGroupVecs = 4;                                    // kVec-column vectors per lane and row
constexpr int kGroupMaxCols = kGroupVecs * kPassCols;            // widest row of the lane-group path (R = 1)
static_assert(kLaneGroupCols == kGroupMaxCols, "the default warp threshold follows the lane-group path");
static_assert(kGroupMaxLookups <= kChunk && kNarrowGroupMaxLookups <= kChunk, "the lane-group path sums one chunk");
static_assert(kGroupVecs % kGroupRows == 0, "rows of one pass need kGroupRows slots per lane");
static_assert(kGroupMaxCols == kGroupVecs * kPassCols, "the one-row shape holds kGroupVecs passes");
static_assert(ArchTraits::kWarpSize % kGroupRows == 0, "kGroupRows must divide the warp");

// Passes a lane holds in shape (R, S): all of kGroupVecs's for the wide shapes, one for the narrow ones.
template <int R, int S>
constexpr int group_passes() { return S == R ? kGroupVecs / R : 1; }
// Widest row of shape (R, S).
template <int R, int S>
constexpr int group_cols() { return (group_passes<R, S>() - 1) * kPassCols + S * (ArchTraits::kWarpSize / R) * kVec; }
template <int R, int S>
constexpr bool valid_group_shape() {
  return R >= 1 && R <= ArchTraits::kWarpSize && ArchTraits::kWarpSize % R == 0 && S >= 1 && S <= R && R % S == 0 &&
         (S == R ? kGroupVecs % R == 0 : S <= kGroupVecs);
}

// Lookups whose gradient rows a lane group loads at once while summing a row (group_update_row): a
// whole batch (L <= 4 lookups) for the narrow shapes, whose lanes hold two vectors; 2 for the wide ones,
// whose lanes hold up to four (docs/tbe_backward_cuda.md, History, 2026-12-03).
template <int R, int S>
constexpr int group_lookups_in_flight() { return S == R ? 2 : ArchTraits::kWarpSize / R; }

// The lane-group shape of a call: rows per warp R and slots per pass S (R = 0: off, one row per warp,
// update_row). The closed set (16, 2), (8, 2), (4, 4), (2, 2), (1, 1) is what
// tbe_backward_warp_rows_kernel is instantiated for. Host only.
struct GroupShape {
  int rows;
  int slots;
};
// The longest rows (lookups) the lane groups take in shape s, 0 when they are off. The narrow shapes
// (rows of at most 32 columns, 8 or 16 rows a warp) take rows of up to a chunk: a whole warp on such a
// row would use 8 of its lanes or fewer. Host only.
inline int group_max_lookups(GroupShape s) {
  return s.rows == 0 ? 0 : s.rows >= 8 ? kNarrowGroupMaxLookups : kGroupMaxLookups;
}
// Whether the optimizers with element-wise state take the lane groups: not in the HIP build, where Debian's
// hipcc 5.2 (clang 15) crashed compiling their kernels for gfx90a; there they take the whole-warp path.
#if defined(__HIP_PLATFORM_AMD__)
constexpr bool kElementStateLaneGroups = false;
#else
constexpr bool kElementStateLaneGroups = true;
#endif
inline GroupShape group_shape(const RowParams& p) {
  if (p.whole_vecs == 0) return {0, 0};
  if (opt::has_elementwise_state(p.opt.type) && (!kElementStateLaneGroups || p.state_vec == 0)) return {0, 0};
  if (p.max_dim <= group_cols<16, 2>()) return {16, 2};
  if (p.max_dim <= group_cols<8, 2>()) return {8, 2};
  if (p.max_dim <= group_cols<4, 4>()) return {4, 4};
  if (p.max_dim <= group_cols<2, 2>()) return {2, 2};
  if (p.max_dim <= group_cols<1, 1>()) return {1, 1};
  return {0, 0};
}

// The lane-group path is compiled per optimizer (a template argument of its kernel: one instantiation
// per optimizer and shape), so its element loops carry no test of the optimizer type. group_update_row
// is written once against the optimizer's trait (tbe/optimizer_traits.h).

// Mask of lane group grp (of L lanes).
template <int L>
__device__ __forceinline__ LaneMask group_mask(int grp) {
  return Warp::group_mask<L>(grp);
}

// warp_sum over the kWarpSize lanes of the one-warp mapping, s[k] being lane gl + k*L's partial (the lanes
// past S*L hold +0): xor steps kWarpSize/2 .. S*L add +0, steps S*L/2 .. L pair slots of the same lane (done in
// registers, highest first), the remaining steps are shuffles within the group of L lanes.
template <int L, int S>
__device__ __forceinline__ float group_sum(float (&s)[S], LaneMask gmask) {
#pragma unroll
  for (int h = S / 2; h >= 1; h /= 2)
#pragma unroll
    for (int k = 0; k < h; ++k) s[k] = __fadd_rn(s[k], s[k + h]);
  float v = s[0];
  v = lane_sum<Warp, L>(v, gmask);
  return v;
}

// Lookup q's meta for lane gl, q = b0 + gl of a row's sorted segment (the caller's `first` for q = 0).
__device__ __forceinline__ LookupMeta group_meta(const RowParams& p, int64_t start, int64_t q, int64_t end,
                                                 const LookupMeta& first) {
  LookupMeta m{0, 1.0f};
  if (q < end) m = q == 0 ? first : lookup_meta(p, start + q);
  return m;
}

// The element-wise state of group_update_row's row: the vectors of momentum1 / momentum2 that the lane's
// weight vectors have (only those the optimizer keeps element-wise are used).
template <int V>
struct GroupElementState {
  float m1[V][kVec];
  float m2[V][kVec];
};

// The optimizer step of group_update_row's row (not in dense mode): g its summed gradient, w its weights,
// state its row-wise state (if the optimizer keeps one), es its element-wise state (if it keeps any); the
// new weights and state are stored.
template <typename W, int R, int S, typename Opt>
__device__ __forceinline__ void group_optimizer_step(const RowParams& p, const RowInfo& r,
                                                     float (&g)[group_passes<R, S>() * S][kVec],
                                                     float (&w)[group_passes<R, S>() * S][kVec],
                                                     GroupElementState<group_passes<R, S>() * S>& es,
                                                     const int (&col)[group_passes<R, S>() * S],
                                                     const int (&ncols)[group_passes<R, S>() * S], float state, int gl,
                                                     LaneMask gmask) {
  constexpr int L = ArchTraits::kWarpSize / R;
  constexpr int P = group_passes<R, S>();
  constexpr int V = P * S;
  const OptimizerParams& o = p.opt;
  const int D = r.D;
  W* wrow = static_cast<W*>(p.weights) + r.wbase;
  // The sum over the row of f(v, e) for the row's columns, per lane in update_row's order (slot k's
  // partial is lane gl + k*L's sum in update_row: its columns of pass 0, then pass 1, ...), then along
  // warp_sum's tree.
  const auto row_sum = [&](auto f) {
    float s[S];
#pragma unroll
    for (int k = 0; k < S; ++k) {
      s[k] = 0.0f;
#pragma unroll
      for (int q = 0; q < P; ++q)
#pragma unroll
        for (int e = 0; e < kVec; ++e)
          if (e < ncols[q * S + k]) s[k] = __fadd_rn(s[k], f(q * S + k, e));
    }
    return group_sum<L, S>(s, gmask);
  };
  // The optimizer's modes are the same for every element of the row: each is tested once here, so the
  // element loops below are straight-line code (the same opt:: functions, the same operations).
  if (o.gradient_clipping > 0.0f) {
#pragma unroll
    for (int v = 0; v < V; ++v)
#pragma unroll
      for (int e = 0; e < kVec; ++e) g[v][e] = opt::clip_grad(g[v][e], o);
  }
  opt::RowTerms terms;
  if constexpr (Opt::kReduction != opt::RowReduction::kNone) {
    // Without L2 weight decay row_sq_term(g, w) is g*g.
    const bool l2 = o.weight_decay_mode == WeightDecayMode::kL2;
    float s[S];
#pragma unroll
    for (int k = 0; k < S; ++k) {
      s[k] = 0.0f;
#pragma unroll
      for (int q = 0; q < P; ++q)
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const float gv = g[q * S + k][e];
          const float t = l2 ? opt::row_sq_term(gv, w[q * S + k][e], o) : gv * gv;
          if (e < ncols[q * S + k]) s[k] = __fadd_rn(s[k], t);
        }
    }
    opt::RowSums sums;
    sums.grad = group_sum<L, S>(s, gmask);
    if constexpr (Opt::kReduction == opt::RowReduction::kSumSqGradAndWeight)
      sums.weight = row_sum([&](int v, int e) { return __fmul_rn(w[v][e], w[v][e]); });
    if constexpr (Opt::kRowState) {
      terms = Opt::row_terms(&state, sums, D, o, p.corrections);
      if (gl == 0) Opt::row_state(p.momentum1, p.momentum2)[r.key] = state;
    } else {
      terms = Opt::row_terms(nullptr, sums, D, o, p.corrections);
    }
  }
  // The element-wise state, updated in registers by apply, is stored (columns past D hold zeros: their
  // values and state are not stored).
  const auto store_state = [&]() {
#pragma unroll
    for (int v = 0; v < V; ++v) {
      const int64_t at = r.wbase + col[v];
      if constexpr (Opt::kElementM1) store_weights<float, VecAccess::kWhole>(p.momentum1 + at, true, ncols[v], es.m1[v]);
      if constexpr (Opt::kElementM2) store_weights<float, VecAccess::kWhole>(p.momentum2 + at, true, ncols[v], es.m2[v]);
    }
  };
  if constexpr (Opt::kTrustRatio) {
    // LAMB: the directions in place of g, then the ratio of the norms of the row's weights and
    // directions, then each weight's step.
#pragma unroll
    for (int v = 0; v < V; ++v)
#pragma unroll
      for (int e = 0; e < kVec; ++e)
        g[v][e] = Opt::apply(w[v][e], g[v][e], terms, &es.m1[v][e], &es.m2[v][e], o, p.corrections);
    store_state();
    const float sq = row_sum([&](int v, int e) { return __fmul_rn(g[v][e], g[v][e]); });
    const float sw = row_sum([&](int v, int e) { return __fmul_rn(w[v][e], w[v][e]); });
    const float ratio = opt::trust_ratio(sw, sq);
#pragma unroll
    for (int v = 0; v < V; ++v)
#pragma unroll
      for (int e = 0; e < kVec; ++e) w[v][e] = opt::trust_step(w[v][e], g[v][e], ratio, o);
  } else {
    // New values in place of w.
#pragma unroll
    for (int v = 0; v < V; ++v)
#pragma unroll
      for (int e = 0; e < kVec; ++e)
        w[v][e] = Opt::apply(w[v][e], g[v][e], terms, &es.m1[v][e], &es.m2[v][e], o, p.corrections);
    store_state();
  }
  if (Opt::renormalises(o)) {
    float sq[S];
#pragma unroll
    for (int k = 0; k < S; ++k) {
      sq[k] = 0.0f;
#pragma unroll
      for (int q = 0; q < P; ++q)
#pragma unroll
        for (int e = 0; e < kVec; ++e)
          if (e < ncols[q * S + k]) sq[k] = __fadd_rn(sq[k], __fmul_rn(w[q * S + k][e], w[q * S + k][e]));
    }
    const float factor = opt::max_norm_factor(group_sum<L, S>(sq, gmask), o);
    if (factor != 1.0f) {
#pragma unroll
      for (int v = 0; v < V; ++v)
#pragma unroll
        for (int e = 0; e < kVec; ++e) w[v][e] = w[v][e] * factor;
    }
  }
  // Stochastic rounding: the random bits' first step (rounding_base) once per row when the row's element
  // indices share their upper 32 bits (all rows but one every 2^32 elements), then one hash per element.
  // Each case is its own loop, so the element loops stay straight-line.
  const auto store_row = [&](int64_t base, auto round_one) {
#pragma unroll
    for (int v = 0; v < V; ++v) {
      if (ncols[v] <= 0) continue;
      W out[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) out[e] = round_one(w[v][e], base + col[v] + e);
      store_weights<W, VecAccess::kWhole>(wrow + col[v], true, ncols[v], out);
    }
  };
  if constexpr (sizeof(W) == sizeof(float)) {
    store_row(r.wbase, [](float x, int64_t) { return x; });
  } else if (p.rounding != WeightRounding::kStochastic) {
    store_row(r.wbase, [](float x, int64_t) { return round_weight<W>(x, WeightRounding::kNearest, 0, 0); });
  } else {
    const int64_t rb = rounding_base_of(p, r);
    if ((static_cast<uint64_t>(rb) >> 32) == (static_cast<uint64_t>(rb + D - 1) >> 32)) {
      const uint32_t base = rounding_base(p.rounding_key, static_cast<uint32_t>(static_cast<uint64_t>(rb) >> 32));
      store_row(rb, [base](float x, int64_t elem) {
        return stochastic_round<W>(x, rounding_bits_at(base, static_cast<uint32_t>(elem)));
      });
    } else {
      const uint64_t key = p.rounding_key;
      store_row(rb, [key](float x, int64_t elem) { return stochastic_round<W>(x, rounding_bits(key, elem)); });
    }
  }
}

// One row of at most kChunk lookups (len from sorted position start; `first` = meta of lookup start) on
// one lane group of L = 32 / R lanes: total = 0 + (0 + part), part = ((0 + c_0) + c_1) + ..., as
// WarpGrad. Shape (R, S); vector v = q*S + k is pass q, slot k.
template <typename W, typename G, int R, int S, OptimizerType kOpt>
__device__ __forceinline__ void group_update_row(const RowParams& p, const RowInfo& r, int64_t start, int64_t len,
                                                 const LookupMeta& first, int gl, LaneMask gmask) {
  static_assert(valid_group_shape<R, S>(), "lane-group shape");
  constexpr int L = ArchTraits::kWarpSize / R;
  constexpr int P = group_passes<R, S>();
  constexpr int V = P * S;
  const int D = r.D;
  W* wrow = static_cast<W*>(p.weights) + r.wbase;
  const G* grad = static_cast<const G*>(p.grad_output);
  using Opt = opt::TraitOf<kOpt>;
  constexpr bool dense = Opt::kDense;
  int col[V], ncols[V];
#pragma unroll
  for (int q = 0; q < P; ++q)
#pragma unroll
    for (int k = 0; k < S; ++k) {
      const int v = q * S + k;
      col[v] = q * kPassCols + (gl + k * L) * kVec;
      const int left = D - col[v];
      ncols[v] = left <= 0 ? 0 : (left < kVec ? left : kVec);
    }
  // Loads first: the metas of lookups 1..L-1, the weights, the row's state and the first gradient row,
  // all independent.
  LookupMeta next{0, 1.0f};
  if (gl > 0 && gl < len) next = lookup_meta(p, start + gl);
  float w[V][kVec], g[V][kVec];
  if (!dense) {
#pragma unroll
    for (int v = 0; v < V; ++v) load_vec<W, false, VecAccess::kWhole>(wrow + col[v], true, ncols[v], w[v]);
  }
  float state = 0.0f;
  if constexpr (Opt::kRowState) state = Opt::row_state(p.momentum1, p.momentum2)[r.key];
  GroupElementState<V> es;
#pragma unroll
  for (int v = 0; v < V; ++v) {
    const int64_t at = r.wbase + col[v];
    if constexpr (Opt::kElementM1) load_vec<float, false, VecAccess::kWhole>(p.momentum1 + at, true, ncols[v], es.m1[v]);
    if constexpr (Opt::kElementM2) load_vec<float, false, VecAccess::kWhole>(p.momentum2 + at, true, ncols[v], es.m2[v]);
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      if constexpr (!Opt::kElementM1) es.m1[v][e] = 0.0f;
      if constexpr (!Opt::kElementM2) es.m2[v][e] = 0.0f;
    }
  }
#pragma unroll
  for (int v = 0; v < V; ++v) load_vec<G, true, VecAccess::kWhole>(grad + first.grad_off + col[v], true, ncols[v], g[v]);
#pragma unroll
  for (int v = 0; v < V; ++v)
#pragma unroll
    for (int e = 0; e < kVec; ++e) g[v][e] = __fadd_rn(0.0f, __fmul_rn(first.scale, g[v][e]));
  // Rows of one lookup (most rows of a uniform batch) skip the loop; the hint keeps it out of their
  // straight-line path.
  if (__builtin_expect(len > 1, 0)) {
    constexpr int K = group_lookups_in_flight<R, S>();
    // The narrow shapes load a batch's metas one batch early, so their dependent loads (sorted value,
    // bag, offset) overlap the previous batch's gradient rows instead of following them; in the wide
    // shapes the registers this holds cost more than it saves.
    constexpr bool kMetasAhead = S != R;
    LookupMeta ahead = next;
    for (int64_t b0 = 0; b0 < len; b0 += L) {
      LookupMeta mine = ahead;
      if constexpr (kMetasAhead) {
        ahead = group_meta(p, start, b0 + L + gl, len, first);
      } else if (b0 > 0) {
        mine = group_meta(p, start, b0 + gl, len, first);
      }
      const int nb = static_cast<int>(len - b0 < L ? len - b0 : L);
      // K lookups' loads in flight; a missing one re-reads lookup j (present) and is not added.
      for (int j = b0 == 0 ? 1 : 0; j < nb; j += K) {
        int64_t off[K];
        float sc[K];
#pragma unroll
        for (int u = 0; u < K; ++u) {
          const int src = j + u < nb ? j + u : j;
          off[u] = Warp::shfl(mine.grad_off, src, L, gmask);
          sc[u] = Warp::shfl(mine.scale, src, L, gmask);
        }
#pragma unroll
        for (int v = 0; v < V; ++v) {
          float x[K][kVec];
#pragma unroll
          for (int u = 0; u < K; ++u)
            load_vec<G, true, VecAccess::kWhole>(grad + off[u] + col[v], true, ncols[v], x[u]);
#pragma unroll
          for (int u = 0; u < K; ++u)
            if (u == 0 || j + u < nb)
#pragma unroll
              for (int e = 0; e < kVec; ++e) g[v][e] = __fadd_rn(g[v][e], __fmul_rn(sc[u], x[u][e]));
        }
      }
    }
  }
#pragma unroll
  for (int v = 0; v < V; ++v)
#pragma unroll
    for (int e = 0; e < kVec; ++e) g[v][e] = __fadd_rn(0.0f, __fadd_rn(0.0f, g[v][e]));

  if constexpr (dense) {
    float* dst = p.unique_grads + r.u * p.max_dim;
#pragma unroll
    for (int v = 0; v < V; ++v)
      if (ncols[v] > 0) store_floats<VecAccess::kWhole>(dst + col[v], true, ncols[v], g[v]);
    for (int d = D + gl; d < p.max_dim; d += L) dst[d] = 0.0f;
  } else {
    group_optimizer_step<W, R, S, Opt>(p, r, g, w, es, col, ncols, state, gl, gmask);
  }
}

// Issues L2 prefetches for what group_update_row will load first for row r (weights, row-wise state,
// the first lookup's gradient row at grad_off): the same addresses, no registers held.
template <typename W, typename G, int R, int S, OptimizerType kOpt>
__device__ __forceinline__ void group_prefetch_row(const RowParams& p, const RowInfo& r, int64_t grad_off, int gl) {
  constexpr int L = ArchTraits::kWarpSize / R;
  constexpr int P = group_passes<R, S>();
  const W* wrow = static_cast<const W*>(p.weights) + r.wbase;
  const G* grad = static_cast<const G*>(p.grad_output) + grad_off;
  using Opt = opt::TraitOf<kOpt>;
#pragma unroll
  for (int q = 0; q < P; ++q)
#pragma unroll
    for (int k = 0; k < S; ++k) {
      const int col = q * kPassCols + (gl + k * L) * kVec;
      if (col < r.D) {
        if (!Opt::kDense) prefetch_l2(wrow + col);
        prefetch_l2(grad + col);
      }
    }
  if constexpr (Opt::kRowState)
    if (gl == 0) prefetch_l2(Opt::row_state(p.momentum1, p.momentum2) + r.key);
  if constexpr (Opt::kElementM1 || Opt::kElementM2) {
#pragma unroll
    for (int q = 0; q < P; ++q)
#pragma unroll
      for (int k = 0; k < S; ++k) {
        const int col = q * kPassCols + (gl + k * L) * kVec;
        if (col < r.D) {
          if constexpr (Opt::kElementM1) prefetch_l2(p.momentum1 + r.wbase + col);
          if constexpr (Opt::kElementM2) prefetch_l2(p.momentum2 + r.wbase + col);
        }
      }
  }
}

// The order in which the lane groups take a batch's rows: the rows of mask c[0], then c[1], c[2], c[3],
// each in lane order.
struct RowOrder {
  LaneMask c[4];
  __device__ __forceinline__ bool empty() const { return (c[0] | c[1] | c[2] | c[3]) == 0; }
  __device__ __forceinline__ void pop() {
    if (c[0] != 0) c[0] &= c[0] - 1;
    else if (c[1] != 0) c[1] &= c[1] - 1;
    else if (c[2] != 0) c[2] &= c[2] - 1;
    else c[3] &= c[3] - 1;
  }
  // The n-th remaining row (lane index), -1 past the end.
  __device__ __forceinline__ int nth(int n) const {
    RowOrder o = *this;
    for (int i = 0; i < n; ++i) o.pop();
    const LaneMask m = o.c[0] != 0 ? o.c[0] : o.c[1] != 0 ? o.c[1] : o.c[2] != 0 ? o.c[2] : o.c[3];
    return m != 0 ? Warp::ffs(m) - 1 : -1;
  }
};

}  // namespace tbe_bwd
}  // namespace cuda
}  // namespace embscale
