// Parts of the FP8 contract (fp8.h) the other FP8 tests leave open, on every available backend:
//  * the no-op flag skips an op only when *noop_flag == 1.0f: 0, 0.5, 2, -1, NaN and the floats next to
//    1 run it (every op that takes the flag);
//  * conversions to fp16/bf16 outputs round to nearest even at exact ties (normal and subnormal), send
//    65520 (the fp16 midpoint past 65504) and above to infinity and keep 65519.99 finite, and keep a NaN
//    a NaN whatever its payload (one in the low mantissa bits only must not truncate to infinity).
//    ReLU passes positive values through unchanged, so its fp32 -> fp16/bf16 output is exactly the
//    conversion; the expected codes come from the oracle's encode (reference_fp8.h).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "fp8_test_util.h"

namespace embscale {
namespace {

using fp8test::DevScalar;
using fp8test::DevTensor;
using fp8test::float_bits_of;
using ref::HostTensor;

class Fp8Contract : public fp8test::Fp8Test {};

float float_of_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST_P(Fp8Contract, NoopFlagSkipsOnlyAtExactlyOne) {
  const int64_t n = 3 * 64;
  HostTensor hx(DType::kF32, n);
  for (int64_t i = 0; i < n; ++i) hx.set(i, 0.25 * static_cast<double>(i % 13) - 1.0);
  DevTensor x(backend(), DType::kF32, n), y(backend(), DType::kF8E4M3, n), yt(backend(), DType::kF8E4M3, n),
      back(backend(), DType::kF32, n), act(backend(), DType::kBF16, n);
  ASSERT_TRUE(x.upload(ctx(), hx).ok());
  DevScalar<float> noop(backend()), a(backend()), s(backend()), si(backend()), one(backend());
  DevScalar<int32_t> flag(backend());
  one.set(ctx(), 1.0f);
  const float values[] = {0.0f, 0.5f, 2.0f, -1.0f, std::nanf(""), -0.0f, std::nextafter(1.0f, 0.0f),
                          std::nextafter(1.0f, 2.0f), 1.0f};
  auto poisoned = [&](const DevTensor& t) {
    const HostTensor h = t.download(ctx());
    for (uint8_t byte : h.bytes)
      if (byte != fp8test::kPoisonByte) return false;
    return true;
  };
  const uint32_t p = 0xA5A5A5A5u;
  for (float v : values) {
    const bool skip = float_bits_of(v) == float_bits_of(1.0f);
    SCOPED_TRACE("noop flag " + std::to_string(v) + " (bits " + std::to_string(float_bits_of(v)) + ")");
    noop.set(ctx(), v);
    AmaxOptions o;
    o.noop_flag = noop.ptr();
    o.nonfinite_flag = flag.ptr();

    a.poison(ctx());
    flag.poison(ctx());
    size_t ws_bytes = 0;
    ASSERT_TRUE(amax_workspace_size(ctx(), x.vec(), o, &ws_bytes).ok());
    Buffer ws(backend(), ws_bytes);
    ASSERT_TRUE(amax(ctx(), x.vec(), a.ptr(), o, ws.data(), ws_bytes).ok());
    ASSERT_TRUE(synchronize(ctx()).ok());
    EXPECT_EQ(float_bits_of(a.get(ctx())) == p, skip) << "amax";
    EXPECT_EQ(static_cast<uint32_t>(flag.get(ctx())) == p, skip) << "amax's non-finite flag";
    if (!skip) EXPECT_EQ(a.get(ctx()), 2.0f);

    s.poison(ctx());
    si.poison(ctx());
    ASSERT_TRUE(compute_scale(ctx(), one.ptr(), DType::kF8E4M3, {}, s.ptr(), si.ptr(), noop.ptr()).ok());
    ASSERT_TRUE(synchronize(ctx()).ok());
    EXPECT_EQ(float_bits_of(s.get(ctx())) == p, skip) << "compute_scale";
    EXPECT_EQ(float_bits_of(si.get(ctx())) == p, skip) << "compute_scale's scale_inv";

    ASSERT_TRUE(y.poison(ctx()).ok());
    ASSERT_TRUE(quantize(ctx(), x.vec(), one.ptr(), y.vec(), noop.ptr()).ok());
    ASSERT_TRUE(synchronize(ctx()).ok());
    EXPECT_EQ(poisoned(y), skip) << "quantize";

    ASSERT_TRUE(back.poison(ctx()).ok());
    ASSERT_TRUE(dequantize(ctx(), y.vec(), one.ptr(), back.vec(), noop.ptr()).ok());
    ASSERT_TRUE(synchronize(ctx()).ok());
    EXPECT_EQ(poisoned(back), skip) << "dequantize";

    ASSERT_TRUE(y.poison(ctx()).ok());
    ASSERT_TRUE(yt.poison(ctx()).ok());
    ASSERT_TRUE(cast_transpose(ctx(), x.mat(3, 64), one.ptr(), y.mat(3, 64), yt.mat(64, 3), noop.ptr()).ok());
    ASSERT_TRUE(synchronize(ctx()).ok());
    EXPECT_EQ(poisoned(y), skip) << "cast_transpose y";
    EXPECT_EQ(poisoned(yt), skip) << "cast_transpose yt";

    ASSERT_TRUE(act.poison(ctx()).ok());
    a.poison(ctx());
    ASSERT_TRUE(activation_amax_workspace_size(ctx(), x.vec(), o, &ws_bytes).ok());
    Buffer ws2(backend(), ws_bytes);
    ASSERT_TRUE(activation_amax(ctx(), Activation::kRelu, x.vec(), act.vec(), a.ptr(), o, ws2.data(), ws_bytes).ok());
    ASSERT_TRUE(synchronize(ctx()).ok());
    EXPECT_EQ(poisoned(act), skip) << "activation_amax";
    EXPECT_EQ(float_bits_of(a.get(ctx())) == p, skip) << "activation_amax's amax";

    ASSERT_TRUE(y.poison(ctx()).ok());
    a.poison(ctx());
    s.poison(ctx());
    CurrentScalingOptions cs;
    cs.amax = o;
    ASSERT_TRUE(quantize_current_scaling_workspace_size(ctx(), x.vec(), cs, &ws_bytes).ok());
    Buffer ws3(backend(), ws_bytes);
    ASSERT_TRUE(
        quantize_current_scaling(ctx(), x.vec(), y.vec(), a.ptr(), s.ptr(), si.ptr(), cs, ws3.data(), ws_bytes).ok());
    ASSERT_TRUE(synchronize(ctx()).ok());
    EXPECT_EQ(poisoned(y), skip) << "quantize_current_scaling y";
    EXPECT_EQ(float_bits_of(a.get(ctx())) == p, skip) << "quantize_current_scaling amax";
    EXPECT_EQ(float_bits_of(s.get(ctx())) == p, skip) << "quantize_current_scaling scale";
  }
}

TEST_P(Fp8Contract, HalfPrecisionOutputsRoundToNearestEvenAtTiesAndEdges) {
  // fp32 values (as bits where it matters) whose fp16 or bf16 rounding is a tie, an edge or a NaN.
  const std::vector<float> values = {
      1.0f + 0x1p-11f,            // fp16 tie between 1 and 1 + 2^-10: even is 1
      1.0f + 3 * 0x1p-11f,        // fp16 tie: even is 1 + 2^-9
      -(1.0f + 3 * 0x1p-11f),     // and negative
      2048.0f + 1.0f,             // fp16 tie (spacing 2 at 2048): even is 2048
      2048.0f + 3.0f,             // fp16 tie: even is 2052
      0x1p-25f,                   // fp16 subnormal tie between 0 and 2^-24: even is 0
      3 * 0x1p-25f,               // fp16 subnormal tie: even is 2^-23
      65519.99f,                  // below the midpoint: 65504
      65520.0f,                   // the midpoint: infinity (even)
      -65520.0f,
      70000.0f,                   // infinity
      1.0f + 0x1p-8f,             // bf16 tie between 1 and 1 + 2^-7: even is 1
      1.0f + 3 * 0x1p-8f,         // bf16 tie: even is 1 + 2^-6
      -(1.0f + 3 * 0x1p-8f),
      0x1.ffp127f,                // bf16 tie above the largest bf16: infinity (even)
      0x1.fefffep127f,            // below that midpoint: the largest bf16
      float_of_bits(0x7f800001u),  // NaN with a payload in the low bits only
      float_of_bits(0x7fc00000u),  // the quiet NaN
      float_of_bits(0xff800001u),  // negative, low payload
  };
  const int64_t n = static_cast<int64_t>(values.size());
  HostTensor hx(DType::kF32, n);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u = float_bits_of(values[i]);
    hx.set_code(i, u);
  }
  for (DType out : {DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(out));
    const ref::Format f = ref::format_of(out);
    DevTensor x(backend(), DType::kF32, n), y(backend(), out, n);
    ASSERT_TRUE(x.upload(ctx(), hx).ok());
    ASSERT_TRUE(y.poison(ctx()).ok());
    DevScalar<float> a(backend());
    size_t ws_bytes = 0;
    ASSERT_TRUE(activation_amax_workspace_size(ctx(), x.vec(), {}, &ws_bytes).ok());
    Buffer ws(backend(), ws_bytes);
    ASSERT_TRUE(activation_amax(ctx(), Activation::kRelu, x.vec(), y.vec(), a.ptr(), {}, ws.data(), ws_bytes).ok());
    ASSERT_TRUE(synchronize(ctx()).ok());
    const HostTensor got = y.download(ctx());
    for (int64_t i = 0; i < n; ++i) {
      const double v = hx.get(i);
      if (std::isnan(v)) {
        EXPECT_TRUE(std::isnan(got.get(i))) << "relu(NaN 0x" << std::hex << hx.code(i) << ") gave code 0x"
                                            << got.code(i) << ", not a NaN";
        continue;
      }
      const uint32_t want = v > 0.0 ? ref::encode(v, f, false) : 0u;  // ReLU: negative values give +0
      EXPECT_EQ(got.code(i), want) << "relu(" << v << "): code 0x" << std::hex << got.code(i) << ", expected 0x"
                                   << want;
    }
  }
}

EMBSCALE_FP8_INSTANTIATE(Fp8Contract);

}  // namespace
}  // namespace embscale
