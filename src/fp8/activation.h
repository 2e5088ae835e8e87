// Activations of the activation+amax fusion (fp8.h), written once for the CPU and CUDA backends and
// evaluated in fp32.
//
// GELU(tanh) and SiLU are v * sigmoid(z) (z = 2u and z = v; 0.5 (1 + tanh u) = sigmoid(2u)), and
// sigmoid(z) is formed from t = exp(-|z|) in (0, 1]: 1 / (1 + t) for z >= 0, t / (1 + t) for z < 0.
// exp() then never overflows and nothing cancels: the tanh form loses everything to 1 + tanh(u) -> 0
// for negative v, and exp(-z) overflows to inf and flushes to zero results that are still bf16 or fp32
// subnormals. The relative error is a few fp32 ulps plus |z| times the relative error of z. At
// +-inf, NaN and overflowing v^3 the result is the function's limit or NaN (GELU(-inf) is NaN).
//
// Device code evaluates the same form with the hardware approximations: t = ex2.approx(-|z| log2 e)
// (relative error 2^-22 plus |z| 2^-24 from rounding the exponent; subnormal t supported) and
// 1 / (1 + t) by rcp.approx (1 + t is in [1, 2]; relative error 2^-23). Against the host form this adds
// about (|z| / 2 + 3) fp32 ulps; where the result is still a normal float, |z| < 104, so the total stays
// far below the 1-code (fp16/bf16) and 2^-14 relative (fp32) tolerances the tests hold both to, and
// the special cases keep their values (t = 0 for |z| = inf, NaN propagates, v * 1 * rcp(1) == v).
#pragma once

#include <cmath>

#include "core/hd.h"
#include "embscale/fp8.h"

namespace embscale {

// max(v, 0) with NaN propagated (so the non-finite flag sees it) and -0 mapped to +0.
EMBSCALE_HD float relu_f(float v) { return (v <= 0.0f) ? 0.0f : v; }

// v * sigmoid(z) without overflow.
EMBSCALE_HD float times_sigmoid_f(float v, float z) {
#if defined(__CUDA_ARCH__)
  float t, r;
  asm("ex2.approx.f32 %0, %1;" : "=f"(t) : "f"(-fabsf(z) * 1.4426950408889634f));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + t));
  return v * (z >= 0.0f ? 1.0f : t) * r;
#else
  const float t = expf(-fabsf(z));
  return v * (z >= 0.0f ? 1.0f : t) / (1.0f + t);
#endif
}

EMBSCALE_HD float gelu_tanh_f(float v) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  const float u = k * (v + 0.044715f * v * v * v);
  return times_sigmoid_f(v, 2.0f * u);
}

EMBSCALE_HD float silu_f(float v) { return times_sigmoid_f(v, v); }

template <Activation kAct>
EMBSCALE_HD float activation_f(float v) {
  if (kAct == Activation::kRelu) return relu_f(v);
  if (kAct == Activation::kGeluTanh) return gelu_tanh_f(v);
  return silu_f(v);
}

}  // namespace embscale
