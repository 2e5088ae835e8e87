// amax and compute_scale against the oracle (tests/reference_fp8.h), on every available backend:
// exact equality of amax for all input dtypes, edge sizes and misaligned pointers, both algorithms
// bit-identical, an unknown algorithm refused by every amax-based op, -0/inf/NaN and the non-finite flag, the no-op flag,
// and the scale rule on TransformerEngine's edge cases.
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

class Fp8Amax : public fp8test::Fp8Test {
 protected:
  // Runs amax with `algo` on x (uploaded at `offset`); returns the amax and writes the flag.
  float run_amax(const HostTensor& x, AmaxAlgo algo, int64_t offset, int32_t* flag_out) {
    DevTensor dx(backend(), x.dtype, x.numel(), offset);
    EXPECT_TRUE(dx.poison(ctx()).ok());
    EXPECT_TRUE(dx.upload(ctx(), x).ok());
    DevScalar<float> out(backend());
    DevScalar<int32_t> flag(backend());
    out.poison(ctx());
    flag.poison(ctx());
    AmaxOptions opts;
    opts.algo = algo;
    opts.nonfinite_flag = flag.ptr();
    size_t ws_bytes = 0;
    EXPECT_TRUE(amax_workspace_size(ctx(), dx.vec(), opts, &ws_bytes).ok());
    Buffer ws(backend(), ws_bytes);
    // Any workspace content on entry: all-ones bytes look like a huge, non-finite block maximum.
    if (ws_bytes > 0) EXPECT_TRUE(fill_bytes(ctx(), ws.data(), 0xFF, ws_bytes).ok());
    const Status st = amax(ctx(), dx.vec(), out.ptr(), opts, ws.data(), ws_bytes);
    EXPECT_TRUE(st.ok()) << st.to_string();
    EXPECT_TRUE(synchronize(ctx()).ok());
    EXPECT_TRUE(dx.guards_intact(ctx()));
    if (flag_out) *flag_out = flag.get(ctx());
    return out.get(ctx());
  }
};

TEST_P(Fp8Amax, MatchesReferenceExactly) {
  const int64_t sizes[] = {0, 1, 2, 3, 7, 31, 1000, 4097, 65537, 1 << 20, 786433, 2000003};
  uint64_t salt = 0;
  for (DType dt : fp8test::kFloatDTypes) {
    for (int64_t n : sizes) {
      const uint64_t seed = fp8test::case_seed(++salt);
      SCOPED_TRACE(std::string(dtype_name(dt)) + " n=" + std::to_string(n) + " seed=" + std::to_string(seed));
      std::mt19937_64 rng(seed);
      HostTensor x(dt, n);
      fp8test::fill_random(&x, rng);
      const ref::AmaxResult want = ref::amax(x);
      if (n > 0) ASSERT_GT(want.amax, 0.0f);
      ASSERT_FALSE(want.nonfinite);
      const int64_t offset = static_cast<int64_t>(salt % 4);  // 0..3 elements past the allocation start
      int32_t flag_a = -1, flag_b = -1;
      const float a = run_amax(x, AmaxAlgo::kAtomic, offset, &flag_a);
      const float b = run_amax(x, AmaxAlgo::kTwoStage, offset, &flag_b);
      // Each algorithm against the reference (max |x|, NaN skipped, -0 -> +0), bit for bit. On the CPU
      // both algorithms may share their code, so comparing them with each other would prove nothing
      // there; on CUDA they are different kernels and must also agree with each other.
      EXPECT_EQ(float_bits_of(a), float_bits_of(want.amax)) << "atomic: " << a << " vs " << want.amax;
      EXPECT_EQ(float_bits_of(b), float_bits_of(want.amax)) << "two_stage: " << b << " vs " << want.amax;
      if (backend() == Backend::kCuda) EXPECT_EQ(float_bits_of(a), float_bits_of(b)) << "atomic and two_stage differ";
      EXPECT_EQ(flag_a, 0);
      EXPECT_EQ(flag_b, 0);
      if (n > 0 && n <= 4097) {  // every misalignment, for sizes around the vector widths
        for (int64_t off = 1; off <= 3; ++off) {
          const float c = run_amax(x, AmaxAlgo::kAuto, off, nullptr);
          EXPECT_EQ(float_bits_of(c), float_bits_of(want.amax)) << "offset " << off;
        }
      }
    }
  }
}

