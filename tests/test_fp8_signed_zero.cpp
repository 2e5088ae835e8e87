// The sign of zero in the FP8 ops, compared bit for bit on every available backend (the oracle in
// reference_fp8.h orders codes by value, so the other tests take +0 and -0 as equal):
//  * ReLU: fp8.h defines relu(v) = max(v, 0) without naming the sign of a zero result. The library
//    returns +0 for every v <= 0, -0 included (src/fp8/activation.h: "-0 mapped to +0"); pinned here
//    for every input and output dtype, with the amax of such an output +0.
//  * GELU(tanh) and SiLU are v * sigmoid(z) (fp8.h): their sign is v's, so -0 gives -0, +0 gives +0, and
//    a negative v whose result is below the output dtype's smallest subnormal gives -0, not +0.
//  * quantize: y = fp8(x * scale) with -0 * scale = -0, the fp8 code 0x80; dequantize of 0x80 gives -0
//    in every float dtype; amax of -0 is +0 (fp8.h).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "fp8_test_util.h"

namespace embscale {
namespace {

using fp8test::DevScalar;
using fp8test::DevTensor;
using fp8test::float_bits_of;
using ref::HostTensor;

class Fp8SignedZero : public fp8test::Fp8Test {
 protected:
  // y = act(x) in dtype `out`, and the amax.
  HostTensor activation(Activation act, const HostTensor& x, DType out, float* amax_out) {
    DevTensor dx(backend(), x.dtype, x.numel()), dy(backend(), out, x.numel());
    EXPECT_TRUE(dx.upload(ctx(), x).ok());
    EXPECT_TRUE(dy.poison(ctx()).ok());
    DevScalar<float> a(backend());
    a.poison(ctx());
    size_t ws_bytes = 0;
    EXPECT_TRUE(activation_amax_workspace_size(ctx(), dx.vec(), {}, &ws_bytes).ok());
    Buffer ws(backend(), ws_bytes);
    const Status st = activation_amax(ctx(), act, dx.vec(), dy.vec(), a.ptr(), {}, ws.data(), ws_bytes);
    EXPECT_TRUE(st.ok()) << st.to_string();
    EXPECT_TRUE(synchronize(ctx()).ok());
    *amax_out = a.get(ctx());
    return dy.download(ctx());
  }
};

// Inputs of every kind of zero result: -0, +0, negative values of every size, -inf; and positive ones.
HostTensor signed_inputs(DType dt, std::mt19937_64& rng, int64_t n) {
  HostTensor x(dt, n);
  const double fixed[] = {-0.0, 0.0, -1e-30, -1e-8, -0.5, -3.0, -40.0, -200.0, -1e30, -INFINITY, 1e-30, 2.5};
  std::uniform_real_distribution<double> mag(-40.0, 10.0);
  for (int64_t i = 0; i < n; ++i) {
    const double v = i < static_cast<int64_t>(std::size(fixed)) ? fixed[i] : -std::exp2(mag(rng));
    x.set(i, i % 3 == 0 && i >= static_cast<int64_t>(std::size(fixed)) ? -0.0 : v);
  }
  return x;
}

TEST_P(Fp8SignedZero, ReluGivesPositiveZeroForEveryNonPositiveInput) {
  const uint64_t seed = fp8test::case_seed(960);
  std::mt19937_64 rng(seed);
  for (DType dt : fp8test::kFloatDTypes) {
    for (DType out : fp8test::kFloatDTypes) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " -> " + dtype_name(out));
      HostTensor x = signed_inputs(dt, rng, 1000);
      x.set(x.numel() - 1, 2.5);  // one positive value, passed through exactly
      float amax = -1.0f;
      const HostTensor y = activation(Activation::kRelu, x, out, &amax);
      const ref::Format fo = ref::format_of(out);
      int bad = 0;
      for (int64_t i = 0; i < x.numel(); ++i) {
        const double v = x.get(i);
        const uint32_t want = v > 0.0 ? ref::encode(v, fo, false) : 0u;  // +0: all bits clear
        if (y.code(i) != want && ++bad <= 3)
          ADD_FAILURE() << "relu(" << v << ") has code 0x" << std::hex << y.code(i) << ", expected 0x" << want;
      }
      EXPECT_EQ(bad, 0);
      EXPECT_EQ(amax, 2.5f);
      // All non-positive: the amax is +0 as well.
      HostTensor neg = signed_inputs(dt, rng, 300);
      for (int64_t i = 0; i < neg.numel(); ++i) neg.set(i, -std::fabs(neg.get(i)));
      const HostTensor yn = activation(Activation::kRelu, neg, out, &amax);
      for (int64_t i = 0; i < neg.numel(); ++i) ASSERT_EQ(yn.code(i), 0u) << "relu(" << neg.get(i) << ")";
      EXPECT_EQ(float_bits_of(amax), 0u);
    }
  }
}

