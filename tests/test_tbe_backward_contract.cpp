// Parts of the TBE backward's contract (tbe.h, tbe/rounding.h) the other backward tests leave open,
// on every available backend:
//  * stochastic rounding is a hash of (seed, step, element): the same seed and step reproduce the bits,
//    another step or another seed changes them;
//  * a finite update beyond the format's largest finite value is rounded to nearest, never to infinity
//    by chance (bf16 and fp16);
//  * the sort keeps every row's lookups together when the linearised rows need a 12th key bit (rows
//    2048 apart share their low 11 bits): dense-gradient mode and row-wise Adagrad against the reference;
//    and when the rows fill a power of two (the sentinel key of lookups outside every bag needs a bit
//    more) and lookups sit before offsets[0];
//  * arguments refused with a message naming them, nothing written: eps = 0 for the Adam variants,
//    negative tuning hints, written buffers aliasing inputs (unique_grads, grad_per_sample_weights);
//  * buffers that touch without overlapping (one allocation cut into consecutive views) are accepted and
//    give the reference's result.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "embscale/memory.h"
#include "embscale/tbe.h"
#include "reference_fp8.h"
#include "reference_tbe_backward.h"
#include "tbe_backward_case.h"

namespace embscale {
namespace {

class TbeBackwardContract : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (!backend_available(GetParam())) GTEST_SKIP() << backend_name(GetParam()) << " backend not available";
  }
  Backend backend() const { return GetParam(); }
  Context ctx() const { return GetParam() == Backend::kCuda ? Context::cuda() : Context::cpu(); }
};

// One table [E, D] of 16-bit weights, each row looked up once (bag r = row r), SGD.
struct OneTableSgd {
  Backend backend;
  Context ctx;
  DType wt;
  int64_t E, D;
  std::unique_ptr<TableBatchedEmbedding> tbe;
  Buffer d_w, d_idx, d_off, d_go;

  OneTableSgd(Backend b, DType w_dtype, int64_t rows, int64_t dim, const std::vector<uint16_t>& w0,
              const std::vector<float>& grad)
      : backend(b), ctx(b == Backend::kCuda ? Context::cuda() : Context::cpu()), wt(w_dtype), E(rows), D(dim) {
    TbeConfig cfg;
    cfg.tables = {TableSpec{E, static_cast<int>(D)}};
    cfg.weights_dtype = wt;
    EXPECT_TRUE(TableBatchedEmbedding::create(ctx, cfg, &tbe).ok());
    std::vector<int64_t> idx(E), off(E + 1);
    for (int64_t i = 0; i < E; ++i) idx[i] = i;
    for (int64_t i = 0; i <= E; ++i) off[i] = i;
    d_w = Buffer(b, E * D * 2);
    d_idx = Buffer(b, E * 8);
    d_off = Buffer(b, (E + 1) * 8);
    d_go = Buffer(b, E * D * 4);
    EXPECT_TRUE(copy_to_backend(ctx, d_idx.data(), idx.data(), E * 8).ok());
    EXPECT_TRUE(copy_to_backend(ctx, d_off.data(), off.data(), (E + 1) * 8).ok());
    EXPECT_TRUE(copy_to_backend(ctx, d_go.data(), grad.data(), E * D * 4).ok());
    w_init = w0;
  }
  std::vector<uint16_t> w_init;

  // Resets the weights, runs one step, returns the weights' bits.
  std::vector<uint16_t> step(float lr, uint64_t seed, int64_t step_no, WeightRounding rounding) {
    EXPECT_TRUE(copy_to_backend(ctx, d_w.data(), w_init.data(), E * D * 2).ok());
    TbeBackwardArgs a;
    a.weights = TensorView::vec(d_w.data(), wt, E * D);
    a.indices = TensorView::vec(d_idx.data(), DType::kI64, E);
    a.offsets = TensorView::vec(d_off.data(), DType::kI64, E + 1);
    a.batch_size = E;
    a.grad_output = TensorView::mat(d_go.data(), DType::kF32, E, D);
    a.optimizer.type = OptimizerType::kSgd;
    a.optimizer.learning_rate = lr;
    a.optimizer.step = step_no;
    a.rounding = rounding;
    a.seed = seed;
    size_t bytes = 0;
    EXPECT_TRUE(tbe->backward_workspace_size(ctx, a, &bytes).ok());
    Buffer ws(backend, bytes);
    const Status st = tbe->backward(ctx, a, ws.data(), bytes);
    EXPECT_TRUE(st.ok()) << st.to_string();
    EXPECT_TRUE(synchronize(ctx).ok());
    std::vector<uint16_t> out(E * D);
    EXPECT_TRUE(copy_to_host(ctx, out.data(), d_w.data(), E * D * 2).ok());
    return out;
  }
};

