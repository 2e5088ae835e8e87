// TBE backward: bad input is reported as a Status naming the argument, and on every error the weights,
// the optimizer state and the dense-mode outputs are left untouched (compared byte for byte before and
// after): an out-of-range index in kError mode (named by feature, bag and position), bad offsets, bad
// optimizer parameters, missing or unexpected state pointers, bad shapes and dtypes, a short workspace.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "embscale/memory.h"
#include "embscale/tbe.h"
#include "reference_tbe_backward.h"
#include "tbe/tbe_backend.h"

namespace embscale {
namespace {

uint32_t float_bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// 3 features over 2 tables (E = 20, 9; D = 5, 3), B = 3, int32 lookups, row-wise Adagrad state.
struct Problem {
  Backend backend;
  Context ctx;
  std::unique_ptr<TableBatchedEmbedding> tbe;
  std::vector<int32_t> idx = {1, 2, 3, 4, 5, 6, 7, 8, 8, 0, 19, 2};
  std::vector<int32_t> off = {0, 1, 2, 3, 5, 6, 9, 10, 11, 12};
  Buffer d_w, d_idx, d_off, d_go, d_m1, d_m2, d_ws;
  std::vector<float> w0, m0;
  size_t ws_bytes = 0;

  explicit Problem(Backend b) : backend(b), ctx(b == Backend::kCuda ? Context::cuda() : Context::cpu()) {
    TbeConfig cfg;
    cfg.tables = {TableSpec{20, 5}, TableSpec{9, 3}};
    cfg.feature_table_map = {0, 1, 0};
    EXPECT_TRUE(TableBatchedEmbedding::create(ctx, cfg, &tbe).ok());
    w0.resize(tbe->num_weights());
    for (size_t i = 0; i < w0.size(); ++i) w0[i] = 0.25f * static_cast<float>(static_cast<int>(i % 9) - 4);
    m0.assign(tbe->num_weights(), 0.5f);
    d_w = Buffer(b, w0.size() * 4);
    d_idx = Buffer(b, idx.size() * 4);
    d_off = Buffer(b, off.size() * 4);
    d_go = Buffer(b, 3 * tbe->total_dim() * 4);
    d_m1 = Buffer(b, m0.size() * 4);
    d_m2 = Buffer(b, m0.size() * 4);
    const std::vector<float> go(3 * tbe->total_dim(), 1.0f);
    EXPECT_TRUE(copy_to_backend(ctx, d_idx.data(), idx.data(), idx.size() * 4).ok());
    EXPECT_TRUE(copy_to_backend(ctx, d_off.data(), off.data(), off.size() * 4).ok());
    EXPECT_TRUE(copy_to_backend(ctx, d_go.data(), go.data(), go.size() * 4).ok());
    reset();
  }
  void reset() {
    EXPECT_TRUE(copy_to_backend(ctx, d_w.data(), w0.data(), w0.size() * 4).ok());
    EXPECT_TRUE(copy_to_backend(ctx, d_m1.data(), m0.data(), m0.size() * 4).ok());
    EXPECT_TRUE(copy_to_backend(ctx, d_m2.data(), m0.data(), m0.size() * 4).ok());
  }
  TbeBackwardArgs args() const {
    TbeBackwardArgs a;
    a.weights = TensorView::vec(d_w.data(), DType::kF32, tbe->num_weights());
    a.indices = TensorView::vec(d_idx.data(), DType::kI32, static_cast<int64_t>(idx.size()));
    a.offsets = TensorView::vec(d_off.data(), DType::kI32, static_cast<int64_t>(off.size()));
    a.batch_size = 3;
    a.grad_output = TensorView::mat(d_go.data(), DType::kF32, 3, tbe->total_dim());
    a.optimizer.type = OptimizerType::kRowwiseAdagrad;
    a.momentum1 = rowwise(d_m1);
    return a;
  }
  // Optimizer state views over d_m1 / d_m2: row-wise ([total_rows()]) or element-wise ([num_weights()]).
  TensorView rowwise(const Buffer& b) const { return TensorView::vec(b.data(), DType::kF32, tbe->total_rows()); }
  TensorView elementwise(const Buffer& b) const { return TensorView::vec(b.data(), DType::kF32, tbe->num_weights()); }
  Status run(const TbeBackwardArgs& a) {
    size_t bytes = 0;
    Status st = tbe->backward_workspace_size(ctx, a, &bytes);
    if (st.ok() && bytes > ws_bytes) {
      d_ws = Buffer(backend, bytes);
      ws_bytes = bytes;
    }
    st = tbe->backward(ctx, a, d_ws.data(), ws_bytes);
    if (st.ok()) st = synchronize(ctx);
    return st;
  }
  // Weights and both state buffers equal their initial bytes.
  bool untouched() {
    std::vector<float> w(w0.size()), m1(m0.size()), m2(m0.size());
    EXPECT_TRUE(copy_to_host(ctx, w.data(), d_w.data(), w.size() * 4).ok());
    EXPECT_TRUE(copy_to_host(ctx, m1.data(), d_m1.data(), m1.size() * 4).ok());
    EXPECT_TRUE(copy_to_host(ctx, m2.data(), d_m2.data(), m2.size() * 4).ok());
    return std::memcmp(w.data(), w0.data(), w.size() * 4) == 0 && std::memcmp(m1.data(), m0.data(), m1.size() * 4) == 0 &&
           std::memcmp(m2.data(), m0.data(), m2.size() * 4) == 0;
  }
};

class TbeBackwardErrors : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (!backend_available(GetParam())) GTEST_SKIP() << backend_name(GetParam()) << " backend not available";
  }
};

