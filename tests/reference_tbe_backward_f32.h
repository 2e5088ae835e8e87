// fp32 reference of the TBE backward's weight update: the value each updated weight has in fp32 just
// before it is rounded to an fp16/bf16 weights buffer, computed with the operations, in the order, the
// library documents (tbe.h; the rules in src/tbe/optimizer.h) and independent of src/:
//  * each unique row's gradient summed in fp32 in lookup order, starting from +0 (0 + s*x, then
//    acc + s*x; each product rounded, no fused multiply-add), s = 1, the per-sample weight, or for MEAN
//    the fp32 reciprocal 1/count of the bag's valid lookups;
//  * clipping, then the optimizer's per-element formulas evaluated in fp32, one rounding per operation;
//  * row sums (row-wise Adagrad's and the partial row-wise optimizers' mean of g'^2, max-norm's sum of
//    squares, LAMB's and LARS's norms)
//    in the CPU backend's fixed order: 8 interleaved partial sums combined as
//    ((p0+p4)+(p2+p6))+((p1+p5)+(p3+p7)). The CUDA backend sums rows in its own order and may contract
//    products into FMAs, so on CUDA this reference is within the fp32 tolerance, not bit-identical.
// Compiled for the tests' baseline x86-64 target, which has no FMA instructions to contract into.
// Rounding to fp16/bf16 is the caller's (reference_fp8.h's encode, from the value).
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <vector>

#include "embscale/tbe.h"
#include "reference_tbe_backward.h"