TEST_P(TbeBackwardContract, StochasticRoundingFollowsSeedAndStep) {
  const uint64_t seed = 5150;
  std::printf("[ seed     ] %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  for (DType wt : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(wt));
    const ref::Format f = ref::format_of(wt);
    const int64_t E = 256, D = 32;
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    std::vector<uint16_t> w0(E * D);
    std::vector<float> grad(E * D);
    const double ulp = wt == DType::kBF16 ? 0x1p-8 : 0x1p-11;
    for (auto& w : w0) w = static_cast<uint16_t>(ref::encode(u(rng), f, false));
    for (auto& g : grad) g = static_cast<float>(u(rng) * ulp * 16);  // lr 2^-4: updates of about one ulp
    OneTableSgd t(backend(), wt, E, D, w0, grad);
    const std::vector<uint16_t> a = t.step(0.0625f, 9, 3, WeightRounding::kStochastic);
    const std::vector<uint16_t> b = t.step(0.0625f, 9, 3, WeightRounding::kStochastic);
    const std::vector<uint16_t> next_step = t.step(0.0625f, 9, 4, WeightRounding::kStochastic);
    const std::vector<uint16_t> other_seed = t.step(0.0625f, 10, 3, WeightRounding::kStochastic);
    EXPECT_EQ(a, b) << "the same seed and step must give the same bits";
    int64_t by_step = 0, by_seed = 0;
    for (int64_t i = 0; i < E * D; ++i) {
      by_step += a[i] != next_step[i];
      by_seed += a[i] != other_seed[i];
    }
    // Each inexact element rounds up with its own probability p: another draw differs with probability
    // 2p(1-p), a quarter of the elements or so; far above 5% of them.
    EXPECT_GT(by_step, E * D / 20) << "the step does not enter the rounding";
    EXPECT_GT(by_seed, E * D / 20) << "the seed does not enter the rounding";
  }
}

TEST_P(TbeBackwardContract, StochasticRoundingNeverOverflowsAFiniteUpdate) {
  struct Case {
    DType wt;
    double w0;     // the largest finite value (or its negative)
    double delta;  // the update: w0 + delta is finite in fp32 and rounds to nearest back to w0
  };
  const double bf16_max = 0x1.fep127, bf16_ulp = 0x1p120, fp16_max = 65504.0;
  const Case cases[] = {{DType::kBF16, bf16_max, 0.3 * bf16_ulp},
                        {DType::kBF16, -bf16_max, -0.45 * bf16_ulp},
                        {DType::kF16, fp16_max, 10.0},
                        {DType::kF16, -fp16_max, -15.0}};
  for (const Case& k : cases) {
    SCOPED_TRACE(std::string(dtype_name(k.wt)) + " " + std::to_string(k.w0) + " + " + std::to_string(k.delta));
    const ref::Format f = ref::format_of(k.wt);
    const int64_t E = 64, D = 64;
    const uint16_t w_bits = static_cast<uint16_t>(ref::encode(k.w0, f, false));
    ASSERT_EQ(ref::decode(w_bits, f), k.w0);
    const float x = static_cast<float>(k.w0) + static_cast<float>(k.delta);  // the fp32 update, lr = 1
    ASSERT_TRUE(std::isfinite(x));
    ASSERT_GT(std::fabs(static_cast<double>(x)), std::fabs(k.w0));
    ASSERT_EQ(ref::encode(x, f, false), w_bits) << "nearest rounding of the update gives the maximum";
    OneTableSgd t(backend(), k.wt, E, D, std::vector<uint16_t>(E * D, w_bits),
                  std::vector<float>(E * D, static_cast<float>(-k.delta)));
    for (uint64_t seed : {1u, 2u, 3u}) {
      const std::vector<uint16_t> got = t.step(1.0f, seed, 1, WeightRounding::kStochastic);
      int64_t wrong = 0;
      for (uint16_t v : got) wrong += v != w_bits;
      EXPECT_EQ(wrong, 0) << "seed " << seed << ": " << wrong << " of " << E * D
                          << " weights left the largest finite value (infinity by chance)";
    }
  }
}

