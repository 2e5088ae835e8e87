// The TBE backward's optimizer rules, written once for the CPU and CUDA backends (EMBSCALE_HD). The
// backends reach them through the optimizers' traits (optimizer_traits.h), which say which rule each
// optimizer uses at each step; the facts (names, state buffers, hyper-parameters) are in optimizer_table.h.
//
// Shape: a backend first sums each unique row's gradient g[0..D) in fp32 (in sorted lookup order),
// clips it (clip_grad), then
//   * computes the row-level reductions the trait asks for its own way (8 interleaved partial sums on
//     the CPU, a warp or block reduction on CUDA): the sum over d of row_sq_term(g, w) for row-wise
//     Adagrad and partial row-wise Adam, and, for max_norm, the sum of squares of the updated row;
//   * turns them into per-row scalars with rowwise_adagrad_multiplier / partial_rowwise_adam_denominator,
//     which also update the row-wise state in place;
//   * applies the per-element rule (*_apply) to every element of the row, in fp32.
// The reduction order of a row sum is each backend's own fixed order, so each backend is deterministic;
// CPU and CUDA may differ in the last bits of those sums (and by FMA contraction), not in the rules.
//
// Rules (w: fp32 value of the weight before the update; g: summed, clipped gradient; wd: weight decay).
// Each is FBGEMM's (fbgemm_gpu's codegen/genscript/optimizers.py), weight decay included:
//   clip:            g = clamp(g, -c, c) when gradient_clipping c > 0 (before anything else)
//   SGD:             w -= lr * g                                     (weight decay is not applied)
//   row-wise Adagrad g' = g + wd*w in L2 mode, else g;  m += mean_d(g'^2);  mult = lr / (sqrt(m) + eps)
//                    w = corr*w - mult*g,  corr = 1 - mult*wd (L2), 1 - lr*wd (decoupled), else 1;
//                    then if max_norm > 0 and ||w||_2 > max_norm: w *= max_norm / ||w||_2
//   Adam:            m1 = b1*m1 + (1-b1)*g;  m2 = b2*m2 + (1-b2)*g^2
//                    w -= lr * (m1/(1-b1^step) / (sqrt(m2/(1-b2^step)) + eps) + wd*w)
//   partial row-wise Adam: as Adam with the element-wise m2 replaced by a row-wise
//                    v = b2*v + (1-b2)*mean_d(g^2).
//   Adagrad:         m += g^2;  w -= (lr * g) / (sqrt(m) + eps)          (weight decay is not applied)
//   LAMB:            m1, m2 as Adam's;  r = m1/(1-b1^step) / (sqrt(m2/(1-b2^step)) + eps) + wd*w
//                    w -= lr * ratio * r,  ratio = ||w||_2 / ||r||_2 over the row (w before the update)
//   partial row-wise LAMB: as LAMB with partial row-wise Adam's row-wise v in place of m2.
//   LARS-SGD:        rate = lr * eta * ||w||_2 / (||g||_2 + wd * ||w||_2) over the row (w before the update)
//                    m1 = momentum * m1 + rate * (g + wd*w);  w -= m1
// Adam, partial row-wise Adam, LAMB, partial row-wise LAMB and LARS-SGD do not read weight_decay_mode:
// their weight decay is always their own decoupled rule above, as FBGEMM's, which take no mode.
// torch.optim.Adam's L2 (wd*w added to g before the moments) is not offered: FBGEMM has no such optimizer
// either. Where FBGEMM's ratios divide by zero (LAMB: ||r|| = 0; LARS: ||g|| + wd*||w|| = 0, a row of zero
// gradient without decay) and would write NaN into the row, the ratio here is 0: LAMB then leaves the row
// as it is (r is 0), LARS applies its momentum alone.
// mean_d(x) is computed as sum_d(x) / D (a correctly rounded fp32 division of the fp32 sum).
// The bias corrections 1 - beta^step are computed once per call on the host in double and rounded
// to fp32 (adam_corrections), so both backends use the same two floats.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/hd.h"
#include "embscale/tbe.h"

