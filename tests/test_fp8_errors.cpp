// Bad input to the FP8 API: each case returns the documented StatusCode with a message naming the
// offending argument, never crashes and never writes outputs. Validation happens before dispatch,
// so these run on every available backend with the same expectations.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <functional>
#include <cstdio>
#include <random>
#include <string>

#include "fp8_test_util.h"

namespace embscale {
namespace {

using fp8test::DevScalar;
using fp8test::DevTensor;

class Fp8Errors : public fp8test::Fp8Test {};

#define EXPECT_STATUS(expr, code_, needle)                                                           \
  do {                                                                                               \
    const ::embscale::Status _st = (expr);                                                           \
    EXPECT_EQ(_st.code(), code_) << #expr << " -> " << _st.to_string();                              \
    EXPECT_NE(_st.message().find(needle), std::string::npos) << #expr << " -> " << _st.to_string(); \
  } while (0)

TEST_P(Fp8Errors, AmaxArguments) {
  const StatusCode kBad = StatusCode::kInvalidArgument;
  DevTensor x(backend(), DType::kF32, 100), xi(backend(), DType::kI32, 100);
  DevScalar<float> out(backend());
  out.poison(ctx());
  EXPECT_STATUS(amax(ctx(), xi.vec(), out.ptr(), {}, nullptr, 0), kBad, "x: dtype int32");
  EXPECT_STATUS(amax(ctx(), TensorView::vec(x.data(), DType::kF8E4M3, 100), out.ptr(), {}, nullptr, 0), kBad, "x: dtype fp8e4m3");
  EXPECT_STATUS(amax(ctx(), TensorView::vec(nullptr, DType::kF32, 100), out.ptr(), {}, nullptr, 0), kBad, "x: data is null");
  EXPECT_STATUS(amax(ctx(), x.vec(), nullptr, {}, nullptr, 0), kBad, "amax: must not be null");
  TensorView neg = x.vec();
  neg.shape[0] = -4;
  EXPECT_STATUS(amax(ctx(), neg, out.ptr(), {}, nullptr, 0), kBad, "x: shape [-4]");
  TensorView bad_ndim = x.vec();
  bad_ndim.ndim = 7;
  EXPECT_STATUS(amax(ctx(), bad_ndim, out.ptr(), {}, nullptr, 0), kBad, "x: ndim 7");
  const TensorView odd = TensorView::vec(static_cast<char*>(x.data()) + 2, DType::kF32, 10);
  EXPECT_STATUS(amax(ctx(), odd, out.ptr(), {}, nullptr, 0), kBad, "x: data pointer is not aligned");
  AmaxOptions bad_algo;
  bad_algo.algo = static_cast<AmaxAlgo>(9);
  EXPECT_STATUS(amax(ctx(), x.vec(), out.ptr(), bad_algo, nullptr, 0), kBad, "opts.algo");
  size_t bytes = 0;
  EXPECT_STATUS(amax_workspace_size(ctx(), x.vec(), {}, nullptr), kBad, "bytes: must not be null");
  EXPECT_STATUS(amax_workspace_size(ctx(), xi.vec(), {}, &bytes), kBad, "x: dtype int32");
  EXPECT_EQ(fp8test::float_bits_of(out.get(ctx())), 0xA5A5A5A5u) << "a refused call wrote its output";
}

// The workspace contract, on every backend and for every op that takes a workspace (amax, quantize
// with current scaling, activation + amax) and every algorithm: the size query decides. Where it asks
// for bytes (e.g. the CUDA two-stage reduction's block maxima), one byte fewer is kWorkspaceTooSmall, a
// null workspace is invalid_argument, and neither writes anything (outputs poisoned before stay so);
// where it asks for none (the CPU backend), a null workspace of 0 bytes is enough. Either way a
// workspace larger than asked for works, and the results are the reference's.
TEST_P(Fp8Errors, WorkspaceTooSmallOrMissing) {
  const uint64_t seed = fp8test::case_seed(950);
  std::mt19937_64 rng(seed);
  constexpr int64_t kN = (1 << 20) + 5;
  ref::HostTensor hx(DType::kBF16, kN);
  fp8test::fill_random(&hx, rng);
  const float want_amax = ref::amax(hx).amax;
  DevTensor x(backend(), DType::kBF16, kN), y8(backend(), DType::kF8E4M3, kN), yb(backend(), DType::kBF16, kN);
  ASSERT_TRUE(x.upload(ctx(), hx).ok());
  DevScalar<float> out(backend()), s(backend()), si(backend());
  DevScalar<int32_t> flag(backend());
  enum Op { kAmax, kCurrentScaling, kActivation };
  auto poison_outputs = [&]() {
    out.poison(ctx());
    s.poison(ctx());
    si.poison(ctx());
    flag.poison(ctx());
    ASSERT_TRUE(y8.poison(ctx()).ok());
    ASSERT_TRUE(yb.poison(ctx()).ok());
  };
  auto untouched = [&]() {
    const uint32_t p = 0xA5A5A5A5u;
    bool same = fp8test::float_bits_of(out.get(ctx())) == p && fp8test::float_bits_of(s.get(ctx())) == p &&
                fp8test::float_bits_of(si.get(ctx())) == p && static_cast<uint32_t>(flag.get(ctx())) == p;
    for (const DevTensor* t : {&y8, &yb}) {
      const ref::HostTensor h = t->download(ctx());
      for (uint8_t b : h.bytes) same = same && b == fp8test::kPoisonByte;
    }
    return same;
  };
  auto query = [&](Op op, const AmaxOptions& o, size_t* bytes) {
    CurrentScalingOptions cs;
    cs.amax = o;
    switch (op) {
      case kAmax: return amax_workspace_size(ctx(), x.vec(), o, bytes);
      case kCurrentScaling: return quantize_current_scaling_workspace_size(ctx(), x.vec(), cs, bytes);
      default: return activation_amax_workspace_size(ctx(), x.vec(), o, bytes);
    }
  };
  auto call = [&](Op op, const AmaxOptions& o, void* ws, size_t bytes) {
    CurrentScalingOptions cs;
    cs.amax = o;
    switch (op) {
      case kAmax: return amax(ctx(), x.vec(), out.ptr(), o, ws, bytes);
      case kCurrentScaling:
        return quantize_current_scaling(ctx(), x.vec(), y8.vec(), out.ptr(), s.ptr(), si.ptr(), cs, ws, bytes);
      default: return activation_amax(ctx(), Activation::kRelu, x.vec(), yb.vec(), out.ptr(), o, ws, bytes);
    }
  };
  const char* names[] = {"amax", "quantize_current_scaling", "activation_amax"};
  int sized = 0;
  for (Op op : {kAmax, kCurrentScaling, kActivation}) {
    for (AmaxAlgo algo : {AmaxAlgo::kAuto, AmaxAlgo::kAtomic, AmaxAlgo::kTwoStage}) {
      SCOPED_TRACE(std::string(names[op]) + " " + amax_algo_name(algo));
      AmaxOptions o;
      o.algo = algo;
      o.nonfinite_flag = flag.ptr();
      size_t need = 0;
      ASSERT_TRUE(query(op, o, &need).ok());
      if (need > 0) {
        ++sized;
        Buffer ws(backend(), need);
        poison_outputs();
        EXPECT_STATUS(call(op, o, ws.data(), need - 1), StatusCode::kWorkspaceTooSmall, "workspace_bytes");
        EXPECT_TRUE(untouched()) << "a call refused for its workspace wrote an output";
        EXPECT_STATUS(call(op, o, ws.data(), 0), StatusCode::kWorkspaceTooSmall, "workspace_bytes");
        EXPECT_STATUS(call(op, o, nullptr, need), StatusCode::kInvalidArgument, "workspace: null");
        EXPECT_TRUE(untouched()) << "a call refused for its workspace wrote an output";
      } else {
        poison_outputs();
        const Status st = call(op, o, nullptr, 0);
        ASSERT_TRUE(st.ok()) << "no workspace asked for, none given: " << st.to_string();
        ASSERT_TRUE(synchronize(ctx()).ok());
        // ReLU's amax is that of max(x, 0); the others that of x.
        if (op != kActivation) EXPECT_EQ(out.get(ctx()), want_amax);
        EXPECT_EQ(flag.get(ctx()), 0);
      }
      // More than asked for is fine, with any content.
      Buffer big(backend(), need + 512);
      ASSERT_TRUE(fill_bytes(ctx(), big.data(), 0xFF, need + 512).ok());
      poison_outputs();
      const Status st = call(op, o, big.data(), need + 512);
      ASSERT_TRUE(st.ok()) << st.to_string();
      ASSERT_TRUE(synchronize(ctx()).ok());
      if (op != kActivation) EXPECT_EQ(out.get(ctx()), want_amax);
      EXPECT_EQ(flag.get(ctx()), 0);
    }
  }
  std::printf("  %s: %d of 9 (op, algorithm) pairs ask for a workspace\n", backend_name(backend()), sized);
  // The two-stage reduction keeps its block maxima in the workspace on CUDA (fp8.h).
  if (backend() == Backend::kCuda) EXPECT_GT(sized, 0);
}

TEST_P(Fp8Errors, ScaleArguments) {
  const StatusCode kBad = StatusCode::kInvalidArgument;
  DevScalar<float> a(backend()), s(backend()), si(backend());
  a.set(ctx(), 1.0f);
  EXPECT_STATUS(compute_scale(ctx(), nullptr, DType::kF8E4M3, {}, s.ptr(), si.ptr()), kBad, "amax: must not be null");
  EXPECT_STATUS(compute_scale(ctx(), a.ptr(), DType::kBF16, {}, s.ptr(), si.ptr()), kBad, "fp8_dtype: dtype bf16");
  EXPECT_STATUS(compute_scale(ctx(), a.ptr(), DType::kF8E5M2, {}, nullptr, si.ptr()), kBad, "scale: must not be null");
  EXPECT_STATUS(compute_scale(ctx(), a.ptr(), DType::kF8E5M2, {}, s.ptr(), nullptr), kBad, "scale_inv: must not be null");
  ScaleOptions neg;
  neg.eps = -1.0f;
  EXPECT_STATUS(compute_scale(ctx(), a.ptr(), DType::kF8E4M3, neg, s.ptr(), si.ptr()), kBad, "opts.eps");
  // eps must be finite and >= 0: NaN and both infinities are refused, and nothing is written.
  s.poison(ctx());
  si.poison(ctx());
  for (float bad_eps : {std::nanf(""), INFINITY, -INFINITY, -0x1p-149f}) {
    ScaleOptions o;
    o.eps = bad_eps;
    EXPECT_STATUS(compute_scale(ctx(), a.ptr(), DType::kF8E4M3, o, s.ptr(), si.ptr()), kBad, "opts.eps");
  }
  EXPECT_EQ(fp8test::float_bits_of(s.get(ctx())), 0xA5A5A5A5u) << "a refused compute_scale wrote scale";
  EXPECT_EQ(fp8test::float_bits_of(si.get(ctx())), 0xA5A5A5A5u) << "a refused compute_scale wrote scale_inv";
  // The largest finite eps and 0 are valid.
  for (float good_eps : {FLT_MAX, 0.0f}) {
    ScaleOptions o;
    o.eps = good_eps;
    EXPECT_TRUE(compute_scale(ctx(), a.ptr(), DType::kF8E4M3, o, s.ptr(), si.ptr()).ok()) << good_eps;
  }
  EXPECT_EQ(fp8_max(DType::kF8E4M3), 448.0f);
  EXPECT_EQ(fp8_max(DType::kF8E5M2), 57344.0f);
  EXPECT_EQ(fp8_max(DType::kF32), 0.0f);
}

TEST_P(Fp8Errors, CastArguments) {
  const StatusCode kBad = StatusCode::kInvalidArgument;
  DevTensor x(backend(), DType::kF16, 64), y(backend(), DType::kF8E4M3, 64), y_short(backend(), DType::kF8E4M3, 63);
  DevScalar<float> s(backend()), si(backend()), a(backend());
  s.set(ctx(), 1.0f);
  ASSERT_TRUE(y.poison(ctx()).ok());
  EXPECT_STATUS(quantize(ctx(), x.vec(), s.ptr(), y_short.vec()), kBad, "y: shape [63] has 63 elements; expected 64");
  EXPECT_STATUS(quantize(ctx(), x.vec(), s.ptr(), x.vec()), kBad, "y: dtype fp16 is not supported; expected fp8e4m3 or fp8e5m2");
  EXPECT_STATUS(quantize(ctx(), y.vec(), s.ptr(), y.vec()), kBad, "x: dtype fp8e4m3");
  EXPECT_STATUS(quantize(ctx(), x.vec(), nullptr, y.vec()), kBad, "scale: must not be null");
  EXPECT_STATUS(quantize(ctx(), x.vec(), s.ptr(), TensorView::vec(nullptr, DType::kF8E5M2, 64)), kBad, "y: data is null");
  EXPECT_STATUS(dequantize(ctx(), y.vec(), nullptr, x.vec()), kBad, "scale_inv: must not be null");
  EXPECT_STATUS(dequantize(ctx(), x.vec(), si.ptr(), x.vec()), kBad, "y: dtype fp16");
  EXPECT_STATUS(dequantize(ctx(), y.vec(), si.ptr(), TensorView::vec(x.data(), DType::kI64, 8)), kBad, "x: dtype int64");
  EXPECT_STATUS(dequantize(ctx(), y_short.vec(), si.ptr(), x.vec()), kBad, "x: shape [64]");
  CurrentScalingOptions cs;
  EXPECT_STATUS(quantize_current_scaling(ctx(), x.vec(), y.vec(), nullptr, s.ptr(), si.ptr(), cs, nullptr, 0), kBad,
                "amax: must not be null");
  EXPECT_STATUS(quantize_current_scaling(ctx(), x.vec(), y.vec(), a.ptr(), nullptr, si.ptr(), cs, nullptr, 0), kBad,
                "scale: must not be null");
  EXPECT_STATUS(quantize_current_scaling(ctx(), x.vec(), y.vec(), a.ptr(), s.ptr(), nullptr, cs, nullptr, 0), kBad,
                "scale_inv: must not be null");
  EXPECT_STATUS(quantize_current_scaling(ctx(), x.vec(), y_short.vec(), a.ptr(), s.ptr(), si.ptr(), cs, nullptr, 0), kBad,
                "y: shape [63]");
  for (float bad_eps : {-2.0f, std::nanf(""), INFINITY, -INFINITY}) {
    cs.scale.eps = bad_eps;
    EXPECT_STATUS(quantize_current_scaling(ctx(), x.vec(), y.vec(), a.ptr(), s.ptr(), si.ptr(), cs, nullptr, 0), kBad,
                  "opts.scale.eps");
  }
  const ref::HostTensor untouched = y.download(ctx());
  for (int64_t i = 0; i < untouched.numel(); ++i) ASSERT_EQ(untouched.code(i), fp8test::kPoisonByte);
}

TEST_P(Fp8Errors, FusionArguments) {
  const StatusCode kBad = StatusCode::kInvalidArgument;
  DevTensor x(backend(), DType::kBF16, 12), y(backend(), DType::kF32, 12), q(backend(), DType::kF8E4M3, 12),
      qt(backend(), DType::kF8E4M3, 12), q5(backend(), DType::kF8E5M2, 12);
  DevScalar<float> a(backend()), s(backend());
  s.set(ctx(), 1.0f);
  EXPECT_STATUS(activation_amax(ctx(), static_cast<Activation>(7), x.vec(), y.vec(), a.ptr(), {}, nullptr, 0), kBad, "act");
  EXPECT_STATUS(activation_amax(ctx(), Activation::kSilu, x.vec(), q.vec(), a.ptr(), {}, nullptr, 0), kBad, "y: dtype fp8e4m3");
  EXPECT_STATUS(activation_amax(ctx(), Activation::kSilu, x.vec(), y.mat(3, 3), a.ptr(), {}, nullptr, 0), kBad, "y: shape [3, 3]");
  EXPECT_STATUS(activation_amax(ctx(), Activation::kSilu, x.vec(), y.vec(), nullptr, {}, nullptr, 0), kBad, "amax: must not be null");

  EXPECT_STATUS(cast_transpose(ctx(), x.vec(), s.ptr(), q.vec(), qt.vec()), kBad, "x: shape [12] is not 2-D");
  EXPECT_STATUS(cast_transpose(ctx(), x.mat(3, 4), s.ptr(), q.mat(4, 3), qt.mat(4, 3)), kBad, "y: shape [4, 3]");
  EXPECT_STATUS(cast_transpose(ctx(), x.mat(3, 4), s.ptr(), q.mat(3, 4), qt.mat(3, 4)), kBad, "yt: shape [3, 4] is not the transpose");
  EXPECT_STATUS(cast_transpose(ctx(), x.mat(3, 4), s.ptr(), q.mat(3, 4), q5.mat(4, 3)), kBad, "yt: dtype fp8e5m2");
  EXPECT_STATUS(cast_transpose(ctx(), x.mat(3, 4), s.ptr(), y.mat(3, 4), qt.mat(4, 3)), kBad, "y: dtype fp32");
  EXPECT_STATUS(cast_transpose(ctx(), x.mat(3, 4), nullptr, q.mat(3, 4), qt.mat(4, 3)), kBad, "scale: must not be null");
}

// Buffers an op writes must share no byte with any other argument: each such call is refused with
// invalid_argument naming the written argument first and the one it overlaps, and writes nothing (the
// whole allocation the views are cut from keeps its poison). Views that only touch are accepted.
TEST_P(Fp8Errors, OverlappingBuffersAreRefused) {
  DevTensor mem(backend(), DType::kF32, 1024);  // 4096 bytes
  ASSERT_TRUE(mem.poison(ctx()).ok());
  char* base = static_cast<char*>(mem.data());
  auto f32 = [&](size_t byte, int64_t n) { return TensorView::vec(base + byte, DType::kF32, n); };
  auto e4 = [&](size_t byte, int64_t n) { return TensorView::vec(base + byte, DType::kF8E4M3, n); };
  auto fp = [&](size_t byte) { return reinterpret_cast<float*>(base + byte); };
  const TensorView x = f32(0, 64);  // bytes [0, 256)
  AmaxOptions flag_on_amax;
  flag_on_amax.nonfinite_flag = reinterpret_cast<int32_t*>(fp(1024));
  CurrentScalingOptions cs;
  const struct {
    const char* what;  // the message's start: "<written>: overlaps <other>"
    std::function<Status()> call;
  } cases[] = {
      {"amax: overlaps x", [&] { return amax(ctx(), x, fp(128), {}, nullptr, 0); }},
      {"amax: overlaps opts.nonfinite_flag", [&] { return amax(ctx(), x, fp(1024), flag_on_amax, nullptr, 0); }},
      {"scale: overlaps scale_inv", [&] { return compute_scale(ctx(), fp(1024), DType::kF8E4M3, {}, fp(1028), fp(1028)); }},
      {"scale: overlaps amax", [&] { return compute_scale(ctx(), fp(1024), DType::kF8E4M3, {}, fp(1024), fp(1028)); }},
      {"y: overlaps x", [&] { return quantize(ctx(), x, fp(1024), e4(192, 64)); }},
      {"y: overlaps scale", [&] { return quantize(ctx(), x, fp(1024), e4(1000, 64)); }},
      {"x: overlaps y", [&] { return dequantize(ctx(), e4(512, 64), fp(1024), f32(448, 64)); }},
      {"scale: overlaps x", [&] { return quantize_current_scaling(ctx(), x, e4(512, 64), fp(1024), fp(4), fp(1028), cs, nullptr, 0); }},
      {"y: overlaps amax", [&] { return quantize_current_scaling(ctx(), x, e4(512, 64), fp(560), fp(1024), fp(1028), cs, nullptr, 0); }},
      {"y: overlaps x", [&] { return activation_amax(ctx(), Activation::kRelu, x, x, fp(1024), {}, nullptr, 0); }},
      {"y: overlaps amax", [&] { return activation_amax(ctx(), Activation::kRelu, x, f32(512, 64), fp(600), {}, nullptr, 0); }},
      {"y: overlaps yt", [&] {
         return cast_transpose(ctx(), TensorView::mat(base, DType::kF32, 8, 8), fp(1024),
                               TensorView::mat(base + 512, DType::kF8E4M3, 8, 8), TensorView::mat(base + 560, DType::kF8E4M3, 8, 8));
       }},
  };
  for (const auto& c : cases) {
    const Status st = c.call();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.what << " -> " << st.to_string();
    EXPECT_EQ(st.message().rfind(c.what, 0), 0u) << "message \"" << st.message() << "\" should start with " << c.what;
    ASSERT_TRUE(synchronize(ctx()).ok());
    std::vector<uint8_t> all(mem.buf.bytes());
    ASSERT_TRUE(copy_to_host(ctx(), all.data(), mem.buf.data(), all.size()).ok());
    for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i], fp8test::kPoisonByte) << c.what << ": byte " << i << " written";
  }
  // A workspace the call uses must not overlap either (where the size query asks for one).
  size_t ws_bytes = 0;
  AmaxOptions two_stage;
  two_stage.algo = AmaxAlgo::kTwoStage;
  ASSERT_TRUE(amax_workspace_size(ctx(), x, two_stage, &ws_bytes).ok());
  if (ws_bytes > 0) {
    DevTensor ws(backend(), DType::kF32, static_cast<int64_t>(ws_bytes / 4 + 1));
    EXPECT_STATUS(amax(ctx(), x, reinterpret_cast<float*>(ws.data()), two_stage, ws.data(), ws_bytes), StatusCode::kInvalidArgument,
                  "amax: overlaps workspace");
    EXPECT_STATUS(amax(ctx(), TensorView::vec(ws.data(), DType::kF32, 4), fp(1024), two_stage, ws.data(), ws_bytes),
                  StatusCode::kInvalidArgument, "workspace: overlaps x");
  }
  // Buffers that only touch: x [0, 256), y [256, 320), scale [320, 324) in one allocation.
  const float one = 1.0f;
  ASSERT_TRUE(copy_to_backend(ctx(), fp(320), &one, 4).ok());
  const Status touching = quantize(ctx(), x, fp(320), e4(256, 64));
  EXPECT_TRUE(touching.ok()) << "buffers that only touch must be accepted: " << touching.to_string();
}

