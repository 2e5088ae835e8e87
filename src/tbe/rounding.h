// Rounding of updated fp32 weights back to fp16/bf16, written once for the CPU and CUDA backends.
//
// Nearest: round to nearest even (numerics.h).
// Stochastic: x is rounded to one of its two neighbouring representable values, up in magnitude with
// probability (|x| - |lo|) / (|hi| - |lo|) where lo is x truncated toward zero, so E[round(x)] = x
// (up to the 2^-k resolution of the k random bits used: 16 for bf16, 13 for fp16 normals, 24 for fp16
// subnormals). The random bits come from a counter-based hash of (seed, step, element), where element
// is the weight's linear index in the whole buffer (weight_offset(t) + r*D + d): no state, no order
// dependence, identical on CPU and CUDA, reproducible for a given seed and step.
// Edge cases: NaN and infinity round as in nearest mode; |x| beyond the largest finite value of the
// format rounds to nearest (so a finite update never becomes infinity by chance); zero stays zero
// (with its sign).
#pragma once

#include <cstdint>

#include "core/hd.h"
#include "core/numerics.h"
#include "embscale/tbe.h"

namespace embscale {

// The SplitMix64 finalizer: a bijective 64-bit mixer with full avalanche.
EMBSCALE_HD uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// Per-call key: computed once per backward from (seed, step); pass it to kernels by value.
EMBSCALE_HD uint64_t rounding_key(uint64_t seed, int64_t step) {
  return mix64(mix64(seed ^ 0x6a09e667f3bcc909ull) + static_cast<uint64_t>(step) * 0x9e3779b97f4a7c15ull);
}

// A 32-bit multiply-xorshift integer hash (two multiply rounds): 32-bit multiplies only, which GPUs
// run at full rate, where a 64-bit mixer costs several instructions per multiply.
EMBSCALE_HD uint32_t hash32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// 32 random bits for one weight element, in two steps so a kernel can hoist the first out of its
// element loop: the per-call key is folded with the element index's upper half (the same for 2^32
// consecutive elements; rounding_base), then the lower half is hashed with that (rounding_bits_at):
// one 32-bit hash per element.
EMBSCALE_HD uint32_t rounding_base(uint64_t key, uint32_t element_hi) {
  return hash32(element_hi ^ static_cast<uint32_t>(key >> 32)) ^ static_cast<uint32_t>(key);
}
EMBSCALE_HD uint32_t rounding_bits_at(uint32_t base, uint32_t element_lo) { return hash32(element_lo ^ base); }
EMBSCALE_HD uint32_t rounding_bits(uint64_t key, int64_t element) {
  const uint64_t e = static_cast<uint64_t>(element);
  return rounding_bits_at(rounding_base(key, static_cast<uint32_t>(e >> 32)), static_cast<uint32_t>(e));
}

// bf16: adding 16 random bits below the kept mantissa and truncating rounds up with probability
// (low 16 bits) / 2^16, which is the proximity ratio (same sign, monotone bit patterns).
EMBSCALE_HD uint16_t stochastic_round_bf16(float x, uint32_t rnd) {
  const uint32_t u = float_bits(x);
  const uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f7f0000u) return float_to_bf16(x);  // inf, NaN, or beyond the largest finite bf16
  return static_cast<uint16_t>((u + (rnd >> 16)) >> 16);
}

// fp16: normals as for bf16 with 13 dropped bits; subnormals (|x| < 2^-14, a fixed step of 2^-24)
// by comparing the exact fractional part in units of 2^-24 with a 24-bit uniform.
EMBSCALE_HD uint16_t stochastic_round_fp16(float x, uint32_t rnd) {
  const uint32_t u = float_bits(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a >= 0x477fe000u) return float_to_fp16(x);  // >= 65504 (largest finite fp16), inf, NaN
  if (a < 0x38800000u) {                          // below 2^-14
    const float s = bits_float(a) * 16777216.0f;  // units of 2^-24, exact
    const float q = floorf(s);
    const float frac = s - q;                                            // exact, in [0, 1)
    const float r = static_cast<float>(rnd >> 8) * 5.9604644775390625e-8f;  // [0, 1) in steps of 2^-24
    const uint32_t m = static_cast<uint32_t>(q) + (r < frac ? 1u : 0u);  // m <= 1024: 1024 is 2^-14
    return static_cast<uint16_t>(sign | m);
  }
  const uint32_t t = (a + (rnd >> 19)) >> 13;  // 13 random bits
  return static_cast<uint16_t>(sign | (t - (112u << 10)));
}

// Stochastic rounding of an updated fp32 weight to W with the element's random bits (float: unchanged).
template <typename W>
EMBSCALE_HD W stochastic_round(float v, uint32_t rnd);
template <>
EMBSCALE_HD float stochastic_round<float>(float v, uint32_t) { return v; }
template <>
EMBSCALE_HD bf16_t stochastic_round<bf16_t>(float v, uint32_t rnd) { return bf16_t{stochastic_round_bf16(v, rnd)}; }
template <>
EMBSCALE_HD fp16_t stochastic_round<fp16_t>(float v, uint32_t rnd) { return fp16_t{stochastic_round_fp16(v, rnd)}; }

// Round an updated fp32 weight to the storage type W (float: unchanged).
template <typename W>
EMBSCALE_HD W round_weight(float v, WeightRounding mode, uint64_t key, int64_t element);
template <>
EMBSCALE_HD float round_weight<float>(float v, WeightRounding, uint64_t, int64_t) { return v; }
template <>
EMBSCALE_HD bf16_t round_weight<bf16_t>(float v, WeightRounding mode, uint64_t key, int64_t element) {
  if (mode == WeightRounding::kStochastic) return bf16_t{stochastic_round_bf16(v, rounding_bits(key, element))};
  return bf16_t{float_to_bf16(v)};
}
template <>
EMBSCALE_HD fp16_t round_weight<fp16_t>(float v, WeightRounding mode, uint64_t key, int64_t element) {
  if (mode == WeightRounding::kStochastic) return fp16_t{stochastic_round_fp16(v, rounding_bits(key, element))};
  return fp16_t{float_to_fp16(v)};
}

}  // namespace embscale
