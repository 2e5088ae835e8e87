// quantize, dequantize and quantize_current_scaling against the oracle, on every available backend.
// fp8 codes must equal the oracle's exactly: the product x * scale is one fp32 rounding and the fp8
// cast is round-to-nearest-even with saturation, both fully determined, so there is no neighbouring
// code to allow (NaN matches any NaN code). Dequantized values are exact as well.
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

// First index where two code tensors differ (NaN == NaN), or -1.
int64_t first_mismatch(const HostTensor& got, const HostTensor& want) {
  const ref::Format f = ref::format_of(want.dtype);
  for (int64_t i = 0; i < want.numel(); ++i)
    if (!ref::same_code(got.code(i), want.code(i), f)) return i;
  return -1;
}

std::string describe(const HostTensor& x, const HostTensor& got, const HostTensor& want, int64_t i) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "index %lld: x=%.9g got code 0x%x (%g), want 0x%x (%g)", static_cast<long long>(i),
                x.get(i), got.code(i), got.get(i), want.code(i), want.get(i));
  return buf;
}

class Fp8Cast : public fp8test::Fp8Test {
 protected:
  HostTensor run_quantize(const HostTensor& x, float scale, DType fp8, int64_t offset) {
    DevTensor dx(backend(), x.dtype, x.numel(), offset), dy(backend(), fp8, x.numel(), 3 - offset);
    EXPECT_TRUE(dx.upload(ctx(), x).ok());
    EXPECT_TRUE(dy.poison(ctx()).ok());
    DevScalar<float> s(backend());
    s.set(ctx(), scale);
    const Status st = quantize(ctx(), dx.vec(), s.ptr(), dy.vec());
    EXPECT_TRUE(st.ok()) << st.to_string();
    EXPECT_TRUE(synchronize(ctx()).ok());
    EXPECT_TRUE(dy.guards_intact(ctx())) << "quantize wrote outside y";
    return dy.download(ctx());
  }

  // quantize_current_scaling of x (starting x_offset elements into its allocation, y y_offset bytes in)
  // with opts, against the oracle: amax, scale and scale_inv bit for bit, the non-finite flag, every code,
  // nothing written outside y. The workspace is poisoned first (every byte fp8test::kPoisonByte);
  // *ws_after (when given) receives it after the op. opts.amax.nonfinite_flag is set here.
  void check_current_scaling(const HostTensor& x, DType fp8, CurrentScalingOptions opts, int64_t x_offset,
                             int64_t y_offset, size_t* ws_size = nullptr,
                             std::vector<uint8_t>* ws_after = nullptr) {
    const int64_t n = x.numel();
    const ref::AmaxResult ra = ref::amax(x);
    const float rs = ref::scale(ra.amax, fp8_max(fp8), opts.scale.eps, opts.scale.power_of_2);
    HostTensor want(fp8, n);
    ref::quantize(x, rs, &want);

    DevTensor dx(backend(), x.dtype, n, x_offset), dy(backend(), fp8, n, y_offset);
    ASSERT_TRUE(dx.upload(ctx(), x).ok());
    ASSERT_TRUE(dy.poison(ctx()).ok());
    DevScalar<float> a(backend()), s(backend()), si(backend());
    DevScalar<int32_t> flag(backend());
    a.poison(ctx());
    s.poison(ctx());
    si.poison(ctx());
    flag.poison(ctx());
    opts.amax.nonfinite_flag = flag.ptr();
    size_t ws_bytes = 0;
    ASSERT_TRUE(quantize_current_scaling_workspace_size(ctx(), dx.vec(), opts, &ws_bytes).ok());
    Buffer ws(backend(), ws_bytes);
    if (ws_bytes > 0) ASSERT_TRUE(fill_bytes(ctx(), ws.data(), fp8test::kPoisonByte, ws_bytes).ok());
    const Status st =
        quantize_current_scaling(ctx(), dx.vec(), dy.vec(), a.ptr(), s.ptr(), si.ptr(), opts, ws.data(), ws_bytes);
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(float_bits_of(a.get(ctx())), float_bits_of(ra.amax));
    EXPECT_EQ(float_bits_of(s.get(ctx())), float_bits_of(rs));
    EXPECT_EQ(float_bits_of(si.get(ctx())), float_bits_of(ref::scale_inv(rs)));
    EXPECT_EQ(flag.get(ctx()), ra.nonfinite ? 1 : 0);
    EXPECT_TRUE(dy.guards_intact(ctx()));
    const HostTensor got = dy.download(ctx());
    const int64_t bad = first_mismatch(got, want);
    EXPECT_EQ(bad, -1) << (bad >= 0 ? describe(x, got, want, bad) : "");
    if (ws_size != nullptr) *ws_size = ws_bytes;
    if (ws_after != nullptr) {
      ws_after->assign(ws_bytes, 0);
      ASSERT_TRUE(copy_to_host(ctx(), ws_after->data(), ws.data(), ws_bytes).ok());
    }
  }
};

