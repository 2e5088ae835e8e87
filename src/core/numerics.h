// Bit-exact conversions between fp32 and the 16-bit / 8-bit float formats, written once for the CPU
// and CUDA backends. On the host they are software (round-to-nearest-even, like the hardware); in
// device code the fp8 casts use the hardware cvt instructions, which compute the same function.
//
// Storage types are plain structs over the bits so host code needs no CUDA headers.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/hd.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#endif

namespace embscale {

struct fp16_t { uint16_t bits; };
struct bf16_t { uint16_t bits; };
struct fp8e4m3_t { uint8_t bits; };
struct fp8e5m2_t { uint8_t bits; };

constexpr float kFp8E4M3Max = 448.0f;
constexpr float kFp8E5M2Max = 57344.0f;

EMBSCALE_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

EMBSCALE_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// Classification on the bits, so it holds under any floating-point compiler flags.
EMBSCALE_HD bool is_finite_f(float f) { return (float_bits(f) & 0x7f800000u) != 0x7f800000u; }
EMBSCALE_HD bool is_nan_f(float f) { return (float_bits(f) & 0x7fffffffu) > 0x7f800000u; }

// ---- bf16 ----
EMBSCALE_HD float bf16_to_float(uint16_t b) { return bits_float(static_cast<uint32_t>(b) << 16); }

EMBSCALE_HD uint16_t float_to_bf16(float f) {
  // Kept in software on the device too: the hardware cvt.rn.bf16.f32 measured no faster in the TBE forward
  // and 2.6% slower in its bf16 sequence mode (H200, same run).
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

// ---- fp16 ----
EMBSCALE_HD float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0x1fu) return bits_float(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp == 0) {
    const float mag = static_cast<float>(man) * 5.9604644775390625e-8f;  // man * 2^-24, exact
    return sign ? -mag : mag;
  }
  return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}

// Software round-to-nearest-even (host; and the reference the device form is tested against).
EMBSCALE_HD uint16_t float_to_fp16_soft(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (a < 0x38800000u) {                                                // below 2^-14: subnormal
    const float q = rintf(bits_float(a) * 16777216.0f);                 // units of 2^-24, exact scaling
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(q));
  }
  const uint32_t r = (a + 0x0fffu + ((a >> 13) & 1u)) >> 13;
  return static_cast<uint16_t>(sign | (r - (112u << 10)));
}

EMBSCALE_HD uint16_t float_to_fp16(float f) {
#if defined(__CUDA_ARCH__)
  // One cvt.rn.f16.f32: the same result as the software form for every non-NaN input (round to nearest
  // even, >= 65520 to inf, subnormals rounded); NaN keeps the software form's quiet NaN with its sign
  // (the hardware returns a canonical one).
  if (is_nan_f(f)) return float_to_fp16_soft(f);
  return __half_as_ushort(__float2half_rn(f));
#else
  return float_to_fp16_soft(f);
#endif
}

// ---- fp8 (OCP e4m3fn and e5m2), saturating to the largest finite value, NaN kept ----
// Software form for any (exponent bits, mantissa bits). fp8 e4m3fn has no infinity and one NaN
// pattern (S.1111.111), so its largest finite value is 448 (S.1111.110); e5m2 is IEEE-like (max 57344).
template <int kExpBits, int kManBits>
EMBSCALE_HD uint8_t float_to_fp8_soft(float f) {
  constexpr int kBias = (1 << (kExpBits - 1)) - 1;
  constexpr uint8_t kMaxBits = (kExpBits == 4) ? 0x7e : 0x7b;
  constexpr float kMax = (kExpBits == 4) ? kFp8E4M3Max : kFp8E5M2Max;
  const uint32_t u = float_bits(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7f;  // NaN -> the canonical positive NaN code, as the hardware cvt gives
  const float af = bits_float(a);
  if (af >= kMax) return static_cast<uint8_t>(sign | kMaxBits);  // saturate (inf included)
  // Smallest normal is 2^(1 - bias); below it the grid is uniform with step 2^(1 - bias - man).
  const float min_normal = bits_float(static_cast<uint32_t>(127 + 1 - kBias) << 23);
  if (af < min_normal) {
    const float step_inv = bits_float(static_cast<uint32_t>(127 - (1 - kBias - kManBits)) << 23);
    const float q = rintf(af * step_inv);  // exact power-of-two scaling, then round to nearest even
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(q));
  }
  constexpr int kShift = 23 - kManBits;
  const uint32_t r = (a + ((1u << (kShift - 1)) - 1u) + ((a >> kShift) & 1u)) >> kShift;
  return static_cast<uint8_t>(sign | static_cast<uint8_t>(r - (static_cast<uint32_t>(127 - kBias) << kManBits)));
}

template <int kExpBits, int kManBits>
EMBSCALE_HD float fp8_to_float_soft(uint8_t v) {
  constexpr int kBias = (1 << (kExpBits - 1)) - 1;
  const bool neg = (v & 0x80) != 0;
  const uint32_t exp = (v >> kManBits) & ((1u << kExpBits) - 1u);
  const uint32_t man = v & ((1u << kManBits) - 1u);
  float mag;
  if (kExpBits == 4 && exp == 0xf && man == 0x7) {
    mag = bits_float(0x7fc00000u);  // e4m3fn NaN
  } else if (kExpBits == 5 && exp == 0x1f) {
    mag = man ? bits_float(0x7fc00000u) : bits_float(0x7f800000u);
  } else if (exp == 0) {
    const float step = bits_float(static_cast<uint32_t>(127 + 1 - kBias - kManBits) << 23);
    mag = static_cast<float>(man) * step;
  } else {
    mag = bits_float(((exp + 127u - kBias) << 23) | (man << (23 - kManBits)));
  }
  return neg ? -mag : mag;
}

EMBSCALE_HD uint8_t float_to_e4m3(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3));
#else
  return float_to_fp8_soft<4, 3>(f);
#endif
}
EMBSCALE_HD uint8_t float_to_e5m2(float f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E5M2));
#else
  return float_to_fp8_soft<5, 2>(f);
#endif
}
EMBSCALE_HD float e4m3_to_float(uint8_t v) { return fp8_to_float_soft<4, 3>(v); }
EMBSCALE_HD float e5m2_to_float(uint8_t v) { return fp8_to_float_soft<5, 2>(v); }

// ---- typed load/store used by templated kernels: to_float(T) and from_float<T>(float) ----
EMBSCALE_HD float to_float(float v) { return v; }
EMBSCALE_HD float to_float(fp16_t v) { return fp16_to_float(v.bits); }
EMBSCALE_HD float to_float(bf16_t v) { return bf16_to_float(v.bits); }
EMBSCALE_HD float to_float(fp8e4m3_t v) { return e4m3_to_float(v.bits); }
EMBSCALE_HD float to_float(fp8e5m2_t v) { return e5m2_to_float(v.bits); }

template <typename T>
EMBSCALE_HD T from_float(float v);
template <>
EMBSCALE_HD float from_float<float>(float v) { return v; }
template <>
EMBSCALE_HD fp16_t from_float<fp16_t>(float v) { return fp16_t{float_to_fp16(v)}; }
template <>
EMBSCALE_HD bf16_t from_float<bf16_t>(float v) { return bf16_t{float_to_bf16(v)}; }
template <>
EMBSCALE_HD fp8e4m3_t from_float<fp8e4m3_t>(float v) { return fp8e4m3_t{float_to_e4m3(v)}; }
template <>
EMBSCALE_HD fp8e5m2_t from_float<fp8e5m2_t>(float v) { return fp8e5m2_t{float_to_e5m2(v)}; }

}  // namespace embscale