namespace embscale {
namespace opt {

// ---- shared pieces ---------------------------------------------------------------------------------

// Clamp one summed gradient element to [-c, c] when c > 0 (a NaN gradient stays NaN).
EMBSCALE_HD float clip_grad(float g, const OptimizerParams& p) {
  const float c = p.gradient_clipping;
  if (c > 0.0f) {
    if (g > c) return c;
    if (g < -c) return -c;
  }
  return g;
}

// Whether the optimizer adds the L2 term wd*w to the gradient: row-wise Adagrad in L2 mode only (Adam's
// weight decay is decoupled whatever the mode, see above).
EMBSCALE_HD bool adds_l2_term(const OptimizerParams& p) {
  return p.type == OptimizerType::kRowwiseAdagrad && p.weight_decay_mode == WeightDecayMode::kL2;
}

// The gradient the second moment sees: g + wd*w where adds_l2_term, g otherwise.
EMBSCALE_HD float l2_grad(float g, float w, const OptimizerParams& p) {
  return adds_l2_term(p) ? g + p.weight_decay * w : g;
}

// One term of a row's second-moment sum (row-wise Adagrad, partial row-wise Adam): g'^2.
EMBSCALE_HD float row_sq_term(float g, float w, const OptimizerParams& p) {
  const float gp = l2_grad(g, w, p);
  return gp * gp;
}

// The decoupled weight decay term wd*w added to x (Adam's and LAMB's step before the learning rate
// multiplies it, LARS-SGD's gradient); none when wd is 0, so that a row without decay is left bit-identical.
EMBSCALE_HD float adam_decay(float upd, float w, const OptimizerParams& p) {
  return p.weight_decay != 0.0f ? upd + p.weight_decay * w : upd;
}

// Bias corrections of Adam and partial row-wise Adam: 1 - beta1^step and 1 - beta2^step.
struct AdamCorrections {
  float bc1 = 1.0f;
  float bc2 = 1.0f;
};

// Host only: call once per backward, pass the result (a plain struct) to kernels by value.
inline AdamCorrections adam_corrections(const OptimizerParams& p) {
  AdamCorrections c;
  const double s = static_cast<double>(p.step);
  c.bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(p.beta1), s));
  c.bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(p.beta2), s));
  return c;
}

// ---- SGD -------------------------------------------------------------------------------------------
EMBSCALE_HD float sgd_apply(float w, float g, const OptimizerParams& p) { return w - p.learning_rate * g; }

// ---- row-wise Adagrad ------------------------------------------------------------------------------

// m += sum_sq / D (sum_sq = sum over the row of row_sq_term); returns mult = lr / (sqrt(m) + eps).
EMBSCALE_HD float rowwise_adagrad_multiplier(float* m, float sum_sq, int D, const OptimizerParams& p) {
  const float mnew = *m + sum_sq / static_cast<float>(D);
  *m = mnew;
  return p.learning_rate / (sqrtf(mnew) + p.eps);
}

// corr of w = corr*w - mult*g.
EMBSCALE_HD float rowwise_adagrad_correction(float mult, const OptimizerParams& p) {
  switch (p.weight_decay_mode) {
    case WeightDecayMode::kL2: return 1.0f - mult * p.weight_decay;
    case WeightDecayMode::kDecoupled: return 1.0f - p.learning_rate * p.weight_decay;
    default: return 1.0f;
  }
}

// g is the clipped gradient without the L2 term (the L2 term enters through corr).
EMBSCALE_HD float rowwise_adagrad_apply(float w, float g, float mult, float corr) { return corr * w - mult * g; }

// max_norm: the factor applied to the updated row, from the sum of squares of its updated fp32 values
// (1.0f when max_norm <= 0 or the norm is within it, so the row is then left bit-identical).
EMBSCALE_HD float max_norm_factor(float sum_sq_w, const OptimizerParams& p) {
  if (p.max_norm > 0.0f) {
    const float norm = sqrtf(sum_sq_w);
    if (norm > p.max_norm) return p.max_norm / norm;
  }
  return 1.0f;
}

// ---- Adam ------------------------------------------------------------------------------------------

// One element: updates m1, m2 in place and returns the new weight.
EMBSCALE_HD float adam_apply(float w, float g, float* m1, float* m2, const OptimizerParams& p,
                             const AdamCorrections& c) {
  const float a = p.beta1 * *m1 + (1.0f - p.beta1) * g;
  const float b = p.beta2 * *m2 + (1.0f - p.beta2) * (g * g);
  *m1 = a;
  *m2 = b;
  const float m1h = a / c.bc1;
  const float m2h = b / c.bc2;
  const float upd = adam_decay(m1h / (sqrtf(m2h) + p.eps), w, p);
  return w - p.learning_rate * upd;
}

