// Branch-free SIMD form of the shared fp32 -> fp8 cast (float_to_fp8_soft in core/numerics.h), used by
// the CPU backend's quantize. It computes the same function on the bits of the fp32 value, lane by lane:
//  * normal range: round-to-nearest-even by integer addition on the bits (the same formula as the
//    shared cast), then rebias;
//  * below the smallest fp8 normal: |v| + M with M = 2^23 * step, whose fp32 rounding (to nearest even,
//    the default mode, as rintf in the shared cast) leaves round(|v| / step) in the low mantissa bits;
//  * |v| >= fp8 max (infinity included): the largest finite code; NaN: 0x7f without the sign;
// and the three results are selected with compares and blends. The SSE4.1 form is always available;
// the AVX2 form is compiled for that target only and chosen at run time. Both were checked against the
// shared cast for all 2^32 fp32 inputs.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "core/numerics.h"

namespace embscale {
namespace cpu {
namespace fp8simd {

template <int kExpBits, int kManBits>
struct Fp8Format {
  static constexpr int kBias = (1 << (kExpBits - 1)) - 1;
  static constexpr int kShift = 23 - kManBits;
  static constexpr uint32_t kRoundHalfMinusOne = (1u << (kShift - 1)) - 1u;
  static constexpr uint32_t kRebias = static_cast<uint32_t>(127 - kBias) << kManBits;
  static constexpr uint32_t kMinNormalBits = static_cast<uint32_t>(127 + 1 - kBias) << 23;
  // |v| * 2^23 / step lies in [2^23, 2^24) for the subnormal grid: M = 2^(23 + 1 - bias - man).
  static constexpr uint32_t kMagicBits = static_cast<uint32_t>(127 + 23 + 1 - kBias - kManBits) << 23;
  static constexpr uint32_t kSatBits = (kExpBits == 4) ? 0x43e00000u : 0x47600000u;  // 448, 57344
  static constexpr uint32_t kMaxCode = (kExpBits == 4) ? 0x7eu : 0x7bu;
};

template <typename F8> struct FormatOf;
template <> struct FormatOf<fp8e4m3_t> { using type = Fp8Format<4, 3>; };
template <> struct FormatOf<fp8e5m2_t> { using type = Fp8Format<5, 2>; };

// ---- SSE4.1: 4 lanes ----
template <typename Fmt>
__attribute__((always_inline)) inline __m128i encode4(__m128 p) {
  const __m128i u = _mm_castps_si128(p);
  const __m128i a = _mm_and_si128(u, _mm_set1_epi32(0x7fffffff));
  const __m128i sign = _mm_and_si128(_mm_srli_epi32(u, 24), _mm_set1_epi32(0x80));
  const __m128i odd = _mm_and_si128(_mm_srli_epi32(a, Fmt::kShift), _mm_set1_epi32(1));
  const __m128i rounded = _mm_add_epi32(_mm_add_epi32(a, _mm_set1_epi32(Fmt::kRoundHalfMinusOne)), odd);
  const __m128i normal = _mm_sub_epi32(_mm_srli_epi32(rounded, Fmt::kShift), _mm_set1_epi32(Fmt::kRebias));
  const __m128i magic = _mm_set1_epi32(static_cast<int>(Fmt::kMagicBits));
  const __m128i sub = _mm_sub_epi32(_mm_castps_si128(_mm_add_ps(_mm_castsi128_ps(a), _mm_castsi128_ps(magic))), magic);
  // a <= 0x7fffffff, so the signed compares order it as unsigned.
  const __m128i is_sub = _mm_cmplt_epi32(a, _mm_set1_epi32(static_cast<int>(Fmt::kMinNormalBits)));
  const __m128i is_sat = _mm_cmpgt_epi32(a, _mm_set1_epi32(static_cast<int>(Fmt::kSatBits - 1u)));
  const __m128i is_nan = _mm_cmpgt_epi32(a, _mm_set1_epi32(0x7f800000));
  __m128i code = _mm_blendv_epi8(normal, sub, is_sub);
  code = _mm_blendv_epi8(code, _mm_set1_epi32(static_cast<int>(Fmt::kMaxCode)), is_sat);
  code = _mm_or_si128(code, sign);
  return _mm_blendv_epi8(code, _mm_set1_epi32(0x7f), is_nan);
}

// Four vectors of 32-bit codes (each <= 0xff) -> 16 bytes in element order.
__attribute__((always_inline)) inline __m128i pack16(__m128i c0, __m128i c1, __m128i c2, __m128i c3) {
  return _mm_packus_epi16(_mm_packus_epi32(c0, c1), _mm_packus_epi32(c2, c3));
}

__attribute__((always_inline)) inline __m128 load4(const float* x) { return _mm_loadu_ps(x); }
// bf16 -> fp32 is the bits shifted up 16.
__attribute__((always_inline)) inline void load8_bf16(const bf16_t* x, __m128* lo, __m128* hi) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
  const __m128i z = _mm_setzero_si128();
  *lo = _mm_castsi128_ps(_mm_unpacklo_epi16(z, v));
  *hi = _mm_castsi128_ps(_mm_unpackhi_epi16(z, v));
}

// y[i] = fp8(x[i] * s) for i < n rounded down to a multiple of 16; returns that count.
template <typename F8>
inline int64_t encode_sse(const float* x, float s, uint8_t* y, int64_t n) {
  using Fmt = typename FormatOf<F8>::type;
  const __m128 vs = _mm_set1_ps(s);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m128i c0 = encode4<Fmt>(_mm_mul_ps(load4(x + i), vs));
    const __m128i c1 = encode4<Fmt>(_mm_mul_ps(load4(x + i + 4), vs));
    const __m128i c2 = encode4<Fmt>(_mm_mul_ps(load4(x + i + 8), vs));
    const __m128i c3 = encode4<Fmt>(_mm_mul_ps(load4(x + i + 12), vs));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), pack16(c0, c1, c2, c3));
  }
  return i;
}