// Linearised rows in [2048, 4096): the key needs 12 bits, and rows 2048 apart share their low 11 bits.
TEST_P(TbeBackwardContract, SortUsesEveryKeyBit) {
  for (OptimizerType opt : {OptimizerType::kNone, OptimizerType::kRowwiseAdagrad}) {
    for (int64_t rows0 : {int64_t{2000}, int64_t{3000}}) {
      testing_tbe::BwdCase c;
      c.num_rows = {rows0, 1000};
      c.dims = {4, 3};
      c.batch_size = 300;
      c.max_bag = 20;
      c.integer_values = true;
      c.opt.type = opt;
      c.opt.learning_rate = 0.25f;
      c.opt.eps = 0.125f;
      c.seed = 7700 + rows0 + (opt == OptimizerType::kNone ? 0 : 1);
      const testing_tbe::BwdOutcome o = testing_tbe::run_backward_case(backend(), c);
      EXPECT_TRUE(o.failure.empty()) << o.failure;
      EXPECT_TRUE(o.reference_nonzero);
    }
  }
}

// Two tables of 256 rows: 512 = 2^9 rows, keys 0..511, and the sentinel key 512 of a lookup outside every
// bag needs a 10th bit; a sort on the rows' 9 bits alone would rank the sentinel with row 0 (low bits 0).
// The lookups outside every bag (3 before offsets[0], all naming row 0) must change nothing, and row 0 (a
// hot row of features 0 and 2) must be updated once with exactly its bagged lookups' gradients, as the
// reference does, and row 511 (the largest key, hot in feature 1) too. SGD (exact: integer values times
// 0.25), row-wise Adagrad and dense mode (the unique rows ascending, with their summed gradients), in off
// and error modes, and in skip and warn modes with out-of-range lookups among the bags' (their sentinel
// keys then sit between row 0's lookups, so there the sort must keep the sentinel's bit).
TEST_P(TbeBackwardContract, PowerOfTwoRowsWithLookupsOutsideEveryBag) {
  const uint64_t seed = 8128;
  std::mt19937_64 rng(seed);
  const std::vector<int64_t> rows = {256, 256};
  const std::vector<int> dims = {4, 3}, fmap = {0, 1, 0};
  const int64_t B = 8, T = 3;
  std::vector<int64_t> idx = {0, 0, 0}, off;
  for (int64_t f = 0; f < T; ++f) {
    const int64_t hot = fmap[f] == 0 ? 0 : 255;
    for (int64_t b = 0; b < B; ++b) {
      off.push_back(static_cast<int64_t>(idx.size()));
      const int64_t len = static_cast<int64_t>(rng() % 13);
      for (int64_t l = 0; l < len; ++l)
        idx.push_back(rng() % 10 < 4 ? hot : static_cast<int64_t>(rng() % rows[fmap[f]]));
    }
  }
  off.push_back(static_cast<int64_t>(idx.size()));
  const int64_t N = static_cast<int64_t>(idx.size());
  // For skip and warn modes: every fifth bagged lookup out of range (past the end or negative).
  std::vector<int64_t> idx_bad = idx;
  for (int64_t i = 3; i < N; i += 5) idx_bad[i] = i % 2 != 0 ? 256 + i % 7 : -1 - i % 3;
  TbeConfig cfg;
  cfg.tables = {TableSpec{rows[0], dims[0]}, TableSpec{rows[1], dims[1]}};
  cfg.feature_table_map = fmap;
  std::unique_ptr<TableBatchedEmbedding> tbe;
  ASSERT_TRUE(TableBatchedEmbedding::create(ctx(), cfg, &tbe).ok());
  const int64_t NW = tbe->num_weights(), R = tbe->total_rows(), cols = tbe->total_dim();
  std::vector<float> w0(NW), m0(R, 0.5f), go(B * cols);
  for (int64_t i = 0; i < NW; ++i) w0[i] = static_cast<float>(i % 7) - 3.0f;
  for (int64_t i = 0; i < B * cols; ++i) go[i] = static_cast<float>(i % 5) - 2.0f;
  Buffer d_w(backend(), NW * 4), d_m1(backend(), R * 4), d_idx(backend(), N * 8), d_idx_bad(backend(), N * 8),
      d_off(backend(), off.size() * 8), d_go(backend(), go.size() * 4);
  ASSERT_TRUE(copy_to_backend(ctx(), d_idx.data(), idx.data(), N * 8).ok());
  ASSERT_TRUE(copy_to_backend(ctx(), d_idx_bad.data(), idx_bad.data(), N * 8).ok());
  ASSERT_TRUE(copy_to_backend(ctx(), d_off.data(), off.data(), off.size() * 8).ok());
  ASSERT_TRUE(copy_to_backend(ctx(), d_go.data(), go.data(), go.size() * 4).ok());
  ref::BwdInput in;
  in.offsets = off;
  in.batch_size = B;
  in.grad_output.assign(go.begin(), go.end());
  const ref::BwdConfig rc{rows, dims, fmap};
  for (OptimizerType opt : {OptimizerType::kSgd, OptimizerType::kRowwiseAdagrad, OptimizerType::kNone}) {
    for (BoundsCheckMode mode :
         {BoundsCheckMode::kOff, BoundsCheckMode::kError, BoundsCheckMode::kSkip, BoundsCheckMode::kWarn}) {
      const std::string what = std::string(optimizer_name(opt)) + ", " + bounds_check_mode_name(mode) +
                               ", seed " + std::to_string(seed);
      const bool skips = mode == BoundsCheckMode::kSkip || mode == BoundsCheckMode::kWarn;
      in.indices = skips ? idx_bad : idx;
      ASSERT_TRUE(copy_to_backend(ctx(), d_w.data(), w0.data(), NW * 4).ok());
      ASSERT_TRUE(copy_to_backend(ctx(), d_m1.data(), m0.data(), R * 4).ok());
      Buffer d_rows(backend(), N * 8), d_count(backend(), 8), d_grads(backend(), N * tbe->max_dim() * 4),
          d_skipped(backend(), 8);
      TbeBackwardArgs a;
      a.weights = TensorView::vec(d_w.data(), DType::kF32, NW);
      a.indices = TensorView::vec(skips ? d_idx_bad.data() : d_idx.data(), DType::kI64, N);
      a.offsets = TensorView::vec(d_off.data(), DType::kI64, static_cast<int64_t>(off.size()));
      a.batch_size = B;
      a.bounds_check = mode;
      if (skips) a.num_skipped = d_skipped.as<int64_t>();
      a.grad_output = TensorView::mat(d_go.data(), DType::kF32, B, cols);
      a.optimizer.type = opt;
      a.optimizer.learning_rate = 0.25f;
      a.optimizer.eps = 0.125f;
      if (opt == OptimizerType::kRowwiseAdagrad) a.momentum1 = TensorView::vec(d_m1.data(), DType::kF32, R);
      if (opt == OptimizerType::kNone) {
        a.unique_rows = TensorView::vec(d_rows.data(), DType::kI64, N);
        a.num_unique = d_count.as<int64_t>();
        a.unique_grads = TensorView::vec(d_grads.data(), DType::kF32, N * tbe->max_dim());
      }
      size_t bytes = 0;
      ASSERT_TRUE(tbe->backward_workspace_size(ctx(), a, &bytes).ok()) << what;
      Buffer d_ws(backend(), bytes);
      const Status st = tbe->backward(ctx(), a, d_ws.data(), bytes);
      ASSERT_TRUE(st.ok()) << what << ": " << st.to_string();
      ASSERT_TRUE(synchronize(ctx()).ok());
      ref::BwdState rs;
      rs.w.assign(w0.begin(), w0.end());
      rs.m1.assign(m0.begin(), m0.end());
      OptimizerParams p = a.optimizer;
      const ref::BwdOutput want = ref::tbe_backward(rc, in, p, &rs);
      ASSERT_EQ(want.skipped > 0, skips) << what;
      if (skips) {
        int64_t skipped = -1;
        ASSERT_TRUE(copy_to_host(ctx(), &skipped, d_skipped.data(), 8).ok());
        EXPECT_EQ(skipped, want.skipped) << what;
      }
      ASSERT_GT(want.row_count.at(0), 5) << what << ": row 0 should be hot";
      ASSERT_GT(want.row_count.at(R - 1), 3) << what << ": row 511 should be hot";
      if (opt == OptimizerType::kNone) {
        int64_t count = -1;
        ASSERT_TRUE(copy_to_host(ctx(), &count, d_count.data(), 8).ok());
        ASSERT_EQ(count, static_cast<int64_t>(want.row_grad.size())) << what;
        std::vector<int64_t> urows(count);
        std::vector<float> grads(N * tbe->max_dim());
        ASSERT_TRUE(copy_to_host(ctx(), urows.data(), d_rows.data(), count * 8).ok());
        ASSERT_TRUE(copy_to_host(ctx(), grads.data(), d_grads.data(), grads.size() * 4).ok());
        int64_t u = 0;
        for (const auto& kv : want.row_grad) {
          ASSERT_EQ(urows[u], kv.first) << what << ": unique row " << u;
          for (size_t d = 0; d < kv.second.size(); ++d)
            EXPECT_EQ(grads[u * tbe->max_dim() + d], kv.second[d]) << what << ": row " << kv.first << ", column " << d;
          ++u;
        }
        continue;
      }
      std::vector<float> w(NW), m1(R);
      ASSERT_TRUE(copy_to_host(ctx(), w.data(), d_w.data(), NW * 4).ok());
      ASSERT_TRUE(copy_to_host(ctx(), m1.data(), d_m1.data(), R * 4).ok());
      for (int64_t i = 0; i < NW; ++i) {
        if (opt == OptimizerType::kSgd)
          EXPECT_EQ(w[i], rs.w[i]) << what << ": weights[" << i << "]";
        else
          EXPECT_NEAR(w[i], rs.w[i], 1e-5 * std::max(1.0, std::fabs(rs.w[i]))) << what << ": weights[" << i << "]";
      }
      if (opt == OptimizerType::kRowwiseAdagrad)
        for (int64_t r = 0; r < R; ++r) EXPECT_NEAR(m1[r], rs.m1[r], 1e-5 * std::fabs(rs.m1[r])) << what << ": momentum1[" << r << "]";
    }
  }
}