// A call with two faults, arguments that overlap and a workspace too small for the call, gets the
// arguments' error on every backend: the workspace is checked last, since how much of it a call needs
// differs between backends (the CPU asks for none where CUDA asks for block partials).
TEST_P(Fp8Errors, ArgumentFaultsComeBeforeTheWorkspace) {
  DevTensor mem(backend(), DType::kF32, 1024);  // 4096 bytes
  ASSERT_TRUE(mem.poison(ctx()).ok());
  char* base = static_cast<char*>(mem.data());
  auto fp = [&](size_t byte) { return reinterpret_cast<float*>(base + byte); };
  const TensorView x = TensorView::vec(base, DType::kF32, 64);  // bytes [0, 256)
  const TensorView y8 = TensorView::vec(base + 512, DType::kF8E4M3, 64);
  const TensorView y32 = TensorView::vec(base + 1024, DType::kF32, 64);
  AmaxOptions two_stage;
  two_stage.algo = AmaxAlgo::kTwoStage;
  CurrentScalingOptions cs;
  cs.amax = two_stage;
  DevTensor small(backend(), DType::kF32, 1);  // a workspace of 1 byte: too small wherever one is needed
  EXPECT_STATUS(amax(ctx(), x, fp(128), two_stage, small.data(), 1), StatusCode::kInvalidArgument,
                "amax: overlaps x");
  EXPECT_STATUS(quantize_current_scaling(ctx(), x, y8, fp(2048), fp(4), fp(2052), cs, small.data(), 1),
                StatusCode::kInvalidArgument, "scale: overlaps x");
  EXPECT_STATUS(activation_amax(ctx(), Activation::kRelu, x, y32, fp(128), two_stage, small.data(), 1),
                StatusCode::kInvalidArgument, "amax: overlaps x");
  ASSERT_TRUE(synchronize(ctx()).ok());
  std::vector<uint8_t> all(mem.buf.bytes());
  ASSERT_TRUE(copy_to_host(ctx(), all.data(), mem.buf.data(), all.size()).ok());
  for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i], fp8test::kPoisonByte) << "byte " << i << " written";
}