// The problem's valid call (row-wise Adagrad, the default hyper-parameters) against the naive reference
// (reference_tbe_backward.h): every weight and every row-wise state value; rows no lookup names, the
// state past total_rows() and momentum2 (unused) keep their bits.
TEST_P(TbeBackwardErrors, ValidCallUpdates) {
  Problem p(GetParam());
  const TbeBackwardArgs a = p.args();
  const Status st = p.run(a);
  ASSERT_TRUE(st.ok()) << st.to_string();
  std::vector<float> w(p.w0.size()), m1(p.m0.size()), m2(p.m0.size());
  ASSERT_TRUE(copy_to_host(p.ctx, w.data(), p.d_w.data(), w.size() * 4).ok());
  ASSERT_TRUE(copy_to_host(p.ctx, m1.data(), p.d_m1.data(), m1.size() * 4).ok());
  ASSERT_TRUE(copy_to_host(p.ctx, m2.data(), p.d_m2.data(), m2.size() * 4).ok());

  ref::BwdConfig rc{{20, 9}, {5, 3}, {0, 1, 0}};
  ref::BwdInput in;
  in.indices.assign(p.idx.begin(), p.idx.end());
  in.offsets.assign(p.off.begin(), p.off.end());
  in.batch_size = 3;
  in.grad_output.assign(3 * p.tbe->total_dim(), 1.0);
  ref::BwdState rs;
  rs.w.assign(p.w0.begin(), p.w0.end());
  rs.m1.assign(p.m0.begin(), p.m0.begin() + p.tbe->total_rows());
  const ref::BwdOutput ro = ref::tbe_backward(rc, in, a.optimizer, &rs);
  ASSERT_EQ(ro.row_grad.size(), 10u) << "rows the lookups name";

  std::vector<bool> row_named(p.tbe->total_rows(), false);
  for (const auto& kv : ro.row_grad) row_named[kv.first] = true;
  int changed = 0;
  for (int64_t i = 0; i < p.tbe->num_weights(); ++i) {
    const int t = i < p.tbe->weight_offset(1) ? 0 : 1;
    const int D = t == 0 ? 5 : 3;
    const int64_t row = p.tbe->row_offset(t) + (i - p.tbe->weight_offset(t)) / D;
    if (!row_named[row]) {
      EXPECT_EQ(float_bits_of(w[i]), float_bits_of(p.w0[i])) << "weights[" << i << "] of a row no lookup names";
      continue;
    }
    changed += w[i] != p.w0[i];
    EXPECT_NEAR(w[i], rs.w[i], 1e-6 + 1e-6 * std::fabs(rs.w[i])) << "weights[" << i << "]";
  }
  EXPECT_GT(changed, 30) << "the named rows must change";
  for (int64_t r = 0; r < p.tbe->total_rows(); ++r) {
    if (row_named[r]) {
      EXPECT_NEAR(m1[r], rs.m1[r], 1e-6 * std::fabs(rs.m1[r])) << "momentum1[" << r << "]";
      EXPECT_GT(m1[r], p.m0[r]) << "momentum1[" << r << "] must grow";
    } else {
      EXPECT_EQ(float_bits_of(m1[r]), float_bits_of(p.m0[r])) << "momentum1[" << r << "] of a row no lookup names";
    }
  }
  for (size_t i = p.tbe->total_rows(); i < m1.size(); ++i) ASSERT_EQ(float_bits_of(m1[i]), float_bits_of(p.m0[i]));
  for (size_t i = 0; i < m2.size(); ++i) ASSERT_EQ(float_bits_of(m2[i]), float_bits_of(p.m0[i])) << "momentum2 is unused";
}