TEST_P(Fp8SignedZero, GeluAndSiluKeepTheSignOfTheirInput) {
  const uint64_t seed = fp8test::case_seed(961);
  std::mt19937_64 rng(seed);
  for (Activation act : {Activation::kGeluTanh, Activation::kSilu}) {
    for (DType dt : fp8test::kFloatDTypes) {
      for (DType out : fp8test::kFloatDTypes) {
        SCOPED_TRACE(std::string(activation_name(act)) + " " + dtype_name(dt) + " -> " + dtype_name(out));
        HostTensor x = signed_inputs(dt, rng, 1000);
        x.set(9, -87.0);  // -inf: GELU's limit is NaN, not a zero; use a finite deep-tail value instead
        float amax = -1.0f;
        const HostTensor y = activation(act, x, out, &amax);
        const ref::Format fo = ref::format_of(out);
        int zeros = 0, bad = 0;
        for (int64_t i = 0; i < x.numel(); ++i) {
          const double v = x.get(i);
          const double r = ref::activation(act, v);
          if (std::isnan(r)) continue;
          const uint32_t want = ref::encode(r, fo, false), got = y.code(i);
          const uint32_t mag_mask = ref::sign_bit(fo) - 1u;
          // Where the result or the reference is a zero (the value tests allow one code of difference
          // near the smallest subnormal), its sign must be the reference's: v's.
          if ((want & mag_mask) != 0 && (got & mag_mask) != 0) continue;
          ++zeros;
          if ((got & ref::sign_bit(fo)) != (want & ref::sign_bit(fo)) && ++bad <= 3)
            ADD_FAILURE() << activation_name(act) << "(" << v << ") has code 0x" << std::hex << got
                          << ", expected the sign of 0x" << want;
        }
        EXPECT_EQ(bad, 0);
        EXPECT_GT(zeros, 100) << "the inputs must produce zeros of both signs";
      }
    }
  }
}

TEST_P(Fp8SignedZero, CastsKeepNegativeZero) {
  for (DType dt : fp8test::kFloatDTypes) {
    for (DType fp8 : fp8test::kFp8DTypes) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " -> " + dtype_name(fp8));
      const int64_t n = 1000;  // SIMD bodies and scalar tails
      HostTensor x(dt, n);
      for (int64_t i = 0; i < n; ++i) x.set(i, i % 2 ? -0.0 : 0.0);
      DevTensor dx(backend(), dt, n), dy(backend(), fp8, n), dback(backend(), dt, n);
      ASSERT_TRUE(dx.upload(ctx(), x).ok());
      DevScalar<float> s(backend()), si(backend()), a(backend());
      s.set(ctx(), 3.0f);
      si.set(ctx(), 1.0f / 3.0f);
      ASSERT_TRUE(quantize(ctx(), dx.vec(), s.ptr(), dy.vec()).ok());
      ASSERT_TRUE(dequantize(ctx(), dy.vec(), si.ptr(), dback.vec()).ok());
      ASSERT_TRUE(synchronize(ctx()).ok());
      const HostTensor y = dy.download(ctx()), back = dback.download(ctx());
      const uint32_t neg_zero = ref::sign_bit(ref::format_of(dt));
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(y.code(i), i % 2 ? 0x80u : 0u) << "quantize element " << i;
        ASSERT_EQ(back.code(i), i % 2 ? neg_zero : 0u) << "dequantize element " << i;
      }
      size_t ws_bytes = 0;
      ASSERT_TRUE(amax_workspace_size(ctx(), dx.vec(), {}, &ws_bytes).ok());
      Buffer ws(backend(), ws_bytes);
      a.poison(ctx());
      ASSERT_TRUE(amax(ctx(), dx.vec(), a.ptr(), {}, ws.data(), ws_bytes).ok());
      EXPECT_EQ(float_bits_of(a.get(ctx())), 0u) << "amax of -0 and +0 is +0";
    }
  }
}

EMBSCALE_FP8_INSTANTIATE(Fp8SignedZero);

}  // namespace
}  // namespace embscale
