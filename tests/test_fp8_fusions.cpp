// The FP8 fusions against the oracle, on every available backend:
//  * activation_amax: y = act(x) evaluated in fp32 and rounded to y's dtype. For fp16/bf16 outputs y
//    must be the double reference rounded to that dtype or its neighbour (1 ulp: the fp32 evaluation
//    error is far below half an ulp of those formats but can tip a rounding). For fp32 outputs the
//    bound is that of an fp32 evaluation of v * sigmoid(z): relative |z| * (error of z) + a few ulps,
//    at most 104 * 5 * 2^-24 + 4 * 2^-24 < 2^-15 while exp(-|z|) is not subnormal (|z| < 104), taken
//    with a factor 2 of margin as 2^-14; plus 1e-40 absolute for results in the fp32 subnormals,
//    whose spacing 2^-149 times |v| bounds their error. ReLU is exact.
//    amax must equal max |y| over the y actually returned, exactly.
//  * cast_transpose: y and yt are exactly the oracle's codes, for square, thin and odd shapes.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <string>

#include "fp8_test_util.h"

namespace embscale {
namespace {

using fp8test::DevScalar;
using fp8test::DevTensor;
using fp8test::float_bits_of;
using ref::HostTensor;

class Fp8Fusion : public fp8test::Fp8Test {};

// Whether y (as stored) is acceptable for the double reference value r.
bool activation_close(double got, uint32_t got_code, double r, DType out, Activation act, std::string* why) {
  if (std::isnan(r)) return std::isnan(got);
  if (act == Activation::kRelu || out != DType::kF32) {
    const ref::Format f = ref::format_of(out);
    const uint32_t want = ref::encode(r, f, /*saturate=*/false);
    const int64_t d = ref::ordinal(got_code, f) - ref::ordinal(want, f);
    const int64_t allowed = act == Activation::kRelu ? 0 : 1;
    if (d >= -allowed && d <= allowed) return true;
    *why = "code distance " + std::to_string(d);
    return false;
  }
  const double tol = 0x1p-14 * std::fabs(r) + 1e-40;
  if (std::fabs(got - r) <= tol) return true;
  char buf[96];
  std::snprintf(buf, sizeof(buf), "|diff| %.3g > tol %.3g", std::fabs(got - r), tol);
  *why = buf;
  return false;
}

TEST_P(Fp8Fusion, ActivationAmaxMatchesReference) {
  const int64_t sizes[] = {0, 1, 7, 1000, 65537};
  const Activation acts[] = {Activation::kRelu, Activation::kGeluTanh, Activation::kSilu};
  // Values where the functions are delicate: deep negative tails, exp() overflow, large positives.
  const double specials[] = {-0.0, 0.0, -3.0, -9.5, -12.0, -30.0, -87.0, -89.0, -100.0, 15.0, 300.0, 1e-30, -1e-30};
  uint64_t salt = 500;
  for (Activation act : acts) {
    for (DType dt : fp8test::kFloatDTypes) {
      for (DType out : fp8test::kFloatDTypes) {
        for (int64_t n : sizes) {
          const uint64_t seed = fp8test::case_seed(++salt);
          SCOPED_TRACE(std::string(activation_name(act)) + " " + dtype_name(dt) + "->" + dtype_name(out) +
                       " n=" + std::to_string(n) + " seed=" + std::to_string(seed));
          std::mt19937_64 rng(seed);
          HostTensor x(dt, n);
          fp8test::fill_random(&x, rng, 4.0);
          for (int64_t k = 0; k < n && k < static_cast<int64_t>(std::size(specials)); ++k) x.set(k, specials[k]);
          if (n > 1) x.set(n - 1, 2.5);  // at least one positive input, so no activation is all zeros

          DevTensor dx(backend(), dt, n, salt % 4), dy(backend(), out, n, (salt + 1) % 4);
          ASSERT_TRUE(dx.upload(ctx(), x).ok());
          ASSERT_TRUE(dy.poison(ctx()).ok());
          DevScalar<float> a(backend());
          DevScalar<int32_t> flag(backend());
          a.poison(ctx());
          flag.poison(ctx());
          AmaxOptions opts;
          opts.algo = salt % 2 ? AmaxAlgo::kAtomic : AmaxAlgo::kTwoStage;
          opts.nonfinite_flag = flag.ptr();
          size_t ws_bytes = 0;
          ASSERT_TRUE(activation_amax_workspace_size(ctx(), dx.vec(), opts, &ws_bytes).ok());
          Buffer ws(backend(), ws_bytes);
          const Status st = activation_amax(ctx(), act, dx.vec(), dy.vec(), a.ptr(), opts, ws.data(), ws_bytes);
          ASSERT_TRUE(st.ok()) << st.to_string();
          EXPECT_TRUE(dy.guards_intact(ctx()));
          const HostTensor y = dy.download(ctx());

          double ref_max = 0.0;
          int bad = 0;
          for (int64_t i = 0; i < n; ++i) {
            const double r = ref::activation(act, x.get(i));
            ref_max = std::fmax(ref_max, std::fabs(r));
            std::string why;
            if (!activation_close(y.get(i), y.code(i), r, out, act, &why) && ++bad <= 3)
              ADD_FAILURE() << "index " << i << ": x=" << x.get(i) << " y=" << y.get(i) << " ref=" << r << ": " << why;
          }
          EXPECT_EQ(bad, 0);
          if (n > 1) ASSERT_GT(ref_max, 0.0) << "reference is all zeros";
          const ref::AmaxResult of_y = ref::amax(y);
          EXPECT_EQ(float_bits_of(a.get(ctx())), float_bits_of(of_y.amax)) << "amax must be max |y| as stored";
          EXPECT_EQ(flag.get(ctx()), of_y.nonfinite ? 1 : 0);
        }
      }
    }
  }
}

TEST_P(Fp8Fusion, ActivationPropagatesNaNAndFlagsIt) {
  for (Activation act : {Activation::kRelu, Activation::kGeluTanh, Activation::kSilu}) {
    HostTensor x(DType::kF32, 40000);
    for (int64_t i = 0; i < x.numel(); ++i) x.set(i, 0.001 * static_cast<double>(i % 1000) - 0.3);
    x.set(12345, std::nan(""));
    DevTensor dx(backend(), DType::kF32, x.numel()), dy(backend(), DType::kBF16, x.numel());
    ASSERT_TRUE(dx.upload(ctx(), x).ok());
    DevScalar<float> a(backend()), noop(backend());
    DevScalar<int32_t> flag(backend());
    AmaxOptions opts;
    opts.nonfinite_flag = flag.ptr();
    opts.noop_flag = noop.ptr();
    size_t ws_bytes = 0;
    ASSERT_TRUE(activation_amax_workspace_size(ctx(), dx.vec(), opts, &ws_bytes).ok());
    Buffer ws(backend(), ws_bytes);
    // No-op first: nothing may change.
    noop.set(ctx(), 1.0f);
    ASSERT_TRUE(dy.poison(ctx()).ok());
    a.poison(ctx());
    flag.poison(ctx());
    ASSERT_TRUE(activation_amax(ctx(), act, dx.vec(), dy.vec(), a.ptr(), opts, ws.data(), ws_bytes).ok());
    EXPECT_EQ(float_bits_of(a.get(ctx())), 0xA5A5A5A5u);
    EXPECT_EQ(static_cast<uint32_t>(flag.get(ctx())), 0xA5A5A5A5u);
    EXPECT_EQ(dy.download(ctx()).code(0), 0xA5A5u);
    noop.set(ctx(), 0.0f);
    ASSERT_TRUE(activation_amax(ctx(), act, dx.vec(), dy.vec(), a.ptr(), opts, ws.data(), ws_bytes).ok());
    const HostTensor y = dy.download(ctx());
    EXPECT_TRUE(std::isnan(y.get(12345))) << activation_name(act);
    EXPECT_EQ(flag.get(ctx()), 1) << activation_name(act);
    EXPECT_EQ(a.get(ctx()), ref::amax(y).amax);
    EXPECT_GT(a.get(ctx()), 0.4f);  // act(0.699) for the largest input
  }
}

// ---- cast + transpose ----

TEST_P(Fp8Fusion, CastTransposeMatchesReference) {
  const int64_t shapes[][2] = {{1, 1}, {1, 37}, {45, 1}, {2, 3}, {33, 65}, {128, 256}, {97, 300}, {0, 5}, {5, 0}, {513, 129}};
  uint64_t salt = 700;
  for (DType dt : fp8test::kFloatDTypes) {
    for (DType fp8 : fp8test::kFp8DTypes) {
      for (const auto& sh : shapes) {
        const int64_t rows = sh[0], cols = sh[1], n = rows * cols;
        const uint64_t seed = fp8test::case_seed(++salt);
        SCOPED_TRACE(std::string(dtype_name(dt)) + "->" + dtype_name(fp8) + " " + std::to_string(rows) + "x" +
                     std::to_string(cols) + " seed=" + std::to_string(seed));
        std::mt19937_64 rng(seed);
        HostTensor x(dt, n);
        fp8test::fill_random(&x, rng);
        const float scale = ref::scale(ref::amax(x).amax, fp8_max(fp8), 0.0f, false);
        HostTensor want(fp8, n);
        ref::quantize(x, scale, &want);
        if (n > 4) {
          int64_t nonzero = 0;
          for (int64_t i = 0; i < n; ++i) nonzero += want.get(i) != 0.0;
          ASSERT_GT(nonzero, 0) << "reference is all zeros";
        }

        DevTensor dx(backend(), dt, n, salt % 4), dy(backend(), fp8, n, 1), dyt(backend(), fp8, n, 2);
        ASSERT_TRUE(dx.upload(ctx(), x).ok());
        ASSERT_TRUE(dy.poison(ctx()).ok());
        ASSERT_TRUE(dyt.poison(ctx()).ok());
        DevScalar<float> s(backend());
        s.set(ctx(), scale);
        const Status st = cast_transpose(ctx(), dx.mat(rows, cols), s.ptr(), dy.mat(rows, cols), dyt.mat(cols, rows));
        ASSERT_TRUE(st.ok()) << st.to_string();
        EXPECT_TRUE(dy.guards_intact(ctx()));
        EXPECT_TRUE(dyt.guards_intact(ctx()));
        const HostTensor y = dy.download(ctx()), yt = dyt.download(ctx());
        const ref::Format f = ref::format_of(fp8);
        int bad = 0;
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < cols; ++c) {
            const uint32_t w = want.code(r * cols + c);
            if (!ref::same_code(y.code(r * cols + c), w, f) && ++bad <= 3)
              ADD_FAILURE() << "y[" << r << "][" << c << "] = 0x" << std::hex << y.code(r * cols + c) << ", want 0x" << w;
            if (!ref::same_code(yt.code(c * rows + r), w, f) && ++bad <= 3)
              ADD_FAILURE() << "yt[" << c << "][" << r << "] = 0x" << std::hex << yt.code(c * rows + r) << ", want 0x" << w;
          }
        }
        EXPECT_EQ(bad, 0);
      }
    }
  }
}