// A small problem (2 tables: E = 6, 4; D = 3, 2; B = 2; int64 lookups) whose buffers are views into
// one allocation `mem`, so tests can place them next to each other or make them overlap.
struct Packed {
  Backend backend;
  Context ctx;
  std::unique_ptr<TableBatchedEmbedding> tbe;
  std::vector<int64_t> idx = {0, 5, 5, 2, 1, 3, 0, 3};
  std::vector<int64_t> off = {0, 2, 4, 6, 8};
  std::vector<float> w0, psw = {1.0f, 2.0f, -1.0f, 0.5f, 1.0f, 1.0f, 2.0f, -2.0f}, go;
  Buffer mem;
  explicit Packed(Backend b) : backend(b), ctx(b == Backend::kCuda ? Context::cuda() : Context::cpu()) {
    TbeConfig cfg;
    cfg.tables = {TableSpec{6, 3}, TableSpec{4, 2}};
    EXPECT_TRUE(TableBatchedEmbedding::create(ctx, cfg, &tbe).ok());
    for (int64_t i = 0; i < tbe->num_weights(); ++i) w0.push_back(static_cast<float>(i % 7) - 3.0f);
    for (int i = 0; i < 2 * tbe->total_dim(); ++i) go.push_back(static_cast<float>(i % 5) - 2.0f);
    mem = Buffer(b, 4096);
  }
  float* at(size_t byte) const { return reinterpret_cast<float*>(static_cast<char*>(mem.data()) + byte); }
  void put(size_t byte, const void* src, size_t n) const {
    EXPECT_TRUE(copy_to_backend(ctx, static_cast<char*>(mem.data()) + byte, src, n).ok());
  }
  std::vector<float> get(size_t byte, size_t n) const {
    std::vector<float> v(n);
    EXPECT_TRUE(copy_to_host(ctx, v.data(), static_cast<char*>(mem.data()) + byte, n * 4).ok());
    return v;
  }
  Status run(const TbeBackwardArgs& a) const {
    size_t bytes = 0;
    Status st = tbe->backward_workspace_size(ctx, a, &bytes);
    if (!st.ok()) return st;
    Buffer ws(backend, bytes);
    st = tbe->backward(ctx, a, ws.data(), bytes);
    return st.ok() ? synchronize(ctx) : st;
  }
};