TEST_P(TbeBackwardErrors, OutOfRangeIndexWritesNothing) {
  Problem p(GetParam());
  p.idx[7] = 9;  // feature 1, bag 2, position 1: table 1 has 9 rows
  ASSERT_TRUE(copy_to_backend(p.ctx, p.d_idx.data(), p.idx.data(), p.idx.size() * 4).ok());
  for (OptimizerType opt : {OptimizerType::kSgd, OptimizerType::kRowwiseAdagrad, OptimizerType::kAdam}) {
    TbeBackwardArgs a = p.args();
    a.optimizer.type = opt;
    a.momentum1 = opt == OptimizerType::kSgd      ? TensorView()
                  : opt == OptimizerType::kAdam ? p.elementwise(p.d_m1)
                                                : p.rowwise(p.d_m1);
    if (opt == OptimizerType::kAdam) a.momentum2 = p.elementwise(p.d_m2);
    const Status st = p.run(a);
    EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.to_string();
    EXPECT_NE(st.message().find("feature 1, bag 2, position 1"), std::string::npos) << st.message();
    EXPECT_TRUE(p.untouched()) << optimizer_name(opt);
  }
  // kSkip and kWarn: the lookup is skipped and counted.
  for (BoundsCheckMode mode : {BoundsCheckMode::kSkip, BoundsCheckMode::kWarn}) {
    TbeBackwardArgs a = p.args();
    Buffer d_skip(GetParam(), 8);
    a.bounds_check = mode;
    a.num_skipped = d_skip.as<int64_t>();
    ASSERT_TRUE(p.run(a).ok());
    int64_t skipped = -1;
    ASSERT_TRUE(copy_to_host(p.ctx, &skipped, d_skip.data(), 8).ok());
    EXPECT_EQ(skipped, 1) << bounds_check_mode_name(mode);
  }
}

// Off mode trusts the indices, but a bad one must still not make the backward write outside the
// tables (the sanitizer runs of this test check the buffers' bounds) or into rows no lookup names
// (the CPU drops a bad index, CUDA clamps it into its table: the last row may change).
TEST_P(TbeBackwardErrors, OffModeBadIndicesStayInsideTheTables) {
  Problem p(GetParam());
  p.idx[0] = -3;         // feature 0 (table 0)
  p.idx[2] = 1 << 30;    // feature 0 (table 0)
  p.idx[7] = 9;          // feature 1 (table 1 has 9 rows); its valid lookups name rows 4..8
  ASSERT_TRUE(copy_to_backend(p.ctx, p.d_idx.data(), p.idx.data(), p.idx.size() * 4).ok());
  TbeBackwardArgs a = p.args();
  a.bounds_check = BoundsCheckMode::kOff;
  const Status st = p.run(a);
  ASSERT_TRUE(st.ok()) << st.to_string();
  std::vector<float> w(p.w0.size());
  ASSERT_TRUE(copy_to_host(p.ctx, w.data(), p.d_w.data(), w.size() * 4).ok());
  for (float v : w) EXPECT_TRUE(std::isfinite(v));
  const int64_t t1 = p.tbe->weight_offset(1);
  for (int64_t e = t1; e < t1 + 4 * 3; ++e) EXPECT_EQ(w[e], p.w0[e]) << "table 1 row " << (e - t1) / 3 << " changed";
}

