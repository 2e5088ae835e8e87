// The CUDA TBE backward's phases timed on their own (dev/tbe_backward_phases.cu): after a full call,
// each phase may be repeated on the same workspace and each repeat of rows is one more optimizer step,
// so the weights and optimizer state after a full call and the phase timing equal those after as many
// full calls of the library as rows ran (bit for bit: the backward's summation order is fixed), in
// every bounds-check mode. Part of the dev tests; without a GPU it reports itself skipped.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "embscale/memory.h"
#include "embscale/tbe.h"
#include "tbe_backward_phases.h"

namespace embscale {
namespace {

constexpr int kBatch = 40;

// Three tables (one row width under a lane group, one of whole warps, one wider), random bags plus
// one bag of 1500 lookups of a single row (the multi-block path), row-wise Adagrad.
struct PhaseCase {
  Context ctx = Context::cuda();
  std::unique_ptr<TableBatchedEmbedding> tbe;
  std::vector<float> w0, go;
  std::vector<int64_t> idx, off;
  Buffer d_w, d_m1, d_idx, d_off, d_go, d_skip;

  explicit PhaseCase(uint64_t seed) {
    TbeConfig cfg;
    cfg.tables = {TableSpec{300, 16}, TableSpec{50, 64}, TableSpec{1000, 160}};
    EXPECT_TRUE(TableBatchedEmbedding::create(ctx, cfg, &tbe).ok());
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    off.push_back(0);
    for (int f = 0; f < tbe->num_features(); ++f) {
      const int64_t rows = cfg.tables[f].num_rows;
      for (int b = 0; b < kBatch; ++b) {
        const int64_t len = f == 2 && b == 3 ? 1500 : static_cast<int64_t>(rng() % 31);
        for (int64_t i = 0; i < len; ++i) idx.push_back(f == 2 && b == 3 ? 7 : static_cast<int64_t>(rng() % rows));
        off.push_back(static_cast<int64_t>(idx.size()));
      }
    }
    w0.resize(static_cast<size_t>(tbe->num_weights()));
    for (float& v : w0) v = value(rng);
    go.resize(static_cast<size_t>(kBatch) * tbe->total_dim());
    for (float& v : go) v = value(rng);
    d_w = Buffer(Backend::kCuda, w0.size() * 4);
    d_m1 = Buffer(Backend::kCuda, static_cast<size_t>(tbe->total_rows()) * 4);
    d_idx = Buffer(Backend::kCuda, idx.size() * 8);
    d_off = Buffer(Backend::kCuda, off.size() * 8);
    d_go = Buffer(Backend::kCuda, go.size() * 4);
    d_skip = Buffer(Backend::kCuda, 8);
    EXPECT_TRUE(copy_to_backend(ctx, d_idx.data(), idx.data(), idx.size() * 8).ok());
    EXPECT_TRUE(copy_to_backend(ctx, d_off.data(), off.data(), off.size() * 8).ok());
    EXPECT_TRUE(copy_to_backend(ctx, d_go.data(), go.data(), go.size() * 4).ok());
  }

  TbeBackwardArgs args(BoundsCheckMode bounds) const {
    TbeBackwardArgs a;
    a.weights = TensorView::vec(d_w.data(), DType::kF32, tbe->num_weights());
    a.indices = TensorView::vec(d_idx.data(), DType::kI64, static_cast<int64_t>(idx.size()));
    a.offsets = TensorView::vec(d_off.data(), DType::kI64, static_cast<int64_t>(off.size()));
    a.batch_size = kBatch;
    a.bounds_check = bounds;
    a.num_skipped = bounds == BoundsCheckMode::kSkip || bounds == BoundsCheckMode::kWarn ? d_skip.as<int64_t>() : nullptr;
    a.grad_output = TensorView::mat(d_go.data(), DType::kF32, kBatch, tbe->total_dim());
    a.optimizer.type = OptimizerType::kRowwiseAdagrad;
    a.optimizer.learning_rate = 0.05f;
    a.optimizer.eps = 0.1f;
    a.momentum1 = TensorView::vec(d_m1.data(), DType::kF32, tbe->total_rows());
    return a;
  }

  void reset() {
    ASSERT_TRUE(copy_to_backend(ctx, d_w.data(), w0.data(), w0.size() * 4).ok());
    ASSERT_TRUE(fill_bytes(ctx, d_m1.data(), 0, d_m1.bytes()).ok());
  }

  // The weights and the optimizer state, on the host.
  std::pair<std::vector<float>, std::vector<float>> state() const {
    std::vector<float> w(w0.size()), m(static_cast<size_t>(tbe->total_rows()));
    EXPECT_TRUE(synchronize(ctx).ok());
    EXPECT_TRUE(copy_to_host(ctx, w.data(), d_w.data(), w.size() * 4).ok());
    EXPECT_TRUE(copy_to_host(ctx, m.data(), d_m1.data(), m.size() * 4).ok());
    return {w, m};
  }
};

TEST(TbeBackwardPhases, EachRepeatOfRowsIsOneMoreStep) {
  if (!backend_available(Backend::kCuda)) GTEST_SKIP() << "cuda backend not available";
  const uint64_t seed = 20261201;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  PhaseCase c(seed);
  for (BoundsCheckMode bounds :
       {BoundsCheckMode::kOff, BoundsCheckMode::kError, BoundsCheckMode::kSkip, BoundsCheckMode::kWarn}) {
    SCOPED_TRACE(std::string("bounds_check ") + bounds_check_mode_name(bounds));
    const TbeBackwardArgs a = c.args(bounds);
    size_t bytes = 0;
    ASSERT_TRUE(c.tbe->backward_workspace_size(c.ctx, a, &bytes).ok());
    Buffer ws(Backend::kCuda, bytes);
    tools::TimingConfig cfg;
    cfg.warmup = 1;
    cfg.repeats = 2;  // with the warmup: each phase runs 3 times, so rows makes 3 more steps

    c.reset();
    for (int call = 0; call < 4; ++call) ASSERT_TRUE(c.tbe->backward(c.ctx, a, ws.data(), bytes).ok());
    const auto want = c.state();

    c.reset();
    ASSERT_TRUE(c.tbe->backward(c.ctx, a, ws.data(), bytes).ok());
    std::vector<std::pair<std::string, double>> phases;
    const Status st = dev::time_backward_phases(c.ctx, *c.tbe, a, ws.data(), bytes, cfg, &phases);
    ASSERT_TRUE(st.ok()) << st.to_string();
    const auto got = c.state();

    ASSERT_EQ(phases.size(), 4u);
    const char* names[] = {"linearize", "sort", "encode", "rows"};
    for (size_t k = 0; k < 4; ++k) {
      EXPECT_EQ(phases[k].first, names[k]);
      EXPECT_GT(phases[k].second, 0.0) << names[k];
    }
    EXPECT_TRUE(got.first == want.first) << "weights differ from 4 full calls";
    EXPECT_TRUE(got.second == want.second) << "row-wise Adagrad state differs from 4 full calls";
  }
}

}  // namespace
}  // namespace embscale