// ---- partial row-wise Adam -------------------------------------------------------------------------

// v = b2*v + (1-b2) * sum_sq / D (sum_sq = sum over the row of row_sq_term); returns the per-row
// denominator sqrt(v / (1 - b2^step)) + eps.
EMBSCALE_HD float partial_rowwise_adam_denominator(float* v, float sum_sq, int D, const OptimizerParams& p,
                                                   const AdamCorrections& c) {
  const float vnew = p.beta2 * *v + (1.0f - p.beta2) * (sum_sq / static_cast<float>(D));
  *v = vnew;
  return sqrtf(vnew / c.bc2) + p.eps;
}

// One element: updates m1 in place and returns the new weight.
EMBSCALE_HD float partial_rowwise_adam_apply(float w, float g, float* m1, float denom, const OptimizerParams& p,
                                             const AdamCorrections& c) {
  const float a = p.beta1 * *m1 + (1.0f - p.beta1) * g;
  *m1 = a;
  const float upd = adam_decay((a / c.bc1) / denom, w, p);
  return w - p.learning_rate * upd;
}

// ---- Adagrad (element-wise) ------------------------------------------------------------------------

// One element: updates m (its sum of squared gradients) in place and returns the new weight.
EMBSCALE_HD float adagrad_apply(float w, float g, float* m, const OptimizerParams& p) {
  const float mnew = *m + g * g;
  *m = mnew;
  return w - (p.learning_rate * g) / (sqrtf(mnew) + p.eps);
}

// ---- LAMB, partial row-wise LAMB --------------------------------------------------------------------

// One element's LAMB direction r (before the trust ratio): updates m1, m2 in place.
EMBSCALE_HD float lamb_direction(float w, float g, float* m1, float* m2, const OptimizerParams& p,
                                 const AdamCorrections& c) {
  const float a = p.beta1 * *m1 + (1.0f - p.beta1) * g;
  const float gg = g * g;
  const float b = p.beta2 * *m2 + (1.0f - p.beta2) * gg;
  *m1 = a;
  *m2 = b;
  return adam_decay((a / c.bc1) / (sqrtf(b / c.bc2) + p.eps), w, p);
}

// Partial row-wise LAMB's direction: updates m1 in place; denom is the row's
// partial_rowwise_adam_denominator (its row-wise v updated there).
EMBSCALE_HD float partial_rowwise_lamb_direction(float w, float g, float* m1, float denom, const OptimizerParams& p,
                                                 const AdamCorrections& c) {
  const float a = p.beta1 * *m1 + (1.0f - p.beta1) * g;
  *m1 = a;
  return adam_decay((a / c.bc1) / denom, w, p);
}

// The row's trust ratio ||w|| / ||r|| from the sums of squares of its weights (before the update) and of
// its directions; 0 when every direction is 0 (FBGEMM's would be inf or NaN, see above).
EMBSCALE_HD float trust_ratio(float sum_sq_w, float sum_sq_r) {
  return sum_sq_r > 0.0f ? sqrtf(sum_sq_w) / sqrtf(sum_sq_r) : 0.0f;
}

// The new weight from its direction r and the row's trust ratio.
EMBSCALE_HD float trust_step(float w, float r, float ratio, const OptimizerParams& p) {
  return w - (p.learning_rate * ratio) * r;
}

// ---- LARS-SGD --------------------------------------------------------------------------------------

// The row's learning rate from the sums of squares of its weights (before the update) and of its
// gradient; 0 when the denominator is 0 (FBGEMM's would be inf or NaN, see above).
EMBSCALE_HD float lars_rate(float sum_sq_w, float sum_sq_g, const OptimizerParams& p) {
  const float wn = sqrtf(sum_sq_w);
  const float den = sqrtf(sum_sq_g) + p.weight_decay * wn;
  return den > 0.0f ? (p.learning_rate * p.eta * wn) / den : 0.0f;
}

// One element: updates m1 (its velocity) in place and returns the new weight.
EMBSCALE_HD float lars_sgd_apply(float w, float g, float* m1, float rate, const OptimizerParams& p) {
  const float v = p.momentum * *m1 + rate * adam_decay(g, w, p);
  *m1 = v;
  return w - v;
}

}  // namespace opt
}  // namespace embscale
