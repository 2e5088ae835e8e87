// The FP8 ops under CUDA graph capture: amax (both algorithms), compute_scale,
// quantize_current_scaling, activation_amax and cast_transpose are captured once on a non-default
// stream, then the graph is replayed with different input data copied in between, and every output
// is checked against the oracle after each replay. A final replay with the no-op flag set must leave
// the outputs of the op that reads it untouched. This proves the ops allocate nothing, never
// synchronise and keep no host-side state between calls.
#include <gtest/gtest.h>

#if EMBSCALE_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include <cmath>
#include <string>

#include "fp8_test_util.h"

namespace embscale {
namespace {

#if EMBSCALE_WITH_CUDA

using fp8test::DevScalar;
using fp8test::DevTensor;
using fp8test::float_bits_of;
using ref::HostTensor;

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr
#define API_OK(expr)                                   \
  do {                                                 \
    const ::embscale::Status _st = (expr);             \
    ASSERT_TRUE(_st.ok()) << #expr << ": " << _st.to_string(); \
  } while (0)

TEST(Fp8CudaGraph, CaptureOnceReplayWithNewData) {
  if (!backend_available(Backend::kCuda)) GTEST_SKIP() << "no CUDA device";
  const Backend b = Backend::kCuda;
  const int64_t rows = 515, cols = 2037, n = rows * cols;  // odd sizes on purpose
  const DType xdt = DType::kBF16, fp8 = DType::kF8E4M3;

  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const Context ctx = Context::cuda(stream);

  DevTensor x(b, xdt, n, 1), y(b, fp8, n), y_auto(b, fp8, n, 1), act_y(b, DType::kBF16, n), ct_y(b, fp8, n), ct_yt(b, fp8, n);
  DevScalar<float> amax_atomic(b), amax_two(b), scale(b), scale_inv(b), cs_amax(b), cs_scale(b), cs_scale_inv(b),
      act_amax(b), noop(b), auto_amax(b), auto_scale(b), auto_scale_inv(b);
  DevScalar<int32_t> flag_atomic(b), flag_two(b);
  noop.set(ctx, 0.0f);

  AmaxOptions atomic_opts, two_opts, act_opts;
  atomic_opts.algo = AmaxAlgo::kAtomic;
  atomic_opts.nonfinite_flag = flag_atomic.ptr();
  two_opts.algo = AmaxAlgo::kTwoStage;
  two_opts.nonfinite_flag = flag_two.ptr();
  act_opts.algo = AmaxAlgo::kAuto;
  // auto: at this size (2 MiB of bf16) the resident path; y_auto starts 1 byte in, so that x's 7-element
  // scalar head leaves y's body 8-byte aligned and the path casts whole vectors (else all is scalar).
  CurrentScalingOptions cs_opts, auto_opts;
  cs_opts.amax.algo = AmaxAlgo::kTwoStage;
  auto_opts.amax.algo = AmaxAlgo::kAuto;
  ScaleOptions scale_opts;
  scale_opts.power_of_2 = true;

  size_t ws_atomic = 0, ws_two = 0, ws_cs = 0, ws_act = 0;
  API_OK(amax_workspace_size(ctx, x.vec(), atomic_opts, &ws_atomic));
  API_OK(amax_workspace_size(ctx, x.vec(), two_opts, &ws_two));
  API_OK(quantize_current_scaling_workspace_size(ctx, x.vec(), cs_opts, &ws_cs));
  size_t ws_auto = 0;
  API_OK(quantize_current_scaling_workspace_size(ctx, x.vec(), auto_opts, &ws_auto));
  ASSERT_GT(ws_auto, 0u);  // the resident path's per-block partials
  API_OK(activation_amax_workspace_size(ctx, x.vec(), act_opts, &ws_act));
  Buffer wa(b, ws_atomic), wt(b, ws_two), wc(b, ws_cs), wact(b, ws_act), wauto(b, ws_auto);

  cudaGraph_t graph = nullptr;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  API_OK(amax(ctx, x.vec(), amax_atomic.ptr(), atomic_opts, wa.data(), ws_atomic));
  API_OK(amax(ctx, x.vec(), amax_two.ptr(), two_opts, wt.data(), ws_two));
  API_OK(compute_scale(ctx, amax_atomic.ptr(), fp8, scale_opts, scale.ptr(), scale_inv.ptr()));
  API_OK(quantize_current_scaling(ctx, x.vec(), y.vec(), cs_amax.ptr(), cs_scale.ptr(), cs_scale_inv.ptr(), cs_opts,
                                  wc.data(), ws_cs));
  API_OK(quantize_current_scaling(ctx, x.vec(), y_auto.vec(), auto_amax.ptr(), auto_scale.ptr(), auto_scale_inv.ptr(),
                                  auto_opts, wauto.data(), ws_auto));
  API_OK(activation_amax(ctx, Activation::kGeluTanh, x.vec(), act_y.vec(), act_amax.ptr(), act_opts, wact.data(), ws_act));
  API_OK(cast_transpose(ctx, x.mat(rows, cols), scale.ptr(), ct_y.mat(rows, cols), ct_yt.mat(cols, rows), noop.ptr()));
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

  HostTensor ct_y_prev, ct_yt_prev;
  for (int replay = 0; replay < 3; ++replay) {
    const bool skip_ct = replay == 2;  // the last replay sets cast_transpose's no-op flag
    const uint64_t seed = fp8test::case_seed(1000 + static_cast<uint64_t>(replay));
    SCOPED_TRACE("replay " + std::to_string(replay) + " seed=" + std::to_string(seed));
    std::mt19937_64 rng(seed);
    HostTensor hx(xdt, n);
    fp8test::fill_random(&hx, rng, 1.0 + replay);
    if (replay == 1) hx.set(n / 2, std::nan(""));
    API_OK(x.upload(ctx, hx));
    noop.set(ctx, skip_ct ? 1.0f : 0.0f);
    CUDA_OK(cudaGraphLaunch(exec, stream));
    CUDA_OK(cudaStreamSynchronize(stream));

    const ref::AmaxResult ra = ref::amax(hx);
    ASSERT_GT(ra.amax, 0.0f);
    EXPECT_EQ(float_bits_of(amax_atomic.get(ctx)), float_bits_of(ra.amax));
    EXPECT_EQ(float_bits_of(amax_two.get(ctx)), float_bits_of(ra.amax));
    EXPECT_EQ(flag_atomic.get(ctx), ra.nonfinite ? 1 : 0);
    EXPECT_EQ(flag_two.get(ctx), ra.nonfinite ? 1 : 0);
    const float rs = ref::scale(ra.amax, fp8_max(fp8), 0.0f, true);
    EXPECT_EQ(scale.get(ctx), rs);
    EXPECT_EQ(scale_inv.get(ctx), ref::scale_inv(rs));

    const float rcs = ref::scale(ra.amax, fp8_max(fp8), 0.0f, false);
    EXPECT_EQ(float_bits_of(cs_amax.get(ctx)), float_bits_of(ra.amax));
    EXPECT_EQ(float_bits_of(cs_scale.get(ctx)), float_bits_of(rcs));
    EXPECT_EQ(float_bits_of(cs_scale_inv.get(ctx)), float_bits_of(ref::scale_inv(rcs)));
    HostTensor want_y(fp8, n);
    ref::quantize(hx, rcs, &want_y);
    const HostTensor got_y = y.download(ctx);
    const ref::Format f8 = ref::format_of(fp8);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += !ref::same_code(got_y.code(i), want_y.code(i), f8);
    EXPECT_EQ(bad, 0) << "quantize_current_scaling codes";
    EXPECT_EQ(float_bits_of(auto_amax.get(ctx)), float_bits_of(ra.amax));
    EXPECT_EQ(float_bits_of(auto_scale.get(ctx)), float_bits_of(rcs));
    EXPECT_EQ(float_bits_of(auto_scale_inv.get(ctx)), float_bits_of(ref::scale_inv(rcs)));
    EXPECT_EQ(y_auto.download(ctx).bytes, got_y.bytes) << "quantize_current_scaling (kAuto) codes";

    const HostTensor got_act = act_y.download(ctx);
    const ref::Format fb = ref::format_of(DType::kBF16);
    bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double r = ref::activation(Activation::kGeluTanh, hx.get(i));
      if (std::isnan(r)) {
        bad += !std::isnan(got_act.get(i));
        continue;
      }
      const int64_t d = ref::ordinal(got_act.code(i), fb) - ref::ordinal(ref::encode(r, fb, false), fb);
      bad += d < -1 || d > 1;
    }
    EXPECT_EQ(bad, 0) << "gelu output";
    EXPECT_EQ(float_bits_of(act_amax.get(ctx)), float_bits_of(ref::amax(got_act).amax));

    const HostTensor got_ct = ct_y.download(ctx), got_ctt = ct_yt.download(ctx);
    if (skip_ct) {
      EXPECT_EQ(got_ct.bytes, ct_y_prev.bytes) << "no-op cast_transpose changed y";
      EXPECT_EQ(got_ctt.bytes, ct_yt_prev.bytes) << "no-op cast_transpose changed yt";
    } else {
      HostTensor want_ct(fp8, n);
      ref::quantize(hx, rs, &want_ct);
      bad = 0;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const uint32_t w = want_ct.code(r * cols + c);
          bad += !ref::same_code(got_ct.code(r * cols + c), w, f8);
          bad += !ref::same_code(got_ctt.code(c * rows + r), w, f8);
        }
      }
      EXPECT_EQ(bad, 0) << "cast_transpose codes";
    }
    ct_y_prev = got_ct;
    ct_yt_prev = got_ctt;
  }
  EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
  EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

#else

TEST(Fp8CudaGraph, CaptureOnceReplayWithNewData) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
}  // namespace embscale
