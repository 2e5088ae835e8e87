// The FP8 scaling rules, written once (fp8.h states them): used by the FP8 capability's CPU backend, CUDA
// kernels and public scale_from_amax(), and by the quantized TBE's fp8 row quantizer on both backends.
#pragma once

#include <cfloat>
#include <cmath>

#include "core/hd.h"
#include "core/numerics.h"

namespace embscale {

EMBSCALE_HD float scale_from_amax_rule(float amax, float fp8_max_value, float eps, bool power_of_2) {
  const float a = (amax < eps) ? eps : amax;  // NaN compares false and stays NaN
  if (a == 0.0f || !is_finite_f(a)) return 1.0f;
#if defined(__CUDA_ARCH__)
  float scale = __fdiv_rn(fp8_max_value, a);
#else
  float scale = fp8_max_value / a;  // IEEE division, round to nearest
#endif
  if (!is_finite_f(scale)) scale = FLT_MAX;  // a finite positive quotient can only overflow to inf
  if (power_of_2) scale = bits_float(float_bits(scale) & 0xff800000u);  // drop the mantissa
  return scale;
}

EMBSCALE_HD float scale_inv_from_scale(float scale) {
#if defined(__CUDA_ARCH__)
  return __frcp_rn(scale);
#else
  return 1.0f / scale;
#endif
}

// |v| as an amax contribution: NaN is skipped (returns 0, reported separately), -0 becomes +0.
EMBSCALE_HD float amax_term(float v) {
  const float a = bits_float(float_bits(v) & 0x7fffffffu);
  return (a == a) ? a : 0.0f;
}

}  // namespace embscale
