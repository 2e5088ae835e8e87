// Naive reference for the TBE backward fused with the optimizer, written from the definitions in
// include/embscale/tbe.h and independent of src/: it computes row and weight offsets itself, keeps
// a dense per-row gradient in a std::map (accumulated in double), and applies each optimizer in
// double. Out-of-range indices are skipped (kSkip semantics); lookups before offsets[0] belong to no
// bag. MEAN divides by the bag's valid lookup count. Weights and state are updated in place, in
// double: a test rounds or compares them against a backend's fp32/fp16/bf16 values with a tolerance.
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <vector>

#include "embscale/tbe.h"

namespace embscale {
namespace ref {

struct BwdConfig {
  std::vector<int64_t> num_rows;  // [tables]
  std::vector<int> dims;          // [tables]
  std::vector<int> feature_table; // [T]
};

struct BwdInput {
  std::vector<int64_t> indices;   // [N]
  std::vector<int64_t> offsets;   // [T*B+1]
  std::vector<float> psw;         // [N] or empty (unweighted)
  int64_t batch_size = 0;
  PoolingMode pooling = PoolingMode::kSum;
  std::vector<double> grad_output;  // pooled [B, sum D_f] or sequence [N, D], decoded
};

struct BwdState {
  std::vector<double> w;   // [num_weights]
  std::vector<double> m1;  // row-wise [total_rows] or element-wise [num_weights] per optimizer; else empty
  std::vector<double> m2;
};

struct BwdOutput {
  std::map<int64_t, std::vector<double>> row_grad;  // linearised row -> summed gradient [D]
  std::map<int64_t, std::vector<double>> row_abs;   // linearised row -> sum of |terms| [D] (error bounds)
  std::map<int64_t, int64_t> row_count;             // linearised row -> number of lookups
  std::vector<double> gpsw;                         // [N] gradient w.r.t. the per-sample weights
  int64_t skipped = 0;
};

inline BwdOutput tbe_backward(const BwdConfig& c, const BwdInput& in, const OptimizerParams& p, BwdState* s) {
  const size_t tables = c.num_rows.size();
  std::vector<int64_t> row_off(tables + 1, 0), w_off(tables + 1, 0);
  for (size_t t = 0; t < tables; ++t) {
    row_off[t + 1] = row_off[t] + c.num_rows[t];
    w_off[t + 1] = w_off[t] + c.num_rows[t] * c.dims[t];
  }
  const int64_t T = static_cast<int64_t>(c.feature_table.size());
  const int64_t B = in.batch_size;
  const int64_t N = static_cast<int64_t>(in.indices.size());
  std::vector<int64_t> col(T + 1, 0);
  for (int64_t f = 0; f < T; ++f) col[f + 1] = col[f] + c.dims[c.feature_table[f]];
  const bool seq = in.pooling == PoolingMode::kNone;
  const int64_t stride = seq ? (T > 0 ? c.dims[c.feature_table[0]] : 0) : col[T];

  BwdOutput out;
  out.gpsw.assign(N, 0.0);
  for (int64_t f = 0; f < T; ++f) {
    const int t = c.feature_table[f];
    const int D = c.dims[t];
    for (int64_t b = 0; b < B; ++b) {
      const int64_t s0 = in.offsets[f * B + b], s1 = in.offsets[f * B + b + 1];
      int64_t valid = 0;
      for (int64_t i = s0; i < s1; ++i) valid += (in.indices[i] >= 0 && in.indices[i] < c.num_rows[t]) ? 1 : 0;
      for (int64_t i = s0; i < s1; ++i) {
        const int64_t idx = in.indices[i];
        if (idx < 0 || idx >= c.num_rows[t]) {
          ++out.skipped;
          continue;
        }
        const double* go = in.grad_output.data() + (seq ? i * stride : b * stride + col[f]);
        double scale = 1.0;
        if (!in.psw.empty()) scale = in.psw[i];
        if (in.pooling == PoolingMode::kMean) scale = 1.0 / static_cast<double>(valid);
        std::vector<double>& g = out.row_grad[row_off[t] + idx];
        std::vector<double>& ga = out.row_abs[row_off[t] + idx];
        g.resize(D, 0.0);
        ga.resize(D, 0.0);
        ++out.row_count[row_off[t] + idx];
        double dot = 0.0;
        for (int d = 0; d < D; ++d) {
          g[d] += scale * go[d];
          ga[d] += std::fabs(scale * go[d]);
          dot += s->w[w_off[t] + idx * D + d] * go[d];
        }
        out.gpsw[i] = dot;
      }
    }
  }
  if (p.type == OptimizerType::kNone) return out;

  const double lr = p.learning_rate, eps = p.eps, b1 = p.beta1, b2 = p.beta2, wd = p.weight_decay;
  const bool l2 = p.weight_decay_mode == WeightDecayMode::kL2;
  const bool decoupled = p.weight_decay_mode == WeightDecayMode::kDecoupled;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(p.step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(p.step));
  for (const auto& kv : out.row_grad) {
    const int64_t key = kv.first;
    size_t t = 0;
    while (key >= row_off[t + 1]) ++t;
    const int D = c.dims[t];
    double* w = s->w.data() + w_off[t] + (key - row_off[t]) * D;
    const int64_t e0 = w_off[t] + (key - row_off[t]) * D;  // element-wise state index of d = 0
    std::vector<double> g = kv.second;
    if (p.gradient_clipping > 0)
      for (double& x : g) x = std::min<double>(std::max<double>(x, -p.gradient_clipping), p.gradient_clipping);
    switch (p.type) {
      case OptimizerType::kSgd:
        for (int d = 0; d < D; ++d) w[d] -= lr * g[d];
        break;
      case OptimizerType::kRowwiseAdagrad: {
        double sum = 0;
        for (int d = 0; d < D; ++d) {
          const double gp = l2 ? g[d] + wd * w[d] : g[d];
          sum += gp * gp;
        }
        s->m1[key] += sum / D;
        const double mult = lr / (std::sqrt(s->m1[key]) + eps);
        const double corr = l2 ? 1.0 - mult * wd : decoupled ? 1.0 - lr * wd : 1.0;
        for (int d = 0; d < D; ++d) w[d] = corr * w[d] - mult * g[d];
        if (p.max_norm > 0) {
          double n2 = 0;
          for (int d = 0; d < D; ++d) n2 += w[d] * w[d];
          const double norm = std::sqrt(n2);
          if (norm > p.max_norm)
            for (int d = 0; d < D; ++d) w[d] *= p.max_norm / norm;
        }
        break;
      }
      case OptimizerType::kAdam:  // FBGEMM's ADAM: decoupled weight decay whatever the mode
        for (int d = 0; d < D; ++d) {
          double& m = s->m1[e0 + d];
          double& v = s->m2[e0 + d];
          m = b1 * m + (1 - b1) * g[d];
          v = b2 * v + (1 - b2) * g[d] * g[d];
          const double upd = (m / bc1) / (std::sqrt(v / bc2) + eps) + wd * w[d];
          w[d] -= lr * upd;
        }
        break;
      case OptimizerType::kPartialRowwiseAdam: {  // FBGEMM's PARTIAL_ROWWISE_ADAM: likewise
        double sum = 0;
        for (int d = 0; d < D; ++d) sum += g[d] * g[d];
        double& v = s->m2[key];
        v = b2 * v + (1 - b2) * (sum / D);
        const double denom = std::sqrt(v / bc2) + eps;
        for (int d = 0; d < D; ++d) {
          double& m = s->m1[e0 + d];
          m = b1 * m + (1 - b1) * g[d];
          w[d] -= lr * ((m / bc1) / denom + wd * w[d]);
        }
        break;
      }
      case OptimizerType::kAdagrad:  // FBGEMM's EXACT_ADAGRAD: no weight decay
        for (int d = 0; d < D; ++d) {
          double& m = s->m1[e0 + d];
          m += g[d] * g[d];
          w[d] -= lr * g[d] / (std::sqrt(m) + eps);
        }
        break;
      case OptimizerType::kLamb:                 // FBGEMM's LAMB and PARTIAL_ROWWISE_LAMB: the Adam direction
      case OptimizerType::kPartialRowwiseLamb: {  // plus wd*w, scaled by the row's ||w|| / ||direction||
        double denom_row = 0;
        if (p.type == OptimizerType::kPartialRowwiseLamb) {
          double sum = 0;
          for (int d = 0; d < D; ++d) sum += g[d] * g[d];
          double& v = s->m2[key];
          v = b2 * v + (1 - b2) * (sum / D);
          denom_row = std::sqrt(v / bc2) + eps;
        }
        std::vector<double> r(D);
        double w2 = 0, r2 = 0;
        for (int d = 0; d < D; ++d) {
          double& m = s->m1[e0 + d];
          m = b1 * m + (1 - b1) * g[d];
          double denom = denom_row;
          if (p.type == OptimizerType::kLamb) {
            double& v = s->m2[e0 + d];
            v = b2 * v + (1 - b2) * g[d] * g[d];
            denom = std::sqrt(v / bc2) + eps;
          }
          r[d] = (m / bc1) / denom + wd * w[d];
          w2 += w[d] * w[d];
          r2 += r[d] * r[d];
        }
        const double ratio = r2 > 0 ? std::sqrt(w2) / std::sqrt(r2) : 0.0;  // 0: no step (FBGEMM: NaN)
        for (int d = 0; d < D; ++d) w[d] -= lr * ratio * r[d];
        break;
      }
      case OptimizerType::kLarsSgd: {  // FBGEMM's LARS_SGD
        double w2 = 0, g2 = 0;
        for (int d = 0; d < D; ++d) {
          w2 += w[d] * w[d];
          g2 += g[d] * g[d];
        }
        const double den = std::sqrt(g2) + wd * std::sqrt(w2);
        const double rate = den > 0 ? lr * p.eta * std::sqrt(w2) / den : 0.0;  // 0: momentum alone (FBGEMM: NaN)
        for (int d = 0; d < D; ++d) {
          double& m = s->m1[e0 + d];
          m = p.momentum * m + rate * (g[d] + wd * w[d]);
          w[d] -= m;
        }
        break;
      }
      default: break;
    }
  }
  return out;
}

}  // namespace ref
}  // namespace embscale
