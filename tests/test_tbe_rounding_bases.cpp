// TbeBackwardArgs::rounding_bases on every backend: stochastic rounding hashes each weight by the element
// index the bases give its row. Two TBEs hold the same two tables in opposite orders; trained with the
// same lookups, the swapped one rounds differently (its rows sit elsewhere in the buffer), and the same
// bit for bit once given the first one's places as bases. This is what lets a row cache (tbe_cache.h)
// round a cached row as the table in place would.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "embscale/memory.h"
#include "embscale/tbe.h"

namespace embscale {
namespace {

class TbeRoundingBases : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (!backend_available(GetParam())) GTEST_SKIP() << backend_name(GetParam()) << " backend not available";
  }
};

struct Trained {
  std::vector<uint16_t> w;  // bf16 bits of the whole buffer after the step
};

// One row-wise Adagrad step with stochastic rounding on tables `specs` (bf16), the lookups of feature f
// going to table fmap[f]; bases: per row of the TBE, or empty for none.
Trained train(Backend b, const std::vector<TableSpec>& specs, const std::vector<int>& fmap,
              const std::vector<uint16_t>& w0, const std::vector<int64_t>& indices, const std::vector<int64_t>& offsets,
              int64_t B, const std::vector<float>& grad, const std::vector<int64_t>& bases) {
  const Context ctx = b == Backend::kCpu ? Context::cpu(2) : Context::cuda();
  TbeConfig cfg;
  cfg.tables = specs;
  cfg.feature_table_map = fmap;
  cfg.weights_dtype = DType::kBF16;
  std::unique_ptr<TableBatchedEmbedding> tbe;
  EXPECT_TRUE(TableBatchedEmbedding::create(ctx, cfg, &tbe).ok());
  Buffer w(b, w0.size() * 2), m1(b, static_cast<size_t>(tbe->total_rows()) * 4), idx(b, indices.size() * 8),
      off(b, offsets.size() * 8), g(b, grad.size() * 4), rb(b, bases.size() * 8 + 8);
  std::vector<float> zeros(static_cast<size_t>(tbe->total_rows()), 0.0f);
  EXPECT_TRUE(copy_to_backend(ctx, w.data(), w0.data(), w0.size() * 2).ok());
  EXPECT_TRUE(copy_to_backend(ctx, m1.data(), zeros.data(), zeros.size() * 4).ok());
  EXPECT_TRUE(copy_to_backend(ctx, idx.data(), indices.data(), indices.size() * 8).ok());
  EXPECT_TRUE(copy_to_backend(ctx, off.data(), offsets.data(), offsets.size() * 8).ok());
  EXPECT_TRUE(copy_to_backend(ctx, g.data(), grad.data(), grad.size() * 4).ok());
  if (!bases.empty()) EXPECT_TRUE(copy_to_backend(ctx, rb.data(), bases.data(), bases.size() * 8).ok());
  TbeBackwardArgs a;
  a.weights = TensorView::vec(w.data(), DType::kBF16, tbe->num_weights());
  a.indices = TensorView::vec(idx.data(), DType::kI64, static_cast<int64_t>(indices.size()));
  a.offsets = TensorView::vec(off.data(), DType::kI64, static_cast<int64_t>(offsets.size()));
  a.batch_size = B;
  a.grad_output = TensorView::mat(g.data(), DType::kF32, B, tbe->total_dim());
  a.optimizer.type = OptimizerType::kRowwiseAdagrad;
  a.optimizer.learning_rate = 0.01f;
  a.optimizer.eps = 1e-4f;
  a.momentum1 = TensorView::vec(m1.data(), DType::kF32, tbe->total_rows());
  a.rounding = WeightRounding::kStochastic;
  a.seed = 99;
  if (!bases.empty()) a.rounding_bases = TensorView::vec(rb.data(), DType::kI64, tbe->total_rows());
  size_t ws = 0;
  EXPECT_TRUE(tbe->backward_workspace_size(ctx, a, &ws).ok());
  Buffer wsb(b, ws);
  const Status st = tbe->backward(ctx, a, wsb.data(), ws);
  EXPECT_TRUE(st.ok()) << st.to_string();
  Trained t;
  t.w.resize(w0.size());
  EXPECT_TRUE(copy_to_host(ctx, t.w.data(), w.data(), w0.size() * 2).ok());
  return t;
}

TEST_P(TbeRoundingBases, RowsRoundByTheirGivenPlaces) {
  const uint32_t seed = 4242;
  std::printf("seed %u\n", seed);
  std::mt19937 rng(seed);
  const TableSpec a{60, 24}, c{40, 16};
  const int64_t B = 32;
  // Feature 0 looks up table A, feature 1 table C.
  std::vector<int64_t> indices, offsets{0};
  for (int f = 0; f < 2; ++f)
    for (int64_t i = 0; i < B; ++i) {
      const int len = static_cast<int>(rng() % 4);
      for (int k = 0; k < len; ++k) indices.push_back(static_cast<int64_t>(rng() % (f == 0 ? a.num_rows : c.num_rows)));
      offsets.push_back(static_cast<int64_t>(indices.size()));
    }
  std::vector<float> grad(static_cast<size_t>(B * (a.dim + c.dim)));
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  for (auto& v : grad) v = uni(rng);
  // Layout 1: [A, C]. Layout 2: [C, A], the output columns still feature 0 (A) then feature 1 (C).
  const int64_t nA = a.num_rows * a.dim, nC = c.num_rows * c.dim;
  std::vector<uint16_t> w1(static_cast<size_t>(nA + nC)), w2(w1.size());
  for (auto& v : w1) v = static_cast<uint16_t>(0x3f00 | (rng() & 0x00ff));  // bf16 in [0.5, 1)
  std::memcpy(w2.data(), w1.data() + nA, static_cast<size_t>(nC) * 2);
  std::memcpy(w2.data() + nC, w1.data(), static_cast<size_t>(nA) * 2);
  const Trained t1 = train(GetParam(), {a, c}, {0, 1}, w1, indices, offsets, B, grad, {});
  const Trained plain = train(GetParam(), {c, a}, {1, 0}, w2, indices, offsets, B, grad, {});
  // Layout 2's rows (C's, then A's) given their places in layout 1.
  std::vector<int64_t> bases;
  for (int64_t r = 0; r < c.num_rows; ++r) bases.push_back(nA + r * c.dim);
  for (int64_t r = 0; r < a.num_rows; ++r) bases.push_back(r * a.dim);
  const Trained based = train(GetParam(), {c, a}, {1, 0}, w2, indices, offsets, B, grad, bases);
  const auto swapped = [&](const Trained& t) {  // back to layout 1
    std::vector<uint16_t> v(t.w.size());
    std::memcpy(v.data(), t.w.data() + nC, static_cast<size_t>(nA) * 2);
    std::memcpy(v.data() + nA, t.w.data(), static_cast<size_t>(nC) * 2);
    return v;
  };
  int64_t changed = 0;
  for (size_t i = 0; i < w1.size(); ++i) changed += t1.w[i] != w1[i];
  ASSERT_GT(changed, 100) << "the step changed too few weights to compare";
  EXPECT_EQ(swapped(based), t1.w) << "rows given their places in layout 1 must round as there";
  EXPECT_NE(swapped(plain), t1.w) << "without bases the rows round by their own places (the test would prove nothing)";
}

INSTANTIATE_TEST_SUITE_P(Backends, TbeRoundingBases, ::testing::Values(Backend::kCpu, Backend::kCuda),
                         [](const ::testing::TestParamInfo<Backend>& i) { return std::string(backend_name(i.param)); });

}  // namespace
}  // namespace embscale
