// Naive scalar oracle for the FP8 ops, written from the definitions and independent of src/common:
// every float format is decoded from its bit fields into a double, and rounding into a format is a
// search over that format's codes for the nearest value (ties to the even code), so no bit tricks of
// the library are reused. Slow on purpose; header-only so the tests and `embscale check` share it.
//
// Formats: fp32 (1-8-23), fp16 (1-5-10), bf16 (1-8-7) and OCP fp8 e5m2 (1-5-2) are IEEE-like with
// infinities; fp8 e4m3fn (1-4-3) has no infinity, one NaN pattern per sign (S.1111.111) and its top
// exponent holds normal numbers up to 448. fp8 casts saturate: |v| beyond the largest finite value
// (infinity included) gives +-max; NaN stays NaN.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "embscale/dtype.h"
#include "embscale/fp8.h"

namespace embscale {
namespace ref {

struct Format {
  int exp_bits;
  int man_bits;
  bool has_inf;  // IEEE-like top exponent (inf/NaN); false for e4m3fn
};

inline Format format_of(DType t) {
  switch (t) {
    case DType::kF16: return {5, 10, true};
    case DType::kBF16: return {8, 7, true};
    case DType::kF8E4M3: return {4, 3, false};
    case DType::kF8E5M2: return {5, 2, true};
    default: return {8, 23, true};
  }
}

inline int bias_of(const Format& f) { return (1 << (f.exp_bits - 1)) - 1; }
inline uint32_t sign_bit(const Format& f) { return 1u << (f.exp_bits + f.man_bits); }
inline uint32_t top_exp(const Format& f) { return (1u << f.exp_bits) - 1u; }

// Value of a code as a double (exact: every format here fits in a double).
inline double decode(uint32_t code, const Format& f) {
  const bool neg = (code & sign_bit(f)) != 0;
  const uint32_t e = (code >> f.man_bits) & top_exp(f);
  const uint32_t m = code & ((1u << f.man_bits) - 1u);
  double mag;
  if (f.has_inf && e == top_exp(f)) {
    mag = m ? NAN : INFINITY;
  } else if (!f.has_inf && e == top_exp(f) && m == (1u << f.man_bits) - 1u) {
    mag = NAN;
  } else if (e == 0) {
    mag = std::ldexp(static_cast<double>(m), 1 - bias_of(f) - f.man_bits);
  } else {
    mag = std::ldexp(1.0 + std::ldexp(static_cast<double>(m), -f.man_bits), static_cast<int>(e) - bias_of(f));
  }
  return neg ? -mag : mag;
}

inline uint32_t max_finite_code(const Format& f) {
  return f.has_inf ? (top_exp(f) << f.man_bits) - 1u : (top_exp(f) << f.man_bits) | ((1u << f.man_bits) - 2u);
}
inline uint32_t nan_code(const Format& f) {
  return f.has_inf ? (top_exp(f) << f.man_bits) | (1u << (f.man_bits - 1)) : (top_exp(f) << f.man_bits) | ((1u << f.man_bits) - 1u);
}

// Nearest code to v, ties to the even code. saturate: |v| beyond the largest finite value (inf too)
// gives +-max; otherwise (IEEE formats) the value one step past the largest finite, 2^(emax+1), is
// the infinity code, so overflow rounds to inf exactly as IEEE round-to-nearest-even does.
inline uint32_t encode(double v, const Format& f, bool saturate) {
  const uint32_t sign = std::signbit(v) ? sign_bit(f) : 0u;
  if (std::isnan(v)) return sign | nan_code(f);
  const double a = std::fabs(v);
  const uint32_t maxc = max_finite_code(f);
  if (saturate || !f.has_inf) {
    if (a >= decode(maxc, f)) return sign | maxc;
  }
  const uint32_t top = (saturate || !f.has_inf) ? maxc : maxc + 1;  // maxc + 1 is the inf code
  auto val = [&](uint32_t c) {
    return c == maxc + 1 ? std::ldexp(1.0, static_cast<int>(top_exp(f)) - bias_of(f)) : decode(c, f);
  };
  if (a >= val(top)) return sign | top;
  uint32_t lo = 0, hi = top;  // invariant: val(lo) <= a < val(hi)
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (val(mid) <= a) lo = mid; else hi = mid;
  }
  const double dlo = a - val(lo), dhi = val(hi) - a;
  const uint32_t c = dlo < dhi ? lo : dhi < dlo ? hi : ((lo % 2 == 0) ? lo : hi);
  return sign | c;
}

// Position of a code on the number line (sign-magnitude -> signed integer); +0 and -0 coincide.
inline int64_t ordinal(uint32_t code, const Format& f) {
  const int64_t mag = code & (sign_bit(f) - 1u);
  return (code & sign_bit(f)) ? -mag : mag;
}

inline bool is_nan_code(uint32_t code, const Format& f) { return std::isnan(decode(code, f)); }

// Same value, NaN matching any NaN.
inline bool same_code(uint32_t a, uint32_t b, const Format& f) {
  if (is_nan_code(a, f) || is_nan_code(b, f)) return is_nan_code(a, f) && is_nan_code(b, f);
  return a == b;
}

// ---- host tensors of any float dtype, as raw codes ----
struct HostTensor {
  DType dtype = DType::kF32;
  std::vector<uint8_t> bytes;