TEST_P(TbeBackwardErrors, BadOffsetsWriteNothing) {
  Problem p(GetParam());
  p.off[4] = 2;  // decreases
  ASSERT_TRUE(copy_to_backend(p.ctx, p.d_off.data(), p.off.data(), p.off.size() * 4).ok());
  const Status st = p.run(p.args());
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.to_string();
  EXPECT_NE(st.message().find("offsets"), std::string::npos) << st.message();
  EXPECT_TRUE(p.untouched());
  // Warn mode: an error on the CPU (nothing is waited for there); on CUDA the call does not wait for the
  // report, so it succeeds, counts -1 and still writes nothing.
  TbeBackwardArgs a = p.args();
  Buffer d_skip(GetParam(), 8);
  a.bounds_check = BoundsCheckMode::kWarn;
  a.num_skipped = d_skip.as<int64_t>();
  const Status warn = p.run(a);
  if (GetParam() == Backend::kCuda) {
    EXPECT_TRUE(warn.ok()) << warn.to_string();
    int64_t skipped = 0;
    ASSERT_TRUE(copy_to_host(p.ctx, &skipped, d_skip.data(), 8).ok());
    EXPECT_EQ(skipped, -1);
  } else {
    EXPECT_EQ(warn.code(), StatusCode::kOutOfRange) << warn.to_string();
  }
  EXPECT_TRUE(p.untouched());
  if (GetParam() != Backend::kCuda) return;
  // What such a call still outputs on CUDA is defined: dense mode gives no unique row, and the gradient
  // of every per-sample weight is 0 (the output buffers start as 0x7f sentinels).
  const int64_t N = static_cast<int64_t>(p.idx.size());
  Buffer d_rows(GetParam(), N * 8), d_count(GetParam(), 8), d_grads(GetParam(), N * p.tbe->max_dim() * 4);
  Buffer d_psw(GetParam(), N * 4), d_gpsw(GetParam(), N * 4);
  const std::vector<float> ones(N, 1.0f);
  ASSERT_TRUE(copy_to_backend(p.ctx, d_psw.data(), ones.data(), N * 4).ok());
  for (const Buffer* b : {&d_rows, &d_count, &d_grads, &d_gpsw})
    ASSERT_TRUE(fill_bytes(p.ctx, b->data(), 0x7f, b->bytes()).ok());
  TbeBackwardArgs dense = a;
  dense.optimizer.type = OptimizerType::kNone;
  dense.momentum1 = TensorView();
  dense.unique_rows = TensorView::vec(d_rows.data(), DType::kI64, N);
  dense.num_unique = d_count.as<int64_t>();
  dense.unique_grads = TensorView::vec(d_grads.data(), DType::kF32, N * p.tbe->max_dim());
  ASSERT_TRUE(p.run(dense).ok());
  int64_t unique = -1;
  ASSERT_TRUE(copy_to_host(p.ctx, &unique, d_count.data(), 8).ok());
  EXPECT_EQ(unique, 0) << "dense mode with broken offsets";
  TbeBackwardArgs weighted = a;
  weighted.per_sample_weights = TensorView::vec(d_psw.data(), DType::kF32, N);
  weighted.grad_per_sample_weights = TensorView::vec(d_gpsw.data(), DType::kF32, N);
  ASSERT_TRUE(p.run(weighted).ok());
  std::vector<float> gpsw(N, -1.0f);
  ASSERT_TRUE(copy_to_host(p.ctx, gpsw.data(), d_gpsw.data(), N * 4).ok());
  for (int64_t i = 0; i < N; ++i) EXPECT_EQ(gpsw[i], 0.0f) << "grad_per_sample_weights[" << i << "]";
  EXPECT_TRUE(p.untouched());
}

