// Activations of the activation+amax fusion (fp8.h), written once for the CPU and CUDA backends and
// evaluated in fp32.
//
// GELU(tanh) is evaluated through the identity 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u)): the tanh form
// cancels catastrophically for negative v (1 + tanh(u) -> 0), the exp form keeps a small relative error
// everywhere, and both give the same values at +-0, +inf and NaN. Overflow of v^3 or exp() is benign:
// it drives the quotient to v or to a signed zero, which is the limit of the function.
#pragma once

#include <cmath>

#include "common/hd.h"
#include "embscale/fp8.h"

namespace embscale {

// max(v, 0) with NaN propagated (so the non-finite flag sees it) and -0 mapped to +0.
EMBSCALE_HD float relu_f(float v) { return (v <= 0.0f) ? 0.0f : v; }

EMBSCALE_HD float gelu_tanh_f(float v) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  const float u = k * (v + 0.044715f * v * v * v);
  return v / (1.0f + expf(-2.0f * u));
}

EMBSCALE_HD float silu_f(float v) { return v / (1.0f + expf(-v)); }

template <Activation kAct>
EMBSCALE_HD float activation_f(float v) {
  if (kAct == Activation::kRelu) return relu_f(v);
  if (kAct == Activation::kGeluTanh) return gelu_tanh_f(v);
  return silu_f(v);
}

}  // namespace embscale
