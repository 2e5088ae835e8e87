// The seeded TBE input generator: reproducible, shaped as tbe.h requires (table-major offsets of
// T*B+1 entries, last == N), indices in range, bag sizes in [0, 2L], Zipf frequencies following
// k^-alpha with hot rows spread over the table; the weight initialiser is chunk-independent. Also the
// CPU forward's determinism across thread counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <vector>

#include "embscale/tbe_generator.h"
#include "tbe_case.h"

namespace embscale {
namespace {

TEST(TbeGenerator, ShapesRangesAndReproducibility) {
  TbeInputSpec s;
  s.batch_size = 37;
  s.bag_size = 9;
  s.variable_bag_size = true;
  s.num_rows = {1, 10, 100000, 7};
  s.index_dtype = DType::kI32;
  s.weighted = true;
  s.seed = 42;
  std::printf("seed %llu\n", static_cast<unsigned long long>(s.seed));
  TbeInputs a, b;
  ASSERT_TRUE(generate_tbe_inputs(s, &a).ok());
  ASSERT_TRUE(generate_tbe_inputs(s, &b).ok());
  EXPECT_EQ(a.indices, b.indices);
  EXPECT_EQ(a.offsets, b.offsets);
  EXPECT_EQ(a.per_sample_weights, b.per_sample_weights);
  ASSERT_EQ(a.offsets.size(), 4u * 37 + 1);
  EXPECT_EQ(a.offsets[0], 0);
  EXPECT_EQ(a.offsets.back(), a.num_indices());
  bool saw_empty = false, saw_long = false;
  for (int f = 0; f < 4; ++f)
    for (int bag = 0; bag < 37; ++bag) {
      const int64_t len = a.offsets[f * 37 + bag + 1] - a.offsets[f * 37 + bag];
      ASSERT_GE(len, 0);
      ASSERT_LE(len, 18);
      saw_empty |= len == 0;
      saw_long |= len > 9;
      for (int64_t p = a.offsets[f * 37 + bag]; p < a.offsets[f * 37 + bag + 1]; ++p) {
        ASSERT_GE(a.indices[p], 0);
        ASSERT_LT(a.indices[p], s.num_rows[f]);
        ASSERT_EQ(a.indices32[p], a.indices[p]);
        ASSERT_GE(a.per_sample_weights[p], 0.0f);
        ASSERT_LT(a.per_sample_weights[p], 1.0f);
      }
    }
  EXPECT_TRUE(saw_empty);
  EXPECT_TRUE(saw_long);
  EXPECT_EQ(a.offsets32.size(), a.offsets.size());
  s.seed = 43;
  ASSERT_TRUE(generate_tbe_inputs(s, &b).ok());
  EXPECT_NE(a.indices, b.indices);
}

TEST(TbeGenerator, ZipfFrequenciesAndSpread) {
  TbeInputSpec s;
  s.batch_size = 20000;
  s.bag_size = 10;
  s.num_rows = {1000000};
  s.alpha = 1.15;
  s.seed = 7;
  std::printf("seed %llu\n", static_cast<unsigned long long>(s.seed));
  TbeInputs in;
  ASSERT_TRUE(generate_tbe_inputs(s, &in).ok());
  std::map<int64_t, int64_t> count;
  for (int64_t i : in.indices) ++count[i];
  std::vector<std::pair<int64_t, int64_t>> by_freq;  // (count, row)
  for (const auto& kv : count) by_freq.push_back({kv.second, kv.first});
  std::sort(by_freq.rbegin(), by_freq.rend());
  // Expected share of rank 1: 1 / H where H = sum_k k^-1.15 over 1e6 ranks.
  double H = 0;
  for (int k = 1; k <= 1000000; ++k) H += std::pow(k, -1.15);
  const double n = static_cast<double>(in.num_indices());
  const double p1 = 1.0 / H, p2 = std::pow(2.0, -1.15) / H;
  EXPECT_NEAR(by_freq[0].first / n, p1, 5 * std::sqrt(p1 / n));
  EXPECT_NEAR(by_freq[1].first / n, p2, 5 * std::sqrt(p2 / n));
  // The hottest rows are not neighbours.
  for (int i = 0; i < 8; ++i)
    for (int j = i + 1; j < 8; ++j) EXPECT_GT(std::llabs(by_freq[i].second - by_freq[j].second), 1);
  // Far fewer unique rows than uniform sampling would give.
  EXPECT_LT(count.size(), in.indices.size() / 3);
}

TEST(TbeGenerator, ZipfTailBeyondExactRanks) {
  TbeInputSpec s;
  s.batch_size = 4000;
  s.bag_size = 50;
  s.num_rows = {int64_t{1} << 34};
  s.alpha = 1.05;
  s.seed = 9;
  TbeInputs in;
  ASSERT_TRUE(generate_tbe_inputs(s, &in).ok());
  for (int64_t i : in.indices) {
    ASSERT_GE(i, 0);
    ASSERT_LT(i, int64_t{1} << 34);
  }
}

TEST(TbeGenerator, RefusesBadSpecs) {
  TbeInputs in;
  TbeInputSpec s;
  s.num_rows = {10};
  s.batch_size = -1;
  EXPECT_EQ(generate_tbe_inputs(s, &in).message().rfind("batch_size", 0), 0u);
  s.batch_size = 1;
  s.bag_size = -1;
  EXPECT_EQ(generate_tbe_inputs(s, &in).message().rfind("bag_size", 0), 0u);
  s.bag_size = 1;
  s.alpha = -0.5;
  EXPECT_EQ(generate_tbe_inputs(s, &in).message().rfind("alpha", 0), 0u);
  s.alpha = 0;
  s.num_rows = {10, 0};
  EXPECT_EQ(generate_tbe_inputs(s, &in).message().rfind("num_rows[1]", 0), 0u);
  s.num_rows = {10};
  s.index_dtype = DType::kF32;
  EXPECT_EQ(generate_tbe_inputs(s, &in).message().rfind("index_dtype", 0), 0u);
}

TEST(TbeGenerator, WeightInitIsChunkIndependent) {
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    const size_t es = dtype_size(dt);
    std::vector<unsigned char> whole(1000 * es), parts(1000 * es);
    ASSERT_TRUE(init_uniform_weights(dt, 0.5f, 11, 0, 1000, whole.data()).ok());
    ASSERT_TRUE(init_uniform_weights(dt, 0.5f, 11, 0, 333, parts.data()).ok());
    ASSERT_TRUE(init_uniform_weights(dt, 0.5f, 11, 333, 667, parts.data() + 333 * es).ok());
    EXPECT_EQ(whole, parts);
    double lo = 1, hi = -1;
    for (int i = 0; i < 1000; ++i) {
      const double v = ref::decode(whole.data(), dt, i);
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    EXPECT_GE(lo, -0.5);
    EXPECT_LE(hi, 0.5);
    EXPECT_LT(lo, -0.4);
    EXPECT_GT(hi, 0.4);
  }
}

TEST(TbeForwardCpu, BitIdenticalForAnyThreadCount) {
  // Each bag is reduced by one thread in index order, so the output cannot depend on the split.
  TbeConfig cfg;
  cfg.tables = {TableSpec{5000, 37}, TableSpec{300, 129}};
  std::unique_ptr<TableBatchedEmbedding> tbe;
  ASSERT_TRUE(TableBatchedEmbedding::create(Context::cpu(), cfg, &tbe).ok());
  TbeInputSpec s;
  s.batch_size = 257;
  s.bag_size = 31;
  s.variable_bag_size = true;
  s.num_rows = {5000, 300};
  s.weighted = true;
  s.seed = 77;
  TbeInputs in;
  ASSERT_TRUE(generate_tbe_inputs(s, &in).ok());
  std::vector<float> w(static_cast<size_t>(tbe->num_weights()));
  ASSERT_TRUE(init_uniform_weights(DType::kF32, 1.0f, 5, 0, tbe->num_weights(), w.data()).ok());
  std::vector<std::vector<float>> outs;
  for (int threads : {1, 2, 3, 8}) {
    std::vector<float> out(static_cast<size_t>(257 * tbe->total_dim()), NAN);
    TbeForwardArgs a;
    a.weights = TensorView::vec(w.data(), DType::kF32, tbe->num_weights());
    a.indices = TensorView::vec(in.indices.data(), DType::kI64, in.num_indices());
    a.offsets = TensorView::vec(in.offsets.data(), DType::kI64, static_cast<int64_t>(in.offsets.size()));
    a.per_sample_weights = TensorView::vec(in.per_sample_weights.data(), DType::kF32, in.num_indices());
    a.batch_size = 257;
    a.output = TensorView::mat(out.data(), DType::kF32, 257, tbe->total_dim());
    ASSERT_TRUE(tbe->forward(Context::cpu(threads), a).ok());
    outs.push_back(out);
  }
  for (size_t i = 1; i < outs.size(); ++i)
    EXPECT_EQ(0, std::memcmp(outs[0].data(), outs[i].data(), outs[0].size() * 4)) << "thread setting " << i;
}

}  // namespace
}  // namespace embscale