TEST_P(TbeBackwardContract, TouchingBuffersAreAcceptedAndGiveTheReference) {
  Packed p(backend());
  const size_t NW = static_cast<size_t>(p.tbe->num_weights()), R = static_cast<size_t>(p.tbe->total_rows());
  const size_t G = p.go.size(), N = p.idx.size();
  // [weights | momentum1 (row-wise) | grad_output | per_sample_weights | grad_per_sample_weights | indices | offsets]
  const size_t o_w = 0, o_m1 = o_w + NW * 4, o_go = o_m1 + R * 4, o_psw = o_go + G * 4, o_gpsw = o_psw + N * 4,
               o_idx = o_gpsw + N * 4, o_off = o_idx + N * 8;
  ASSERT_LE(o_off + p.off.size() * 8, p.mem.bytes());
  const std::vector<float> m0(R, 0.25f);
  p.put(o_w, p.w0.data(), NW * 4);
  p.put(o_m1, m0.data(), R * 4);
  p.put(o_go, p.go.data(), G * 4);
  p.put(o_psw, p.psw.data(), N * 4);
  p.put(o_idx, p.idx.data(), N * 8);
  p.put(o_off, p.off.data(), p.off.size() * 8);
  TbeBackwardArgs a;
  a.weights = TensorView::vec(p.at(o_w), DType::kF32, static_cast<int64_t>(NW));
  a.momentum1 = TensorView::vec(p.at(o_m1), DType::kF32, static_cast<int64_t>(R));
  a.grad_output = TensorView::mat(p.at(o_go), DType::kF32, 2, p.tbe->total_dim());
  a.per_sample_weights = TensorView::vec(p.at(o_psw), DType::kF32, static_cast<int64_t>(N));
  a.grad_per_sample_weights = TensorView::vec(p.at(o_gpsw), DType::kF32, static_cast<int64_t>(N));
  a.indices = TensorView::vec(p.at(o_idx), DType::kI64, static_cast<int64_t>(N));
  a.offsets = TensorView::vec(p.at(o_off), DType::kI64, static_cast<int64_t>(p.off.size()));
  a.batch_size = 2;
  a.optimizer.type = OptimizerType::kRowwiseAdagrad;
  a.optimizer.learning_rate = 0.5f;
  a.optimizer.eps = 0.25f;
  const Status st = p.run(a);
  ASSERT_TRUE(st.ok()) << "buffers that only touch must be accepted: " << st.to_string();

  ref::BwdConfig rc{{6, 4}, {3, 2}, {0, 1}};
  ref::BwdInput in;
  in.indices = p.idx;
  in.offsets = p.off;
  in.psw = p.psw;
  in.batch_size = 2;
  in.grad_output.assign(p.go.begin(), p.go.end());
  ref::BwdState rs;
  rs.w.assign(p.w0.begin(), p.w0.end());
  rs.m1.assign(m0.begin(), m0.end());
  const ref::BwdOutput ro = ref::tbe_backward(rc, in, a.optimizer, &rs);
  const std::vector<float> w = p.get(o_w, NW), m1 = p.get(o_m1, R), gpsw = p.get(o_gpsw, N);
  for (size_t i = 0; i < NW; ++i) EXPECT_NEAR(w[i], rs.w[i], 1e-5) << "weights[" << i << "]";
  for (size_t r = 0; r < R; ++r) EXPECT_NEAR(m1[r], rs.m1[r], 1e-5 * std::fabs(rs.m1[r])) << "momentum1[" << r << "]";
  for (size_t i = 0; i < N; ++i) EXPECT_EQ(gpsw[i], ro.gpsw[i]) << "grad_per_sample_weights[" << i << "]";  // exact
  // The neighbours were only read: grad_output, per-sample weights and the lookups are unchanged.
  EXPECT_EQ(p.get(o_go, G), p.go);
  EXPECT_EQ(p.get(o_psw, N), p.psw);
}