TEST_P(Fp8Fusion, CastTransposeNoop) {
  const int64_t rows = 70, cols = 90;
  HostTensor x(DType::kF16, rows * cols);
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, static_cast<double>(i % 13) - 6.0);
  DevTensor dx(backend(), x.dtype, x.numel()), dy(backend(), DType::kF8E4M3, x.numel()), dyt(backend(), DType::kF8E4M3, x.numel());
  ASSERT_TRUE(dx.upload(ctx(), x).ok());
  ASSERT_TRUE(dy.poison(ctx()).ok());
  ASSERT_TRUE(dyt.poison(ctx()).ok());
  DevScalar<float> s(backend()), noop(backend());
  s.set(ctx(), 1.0f);
  noop.set(ctx(), 1.0f);
  ASSERT_TRUE(cast_transpose(ctx(), dx.mat(rows, cols), s.ptr(), dy.mat(rows, cols), dyt.mat(cols, rows), noop.ptr()).ok());
  const HostTensor y = dy.download(ctx()), yt = dyt.download(ctx());
  for (int64_t i = 0; i < y.numel(); ++i) {
    ASSERT_EQ(y.code(i), fp8test::kPoisonByte) << i;
    ASSERT_EQ(yt.code(i), fp8test::kPoisonByte) << i;
  }
}

EMBSCALE_FP8_INSTANTIATE(Fp8Fusion);

}  // namespace
}  // namespace embscale