TEST_P(Fp8Amax, MaximumAtEveryPositionOfSmallInputs) {
  // A single large element walks over every position (and alignment) of short inputs, so heads,
  // vector bodies and tails of every kernel shape each have to see it.
  for (DType dt : fp8test::kFloatDTypes) {
    for (int64_t n : {1, 5, 17, 40, 67}) {
      for (int64_t pos = 0; pos < n; ++pos) {
        HostTensor x(dt, n);
        for (int64_t i = 0; i < n; ++i) x.set(i, (i % 2 ? -1.0 : 1.0) * (0.25 + 0.01 * static_cast<double>(i % 7)));
        x.set(pos, -96.0);
        const float want = ref::amax(x).amax;
        ASSERT_EQ(want, 96.0f);
        for (AmaxAlgo algo : {AmaxAlgo::kAtomic, AmaxAlgo::kTwoStage}) {
          const float got = run_amax(x, algo, pos % 4, nullptr);
          EXPECT_EQ(got, want) << dtype_name(dt) << " n=" << n << " pos=" << pos << " " << amax_algo_name(algo);
        }
      }
    }
  }
}

TEST_P(Fp8Amax, SignedZerosInfinitiesAndNaN) {
  const double kNaN = std::nan("");
  for (DType dt : fp8test::kFloatDTypes) {
    for (int64_t n : {1, 33, 70001}) {
      for (AmaxAlgo algo : {AmaxAlgo::kAtomic, AmaxAlgo::kTwoStage}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " n=" + std::to_string(n) + " " + amax_algo_name(algo));
        int32_t flag = -1;
        HostTensor zeros(dt, n);
        for (int64_t i = 0; i < n; ++i) zeros.set(i, -0.0);
        const float z = run_amax(zeros, algo, 1, &flag);
        EXPECT_EQ(float_bits_of(z), 0u) << "-0 must give +0";
        EXPECT_EQ(flag, 0);

        for (int64_t pos : {int64_t{0}, n / 2, n - 1}) {
          HostTensor x(dt, n);
          for (int64_t i = 0; i < n; ++i) x.set(i, 0.5 + static_cast<double>(i % 11));
          const float finite_max = ref::amax(x).amax;
          x.set(pos, kNaN);
          const ref::AmaxResult want = ref::amax(x);
          ASSERT_TRUE(want.nonfinite);
          const float got = run_amax(x, algo, 0, &flag);
          EXPECT_EQ(float_bits_of(got), float_bits_of(want.amax)) << "NaN at " << pos;
          EXPECT_LE(got, finite_max);
          EXPECT_EQ(flag, 1) << "NaN at " << pos;

          x.set(pos, -INFINITY);
          EXPECT_EQ(run_amax(x, algo, 2, &flag), INFINITY) << "-inf at " << pos;
          EXPECT_EQ(flag, 1);
        }
        HostTensor all_nan(dt, n);
        for (int64_t i = 0; i < n; ++i) all_nan.set(i, i % 2 ? -kNaN : kNaN);
        EXPECT_EQ(float_bits_of(run_amax(all_nan, algo, 3, &flag)), 0u);
        EXPECT_EQ(flag, 1);
      }
    }
  }
}

TEST_P(Fp8Amax, EmptyInputGivesZeroWithNullData) {
  DevScalar<float> out(backend());
  DevScalar<int32_t> flag(backend());
  out.poison(ctx());
  flag.poison(ctx());
  AmaxOptions opts;
  opts.nonfinite_flag = flag.ptr();
  for (AmaxAlgo algo : {AmaxAlgo::kAtomic, AmaxAlgo::kTwoStage, AmaxAlgo::kAuto}) {
    opts.algo = algo;
    size_t ws_bytes = 0;
    ASSERT_TRUE(amax_workspace_size(ctx(), TensorView::vec(nullptr, DType::kBF16, 0), opts, &ws_bytes).ok());
    Buffer ws(backend(), ws_bytes);
    const Status st = amax(ctx(), TensorView::vec(nullptr, DType::kBF16, 0), out.ptr(), opts, ws.data(), ws_bytes);
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(float_bits_of(out.get(ctx())), 0u);
    EXPECT_EQ(flag.get(ctx()), 0);
  }
}