// Each mutation must give invalid_argument (or workspace_too_small) naming `what`, and write nothing.
TEST_P(TbeBackwardErrors, BadArguments) {
  Problem p(GetParam());
  Buffer d_rows(GetParam(), 8 * p.idx.size()), d_nu(GetParam(), 8), d_ug(GetParam(), 4 * p.idx.size() * 5),
      d_psw(GetParam(), 4 * p.idx.size()), d_gpsw(GetParam(), 4 * p.idx.size());
  struct Bad {
    const char* what;
    std::function<void(TbeBackwardArgs&)> mutate;
  };
  const int64_t N = static_cast<int64_t>(p.idx.size());
  const auto adam = [&](TbeBackwardArgs& a) {  // Adam with its two element-wise moments
    a.optimizer.type = OptimizerType::kAdam;
    a.momentum1 = p.elementwise(p.d_m1);
    a.momentum2 = p.elementwise(p.d_m2);
  };
  const auto dense = [&](TbeBackwardArgs& a) {  // dense-gradient mode with every output (max_dim() = 5)
    a.optimizer.type = OptimizerType::kNone;
    a.momentum1 = TensorView();
    a.unique_rows = TensorView::vec(d_rows.data(), DType::kI64, N);
    a.num_unique = d_nu.as<int64_t>();
    a.unique_grads = TensorView::vec(d_ug.data(), DType::kF32, N * 5);
  };
  const Bad bads[] = {
      {"learning_rate", [](TbeBackwardArgs& a) { a.optimizer.learning_rate = NAN; }},
      {"eps", [](TbeBackwardArgs& a) { a.optimizer.eps = 0.0f; }},
      {"beta1", [&](TbeBackwardArgs& a) {
         adam(a);
         a.optimizer.beta1 = 1.0f;
       }},
      {"beta2", [&](TbeBackwardArgs& a) {
         a.optimizer.type = OptimizerType::kPartialRowwiseAdam;
         a.momentum1 = p.elementwise(p.d_m1);
         a.momentum2 = p.rowwise(p.d_m2);
         a.optimizer.beta2 = -0.1f;
       }},
      {"step", [](TbeBackwardArgs& a) { a.optimizer.step = 0; }},
      {"momentum1", [](TbeBackwardArgs& a) { a.momentum1 = TensorView(); }},
      {"momentum2", [&](TbeBackwardArgs& a) { a.momentum2 = p.rowwise(p.d_m2); }},
      // state of the wrong length or dtype (a short buffer would be overrun)
      {"momentum1", [](TbeBackwardArgs& a) { a.momentum1.shape[0] = 3; }},
      {"momentum1", [](TbeBackwardArgs& a) { a.momentum1.shape[0] += 1; }},
      {"momentum1", [&](TbeBackwardArgs& a) { a.momentum1 = p.elementwise(p.d_m1); }},
      {"momentum1", [](TbeBackwardArgs& a) { a.momentum1.dtype = DType::kF16; }},
      {"momentum2", [&](TbeBackwardArgs& a) {
         adam(a);
         a.momentum2 = p.rowwise(p.d_m2);
       }},
      // buffers the backward writes may not share memory with each other or with its inputs
      {"weights", [&](TbeBackwardArgs& a) { a.momentum1.data = a.weights.data; }},
      {"momentum1", [&](TbeBackwardArgs& a) { a.momentum1.data = a.grad_output.data; }},
      {"momentum1", [&](TbeBackwardArgs& a) {
         adam(a);
         a.momentum2 = p.elementwise(p.d_m1);
       }},
      // hyper-parameters and options an optimizer does not take
      {"learning_rate", [](TbeBackwardArgs& a) { a.optimizer.learning_rate = -0.1f; }},
      {"learning_rate", [](TbeBackwardArgs& a) { a.optimizer.learning_rate = INFINITY; }},
      {"weight_decay", [](TbeBackwardArgs& a) {
         a.optimizer.type = OptimizerType::kSgd;
         a.momentum1 = TensorView();
         a.optimizer.weight_decay = 0.01f;
         a.optimizer.weight_decay_mode = WeightDecayMode::kL2;
       }},
      {"max_norm", [&](TbeBackwardArgs& a) {
         adam(a);
         a.optimizer.max_norm = 1.0f;
       }},
      {"gradient_clipping", [&](TbeBackwardArgs& a) {
         dense(a);
         a.optimizer.gradient_clipping = 1.0f;
       }},
      {"eps", [](TbeBackwardArgs& a) { a.optimizer.eps = INFINITY; }},
      {"step", [](TbeBackwardArgs& a) { a.optimizer.step = -5; }},
      {"momentum1", [](TbeBackwardArgs& a) { a.optimizer.type = OptimizerType::kSgd; }},
      {"max_norm", [](TbeBackwardArgs& a) { a.optimizer.max_norm = -1.0f; }},
      {"gradient_clipping", [](TbeBackwardArgs& a) { a.optimizer.gradient_clipping = INFINITY; }},
      {"weight_decay", [](TbeBackwardArgs& a) { a.optimizer.weight_decay = NAN; }},
      {"optimizer.type", [](TbeBackwardArgs& a) { a.optimizer.type = static_cast<OptimizerType>(42); }},
      {"unique_rows", [](TbeBackwardArgs& a) {
         a.optimizer.type = OptimizerType::kNone;
         a.momentum1 = TensorView();
       }},
      {"unique_grads", [&](TbeBackwardArgs& a) { a.unique_grads = TensorView::vec(d_ug.data(), DType::kF32, N * 5); }},
      {"unique_grads", [&](TbeBackwardArgs& a) {  // dense mode with a short unique_grads
         dense(a);
         a.unique_grads.shape[0] -= 1;
       }},
      {"unique_rows", [&](TbeBackwardArgs& a) {  // dense mode with int32 unique rows
         dense(a);
         a.unique_rows.dtype = DType::kI32;
       }},
      {"grad_output", [&](TbeBackwardArgs& a) { a.grad_output.shape[1] -= 1; }},
      {"grad_output", [&](TbeBackwardArgs& a) { a.grad_output.dtype = DType::kI32; }},
      {"grad_output", [&](TbeBackwardArgs& a) { a.grad_output.data = nullptr; }},
      {"weights", [&](TbeBackwardArgs& a) { a.weights.shape[0] -= 1; }},
      {"weights", [&](TbeBackwardArgs& a) { a.weights.dtype = DType::kBF16; }},
      {"offsets", [&](TbeBackwardArgs& a) { a.batch_size = 4; }},
      {"indices", [&](TbeBackwardArgs& a) { a.indices.dtype = DType::kF32; }},
      {"per_sample_weights", [&](TbeBackwardArgs& a) {
         a.pooling = PoolingMode::kMean;
         a.per_sample_weights = TensorView::vec(d_psw.data(), DType::kF32, static_cast<int64_t>(p.idx.size()));
       }},
      {"per_sample_weights", [&](TbeBackwardArgs& a) {  // one short: would be read past its end
         a.per_sample_weights = TensorView::vec(d_psw.data(), DType::kF32, static_cast<int64_t>(p.idx.size()) - 1);
       }},
      {"per_sample_weights", [&](TbeBackwardArgs& a) {  // one too many
         a.per_sample_weights = TensorView::vec(d_psw.data(), DType::kF32, static_cast<int64_t>(p.idx.size()) + 1);
       }},
      {"grad_per_sample_weights", [&](TbeBackwardArgs& a) {
         a.grad_per_sample_weights = TensorView::vec(d_gpsw.data(), DType::kF32, static_cast<int64_t>(p.idx.size()));
       }},
      {"grad_per_sample_weights", [&](TbeBackwardArgs& a) {  // short: would be written past its end
         a.per_sample_weights = TensorView::vec(d_psw.data(), DType::kF32, static_cast<int64_t>(p.idx.size()));
         a.grad_per_sample_weights =
             TensorView::vec(d_gpsw.data(), DType::kF32, static_cast<int64_t>(p.idx.size()) - 2);
       }},
      {"pooling", [&](TbeBackwardArgs& a) { a.pooling = PoolingMode::kNone; }},
      {"tuning.block_threads", [&](TbeBackwardArgs& a) { a.tuning.block_threads = -1; }},
      {"rounding", [&](TbeBackwardArgs& a) { a.rounding = static_cast<WeightRounding>(9); }},
      {"batch_size", [&](TbeBackwardArgs& a) { a.batch_size = -1; }},
  };
  for (const Bad& b : bads) {
    TbeBackwardArgs a = p.args();
    b.mutate(a);
    const Status st = p.run(a);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << b.what << ": " << st.to_string();
    EXPECT_NE(st.message().find(b.what), std::string::npos) << b.what << ": " << st.message();
    EXPECT_TRUE(p.untouched()) << b.what;
  }
  // A short workspace.
  TbeBackwardArgs a = p.args();
  size_t bytes = 0;
  ASSERT_TRUE(p.tbe->backward_workspace_size(p.ctx, a, &bytes).ok());
  if (bytes > 0) {
    Buffer ws(GetParam(), bytes);
    const Status st = p.tbe->backward(p.ctx, a, ws.data(), bytes - 1);
    EXPECT_EQ(st.code(), StatusCode::kWorkspaceTooSmall) << st.to_string();
    EXPECT_NE(st.message().find("workspace"), std::string::npos) << st.message();
    EXPECT_TRUE(p.untouched());
  }
}