TEST_P(Fp8Errors, ContextArguments) {
  DevTensor x(backend(), DType::kF32, 4);
  DevScalar<float> out(backend());
  Context bad = ctx();
  bad.backend = static_cast<Backend>(5);
  EXPECT_STATUS(amax(bad, x.vec(), out.ptr(), {}, nullptr, 0), StatusCode::kInvalidArgument, "ctx.backend");
  if (backend() == Backend::kCpu) {
    EXPECT_STATUS(amax(Context::cpu(-2), x.vec(), out.ptr(), {}, nullptr, 0), StatusCode::kInvalidArgument, "ctx.num_threads");
  }
}

EMBSCALE_FP8_INSTANTIATE(Fp8Errors);

TEST(Fp8Names, RoundTrip) {
  for (AmaxAlgo a : {AmaxAlgo::kAuto, AmaxAlgo::kAtomic, AmaxAlgo::kTwoStage}) {
    AmaxAlgo p;
    ASSERT_TRUE(parse_amax_algo(amax_algo_name(a), &p));
    EXPECT_EQ(p, a);
  }
  for (Activation a : {Activation::kRelu, Activation::kGeluTanh, Activation::kSilu}) {
    Activation p;
    ASSERT_TRUE(parse_activation(activation_name(a), &p));
    EXPECT_EQ(p, a);
  }
  AmaxAlgo p;
  EXPECT_FALSE(parse_amax_algo("fast", &p));
  Activation q;
  EXPECT_FALSE(parse_activation("tanh", &q));
}

TEST(Fp8ErrorsNoCuda, CudaContextWithoutCudaBuild) {
  if (backend_compiled(Backend::kCuda)) GTEST_SKIP() << "CUDA is compiled in";
  float out = 0.0f, x = 1.0f;
  const Status st = amax(Context::cuda(), TensorView::vec(&x, DType::kF32, 1), &out, {}, nullptr, 0);
  EXPECT_EQ(st.code(), StatusCode::kUnsupported) << st.to_string();
  EXPECT_NE(st.message().find("ctx.backend"), std::string::npos);
}

}  // namespace
}  // namespace embscale
