// CUDA TBE backward: the optimizer update of one unique row by a warp (or every warp of a block), given
// a gradient provider of tbe_backward_grad_sums.cuh. Written once against the optimizers' traits
// (tbe/optimizer_traits.h): the optimizer is a run-time value here, visited where its steps differ (the
// row-wise state, the per-row terms, the per-element apply), so the kernels are not instantiated per
// optimizer.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/arch_traits.cuh"
#include "embscale/tbe.h"
#include "tbe/cuda/backward/tbe_backward_grad_sums.cuh"
#include "tbe/cuda/backward/tbe_backward_io.cuh"
#include "tbe/cuda/backward/tbe_backward_params.cuh"
#include "tbe/optimizer.h"
#include "tbe/optimizer_traits.h"
#include "tbe/rounding.h"

namespace embscale {
namespace cuda {
namespace tbe_bwd {

struct RowInfo {
  int64_t u;      // unique index
  int64_t key;    // linearised row = row-wise state index
  int64_t wbase;  // element offset of the row in the weights
  int D;
};

__device__ __forceinline__ RowInfo row_info(const RowParams& p, int64_t u) {
  RowInfo r;
  r.u = u;
  r.key = unique_key(p, u);
  const int64_t start = p.run_starts[u];
  const uint32_t v = p.vals_sorted[start];
  const uint32_t item = p.vals_are_items ? v : p.bag_of[v];
  const int f = static_cast<int>(item / static_cast<uint32_t>(p.batch_size));
  r.D = p.dims[f];
  r.wbase = p.weight_offsets[f] + (r.key - p.row_offsets[f]) * r.D;
  return r;
}

// The element index stochastic rounding hashes for the row's first weight (TbeBackwardArgs::rounding_bases).
__device__ __forceinline__ int64_t rounding_base_of(const RowParams& p, const RowInfo& r) {
  return p.rounding_bases != nullptr ? p.rounding_bases[r.key] : r.wbase;
}

// Applies the optimizer to one row given its gradient provider. Called by whole warps; in the block
// path by every warp of the block (the provider synchronises the block), with writer set on warp 0
// only: the other warps compute the same values and discard them. The weights are accessed as the
// gradient rows are (Grad::kAccess).
template <typename W, typename Grad>
__device__ __forceinline__ void update_row(const RowParams& p, const RowInfo& r, const Grad& grad_of, bool writer) {
  const int lane = static_cast<int>(threadIdx.x) & (ArchTraits::kWarpSize - 1);
  const OptimizerParams& o = p.opt;
  const int D = r.D;
  const int passes = (D + kPassCols - 1) / kPassCols;
  W* wrow = static_cast<W*>(p.weights) + r.wbase;
  const bool wvec = p.w_vec != 0;

  const bool dense = opt::dense_mode(o.type);
  // The first pass's weights and the row-wise state are loaded before the gradient is summed, so
  // their latency overlaps the gradient loads (a short row then costs one round trip).
  float wpre[kVec] = {0.0f, 0.0f, 0.0f, 0.0f};
  float state_pre = 0.0f;
  if (!dense) {
    int col, ncols;
    lane_cols(0, D, &col, &ncols);
    load_vec<W, false, Grad::kAccess>(wrow + col, wvec, ncols, wpre);
    opt::visit_optimizer(o.type, [&](auto t) {
      using Opt = decltype(t);
      if constexpr (Opt::kRowState) state_pre = Opt::row_state(p.momentum1, p.momentum2)[r.key];
    });
  }
  // The gradient of the first kCachedPasses passes stays in registers: pass 0's summed here, before any
  // sweep (the providers' only call for pass 0, so their chunk-group code, pass 0 of rows of at most
  // kMaxChunkGroupCols columns, is compiled in once), the next ones by the first sweep; wider rows' passes
  // are summed again for each sweep that needs them (same bits).
  float cache[kCachedPasses][kVec];
  grad_of(p, 0, cache[0]);
  bool cached = false;  // passes 1 .. kCachedPasses - 1 are in the cache
  const auto grad = [&](int pass, float* g) {
    if (pass == 0 || (cached && pass < kCachedPasses)) {
#pragma unroll
      for (int c = 0; c < kCachedPasses; ++c)
        if (c == pass)
#pragma unroll
          for (int k = 0; k < kVec; ++k) g[k] = cache[c][k];
      return;
    }
    grad_of(p, pass, g);
#pragma unroll
    for (int c = 1; c < kCachedPasses; ++c)
      if (c == pass)
#pragma unroll
        for (int k = 0; k < kVec; ++k) cache[c][k] = g[k];
  };
  const auto end_sweep = [&]() { cached = true; };

  if (dense) {
    // Dense mode: the unclipped sum; columns [D, max_dim) of the row are zeros.
    float* dst = p.unique_grads + r.u * p.max_dim;
    for (int pass = 0; pass < passes; ++pass) {
      float g[kVec];
      grad(pass, g);
      int col, ncols;
      lane_cols(pass, D, &col, &ncols);
      if (writer && ncols > 0) store_floats<Grad::kAccess>(dst + col, p.ug_vec != 0, ncols, g);
    }
    if (writer)
      for (int d = D + lane; d < p.max_dim; d += ArchTraits::kWarpSize) dst[d] = 0.0f;
    return;
  }

  const auto load_w = [&](int pass, int col, int ncols, float* w) {
    if (pass == 0) {
#pragma unroll
      for (int k = 0; k < kVec; ++k) w[k] = wpre[k];
    } else {
      load_vec<W, false, Grad::kAccess>(wrow + col, wvec, ncols, w);
    }
  };

  // Row scalars (the row-wise state updated by writer).
  opt::RowTerms terms;
  const opt::RowReduction reduction = opt::row_reduction(o.type);
  if (reduction != opt::RowReduction::kNone) {
    const bool with_w = reduction == opt::RowReduction::kSumSqGradAndWeight;
    float s = 0.0f, sw = 0.0f;
    for (int pass = 0; pass < passes; ++pass) {
      float g[kVec], w[kVec];
      grad(pass, g);
      int col, ncols;
      lane_cols(pass, D, &col, &ncols);
      load_w(pass, col, ncols, w);
#pragma unroll
      for (int k = 0; k < kVec; ++k)
        if (k < ncols) {
          s = __fadd_rn(s, opt::row_sq_term(opt::clip_grad(g[k], o), w[k], o));
          if (with_w) sw = __fadd_rn(sw, __fmul_rn(w[k], w[k]));
        }
    }
    end_sweep();
    opt::RowSums sums;
    sums.grad = warp_sum(s);
    if (with_w) sums.weight = warp_sum(sw);
    opt::visit_optimizer(o.type, [&](auto t) {
      using Opt = decltype(t);
      if constexpr (Opt::kReduction != opt::RowReduction::kNone) {
        if constexpr (Opt::kRowState) {
          float state = state_pre;
          terms = Opt::row_terms(&state, sums, D, o, p.corrections);
          if (writer && lane == 0) Opt::row_state(p.momentum1, p.momentum2)[r.key] = state;
        } else {
          terms = Opt::row_terms(nullptr, sums, D, o, p.corrections);
        }
      }
    });
  }

  // The trait's apply of the lane's columns of one pass (the new fp32 values, or LAMB's directions), and
  // their weights before the update (element-wise state updated in place by writer when write_state).
  const auto new_values = [&](int pass, float* nv, float* w, bool write_state) {
    float g[kVec];
    grad(pass, g);
    int col, ncols;
    lane_cols(pass, D, &col, &ncols);
    load_w(pass, col, ncols, w);
    const int64_t e0 = r.wbase + col;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float gk = opt::clip_grad(g[k], o);
      float v = w[k];
      if (k < ncols) {
        opt::visit_optimizer(o.type, [&](auto t) {
          using Opt = decltype(t);
          if constexpr (!Opt::kDense) {
            float m1 = Opt::kElementM1 ? p.momentum1[e0 + k] : 0.0f;
            float m2 = Opt::kElementM2 ? p.momentum2[e0 + k] : 0.0f;
            v = Opt::apply(w[k], gk, terms, &m1, &m2, o, p.corrections);
            if (write_state) {
              if constexpr (Opt::kElementM1) p.momentum1[e0 + k] = m1;
              if constexpr (Opt::kElementM2) p.momentum2[e0 + k] = m2;
            }
          }
        });
      }
      nv[k] = v;
    }
  };
  const int64_t rbase =
      sizeof(W) < sizeof(float) && p.rounding == WeightRounding::kStochastic ? rounding_base_of(p, r) : r.wbase;
  const auto store = [&](int pass, const float* nv) {
    int col, ncols;
    lane_cols(pass, D, &col, &ncols);
    if (!writer || ncols <= 0) return;
    W out[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) out[k] = round_weight<W>(nv[k], p.rounding, p.rounding_key, rbase + col + k);
    store_weights<W, Grad::kAccess>(wrow + col, wvec, ncols, out);
  };