// The backends' own entry points (which the API layer calls after its own workspace check, and the
// benchmarks call directly) refuse a short workspace with the same code, naming workspace_bytes.
TEST_P(TbeBackwardErrors, BackendRefusesShortWorkspace) {
  Problem p(GetParam());
  const TbeBackwardArgs a = p.args();
  size_t bytes = 0;
  Status st;
  if (GetParam() == Backend::kCpu) {
    ASSERT_TRUE(cpu::tbe_backward_workspace_size(*p.tbe, a, &bytes).ok());
    ASSERT_GT(bytes, 0u);
    Buffer ws(GetParam(), bytes);
    st = cpu::tbe_backward(p.ctx, *p.tbe, a, ws.data(), bytes - 1);
  } else {
#if EMBSCALE_WITH_CUDA
    ASSERT_TRUE(cuda::tbe_backward_workspace_size(*p.tbe, a, &bytes).ok());
    ASSERT_GT(bytes, 0u);
    Buffer ws(GetParam(), bytes);
    st = cuda::tbe_backward(p.ctx, *p.tbe, a, ws.data(), bytes - 1);
#else
    GTEST_SKIP() << "no CUDA backend in this build";
#endif
  }
  EXPECT_EQ(st.code(), StatusCode::kWorkspaceTooSmall) << st.to_string();
  EXPECT_NE(st.message().find("workspace_bytes"), std::string::npos) << st.message();
  EXPECT_TRUE(p.untouched());
}

