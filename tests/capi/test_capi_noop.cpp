// The C API's FP8 ops with their no-op flag (each op's last argument) on the CPU backend, where the flag is
// host memory: with *noop_flag == 1 every output keeps its sentinel, with any other value (0, 2) and with a
// NULL flag the results equal the naive reference (tests/reference_fp8.h), and arguments are checked either
// way.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "embscale/embscale_c.h"
#include "reference_fp8.h"

namespace {

using embscale::DType;
namespace ref = embscale::ref;

constexpr float kSentinel = 12345.0f;
constexpr uint8_t kSentinelCode = 0x5A;
constexpr int32_t kFlagSentinel = 7;
constexpr int64_t kRows = 5, kCols = 7, kN = kRows * kCols;

embscale_context cpu() { return embscale_context{0, 1, nullptr}; }

embscale_tensor tensor(void* data, DType dtype, std::vector<int64_t> shape) {
  embscale_tensor t{};
  t.data = data;
  t.dtype = static_cast<int32_t>(dtype);
  t.ndim = static_cast<int32_t>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
  return t;
}

class CapiNoop : public ::testing::TestWithParam<float> {  // the flag's value; 1 skips
 protected:
  void SetUp() override {
    const unsigned seed = 20261201u;
    std::printf("seed %u\n", seed);
    std::mt19937 gen(seed);
    std::normal_distribution<float> dist(0.0f, 3.0f);
    x.resize(kN);
    for (float& v : x) v = dist(gen);
    x_ref = ref::HostTensor(DType::kF32, kN);
    for (int64_t i = 0; i < kN; ++i) x_ref.set(i, x[i]);
    flag = GetParam();
  }
  bool skips() const { return flag == 1.0f; }
  std::vector<uint8_t> codes() const { return std::vector<uint8_t>(kN, kSentinelCode); }
  std::vector<uint8_t> ref_codes(float scale) const {
    ref::HostTensor y(DType::kF8E4M3, kN);
    ref::quantize(x_ref, scale, &y);
    return y.bytes;
  }