template <typename F8>
inline int64_t encode_sse(const bf16_t* x, float s, uint8_t* y, int64_t n) {
  using Fmt = typename FormatOf<F8>::type;
  const __m128 vs = _mm_set1_ps(s);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m128 v0, v1, v2, v3;
    load8_bf16(x + i, &v0, &v1);
    load8_bf16(x + i + 8, &v2, &v3);
    const __m128i c0 = encode4<Fmt>(_mm_mul_ps(v0, vs));
    const __m128i c1 = encode4<Fmt>(_mm_mul_ps(v1, vs));
    const __m128i c2 = encode4<Fmt>(_mm_mul_ps(v2, vs));
    const __m128i c3 = encode4<Fmt>(_mm_mul_ps(v3, vs));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), pack16(c0, c1, c2, c3));
  }
  return i;
}

// ---- AVX2: 8 lanes, compiled for that target only ----
#define EMBSCALE_FP8_AVX2 __attribute__((target("avx2"), always_inline)) inline

template <typename Fmt>
EMBSCALE_FP8_AVX2 __m256i encode8(__m256 p) {
  const __m256i u = _mm256_castps_si256(p);
  const __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(a, Fmt::kShift), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(a, _mm256_set1_epi32(Fmt::kRoundHalfMinusOne)), odd);
  const __m256i normal = _mm256_sub_epi32(_mm256_srli_epi32(rounded, Fmt::kShift), _mm256_set1_epi32(Fmt::kRebias));
  const __m256i magic = _mm256_set1_epi32(static_cast<int>(Fmt::kMagicBits));
  const __m256i sub =
      _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(magic))), magic);
  const __m256i is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(Fmt::kMinNormalBits)), a);
  const __m256i is_sat = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(static_cast<int>(Fmt::kSatBits - 1u)));
  const __m256i is_nan = _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f800000));
  __m256i code = _mm256_blendv_epi8(normal, sub, is_sub);
  code = _mm256_blendv_epi8(code, _mm256_set1_epi32(static_cast<int>(Fmt::kMaxCode)), is_sat);
  code = _mm256_or_si256(code, sign);
  return _mm256_blendv_epi8(code, _mm256_set1_epi32(0x7f), is_nan);
}

// Four vectors of 8 codes -> 32 bytes in element order (the packs work per 128-bit half; the
// permutation puts the 4-byte groups back in order).
EMBSCALE_FP8_AVX2 __m256i pack32(__m256i c0, __m256i c1, __m256i c2, __m256i c3) {
  const __m256i p = _mm256_packus_epi16(_mm256_packus_epi32(c0, c1), _mm256_packus_epi32(c2, c3));
  return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

EMBSCALE_FP8_AVX2 __m256 load8_bf16_avx2(const bf16_t* x) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

template <typename F8>
__attribute__((target("avx2"))) int64_t encode_avx2(const float* x, float s, uint8_t* y, int64_t n) {
  using Fmt = typename FormatOf<F8>::type;
  const __m256 vs = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i c0 = encode8<Fmt>(_mm256_mul_ps(_mm256_loadu_ps(x + i), vs));
    const __m256i c1 = encode8<Fmt>(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), vs));
    const __m256i c2 = encode8<Fmt>(_mm256_mul_ps(_mm256_loadu_ps(x + i + 16), vs));
    const __m256i c3 = encode8<Fmt>(_mm256_mul_ps(_mm256_loadu_ps(x + i + 24), vs));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), pack32(c0, c1, c2, c3));
  }
  return i;
}

template <typename F8>
__attribute__((target("avx2"))) int64_t encode_avx2(const bf16_t* x, float s, uint8_t* y, int64_t n) {
  using Fmt = typename FormatOf<F8>::type;
  const __m256 vs = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i c0 = encode8<Fmt>(_mm256_mul_ps(load8_bf16_avx2(x + i), vs));
    const __m256i c1 = encode8<Fmt>(_mm256_mul_ps(load8_bf16_avx2(x + i + 8), vs));
    const __m256i c2 = encode8<Fmt>(_mm256_mul_ps(load8_bf16_avx2(x + i + 16), vs));
    const __m256i c3 = encode8<Fmt>(_mm256_mul_ps(load8_bf16_avx2(x + i + 24), vs));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), pack32(c0, c1, c2, c3));
  }
  return i;
}

#undef EMBSCALE_FP8_AVX2

// AVX2 unless the CPU lacks it, decided once. The tests call encode_sse and encode_avx2 directly, so
// both forms are checked on an AVX2 machine.
inline bool use_avx2() {
  static const bool avx2 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return avx2;
}

}  // namespace fp8simd
}  // namespace cpu
}  // namespace embscale