// check_optimizer_params is the backward's check of its optimizer argument on its own, for code that holds
// hyper-parameters between steps: the defaults pass, each bad field is named.
TEST(TbeOptimizerParams, CheckNamesTheBadField) {
  EXPECT_TRUE(check_optimizer_params(OptimizerParams()).ok());
  const struct {
    const char* field;
    std::function<void(OptimizerParams&)> mutate;
  } bads[] = {
      {"optimizer.learning_rate", [](OptimizerParams& o) { o.learning_rate = -INFINITY; }},
      {"optimizer.eps", [](OptimizerParams& o) { o.eps = NAN; }},
      {"optimizer.beta1", [](OptimizerParams& o) {
         o.type = OptimizerType::kAdam;
         o.beta1 = -0.5f;
       }},
      {"optimizer.max_norm", [](OptimizerParams& o) {
         o.type = OptimizerType::kSgd;
         o.max_norm = 1.0f;
       }},
      {"optimizer.gradient_clipping", [](OptimizerParams& o) { o.gradient_clipping = NAN; }},
      {"optimizer.step", [](OptimizerParams& o) { o.step = -3; }},
      {"optimizer.type", [](OptimizerParams& o) { o.type = static_cast<OptimizerType>(17); }},
      {"optimizer.weight_decay_mode", [](OptimizerParams& o) { o.weight_decay_mode = static_cast<WeightDecayMode>(5); }},
  };
  for (const auto& bad : bads) {
    OptimizerParams o;
    bad.mutate(o);
    const Status st = check_optimizer_params(o);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bad.field;
    EXPECT_EQ(st.message().rfind(std::string(bad.field) + ":", 0), 0u) << st.message();
  }
}

TEST(TbeBackwardNames, Optimizers) {
  for (OptimizerType o : {OptimizerType::kNone, OptimizerType::kSgd, OptimizerType::kRowwiseAdagrad,
                          OptimizerType::kAdam, OptimizerType::kPartialRowwiseAdam}) {
    OptimizerType back = OptimizerType::kSgd;
    EXPECT_TRUE(parse_optimizer(optimizer_name(o), &back)) << optimizer_name(o);
    EXPECT_EQ(back, o);
  }
  EXPECT_FALSE(parse_optimizer("adagrad_typo", nullptr));
}

TEST(TbeBackwardNames, FbgemmAliases) {
  const struct { const char* name; OptimizerType o; } aliases[] = {
      {"dense", OptimizerType::kNone},
      {"exact_sgd", OptimizerType::kSgd},
      {"exact_rowwise_adagrad", OptimizerType::kRowwiseAdagrad},
      // FBGEMM's EmbOptimType values (str(EmbOptimType.X)), as its configs spell them.
      {"exact_row_wise_adagrad", OptimizerType::kRowwiseAdagrad},
      {"partial_row_wise_adam", OptimizerType::kPartialRowwiseAdam}};
  for (const auto& a : aliases) {
    OptimizerType back = OptimizerType::kAdam;
    EXPECT_TRUE(parse_optimizer(a.name, &back)) << a.name;
    EXPECT_EQ(back, a.o) << a.name;
  }
}