TEST_P(Fp8Amax, NoopFlagLeavesOutputsUntouched) {
  const uint64_t seed = fp8test::case_seed(900);
  std::mt19937_64 rng(seed);
  HostTensor x(DType::kF32, 100003);
  fp8test::fill_random(&x, rng);
  x.set(17, std::nan(""));
  DevTensor dx(backend(), DType::kF32, x.numel());
  ASSERT_TRUE(dx.upload(ctx(), x).ok());
  DevScalar<float> out(backend()), noop(backend());
  DevScalar<int32_t> flag(backend());
  for (AmaxAlgo algo : {AmaxAlgo::kAtomic, AmaxAlgo::kTwoStage}) {
    AmaxOptions opts;
    opts.algo = algo;
    opts.nonfinite_flag = flag.ptr();
    opts.noop_flag = noop.ptr();
    size_t ws_bytes = 0;
    ASSERT_TRUE(amax_workspace_size(ctx(), dx.vec(), opts, &ws_bytes).ok());
    Buffer ws(backend(), ws_bytes);
    out.poison(ctx());
    flag.poison(ctx());
    noop.set(ctx(), 1.0f);
    ASSERT_TRUE(amax(ctx(), dx.vec(), out.ptr(), opts, ws.data(), ws_bytes).ok());
    EXPECT_EQ(float_bits_of(out.get(ctx())), 0xA5A5A5A5u) << amax_algo_name(algo);
    EXPECT_EQ(static_cast<uint32_t>(flag.get(ctx())), 0xA5A5A5A5u);
    noop.set(ctx(), 0.0f);
    ASSERT_TRUE(amax(ctx(), dx.vec(), out.ptr(), opts, ws.data(), ws_bytes).ok());
    EXPECT_EQ(out.get(ctx()), ref::amax(x).amax);
    EXPECT_EQ(flag.get(ctx()), 1);
  }
}

// The algorithm is an argument only (the library reads no environment variable for it): every op that
// takes one refuses a value outside AmaxAlgo, naming the argument, in the size query and in the call,
// and writes nothing.
TEST_P(Fp8Amax, UnknownAlgorithmIsRefusedByEveryAmaxOp) {
  const StatusCode kBad = StatusCode::kInvalidArgument;
  DevTensor x(backend(), DType::kBF16, 1000), y(backend(), DType::kBF16, 1000), y8(backend(), DType::kF8E4M3, 1000);
  DevScalar<float> out(backend()), s(backend()), si(backend());
  out.poison(ctx());
  AmaxOptions bad;
  bad.algo = static_cast<AmaxAlgo>(3);
  CurrentScalingOptions cs;
  cs.amax = bad;
  size_t bytes = 0;
  const auto expect_refused = [&](const Status& st, const char* name) {
    EXPECT_EQ(st.code(), kBad) << st.message();
    EXPECT_NE(st.message().find(name), std::string::npos) << st.message();
  };
  expect_refused(amax_workspace_size(ctx(), x.vec(), bad, &bytes), "opts.algo: unknown value 3");
  expect_refused(amax(ctx(), x.vec(), out.ptr(), bad, nullptr, 0), "opts.algo: unknown value 3");
  expect_refused(quantize_current_scaling_workspace_size(ctx(), x.vec(), cs, &bytes), "opts.amax.algo: unknown value 3");
  expect_refused(quantize_current_scaling(ctx(), x.vec(), y8.vec(), out.ptr(), s.ptr(), si.ptr(), cs, nullptr, 0),
                 "opts.amax.algo: unknown value 3");
  expect_refused(activation_amax_workspace_size(ctx(), x.vec(), bad, &bytes), "opts.algo: unknown value 3");
  expect_refused(activation_amax(ctx(), Activation::kRelu, x.vec(), y.vec(), out.ptr(), bad, nullptr, 0),
                 "opts.algo: unknown value 3");
  EXPECT_EQ(float_bits_of(out.get(ctx())), 0xA5A5A5A5u) << "a refused call wrote its output";
}

EMBSCALE_FP8_INSTANTIATE(Fp8Amax);

TEST(Fp8AmaxCpu, SameResultForEveryThreadCount) {
  const uint64_t seed = fp8test::case_seed(902);
  std::mt19937_64 rng(seed);
  HostTensor x(DType::kF16, (1 << 20) + 3);
  fp8test::fill_random(&x, rng);
  const float want = ref::amax(x).amax;
  for (int threads : {1, 2, 3, 7}) {
    float got = -1.0f;
    const Status st = amax(Context::cpu(threads), TensorView::vec(x.bytes.data(), x.dtype, x.numel()), &got, {}, nullptr, 0);
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(got, want) << threads << " threads";
  }
}

// ---- compute_scale ----

class Fp8Scale : public fp8test::Fp8Test {};