TEST_P(Fp8Cast, QuantizeRandomMatchesReference) {
  const int64_t sizes[] = {0, 1, 2, 3, 7, 31, 1000, 4097, 65537, (1 << 20) + 1};
  uint64_t salt = 100;
  for (DType dt : fp8test::kFloatDTypes) {
    for (DType fp8 : fp8test::kFp8DTypes) {
      for (int64_t n : sizes) {
        const uint64_t seed = fp8test::case_seed(++salt);
        SCOPED_TRACE(std::string(dtype_name(dt)) + "->" + dtype_name(fp8) + " n=" + std::to_string(n) +
                     " seed=" + std::to_string(seed));
        std::mt19937_64 rng(seed);
        HostTensor x(dt, n);
        fp8test::fill_random(&x, rng);
        const float amax_v = ref::amax(x).amax;
        // The current scale, a scale that saturates a good part of x, and one that sends most of x
        // into the fp8 subnormals.
        for (float scale : {ref::scale(amax_v, fp8_max(fp8), 0.0f, false), 20.0f * fp8_max(fp8) / 8.0f, 1.0f / 4096.0f}) {
          if (n > 70000 && scale != ref::scale(amax_v, fp8_max(fp8), 0.0f, false)) continue;  // time: big n once
          HostTensor want(fp8, n);
          ref::quantize(x, scale, &want);
          const HostTensor got = run_quantize(x, scale, fp8, static_cast<int64_t>(salt % 4));
          const int64_t bad = first_mismatch(got, want);
          EXPECT_EQ(bad, -1) << "scale " << scale << ": " << (bad >= 0 ? describe(x, got, want, bad) : "");
        }
        if (n > 8) {
          HostTensor want(fp8, n);
          ref::quantize(x, 1.0f, &want);
          int64_t nonzero = 0;
          for (int64_t i = 0; i < n; ++i) nonzero += want.get(i) != 0.0;
          ASSERT_GT(nonzero, 0) << "reference is all zeros";
        }
      }
    }
  }
}

// Every midpoint between adjacent fp8 values (ties go to the even code), the values one fp32 step to
// either side of it, every exact fp8 value, overflow and the special values.
TEST_P(Fp8Cast, QuantizeTiesSaturationAndSpecials) {
  for (DType fp8 : fp8test::kFp8DTypes) {
    const ref::Format f = ref::format_of(fp8);
    HostTensor x(DType::kF32, 0);
    std::vector<double> vals;
    const uint32_t maxc = ref::max_finite_code(f);
    for (uint32_t c = 0; c <= maxc; ++c) {
      const double v = ref::decode(c, f);
      vals.push_back(v);
      if (c < maxc) {
        const float mid = static_cast<float>(0.5 * (v + ref::decode(c + 1, f)));  // exact in fp32
        vals.push_back(mid);
        vals.push_back(std::nextafter(mid, 0.0f));
        vals.push_back(std::nextafter(mid, INFINITY));
      }
    }
    const double top = ref::decode(maxc, f);
    for (double v : {top * 1.03, top * 1.5, top * 4.0, 1e30, static_cast<double>(FLT_MAX), static_cast<double>(INFINITY),
                     std::nan(""), 0.0, -0.0})
      vals.push_back(v);
    const size_t n_pos = vals.size();
    for (size_t i = 0; i < n_pos; ++i) vals.push_back(-vals[i]);
    x = HostTensor(DType::kF32, static_cast<int64_t>(vals.size()));
    for (size_t i = 0; i < vals.size(); ++i) x.set(static_cast<int64_t>(i), vals[i]);
    HostTensor want(fp8, x.numel());
    ref::quantize(x, 1.0f, &want);
    // Spot checks of the oracle itself: saturation, and the sign of zero.
    EXPECT_EQ(want.code(static_cast<int64_t>(n_pos) - 4), maxc) << "+inf saturates";
    EXPECT_EQ(want.code(static_cast<int64_t>(vals.size()) - 1), 0u) << "-(-0) is +0";
    const HostTensor got = run_quantize(x, 1.0f, fp8, 1);
    const int64_t bad = first_mismatch(got, want);
    EXPECT_EQ(bad, -1) << dtype_name(fp8) << ": " << (bad >= 0 ? describe(x, got, want, bad) : "");
  }
}