  const bool trust = opt::trust_ratio_step(o.type);
  if (!trust && !opt::renormalises(o)) {
    for (int pass = 0; pass < passes; ++pass) {
      float nv[kVec], w[kVec];
      new_values(pass, nv, w, writer);
      store(pass, nv);
    }
    return;
  }
  // max_norm (the norm of the whole updated row) or LAMB's trust ratio (the norms of the row's weights
  // and directions) first, then the stores. The first sweep writes no state, so the second computes the
  // same values from the same state, and writes it.
  float sq = 0.0f, sw = 0.0f;
  for (int pass = 0; pass < passes; ++pass) {
    float nv[kVec], w[kVec];
    new_values(pass, nv, w, false);
    int col, ncols;
    lane_cols(pass, D, &col, &ncols);
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      if (k < ncols) {
        sq = __fadd_rn(sq, __fmul_rn(nv[k], nv[k]));
        if (trust) sw = __fadd_rn(sw, __fmul_rn(w[k], w[k]));
      }
  }
  end_sweep();
  const float factor = trust ? opt::trust_ratio(warp_sum(sw), warp_sum(sq)) : opt::max_norm_factor(warp_sum(sq), o);
  for (int pass = 0; pass < passes; ++pass) {
    float nv[kVec], w[kVec];
    new_values(pass, nv, w, writer);
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      nv[k] = trust ? opt::trust_step(w[k], nv[k], factor, o) : factor == 1.0f ? nv[k] : nv[k] * factor;
    store(pass, nv);
  }
}

}  // namespace tbe_bwd
}  // namespace cuda
}  // namespace embscale
