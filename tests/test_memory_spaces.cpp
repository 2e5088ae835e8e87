// On the CUDA backend every buffer must be memory the current device can use: a host buffer is
// refused with invalid_argument naming it, before any kernel could fault on it (which would leave the
// CUDA context unusable), and nothing is written. Runs on the CUDA backend only.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "embscale/fp8.h"
#include "embscale/memory.h"
#include "embscale/tbe.h"

namespace embscale {
namespace {

void expect_host_refusal(const Status& st, const std::string& name) {
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << name << ": " << st.to_string();
  EXPECT_EQ(st.message().rfind(name + ": host memory", 0), 0u) << st.message();
}

TEST(CudaMemorySpaces, Fp8RefusesHostBuffers) {
  if (!backend_available(Backend::kCuda)) GTEST_SKIP() << "no CUDA device";
  const Context ctx = Context::cuda();
  const int64_t n = 1000;
  Buffer d_x(Backend::kCuda, n * 4), d_y(Backend::kCuda, n), d_s(Backend::kCuda, 4), d_a(Backend::kCuda, 4);
  std::vector<float> h_x(n, 1.0f), h_s(1, 1.0f);
  std::vector<unsigned char> h_y(n, 0x5a);
  const TensorView x = TensorView::vec(d_x.data(), DType::kF32, n), y = TensorView::vec(d_y.data(), DType::kF8E4M3, n);
  expect_host_refusal(quantize(ctx, TensorView::vec(h_x.data(), DType::kF32, n), d_s.as<float>(), y), "x");
  expect_host_refusal(quantize(ctx, x, d_s.as<float>(), TensorView::vec(h_y.data(), DType::kF8E4M3, n)), "y");
  expect_host_refusal(quantize(ctx, x, h_s.data(), y), "scale");
  float noop = 1.0f;
  expect_host_refusal(quantize(ctx, x, d_s.as<float>(), y, &noop), "noop_flag");
  for (unsigned char v : h_y) ASSERT_EQ(v, 0x5a) << "a refused call wrote the host output";

  size_t ws_bytes = 0;
  ASSERT_TRUE(amax_workspace_size(ctx, x, AmaxOptions{}, &ws_bytes).ok());
  std::vector<unsigned char> h_ws(ws_bytes + 1);
  float h_amax = -1.0f;
  expect_host_refusal(amax(ctx, x, &h_amax, AmaxOptions{}, nullptr, 0), "amax");
  EXPECT_EQ(h_amax, -1.0f);
  if (ws_bytes > 0) expect_host_refusal(amax(ctx, x, d_a.as<float>(), AmaxOptions{}, h_ws.data(), ws_bytes), "workspace");
  int32_t flag = 7;
  AmaxOptions o;
  o.nonfinite_flag = &flag;
  Buffer ws(Backend::kCuda, ws_bytes > 0 ? ws_bytes : 1);
  expect_host_refusal(amax(ctx, x, d_a.as<float>(), o, ws.data(), ws_bytes), "opts.nonfinite_flag");
  EXPECT_EQ(flag, 7);
  ASSERT_TRUE(synchronize(ctx).ok()) << "the context must still work after the refusals";
}

// One table of 10 rows of 4 on CUDA (weight i is i / 4) and a backward's arguments on it, every buffer in
// device memory: two bags (rows 1 and 2, then row 3) of int64 lookups, a zero gradient, row-wise
// Adagrad's momentum.
struct SmallTbe {
  std::vector<float> h_w;
  std::unique_ptr<TableBatchedEmbedding> tbe;
  Buffer d_w{Backend::kCuda, 40 * 4}, d_idx{Backend::kCuda, 3 * 8}, d_off{Backend::kCuda, 3 * 8},
      d_go{Backend::kCuda, 2 * 4 * 4}, d_m1{Backend::kCuda, 10 * 4};
  TbeBackwardArgs backward;
};

void make_small_tbe(const Context& ctx, SmallTbe* s) {
  TbeConfig cfg;
  cfg.tables = {TableSpec{10, 4}};
  ASSERT_TRUE(TableBatchedEmbedding::create(ctx, cfg, &s->tbe).ok());
  s->h_w.resize(40);
  for (int i = 0; i < 40; ++i) s->h_w[i] = 0.25f * static_cast<float>(i);
  const std::vector<int64_t> idx = {1, 2, 3}, off = {0, 2, 3};
  ASSERT_TRUE(copy_to_backend(ctx, s->d_w.data(), s->h_w.data(), s->d_w.bytes()).ok());
  ASSERT_TRUE(copy_to_backend(ctx, s->d_idx.data(), idx.data(), 24).ok());
  ASSERT_TRUE(copy_to_backend(ctx, s->d_off.data(), off.data(), 24).ok());
  ASSERT_TRUE(fill_bytes(ctx, s->d_go.data(), 0, s->d_go.bytes()).ok());
  ASSERT_TRUE(fill_bytes(ctx, s->d_m1.data(), 0, s->d_m1.bytes()).ok());
  TbeBackwardArgs& a = s->backward;
  a.weights = TensorView::vec(s->d_w.data(), DType::kF32, 40);
  a.indices = TensorView::vec(s->d_idx.data(), DType::kI64, 3);
  a.offsets = TensorView::vec(s->d_off.data(), DType::kI64, 3);
  a.batch_size = 2;
  a.grad_output = TensorView::mat(s->d_go.data(), DType::kF32, 2, 4);
  a.momentum1 = TensorView::vec(s->d_m1.data(), DType::kF32, 10);
}

TEST(CudaMemorySpaces, TbeBackwardRefusesHostBuffers) {
  if (!backend_available(Backend::kCuda)) GTEST_SKIP() << "no CUDA device";
  const Context ctx = Context::cuda();
  SmallTbe s;
  ASSERT_NO_FATAL_FAILURE(make_small_tbe(ctx, &s));
  TbeBackwardArgs a = s.backward;
  std::vector<float> h_m1(10, 0.5f);
  a.momentum1 = TensorView::vec(h_m1.data(), DType::kF32, 10);
  size_t bytes = 0;
  expect_host_refusal(s.tbe->backward_workspace_size(ctx, a, &bytes), "momentum1");
  a.momentum1 = s.backward.momentum1;
  ASSERT_TRUE(s.tbe->backward_workspace_size(ctx, a, &bytes).ok());
  std::vector<unsigned char> h_ws(bytes);
  if (bytes > 0) expect_host_refusal(s.tbe->backward(ctx, a, h_ws.data(), bytes), "workspace");
  for (float v : h_m1) ASSERT_EQ(v, 0.5f);
  ASSERT_TRUE(synchronize(ctx).ok());
}

// A handle checks each buffer's memory once and remembers it, but never remembers a refusal: a host buffer
// is refused with the same message on every call, before and after calls that succeed, and calls on the
// same (remembered) device buffers keep working and giving the same results.
TEST(CudaMemorySpaces, TbeRefusesAHostBufferOnEveryCall) {
  if (!backend_available(Backend::kCuda)) GTEST_SKIP() << "no CUDA device";
  const Context ctx = Context::cuda();
  SmallTbe s;
  ASSERT_NO_FATAL_FAILURE(make_small_tbe(ctx, &s));
  const std::vector<float>& w = s.h_w;

  // Bag 0 sums rows 1 and 2, bag 1 is row 3: exact in fp32.
  std::vector<float> want(8);
  for (int c = 0; c < 4; ++c) {
    want[c] = w[4 + c] + w[8 + c];
    want[4 + c] = w[12 + c];
  }
  Buffer d_out(Backend::kCuda, 2 * 4 * 4);
  TbeForwardArgs f;
  f.weights = s.backward.weights;
  f.indices = s.backward.indices;
  f.offsets = s.backward.offsets;
  f.batch_size = 2;
  f.output = TensorView::mat(d_out.data(), DType::kF32, 2, 4);
  for (int call = 0; call < 2; ++call) {
    ASSERT_TRUE(fill_bytes(ctx, d_out.data(), 0xff, d_out.bytes()).ok());
    const Status st = s.tbe->forward(ctx, f);
    ASSERT_TRUE(st.ok()) << "forward call " << call << ": " << st.to_string();
    std::vector<float> got(8);
    ASSERT_TRUE(copy_to_host(ctx, got.data(), d_out.data(), d_out.bytes()).ok());
    EXPECT_EQ(got, want) << "forward call " << call;
  }

  TbeBackwardArgs a = s.backward;
  size_t bytes = 0;
  ASSERT_TRUE(s.tbe->backward_workspace_size(ctx, a, &bytes).ok());
  Buffer ws(Backend::kCuda, bytes > 0 ? bytes : 1);
  std::vector<float> h_w = w;
  a.weights = TensorView::vec(h_w.data(), DType::kF32, 40);
  const Status first = s.tbe->backward(ctx, a, ws.data(), bytes);
  expect_host_refusal(first, "weights");
  const Status second = s.tbe->backward(ctx, a, ws.data(), bytes);
  expect_host_refusal(second, "weights");
  EXPECT_EQ(second.message(), first.message());

  a.weights = s.backward.weights;
  for (int call = 0; call < 2; ++call) {
    const Status st = s.tbe->backward(ctx, a, ws.data(), bytes);
    ASSERT_TRUE(st.ok()) << "backward call " << call << ": " << st.to_string();
  }
  a.weights = TensorView::vec(h_w.data(), DType::kF32, 40);
  const Status after = s.tbe->backward(ctx, a, ws.data(), bytes);
  expect_host_refusal(after, "weights");
  EXPECT_EQ(after.message(), first.message()) << "refused the same way after calls that passed";
  EXPECT_EQ(h_w, w) << "a refused call wrote the host weights";
  ASSERT_TRUE(synchronize(ctx).ok());
}

}  // namespace
}  // namespace embscale