TEST_P(Fp8Cast, DequantizeEveryCodeExactly) {
  for (DType fp8 : fp8test::kFp8DTypes) {
    HostTensor y(fp8, 256 * 3 + 1);
    for (int64_t i = 0; i < y.numel(); ++i) y.set_code(i, static_cast<uint32_t>(i % 256));
    for (DType dt : fp8test::kFloatDTypes) {
      for (float s_inv : {1.0f, 1.0f / 3.7f, 0x1p-10f, 1e30f, 3.0e-5f}) {
        SCOPED_TRACE(std::string(dtype_name(fp8)) + "->" + dtype_name(dt) + " scale_inv=" + std::to_string(s_inv));
        HostTensor want(dt, y.numel());
        ref::dequantize(y, s_inv, &want);
        DevTensor dy(backend(), fp8, y.numel(), 1), dx(backend(), dt, y.numel(), 2);
        ASSERT_TRUE(dy.upload(ctx(), y).ok());
        ASSERT_TRUE(dx.poison(ctx()).ok());
        DevScalar<float> si(backend());
        si.set(ctx(), s_inv);
        const Status st = dequantize(ctx(), dy.vec(), si.ptr(), dx.vec());
        ASSERT_TRUE(st.ok()) << st.to_string();
        EXPECT_TRUE(dx.guards_intact(ctx()));
        const HostTensor got = dx.download(ctx());
        const int64_t bad = first_mismatch(got, want);
        EXPECT_EQ(bad, -1) << (bad >= 0 ? describe(y, got, want, bad) : "");
      }
    }
  }
}

TEST_P(Fp8Cast, QuantizeAndDequantizeNoop) {
  HostTensor x(DType::kBF16, 5000);
  for (int64_t i = 0; i < x.numel(); ++i) x.set(i, 0.01 * static_cast<double>(i) - 20.0);
  DevTensor dx(backend(), x.dtype, x.numel()), dy(backend(), DType::kF8E4M3, x.numel());
  ASSERT_TRUE(dx.upload(ctx(), x).ok());
  ASSERT_TRUE(dy.poison(ctx()).ok());
  DevScalar<float> s(backend()), noop(backend());
  s.set(ctx(), 2.0f);
  noop.set(ctx(), 1.0f);
  ASSERT_TRUE(quantize(ctx(), dx.vec(), s.ptr(), dy.vec(), noop.ptr()).ok());
  const HostTensor y = dy.download(ctx());
  for (int64_t i = 0; i < y.numel(); ++i) ASSERT_EQ(y.code(i), fp8test::kPoisonByte) << i;
  ASSERT_TRUE(dx.poison(ctx()).ok());
  ASSERT_TRUE(dequantize(ctx(), dy.vec(), s.ptr(), dx.vec(), noop.ptr()).ok());
  const HostTensor xb = dx.download(ctx());
  for (int64_t i = 0; i < xb.numel(); ++i) ASSERT_EQ(xb.code(i), 0xA5A5u) << i;
}

// ---- quantize with current scaling ----