  HostTensor() = default;
  HostTensor(DType t, int64_t n) : dtype(t), bytes(static_cast<size_t>(n) * dtype_size(t), 0) {}
  int64_t numel() const { return static_cast<int64_t>(bytes.size() / dtype_size(dtype)); }
  uint32_t code(int64_t i) const {
    uint32_t c = 0;
    std::memcpy(&c, bytes.data() + i * dtype_size(dtype), dtype_size(dtype));  // little-endian
    return c;
  }
  void set_code(int64_t i, uint32_t c) { std::memcpy(bytes.data() + i * dtype_size(dtype), &c, dtype_size(dtype)); }
  double get(int64_t i) const { return decode(code(i), format_of(dtype)); }
  // Rounds v to nearest (IEEE overflow to inf; fp8 saturating).
  void set(int64_t i, double v) { set_code(i, encode(v, format_of(dtype), is_fp8_dtype(dtype))); }
};

// ---- the ops ----
struct AmaxResult {
  float amax = 0.0f;
  bool nonfinite = false;
};

// max |v| over the non-NaN elements (exact in double); any inf or NaN sets nonfinite.
inline AmaxResult amax(const HostTensor& x) {
  double m = 0.0;
  bool nonfinite = false;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = x.get(i);
    if (std::isnan(v) || std::isinf(v)) nonfinite = true;
    if (!std::isnan(v) && std::fabs(v) > m) m = std::fabs(v);
  }
  return {static_cast<float>(m), nonfinite};
}

// scale = fp8_max / max(amax, eps) rounded to nearest fp32; 1 for 0/inf/NaN; FLT_MAX on overflow;
// power_of_2 rounds down to 2^floor(log2 scale). The quotient of two floats is computed in double and
// rounded once more to float, which equals the correctly rounded fp32 quotient (53 >= 2*24 + 2).
inline float scale(float amax_v, float fp8_max_v, float eps, bool power_of_2) {
  const double a = std::isnan(amax_v) ? static_cast<double>(amax_v) : std::fmax(amax_v, eps);
  if (a == 0.0 || std::isinf(a) || std::isnan(a)) return 1.0f;
  const double q = static_cast<double>(fp8_max_v) / a;
  float s = static_cast<float>(q);
  if (std::isinf(s)) s = FLT_MAX;
  if (power_of_2) {
    int e = 0;
    std::frexp(s, &e);  // s = f * 2^e, f in [0.5, 1)
    s = static_cast<float>(std::ldexp(1.0, e - 1));
  }
  return s;
}

inline float scale_inv(float s) { return static_cast<float>(1.0 / static_cast<double>(s)); }

// fp8 code of x[i]: the fp32 product x * scale (one IEEE rounding), then the saturating fp8 rounding.
inline uint32_t quantize_code(double x, float s, DType fp8) {
  const float p = static_cast<float>(x) * s;
  return encode(p, format_of(fp8), /*saturate=*/true);
}

inline void quantize(const HostTensor& x, float s, HostTensor* y) {
  for (int64_t i = 0; i < x.numel(); ++i) y->set_code(i, quantize_code(x.get(i), s, y->dtype));
}

// x[i] = float(y[i]) * scale_inv (one fp32 rounding), then rounded to x's dtype.
inline void dequantize(const HostTensor& y, float s_inv, HostTensor* x) {
  for (int64_t i = 0; i < y.numel(); ++i) {
    const float p = static_cast<float>(y.get(i)) * s_inv;
    x->set(i, p);
  }
}

// Activations in double. GELU(tanh) = 0.5 v (1 + tanh u), u = sqrt(2/pi) (v + 0.044715 v^3); for u < 0
// the same value is formed as v e^{2u} / (1 + e^{2u}) so 1 + tanh u does not cancel.
inline double activation(Activation act, double v) {
  if (std::isnan(v)) return v;
  if (act == Activation::kRelu) return v > 0.0 ? v : 0.0;
  if (act == Activation::kSilu) return v / (1.0 + std::exp(-v));
  const double u = std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v);
  if (u >= 0.0) return 0.5 * v * (1.0 + std::tanh(u));
  const double e = std::exp(2.0 * u);
  return v * e / (1.0 + e);
}

}  // namespace ref
}  // namespace embscale
