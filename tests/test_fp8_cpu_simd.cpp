// The CPU quantize's two SIMD forms (src/fp8/cpu/fp8_cast_simd.h), SSE4.1 and AVX2, called directly so
// that both are checked on any machine that has them, whichever the library picks at run time: every
// bf16 pattern and a seeded sample of fp32 patterns (zeros, subnormals, infinities and NaNs included),
// scaled, against the naive fp8 rounding of tests/reference_fp8.h, for both fp8 formats.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "fp8/cpu/fp8_cast_simd.h"
#include "reference_fp8.h"

namespace embscale {
namespace {

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") != 0;
}

float float_of(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// fp32 inputs: every value a bf16 pattern stands for, then seeded random bit patterns. A multiple of
// 32 elements, so both forms (16 and 32 elements a step) cover all of it.
std::vector<float> fp32_inputs() {
  std::vector<float> x;
  for (uint32_t h = 0; h < 65536; ++h) x.push_back(float_of(h << 16));
  std::mt19937 rng(20261201);
  while (x.size() < 65536 + 32768) x.push_back(float_of(static_cast<uint32_t>(rng())));
  return x;
}

// Code of the fp32 product x * s in format F8 (saturating), from the definition.
template <typename F8>
std::vector<uint8_t> reference_codes(const std::vector<float>& x, float s) {
  const DType dt = std::is_same_v<F8, fp8e4m3_t> ? DType::kF8E4M3 : DType::kF8E5M2;
  std::vector<uint8_t> want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = static_cast<uint8_t>(ref::quantize_code(x[i], s, dt));
  return want;
}

// Number of positions where got differs from want (NaN codes match any NaN code of the format).
template <typename F8>
int64_t mismatches(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want, int64_t n, const char* what) {
  const ref::Format f = ref::format_of(std::is_same_v<F8, fp8e4m3_t> ? DType::kF8E4M3 : DType::kF8E5M2);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (ref::same_code(got[i], want[i], f)) continue;
    if (bad++ < 5) ADD_FAILURE() << what << " element " << i << ": code " << int(got[i]) << ", expected " << int(want[i]);
  }
  return bad;
}

template <typename F8>
void check_format() {
  const std::vector<float> x = fp32_inputs();
  std::vector<bf16_t> xb(65536);
  for (uint32_t h = 0; h < 65536; ++h) xb[h].bits = static_cast<uint16_t>(h);
  const int64_t n = static_cast<int64_t>(x.size());
  const bool avx2 = cpu_has_avx2();
  for (float s : {1.0f, 0.3712f, 151.8f}) {
    SCOPED_TRACE("scale " + std::to_string(s));
    const std::vector<uint8_t> want = reference_codes<F8>(x, s);
    std::vector<uint8_t> got(x.size());
    ASSERT_EQ(cpu::fp8simd::encode_sse<F8>(x.data(), s, got.data(), n), n);
    EXPECT_EQ(mismatches<F8>(got, want, n, "sse fp32"), 0);
    // The bf16 inputs are the first 65536 fp32 inputs.
    ASSERT_EQ(cpu::fp8simd::encode_sse<F8>(xb.data(), s, got.data(), 65536), 65536);
    EXPECT_EQ(mismatches<F8>(got, want, 65536, "sse bf16"), 0);
    if (!avx2) continue;
    ASSERT_EQ(cpu::fp8simd::encode_avx2<F8>(x.data(), s, got.data(), n), n);
    EXPECT_EQ(mismatches<F8>(got, want, n, "avx2 fp32"), 0);
    ASSERT_EQ(cpu::fp8simd::encode_avx2<F8>(xb.data(), s, got.data(), 65536), 65536);
    EXPECT_EQ(mismatches<F8>(got, want, 65536, "avx2 bf16"), 0);
  }
  if (!avx2) GTEST_SKIP() << "this CPU has no AVX2: only the SSE4.1 form was checked";
}

TEST(Fp8CpuSimd, E4M3BothFormsMatchTheDefinition) { check_format<fp8e4m3_t>(); }
TEST(Fp8CpuSimd, E5M2BothFormsMatchTheDefinition) { check_format<fp8e5m2_t>(); }

// Both forms process whole steps only (16 and 32 elements) and leave the rest to the scalar cast.
TEST(Fp8CpuSimd, FormsStopAtWholeSteps) {
  std::vector<float> x(47, 1.0f);
  std::vector<uint8_t> y(47, 0);
  EXPECT_EQ(cpu::fp8simd::encode_sse<fp8e4m3_t>(x.data(), 1.0f, y.data(), 47), 32);
  if (cpu_has_avx2()) EXPECT_EQ(cpu::fp8simd::encode_avx2<fp8e4m3_t>(x.data(), 1.0f, y.data(), 47), 32);
  EXPECT_EQ(y[32], 0) << "an element past the last whole step was written";
}

}  // namespace
}  // namespace embscale