// How each optimizer applies weight_decay (FBGEMM's rules): SGD and dense mode not at all (a decay with a mode
// is refused), row-wise Adagrad as weight_decay_mode says, Adam and partial row-wise Adam decoupled whatever the
// mode (so every mode is taken with a weight decay).
TEST(TbeOptimizerParams, WeightDecayRules) {
  const struct { OptimizerType o; OptimizerWeightDecay rule; } rules[] = {
      {OptimizerType::kNone, OptimizerWeightDecay::kNone},
      {OptimizerType::kSgd, OptimizerWeightDecay::kNone},
      {OptimizerType::kRowwiseAdagrad, OptimizerWeightDecay::kByMode},
      {OptimizerType::kAdam, OptimizerWeightDecay::kDecoupled},
      {OptimizerType::kPartialRowwiseAdam, OptimizerWeightDecay::kDecoupled}};
  for (const auto& r : rules) {
    OptimizerInfo info;
    ASSERT_TRUE(optimizer_info(r.o, &info).ok());
    EXPECT_EQ(info.weight_decay, r.rule) << optimizer_name(r.o);
    for (WeightDecayMode mode : {WeightDecayMode::kNone, WeightDecayMode::kL2, WeightDecayMode::kDecoupled}) {
      OptimizerParams p;
      p.type = r.o;
      p.weight_decay = 0.01f;
      p.weight_decay_mode = mode;
      const Status st = check_optimizer_params(p);
      const bool refused = r.rule == OptimizerWeightDecay::kNone && mode != WeightDecayMode::kNone;
      EXPECT_EQ(st.ok(), !refused) << optimizer_name(r.o) << " mode " << static_cast<int>(mode) << ": "
                                   << st.to_string();
      if (refused) EXPECT_EQ(st.message().rfind("optimizer.weight_decay:", 0), 0u) << st.message();
    }
  }
}

// Every bounds-check mode's name parses back to it; FBGEMM's names (BoundsCheckMode.FATAL, WARNING,
// IGNORE, NONE) parse to the mode that does the same job.
TEST(TbeBoundsCheckNames, RoundTripAndFbgemmNames) {
  for (BoundsCheckMode m :
       {BoundsCheckMode::kError, BoundsCheckMode::kSkip, BoundsCheckMode::kOff, BoundsCheckMode::kWarn}) {
    BoundsCheckMode back = BoundsCheckMode::kOff;
    if (m == BoundsCheckMode::kOff) back = BoundsCheckMode::kError;
    EXPECT_TRUE(parse_bounds_check_mode(bounds_check_mode_name(m), &back)) << bounds_check_mode_name(m);
    EXPECT_EQ(back, m);
  }
  const struct { const char* name; BoundsCheckMode m; } fbgemm[] = {
      {"FATAL", BoundsCheckMode::kError}, {"WARNING", BoundsCheckMode::kWarn},
      {"IGNORE", BoundsCheckMode::kSkip}, {"NONE", BoundsCheckMode::kOff}};
  for (const auto& f : fbgemm) {
    BoundsCheckMode back = f.m == BoundsCheckMode::kOff ? BoundsCheckMode::kError : BoundsCheckMode::kOff;
    EXPECT_TRUE(parse_bounds_check_mode(f.name, &back)) << f.name;
    EXPECT_EQ(back, f.m) << f.name;
  }
  EXPECT_FALSE(parse_bounds_check_mode("warnings", nullptr));
}

// What the parsers accept is exactly what their spellings list (the CLI's help and refusals print the
// list): every listed name parses, and near misses, our names in upper case and FBGEMM's in lower case
// among them, do not.
TEST(TbeModeNames, ParsersAcceptExactlyTheListedSpellings) {
  const std::vector<std::string> bounds = bounds_check_mode_spellings();
  EXPECT_EQ(bounds, (std::vector<std::string>{"error", "skip", "off", "warn", "FATAL", "IGNORE", "NONE", "WARNING"}));
  for (const std::string& name : bounds) EXPECT_TRUE(parse_bounds_check_mode(name, nullptr)) << name;
  for (const char* miss : {"ERROR", "SKIP", "OFF", "WARN", "none", "fatal", "ignore", "warning", "Fatal", "", " off"})
    EXPECT_FALSE(parse_bounds_check_mode(miss, nullptr)) << "'" << miss << "'";

  const std::vector<std::string> pooling = pooling_mode_spellings();
  EXPECT_EQ(pooling, (std::vector<std::string>{"sum", "mean", "none", "SUM", "MEAN", "NONE", "sequence"}));
  for (const std::string& name : pooling) EXPECT_TRUE(parse_pooling_mode(name, nullptr)) << name;
  for (const char* miss : {"Sum", "avg", "SEQUENCE", "", "sum "})
    EXPECT_FALSE(parse_pooling_mode(miss, nullptr)) << "'" << miss << "'";
  PoolingMode p = PoolingMode::kSum;
  EXPECT_TRUE(parse_pooling_mode("sequence", &p));
  EXPECT_EQ(p, PoolingMode::kNone);
}

INSTANTIATE_TEST_SUITE_P(Backends, TbeBackwardErrors, ::testing::Values(Backend::kCpu, Backend::kCuda),
                         [](const ::testing::TestParamInfo<Backend>& i) { return std::string(backend_name(i.param)); });

}  // namespace
}  // namespace embscale