  std::vector<float> x;
  ref::HostTensor x_ref;
  float flag = 0.0f;
  embscale_context ctx = cpu();
};

TEST_P(CapiNoop, Amax) {
  float amax = kSentinel;
  int32_t nonfinite = kFlagSentinel;
  embscale_tensor xd = tensor(x.data(), DType::kF32, {kN});
  ASSERT_EQ(embscale_amax(&ctx, &xd, &amax, 0, &nonfinite, nullptr, 0, &flag), 0) << embscale_last_error();
  EXPECT_EQ(amax, skips() ? kSentinel : ref::amax(x_ref).amax);
  EXPECT_EQ(nonfinite, skips() ? kFlagSentinel : 0);
}

TEST_P(CapiNoop, ComputeScale) {
  const float amax = 3.5f;
  float scale = kSentinel, scale_inv = kSentinel;
  ASSERT_EQ(embscale_compute_scale(&ctx, &amax, static_cast<int32_t>(DType::kF8E4M3), 0.0f, 0, &scale, &scale_inv,
                                   &flag), 0) << embscale_last_error();
  const float want = ref::scale(amax, 448.0f, 0.0f, false);
  EXPECT_EQ(scale, skips() ? kSentinel : want);
  EXPECT_EQ(scale_inv, skips() ? kSentinel : ref::scale_inv(want));
}

TEST_P(CapiNoop, QuantizeAndDequantize) {
  const float scale = 16.0f, scale_inv = 1.0f / 16.0f;
  std::vector<uint8_t> y = codes();
  embscale_tensor xd = tensor(x.data(), DType::kF32, {kN}), yd = tensor(y.data(), DType::kF8E4M3, {kN});
  ASSERT_EQ(embscale_quantize(&ctx, &xd, &scale, &yd, &flag), 0) << embscale_last_error();
  EXPECT_EQ(y, skips() ? codes() : ref_codes(scale));

  std::vector<uint8_t> codes_in = ref_codes(scale);
  std::vector<float> back(kN, kSentinel);
  embscale_tensor cd = tensor(codes_in.data(), DType::kF8E4M3, {kN}), bd = tensor(back.data(), DType::kF32, {kN});
  ASSERT_EQ(embscale_dequantize(&ctx, &cd, &scale_inv, &bd, &flag), 0) << embscale_last_error();
  ref::HostTensor c_ref(DType::kF8E4M3, kN), b_ref(DType::kF32, kN);
  c_ref.bytes = codes_in;
  ref::dequantize(c_ref, scale_inv, &b_ref);
  for (int64_t i = 0; i < kN; ++i) EXPECT_EQ(back[i], skips() ? kSentinel : static_cast<float>(b_ref.get(i))) << i;
}

TEST_P(CapiNoop, QuantizeCurrentScaling) {
  std::vector<uint8_t> y = codes();
  float amax = kSentinel, scale = kSentinel, scale_inv = kSentinel;
  int32_t nonfinite = kFlagSentinel;
  embscale_tensor xd = tensor(x.data(), DType::kF32, {kN}), yd = tensor(y.data(), DType::kF8E4M3, {kN});
  size_t bytes = 0;
  ASSERT_EQ(embscale_quantize_current_scaling_workspace_size(&ctx, &xd, 0, &bytes), 0);
  std::vector<uint8_t> ws(bytes);
  ASSERT_EQ(embscale_quantize_current_scaling(&ctx, &xd, &yd, &amax, &scale, &scale_inv, 0, 0.0f, 0, &nonfinite,
                                              ws.data(), bytes, &flag), 0)
      << embscale_last_error();
  const float want_amax = ref::amax(x_ref).amax, want_scale = ref::scale(want_amax, 448.0f, 0.0f, false);
  EXPECT_EQ(amax, skips() ? kSentinel : want_amax);
  EXPECT_EQ(scale, skips() ? kSentinel : want_scale);
  EXPECT_EQ(scale_inv, skips() ? kSentinel : ref::scale_inv(want_scale));
  EXPECT_EQ(nonfinite, skips() ? kFlagSentinel : 0);
  EXPECT_EQ(y, skips() ? codes() : ref_codes(want_scale));
}

TEST_P(CapiNoop, ActivationAmax) {
  std::vector<float> y(kN, kSentinel);
  float amax = kSentinel;
  embscale_tensor xd = tensor(x.data(), DType::kF32, {kN}), yd = tensor(y.data(), DType::kF32, {kN});
  ASSERT_EQ(embscale_activation_amax(&ctx, 0, &xd, &yd, &amax, 0, nullptr, 0, &flag), 0) << embscale_last_error();
  float want_amax = 0.0f;
  for (int64_t i = 0; i < kN; ++i) {
    const float relu = x[i] > 0.0f ? x[i] : 0.0f;
    EXPECT_EQ(y[i], skips() ? kSentinel : relu) << i;
    want_amax = std::fmax(want_amax, relu);
  }
  EXPECT_EQ(amax, skips() ? kSentinel : want_amax);
}

TEST_P(CapiNoop, CastTranspose) {
  const float scale = 16.0f;
  std::vector<uint8_t> y = codes(), yt = codes();
  embscale_tensor xd = tensor(x.data(), DType::kF32, {kRows, kCols});
  embscale_tensor yd = tensor(y.data(), DType::kF8E4M3, {kRows, kCols});
  embscale_tensor ytd = tensor(yt.data(), DType::kF8E4M3, {kCols, kRows});
  ASSERT_EQ(embscale_cast_transpose(&ctx, &xd, &scale, &yd, &ytd, &flag), 0) << embscale_last_error();
  const std::vector<uint8_t> want = ref_codes(scale);
  for (int64_t r = 0; r < kRows; ++r) {
    for (int64_t c = 0; c < kCols; ++c) {
      EXPECT_EQ(y[r * kCols + c], skips() ? kSentinelCode : want[r * kCols + c]);
      EXPECT_EQ(yt[c * kRows + r], skips() ? kSentinelCode : want[r * kCols + c]);
    }
  }
}

// A skipped call still checks its arguments: a bad one is an error naming it, and nothing is written.
TEST_P(CapiNoop, ArgumentsAreCheckedWhetherOrNotTheOpRuns) {
  std::vector<int32_t> ints(kN, 0);
  float amax = kSentinel;
  embscale_tensor xd = tensor(ints.data(), DType::kI32, {kN});
  EXPECT_EQ(embscale_amax(&ctx, &xd, &amax, 0, nullptr, nullptr, 0, &flag), 1);  // invalid_argument
  EXPECT_NE(std::string(embscale_last_error()).find("x"), std::string::npos) << embscale_last_error();
  EXPECT_EQ(amax, kSentinel);
}

INSTANTIATE_TEST_SUITE_P(Flag, CapiNoop, ::testing::Values(1.0f, 0.0f, 2.0f),
                         [](const ::testing::TestParamInfo<float>& i) {
                           return i.param == 1.0f ? std::string("Skip") : "Run" + std::to_string(int(i.param));
                         });

// A NULL flag runs the op.
TEST(CapiNoopNull, NullFlagRuns) {
  std::vector<float> x = {1.0f, -6.5f, 2.0f};
  float amax = kSentinel;
  embscale_context ctx = cpu();
  embscale_tensor xd = tensor(x.data(), DType::kF32, {3});
  ASSERT_EQ(embscale_amax(&ctx, &xd, &amax, 0, nullptr, nullptr, 0, nullptr), 0) << embscale_last_error();
  EXPECT_EQ(amax, 6.5f);
}

}  // namespace