TEST_P(TbeBackwardContract, RefusedArgumentsNameThemselvesAndWriteNothing) {
  Packed p(backend());
  const size_t NW = static_cast<size_t>(p.tbe->num_weights()), R = static_cast<size_t>(p.tbe->total_rows());
  const size_t G = p.go.size(), N = p.idx.size(), maxd = static_cast<size_t>(p.tbe->max_dim());
  // [weights | m1 (element-wise) | m2 (element-wise) | grad_output | psw | indices | offsets | spare]
  const size_t o_w = 0, o_m1 = NW * 4, o_m2 = o_m1 + NW * 4, o_go = o_m2 + NW * 4, o_psw = o_go + G * 4,
               o_idx = o_psw + N * 4, o_off = o_idx + N * 8, o_spare = o_off + p.off.size() * 8;
  ASSERT_LE(o_spare + (N * 8 + 8 + N * maxd * 4 + N * 4), p.mem.bytes());
  const std::vector<float> state(NW, 0.125f);
  auto reset = [&]() {
    p.put(o_w, p.w0.data(), NW * 4);
    p.put(o_m1, state.data(), NW * 4);
    p.put(o_m2, state.data(), NW * 4);
  };
  reset();
  p.put(o_go, p.go.data(), G * 4);
  p.put(o_psw, p.psw.data(), N * 4);
  p.put(o_idx, p.idx.data(), N * 8);
  p.put(o_off, p.off.data(), p.off.size() * 8);
  auto base = [&]() {
    TbeBackwardArgs a;
    a.weights = TensorView::vec(p.at(o_w), DType::kF32, static_cast<int64_t>(NW));
    a.grad_output = TensorView::mat(p.at(o_go), DType::kF32, 2, p.tbe->total_dim());
    a.indices = TensorView::vec(p.at(o_idx), DType::kI64, static_cast<int64_t>(N));
    a.offsets = TensorView::vec(p.at(o_off), DType::kI64, static_cast<int64_t>(p.off.size()));
    a.batch_size = 2;
    a.optimizer.type = OptimizerType::kAdam;
    a.momentum1 = TensorView::vec(p.at(o_m1), DType::kF32, static_cast<int64_t>(NW));
    a.momentum2 = TensorView::vec(p.at(o_m2), DType::kF32, static_cast<int64_t>(NW));
    return a;
  };
  auto dense = [&](TbeBackwardArgs& a) {
    a.optimizer.type = OptimizerType::kNone;
    a.momentum1 = a.momentum2 = TensorView();
    a.unique_rows = TensorView::vec(p.at(o_spare), DType::kI64, static_cast<int64_t>(N));
    a.num_unique = reinterpret_cast<int64_t*>(p.at(o_spare + N * 8));
    a.unique_grads = TensorView::vec(p.at(o_spare + N * 8 + 8), DType::kF32, static_cast<int64_t>(N * maxd));
  };
  // The base call is valid (so each refusal below is the mutation's).
  ASSERT_TRUE(p.run(base()).ok());
  reset();
  const struct {
    const char* what;
    std::function<void(TbeBackwardArgs&)> mutate;
  } bads[] = {
      {"optimizer.eps", [](TbeBackwardArgs& a) { a.optimizer.eps = 0.0f; }},
      {"optimizer.eps", [](TbeBackwardArgs& a) { a.optimizer.eps = -1e-8f; }},
      {"optimizer.eps", [&](TbeBackwardArgs& a) {
         a.optimizer.type = OptimizerType::kPartialRowwiseAdam;
         a.momentum2 = TensorView::vec(p.at(o_m2), DType::kF32, static_cast<int64_t>(R));
         a.optimizer.eps = 0.0f;
       }},
      {"tuning.max_warp_segment", [](TbeBackwardArgs& a) { a.tuning.max_warp_segment = -1; }},
      {"tuning.max_block_segment", [](TbeBackwardArgs& a) { a.tuning.max_block_segment = -8; }},
      {"unique_grads", [&](TbeBackwardArgs& a) {  // written over grad_output, which it is summed from
         dense(a);
         a.unique_grads.data = p.at(o_go);
       }},
      {"unique_grads", [&](TbeBackwardArgs& a) {  // written over the indices
         dense(a);
         a.unique_grads.data = p.at(o_idx);
       }},
      {"unique_rows", [&](TbeBackwardArgs& a) {  // written over the offsets
         dense(a);
         a.unique_rows.data = p.at(o_off);
       }},
      {"num_unique", [&](TbeBackwardArgs& a) {  // written over grad_output
         dense(a);
         a.num_unique = reinterpret_cast<int64_t*>(p.at(o_go + 8));
       }},
      {"weights: overlaps num_skipped", [&](TbeBackwardArgs& a) {  // the skip count written into a table
         a.bounds_check = BoundsCheckMode::kSkip;
         a.num_skipped = reinterpret_cast<int64_t*>(p.at(o_w + 8));
       }},
      {"num_skipped: overlaps offsets", [&](TbeBackwardArgs& a) {
         a.bounds_check = BoundsCheckMode::kSkip;
         a.num_skipped = reinterpret_cast<int64_t*>(p.at(o_off));
       }},
      {"grad_per_sample_weights", [&](TbeBackwardArgs& a) {  // written over the per-sample weights
         a.per_sample_weights = TensorView::vec(p.at(o_psw), DType::kF32, static_cast<int64_t>(N));
         a.grad_per_sample_weights = TensorView::vec(p.at(o_psw), DType::kF32, static_cast<int64_t>(N));
       }},
  };
  for (const auto& b : bads) {
    TbeBackwardArgs a = base();
    b.mutate(a);
    const Status st = p.run(a);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << b.what << ": " << st.to_string();
    EXPECT_EQ(st.message().rfind(b.what, 0), 0u) << "message \"" << st.message() << "\" should start with " << b.what;
    EXPECT_EQ(p.get(o_w, NW), p.w0) << b.what << ": weights written";
    EXPECT_EQ(p.get(o_m1, NW), state) << b.what << ": momentum1 written";
    EXPECT_EQ(p.get(o_m2, NW), state) << b.what << ": momentum2 written";
    EXPECT_EQ(p.get(o_go, G), p.go) << b.what << ": grad_output written";
    EXPECT_EQ(p.get(o_psw, N), p.psw) << b.what << ": per_sample_weights written";
  }
  // The workspace is written too: laid over the weights (or any other argument) it is refused.
  const TbeBackwardArgs a = base();
  size_t bytes = 0;
  ASSERT_TRUE(p.tbe->backward_workspace_size(p.ctx, a, &bytes).ok());
  ASSERT_GT(bytes, 0u);
  for (size_t at : {o_w, o_go, o_idx}) {
    const Status st = p.tbe->backward(p.ctx, a, p.at(at), bytes);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
    EXPECT_EQ(st.message().rfind("workspace: overlaps ", 0), 0u) << st.message();
  }
  // Over a written buffer alone: momentum1 at the start of an allocation of its own, the workspace on it.
  Buffer own(p.backend, bytes + NW * 4);
  ASSERT_TRUE(copy_to_backend(p.ctx, own.data(), state.data(), NW * 4).ok());
  TbeBackwardArgs over_state = base();
  over_state.momentum1 = TensorView::vec(own.data(), DType::kF32, static_cast<int64_t>(NW));
  const Status st = p.tbe->backward(p.ctx, over_state, own.data(), bytes);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_EQ(st.message().rfind("workspace: overlaps momentum1", 0), 0u) << st.message();
  ASSERT_TRUE(synchronize(p.ctx).ok());
  std::vector<float> m1_own(NW);
  ASSERT_TRUE(copy_to_host(p.ctx, m1_own.data(), own.data(), NW * 4).ok());
  EXPECT_EQ(m1_own, state) << "workspace: momentum1 written";
  EXPECT_EQ(p.get(o_w, NW), p.w0) << "workspace: weights written";
  EXPECT_EQ(p.get(o_m1, NW), state) << "workspace: momentum1 written";
  EXPECT_EQ(p.get(o_go, G), p.go) << "workspace: grad_output written";
}

INSTANTIATE_TEST_SUITE_P(Backends, TbeBackwardContract, ::testing::Values(Backend::kCpu, Backend::kCuda),
                         [](const ::testing::TestParamInfo<Backend>& i) { return std::string(backend_name(i.param)); });

}  // namespace
}  // namespace embscale