TEST_P(Fp8Scale, TransformerEngineEdgeCases) {
  const float amaxes[] = {0.0f, std::nanf(""), INFINITY, 1e-8f, 123.456f, 448.0f, 1e-40f};
  const float epses[] = {0.0f, 1e-3f, 100.0f};
  DevScalar<float> a(backend()), s(backend()), si(backend());
  int checked_non_one = 0;
  for (DType fp8 : fp8test::kFp8DTypes) {
    for (float am : amaxes) {
      for (float eps : epses) {
        for (bool p2 : {false, true}) {
          SCOPED_TRACE(std::string(dtype_name(fp8)) + " amax=" + std::to_string(am) + " eps=" + std::to_string(eps) +
                       " pow2=" + std::to_string(p2));
          const float want = ref::scale(am, fp8_max(fp8), eps, p2);
          const float want_inv = ref::scale_inv(want);
          if (want != 1.0f) ++checked_non_one;
          a.set(ctx(), am);
          s.poison(ctx());
          si.poison(ctx());
          ScaleOptions opts;
          opts.eps = eps;
          opts.power_of_2 = p2;
          const Status st = compute_scale(ctx(), a.ptr(), fp8, opts, s.ptr(), si.ptr());
          ASSERT_TRUE(st.ok()) << st.to_string();
          EXPECT_EQ(float_bits_of(s.get(ctx())), float_bits_of(want)) << s.get(ctx()) << " vs " << want;
          EXPECT_EQ(float_bits_of(si.get(ctx())), float_bits_of(want_inv));
          EXPECT_EQ(float_bits_of(scale_from_amax(am, fp8_max(fp8), opts)), float_bits_of(want));
        }
      }
    }
  }
  EXPECT_GT(checked_non_one, 20);
}

// Values worked out by hand from the rule in fp8.h, independent of the oracle's code.
TEST_P(Fp8Scale, HandDerivedValues) {
  struct Case {
    float amax, eps;
    bool p2;
    DType fp8;
    float scale;
  };
  const Case cases[] = {
      {448.0f, 0.0f, false, DType::kF8E4M3, 1.0f},            // amax at the fp8 maximum
      {0.0f, 0.0f, false, DType::kF8E4M3, 1.0f},              // a == 0
      {std::nanf(""), 1e-3f, false, DType::kF8E4M3, 1.0f},    // NaN is not clamped by eps
      {INFINITY, 0.0f, true, DType::kF8E5M2, 1.0f},           // a == inf
      {0.0f, 100.0f, false, DType::kF8E4M3, 448.0f / 100.0f},  // eps clamps
      {1e-40f, 0.0f, false, DType::kF8E4M3, FLT_MAX},          // 448 / 1e-40 overflows
      {1e-40f, 0.0f, true, DType::kF8E5M2, 0x1p127f},          // FLT_MAX rounded down to 2^127
      {1e-40f, 1e-3f, false, DType::kF8E4M3, 448.0f / 1e-3f},
      {123.456f, 0.0f, true, DType::kF8E4M3, 2.0f},            // 3.63 -> 2
      {123.456f, 0.0f, true, DType::kF8E5M2, 256.0f},          // 464.5 -> 256
      {7.0f, 0.0f, false, DType::kF8E5M2, 8192.0f},            // 57344 / 7 = 8192 exactly
      {1e-8f, 0.0f, false, DType::kF8E4M3, 448.0f / 1e-8f},
  };
  DevScalar<float> a(backend()), s(backend()), si(backend());
  for (const Case& c : cases) {
    a.set(ctx(), c.amax);
    ScaleOptions opts;
    opts.eps = c.eps;
    opts.power_of_2 = c.p2;
    ASSERT_TRUE(compute_scale(ctx(), a.ptr(), c.fp8, opts, s.ptr(), si.ptr()).ok());
    EXPECT_EQ(s.get(ctx()), c.scale) << "amax " << c.amax << " eps " << c.eps << " pow2 " << c.p2;
    EXPECT_EQ(si.get(ctx()), 1.0f / c.scale);
  }
}

TEST_P(Fp8Scale, NoopFlag) {
  DevScalar<float> a(backend()), s(backend()), si(backend()), noop(backend());
  a.set(ctx(), 3.5f);
  s.poison(ctx());
  si.poison(ctx());
  noop.set(ctx(), 1.0f);
  ASSERT_TRUE(compute_scale(ctx(), a.ptr(), DType::kF8E4M3, {}, s.ptr(), si.ptr(), noop.ptr()).ok());
  EXPECT_EQ(float_bits_of(s.get(ctx())), 0xA5A5A5A5u);
  EXPECT_EQ(float_bits_of(si.get(ctx())), 0xA5A5A5A5u);
  noop.set(ctx(), 0.0f);
  ASSERT_TRUE(compute_scale(ctx(), a.ptr(), DType::kF8E4M3, {}, s.ptr(), si.ptr(), noop.ptr()).ok());
  EXPECT_EQ(s.get(ctx()), 128.0f);
  EXPECT_EQ(si.get(ctx()), 1.0f / 128.0f);
}

EMBSCALE_FP8_INSTANTIATE(Fp8Scale);

}  // namespace
}  // namespace embscale