namespace embscale {
namespace ref {

struct F32Update {
  std::vector<float> w;              // [num_weights] fp32 value after the update (untouched: before)
  std::vector<unsigned char> updated;  // [num_weights] 1 where the element's row was updated
};

// sum over d of t[d] in the CPU backend's order (see above).
inline float row_sum_f32(const std::vector<float>& t) {
  float p[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  const int D = static_cast<int>(t.size());
  int d = 0;
  for (; d + 8 <= D; d += 8)
    for (int k = 0; k < 8; ++k) p[k] = p[k] + t[d + k];
  for (int k = 0; d + k < D; ++k) p[k] = p[k] + t[d + k];
  return ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
}

// One backward step on fp32 copies of the weights w and the state m1, m2 (updated in place, like the
// library's fp32 state). `in` as for tbe_backward (grad_output holds values exact in fp32).
inline F32Update tbe_backward_f32(const BwdConfig& c, const BwdInput& in, const OptimizerParams& p,
                                  const std::vector<float>& w, std::vector<float>* m1, std::vector<float>* m2) {
  const size_t tables = c.num_rows.size();
  std::vector<int64_t> row_off(tables + 1, 0), w_off(tables + 1, 0);
  for (size_t t = 0; t < tables; ++t) {
    row_off[t + 1] = row_off[t] + c.num_rows[t];
    w_off[t + 1] = w_off[t] + c.num_rows[t] * c.dims[t];
  }
  const int64_t T = static_cast<int64_t>(c.feature_table.size());
  const int64_t B = in.batch_size;
  std::vector<int64_t> col(T + 1, 0);
  for (int64_t f = 0; f < T; ++f) col[f + 1] = col[f] + c.dims[c.feature_table[f]];
  const bool seq = in.pooling == PoolingMode::kNone;
  const int64_t stride = seq ? (T > 0 ? c.dims[c.feature_table[0]] : 0) : col[T];

  // Lookups per linearised row, in lookup order: (grad_output offset, scale).
  struct Term {
    int64_t go;
    float s;
  };
  std::map<int64_t, std::vector<Term>> rows;
  for (int64_t f = 0; f < T; ++f) {
    const int t = c.feature_table[f];
    for (int64_t b = 0; b < B; ++b) {
      const int64_t s0 = in.offsets[f * B + b], s1 = in.offsets[f * B + b + 1];
      int64_t valid = 0;
      for (int64_t i = s0; i < s1; ++i) valid += (in.indices[i] >= 0 && in.indices[i] < c.num_rows[t]) ? 1 : 0;
      const float mean_scale = valid > 0 ? 1.0f / static_cast<float>(valid) : 0.0f;
      for (int64_t i = s0; i < s1; ++i) {
        const int64_t idx = in.indices[i];
        if (idx < 0 || idx >= c.num_rows[t]) continue;
        float s = 1.0f;
        if (!in.psw.empty()) s = in.psw[i];
        if (in.pooling == PoolingMode::kMean) s = mean_scale;
        rows[row_off[t] + idx].push_back(Term{seq ? i * stride : b * stride + col[f], s});
      }
    }
  }

  F32Update out;
  out.w = w;
  out.updated.assign(w.size(), 0);
  if (p.type == OptimizerType::kNone) return out;
  const float lr = p.learning_rate, eps = p.eps, b1 = p.beta1, b2 = p.beta2, wd = p.weight_decay;
  const bool l2 = p.weight_decay_mode == WeightDecayMode::kL2;
  const bool decoupled = p.weight_decay_mode == WeightDecayMode::kDecoupled;
  const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(b1), static_cast<double>(p.step)));
  const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(b2), static_cast<double>(p.step)));
  const float clip = p.gradient_clipping;

  for (const auto& kv : rows) {
    const int64_t key = kv.first;
    size_t t = 0;
    while (key >= row_off[t + 1]) ++t;
    const int D = c.dims[t];
    const int64_t e0 = w_off[t] + (key - row_off[t]) * D;
    std::vector<float> g(D), wr(D), nw(D), sq(D);
    for (int d = 0; d < D; ++d) {
      float acc = 0.0f;
      bool first = true;
      for (const Term& term : kv.second) {
        const float x = static_cast<float>(in.grad_output[term.go + d]);
        const float prod = term.s * x;
        acc = first ? 0.0f + prod : acc + prod;
        first = false;
      }
      if (clip > 0.0f) acc = acc > clip ? clip : acc < -clip ? -clip : acc;
      g[d] = acc;
      wr[d] = w[e0 + d];
    }
    auto l2_grad = [&](int d) {
      if (!l2) return g[d];
      const float decay = wd * wr[d];
      return g[d] + decay;
    };
    switch (p.type) {
      case OptimizerType::kSgd:
        for (int d = 0; d < D; ++d) {
          const float step = lr * g[d];
          nw[d] = wr[d] - step;
        }
        break;
      case OptimizerType::kRowwiseAdagrad: {
        for (int d = 0; d < D; ++d) {
          const float gp = l2_grad(d);
          sq[d] = gp * gp;
        }
        const float mean_sq = row_sum_f32(sq) / static_cast<float>(D);
        float& m = (*m1)[key];
        m = m + mean_sq;
        const float mult = lr / (std::sqrt(m) + eps);
        float corr = 1.0f;
        if (l2) {
          const float mw = mult * wd;
          corr = 1.0f - mw;
        } else if (decoupled) {
          const float lw = lr * wd;
          corr = 1.0f - lw;
        }
        for (int d = 0; d < D; ++d) {
          const float a = corr * wr[d];
          const float b = mult * g[d];
          nw[d] = a - b;
        }
        if (p.max_norm > 0.0f) {
          for (int d = 0; d < D; ++d) sq[d] = nw[d] * nw[d];
          const float norm = std::sqrt(row_sum_f32(sq));
          if (norm > p.max_norm) {
            const float factor = p.max_norm / norm;
            for (int d = 0; d < D; ++d) nw[d] = nw[d] * factor;
          }
        }
        break;
      }
      case OptimizerType::kAdam:  // FBGEMM's ADAM: decoupled weight decay whatever the mode
        for (int d = 0; d < D; ++d) {
          const float gp = g[d];
          float& ma = (*m1)[e0 + d];
          float& mb = (*m2)[e0 + d];
          const float a1 = b1 * ma, a2 = (1.0f - b1) * gp;
          const float a = a1 + a2;
          const float gg = gp * gp;
          const float v1 = b2 * mb, v2 = (1.0f - b2) * gg;
          const float v = v1 + v2;
          ma = a;
          mb = v;
          const float mh = a / bc1, vh = v / bc2;
          float upd = mh / (std::sqrt(vh) + eps);
          if (wd != 0.0f) {
            const float dw = wd * wr[d];
            upd = upd + dw;
          }
          const float step = lr * upd;
          nw[d] = wr[d] - step;
        }
        break;
      case OptimizerType::kPartialRowwiseAdam: {  // FBGEMM's PARTIAL_ROWWISE_ADAM: likewise
        for (int d = 0; d < D; ++d) sq[d] = g[d] * g[d];
        const float mean_sq = row_sum_f32(sq) / static_cast<float>(D);
        float& v = (*m2)[key];
        const float v1 = b2 * v, v2 = (1.0f - b2) * mean_sq;
        v = v1 + v2;
        const float denom = std::sqrt(v / bc2) + eps;
        for (int d = 0; d < D; ++d) {
          float& ma = (*m1)[e0 + d];
          const float a1 = b1 * ma, a2 = (1.0f - b1) * g[d];
          ma = a1 + a2;
          float upd = (ma / bc1) / denom;
          if (wd != 0.0f) {
            const float dw = wd * wr[d];
            upd = upd + dw;
          }
          const float step = lr * upd;
          nw[d] = wr[d] - step;
        }
        break;
      }
      case OptimizerType::kAdagrad:  // FBGEMM's EXACT_ADAGRAD
        for (int d = 0; d < D; ++d) {
          float& m = (*m1)[e0 + d];
          const float gg = g[d] * g[d];
          m = m + gg;
          const float step = lr * g[d];
          const float den = std::sqrt(m) + eps;
          nw[d] = wr[d] - step / den;
        }
        break;
      case OptimizerType::kLamb:
      case OptimizerType::kPartialRowwiseLamb: {  // FBGEMM's LAMB and PARTIAL_ROWWISE_LAMB
        float denom_row = 0.0f;
        if (p.type == OptimizerType::kPartialRowwiseLamb) {
          for (int d = 0; d < D; ++d) sq[d] = g[d] * g[d];
          const float mean_sq = row_sum_f32(sq) / static_cast<float>(D);
          float& v = (*m2)[key];
          const float v1 = b2 * v, v2 = (1.0f - b2) * mean_sq;
          v = v1 + v2;
          denom_row = std::sqrt(v / bc2) + eps;
        }
        std::vector<float> r(D);
        for (int d = 0; d < D; ++d) {
          float& ma = (*m1)[e0 + d];
          const float a1 = b1 * ma, a2 = (1.0f - b1) * g[d];
          ma = a1 + a2;
          float denom = denom_row;
          if (p.type == OptimizerType::kLamb) {
            float& mb = (*m2)[e0 + d];
            const float gg = g[d] * g[d];
            const float v1 = b2 * mb, v2 = (1.0f - b2) * gg;
            mb = v1 + v2;
            denom = std::sqrt(mb / bc2) + eps;
          }
          float rd = (ma / bc1) / denom;
          if (wd != 0.0f) {
            const float dw = wd * wr[d];
            rd = rd + dw;
          }
          r[d] = rd;
        }
        for (int d = 0; d < D; ++d) sq[d] = wr[d] * wr[d];
        const float sw = row_sum_f32(sq);
        for (int d = 0; d < D; ++d) sq[d] = r[d] * r[d];
        const float sr = row_sum_f32(sq);
        const float ratio = sr > 0.0f ? std::sqrt(sw) / std::sqrt(sr) : 0.0f;
        const float lr_ratio = lr * ratio;
        for (int d = 0; d < D; ++d) {
          const float step = lr_ratio * r[d];
          nw[d] = wr[d] - step;
        }
        break;
      }
      case OptimizerType::kLarsSgd: {  // FBGEMM's LARS_SGD
        for (int d = 0; d < D; ++d) sq[d] = g[d] * g[d];
        const float sg = row_sum_f32(sq);
        for (int d = 0; d < D; ++d) sq[d] = wr[d] * wr[d];
        const float wn = std::sqrt(row_sum_f32(sq));
        const float dwn = wd * wn;
        const float den = std::sqrt(sg) + dwn;
        const float lre = lr * p.eta;
        const float rate = den > 0.0f ? (lre * wn) / den : 0.0f;
        for (int d = 0; d < D; ++d) {
          float& m = (*m1)[e0 + d];
          float gd = g[d];
          if (wd != 0.0f) {
            const float dw = wd * wr[d];
            gd = gd + dw;
          }
          const float v1 = p.momentum * m, v2 = rate * gd;
          m = v1 + v2;
          nw[d] = wr[d] - m;
        }
        break;
      }
      default: break;
    }
    for (int d = 0; d < D; ++d) {
      out.w[e0 + d] = nw[d];
      out.updated[e0 + d] = 1;
    }
  }
  return out;
}

}  // namespace ref
}  // namespace embscale