TEST_P(Fp8Cast, CurrentScalingMatchesReference) {
  // kAuto on CUDA: the one-launch cluster path up to 1 MiB of x, the resident path or amax + cast above
  // (2^20 + 7 and 2^20 + 4097 elements of 2 or 4 bytes; which one depends on y's alignment after x's head),
  // so they meet unaligned heads and scalar tails.
  const int64_t sizes[] = {0, 1, 3, 31, 4097, 65537, (1 << 20) + 7, (1 << 20) + 4097};
  uint64_t salt = 300;
  for (DType dt : fp8test::kFloatDTypes) {
    for (DType fp8 : fp8test::kFp8DTypes) {
      for (int64_t n : sizes) {
        for (AmaxAlgo algo : {AmaxAlgo::kAtomic, AmaxAlgo::kTwoStage, AmaxAlgo::kAuto}) {
          const uint64_t seed = fp8test::case_seed(++salt);
          const bool p2 = salt % 3 == 0;
          const float eps = salt % 5 == 0 ? 1e-3f : 0.0f;
          SCOPED_TRACE(std::string(dtype_name(dt)) + "->" + dtype_name(fp8) + " n=" + std::to_string(n) + " " +
                       amax_algo_name(algo) + " pow2=" + std::to_string(p2) + " seed=" + std::to_string(seed));
          std::mt19937_64 rng(seed);
          HostTensor x(dt, n);
          fp8test::fill_random(&x, rng, 0.5);
          if (n > 10) x.set(n / 3, std::nan(""));
          CurrentScalingOptions opts;
          opts.amax.algo = algo;
          opts.scale.eps = eps;
          opts.scale.power_of_2 = p2;
          check_current_scaling(x, fp8, opts, salt % 4, 1);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// The size tests' input: n elements of dt drawn from `seed` (sigma 2), a NaN at n / 7 and max_value at
// n - max_at (max_at 1: the last element).
HostTensor spiked_input(DType dt, int64_t n, uint64_t seed, int64_t max_at, double max_value) {
  std::mt19937_64 rng(seed);
  HostTensor x(dt, n);
  fp8test::fill_random(&x, rng, 2.0);
  x.set(n / 7, std::nan(""));
  x.set(n - max_at, max_value);
  return x;
}

// The elements of x before its first 16-byte boundary (its scalar head) when it starts `offset` elements
// into an aligned buffer.
int64_t scalar_head(DType dt, int64_t offset) {
  const int64_t es = static_cast<int64_t>(dtype_size(dt));
  return (16 - offset * es % 16) % 16 / es;
}

// Where y starts so that its body is aligned for the cast's vector stores after x's scalar head (else the
// whole cast is scalar): one 16-byte input vector gives 16 / es fp8 bytes.
int64_t aligned_y_offset(DType dt, int64_t x_offset) {
  const int64_t per_vec = 16 / static_cast<int64_t>(dtype_size(dt));
  return (per_vec - scalar_head(dt, x_offset) % per_vec) % per_vec;
}

// Whether any byte of ws[first, last) differs from the poison the workspace was filled with.
bool ws_touched(const std::vector<uint8_t>& ws, size_t first, size_t last) {
  for (size_t i = first; i < last && i < ws.size(); ++i)
    if (ws[i] != fp8test::kPoisonByte) return true;
  return false;
}

// kAuto on CUDA from 1 MiB to 8 MiB of x: the resident path (x held in registers by one block per SM, one
// grid barrier), the runs pair above (CurrentScalingRunsSizes). Sizes from one vector per thread to four (bf16 2^22 - 9, fp32 2^21:
// the most a 132-SM H200 holds) and one past the range (fp32 2^21 + 1); unaligned heads and scalar
// tails; the maximum near the end (the last block's last vectors), in the scalar tail, or an infinity;
// a NaN everywhere.
TEST_P(Fp8Cast, CurrentScalingResidentSizes) {
  if (backend() != Backend::kCuda) GTEST_SKIP() << "the resident path is CUDA's";
  struct Case {
    DType dt;
    int64_t n;
    DType fp8;
    int64_t offset;
    int64_t max_at;  // index of the maximum counted from the end (1: the last element)
    double max_value;
    bool resident_on_h200;  // the path applies on a 132-SM H200
  };
  const Case cases[] = {
      {DType::kBF16, (int64_t(1) << 21) + 3, DType::kF8E4M3, 1, 1, 900.0, true},
      {DType::kBF16, (int64_t(1) << 22) - 9, DType::kF8E5M2, 0, 5000, -3000.0, true},
      {DType::kF16, (int64_t(3) << 20) + 1, DType::kF8E4M3, 3, 70000, INFINITY, true},
      {DType::kF32, (int64_t(1) << 19) + 5, DType::kF8E4M3, 2, 2, 1e6, true},
      {DType::kF32, int64_t(1) << 21, DType::kF8E5M2, 0, 100, -7e4, true},
      {DType::kF32, (int64_t(1) << 21) + 1, DType::kF8E4M3, 1, 3, 5e5, false},
  };
  uint64_t salt = 700;
  for (const Case& c : cases) {
    const uint64_t seed = fp8test::case_seed(++salt);
    SCOPED_TRACE(std::string(dtype_name(c.dt)) + "->" + dtype_name(c.fp8) + " n=" + std::to_string(c.n) +
                 " seed=" + std::to_string(seed));
    const HostTensor x = spiked_input(c.dt, c.n, seed, c.max_at, c.max_value);
    // y's body aligned after x's scalar head (else the whole cast is scalar and the path does not apply).
    const int64_t es = static_cast<int64_t>(dtype_size(c.dt));
    const int64_t head = scalar_head(c.dt, c.offset);
    size_t ws_bytes = 0;
    std::vector<uint8_t> ws;
    check_current_scaling(x, c.fp8, CurrentScalingOptions{}, c.offset, aligned_y_offset(c.dt, c.offset), &ws_bytes,
                          &ws);
    if (HasFatalFailure()) return;
    // The workspace is 16 bytes per SM (two 32-bit partials for each of the runs pair's 2 blocks an SM).
    // The resident path runs where it applies, x of 1 to 8 MiB and at most 4 vectors a thread on
    // (workspace / 16) SMs of 1024 threads, and writes its one block an SM's partials to the first half
    // only; the runs pair (where it does not apply) writes both halves (the second holds its flags, 0 or
    // 1, never the poison).
    ASSERT_GT(ws_bytes, 0u) << "x of at most 32 MiB under kAuto asks for a workspace";
    const size_t sms = ws_bytes / 16;
    const int64_t nvec = (c.n - head) / (16 / es);
    const bool resident =
        c.n * es <= (int64_t(8) << 20) && nvec <= 4 * 1024 * static_cast<int64_t>(sms);
    EXPECT_TRUE(ws_touched(ws, 0, ws_bytes / 2)) << "partials in the first half";
    EXPECT_EQ(ws_touched(ws, ws_bytes / 2, ws_bytes), !resident)
        << "workspace " << ws_bytes << " bytes, " << nvec << " vectors";
    if (sms == 132) EXPECT_EQ(resident, c.resident_on_h200) << "the range on a 132-SM H200";
  }
}

// kAuto on CUDA above the resident path up to 32 MiB of x: amax and cast on one grid of contiguous runs,
// block b reading and then casting run b (Fp8Policy::kQcsRunsMaxBytes), the blocks' amax partials passed
// through the workspace; amax + the grid-stride cast above. Runs of unequal length (n not a multiple of the grid), unaligned heads and scalar tails, y
// misaligned so that the whole cast is scalar, the maximum in the first vector, in the last run or in the
// scalar tail (or in the last vector of the last run), an infinity, a NaN; the largest x of the range and
// one element past it.
TEST_P(Fp8Cast, CurrentScalingRunsSizes) {
  if (backend() != Backend::kCuda) GTEST_SKIP() << "the runs path is CUDA's";
  struct Case {
    DType dt;
    int64_t n;
    DType fp8;
    int64_t offset;
    int64_t max_at;  // index of the maximum counted from the end (1: the last element)
    double max_value;
    bool scalar_y;  // y one byte past where its vectors would be aligned: no vectors
  };
  const Case cases[] = {
      {DType::kBF16, (int64_t(1) << 23) + 5, DType::kF8E4M3, 1, 1, 900.0, false},
      {DType::kF32, (int64_t(1) << 21) + 1, DType::kF8E5M2, 0, (int64_t(1) << 21) + 1, -7e4, false},
      {DType::kF32, (int64_t(3) << 21) + 3, DType::kF8E4M3, 2, 40000, 1e6, false},
      {DType::kF16, (int64_t(1) << 24) - 7, DType::kF8E4M3, 3, 70000, INFINITY, false},
      {DType::kF32, (int64_t(1) << 23) + 3, DType::kF8E5M2, 1, 1, 3e4, false},
      {DType::kBF16, (int64_t(1) << 24), DType::kF8E5M2, 0, 5, -3000.0, false},
      {DType::kBF16, (int64_t(1) << 24) + 1, DType::kF8E4M3, 0, 2, 2000.0, false},
      {DType::kBF16, (int64_t(1) << 22) + 9, DType::kF8E4M3, 1, 3, 500.0, true},
  };
  uint64_t salt = 800;
  for (const Case& c : cases) {
    const uint64_t seed = fp8test::case_seed(++salt);
    SCOPED_TRACE(std::string(dtype_name(c.dt)) + "->" + dtype_name(c.fp8) + " n=" + std::to_string(c.n) +
                 " seed=" + std::to_string(seed));
    const HostTensor x = spiked_input(c.dt, c.n, seed, c.max_at, c.max_value);
    // y's body aligned after x's scalar head, or one byte past it.
    const int64_t y_offset = aligned_y_offset(c.dt, c.offset) + (c.scalar_y ? 1 : 0);
    size_t ws_bytes = 0;
    std::vector<uint8_t> ws;
    check_current_scaling(x, c.fp8, CurrentScalingOptions{}, c.offset, y_offset, &ws_bytes, &ws);
    if (HasFatalFailure()) return;
    // Up to 32 MiB the runs pair keeps its blocks' partials in the workspace (16 bytes per SM, all written:
    // the bits, then the flags); amax + cast above needs none.
    const bool runs = c.n * static_cast<int64_t>(dtype_size(c.dt)) <= (int64_t(32) << 20);
    if (!runs) {
      EXPECT_EQ(ws_bytes, 0u) << "amax + the grid-stride cast above the range needs no workspace";
      continue;
    }
    ASSERT_GT(ws_bytes, 0u);
    EXPECT_EQ(ws_bytes % 16, 0u);
    EXPECT_TRUE(ws_touched(ws, 0, ws_bytes / 2)) << "the partials' bits";
    for (size_t i = ws_bytes / 2; i < ws_bytes; i += 4)
      EXPECT_TRUE(ws[i] <= 1 && ws[i + 1] == 0 && ws[i + 2] == 0 && ws[i + 3] == 0) << "a block's flag at byte " << i;
  }
}

TEST_P(Fp8Cast, CurrentScalingNoop) {
  // 70000 elements: the cluster path under kAuto; 2^20 + 3: the resident path.
  for (int64_t n : {int64_t(70000), (int64_t(1) << 20) + 3}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    HostTensor x(DType::kF32, n);
    for (int64_t i = 0; i < x.numel(); ++i) x.set(i, std::sin(0.001 * static_cast<double>(i)) * 50.0);
    DevTensor dx(backend(), x.dtype, x.numel()), dy(backend(), DType::kF8E5M2, x.numel());
    ASSERT_TRUE(dx.upload(ctx(), x).ok());
    ASSERT_TRUE(dy.poison(ctx()).ok());
    DevScalar<float> a(backend()), s(backend()), si(backend()), noop(backend());
    a.poison(ctx());
    s.poison(ctx());
    si.poison(ctx());
    noop.set(ctx(), 1.0f);
    CurrentScalingOptions opts;
    opts.amax.noop_flag = noop.ptr();
    size_t ws_bytes = 0;
    ASSERT_TRUE(quantize_current_scaling_workspace_size(ctx(), dx.vec(), opts, &ws_bytes).ok());
    Buffer ws(backend(), ws_bytes);
    ASSERT_TRUE(quantize_current_scaling(ctx(), dx.vec(), dy.vec(), a.ptr(), s.ptr(), si.ptr(), opts, ws.data(), ws_bytes).ok());
    EXPECT_EQ(float_bits_of(a.get(ctx())), 0xA5A5A5A5u);
    EXPECT_EQ(float_bits_of(s.get(ctx())), 0xA5A5A5A5u);
    EXPECT_EQ(float_bits_of(si.get(ctx())), 0xA5A5A5A5u);
    const HostTensor y = dy.download(ctx());
    for (int64_t i = 0; i < y.numel(); ++i) ASSERT_EQ(y.code(i), fp8test::kPoisonByte) << i;
  }
}

EMBSCALE_FP8_INSTANTIATE(Fp8Cast);

}  // namespace
}  // namespace embscale
