// TBE forward against the naive reference (reference_tbe.h) on every backend: many seeded random
// configurations, then targeted ones (each listed D, empty batches and bags, hot and duplicate rows,
// every dtype combination with exact small-integer data). Errors and bad arguments are in
// test_tbe_forward_errors.cpp.
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "tbe_case.h"

namespace embscale {
namespace {

using testing_tbe::CaseOutcome;
using testing_tbe::TbeCase;
using testing_tbe::random_case;
using testing_tbe::run_tbe_case;

class TbeForward : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (!backend_available(GetParam())) GTEST_SKIP() << backend_name(GetParam()) << " backend not available";
  }
  // Runs c and expects a match; returns whether the reference had a non-zero output.
  bool expect_case(const TbeCase& c) {
    const CaseOutcome o = run_tbe_case(GetParam(), c);
    EXPECT_TRUE(o.failure.empty()) << o.failure;
    return o.reference_nonzero;
  }
};

TEST_P(TbeForward, RandomConfigs) {
  constexpr uint64_t kBaseSeed = 20261130;
  constexpr int kCases = 300;
  std::printf("TbeForward.RandomConfigs: seeds %llu..%llu\n", static_cast<unsigned long long>(kBaseSeed),
              static_cast<unsigned long long>(kBaseSeed + kCases - 1));
  int nonzero = 0;
  for (int i = 0; i < kCases; ++i) {
    const TbeCase c = random_case(kBaseSeed + i);
    const CaseOutcome o = run_tbe_case(GetParam(), c);
    ASSERT_TRUE(o.failure.empty()) << o.failure;
    nonzero += o.reference_nonzero;
  }
  // Empty batches and bags give all-zero references by design; most cases must not.
  EXPECT_GT(nonzero, kCases / 2);
}

TEST_P(TbeForward, EachListedDimension) {
  const uint64_t seed = 101;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  for (int d : {1, 3, 5, 127, 160, 192, 320, 1000, 2048}) {
    for (PoolingMode pool : {PoolingMode::kSum, PoolingMode::kMean, PoolingMode::kNone}) {
      TbeCase c;
      c.num_rows = {500, 37};
      c.dims = {d, d};
      c.batch_size = 9;
      c.bag_size = 6;
      c.variable_bag_size = true;
      c.pooling = pool;
      c.seed = seed + d;
      EXPECT_TRUE(expect_case(c)) << "reference all zeros, D=" << d;
    }
  }
}

TEST_P(TbeForward, MixedDimensionsSharedTables) {
  const uint64_t seed = 202;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  TbeCase c;
  c.num_rows = {1000, 20, 3, 777, 64};
  c.dims = {1, 3, 5, 127, 320};
  c.feature_table = {4, 0, 0, 2, 3, 1, 4, 3};
  c.batch_size = 13;
  c.bag_size = 7;
  c.variable_bag_size = true;
  c.seed = seed;
  for (bool weighted : {false, true}) {
    c.weighted = weighted;
    EXPECT_TRUE(expect_case(c));
  }
}

TEST_P(TbeForward, EmptyBatchAndEmptyBags) {
  TbeCase c;
  c.num_rows = {10, 20};
  c.dims = {4, 7};
  c.seed = 303;
  for (PoolingMode pool : {PoolingMode::kSum, PoolingMode::kMean}) {
    c.pooling = pool;
    c.batch_size = 0;
    c.bag_size = 5;
    expect_case(c);
    c.batch_size = 5;
    c.bag_size = 0;  // every bag empty: SUM and MEAN give zeros, which the poisoned output must show
    expect_case(c);
  }
  c.dims = {4, 4};
  c.pooling = PoolingMode::kNone;
  c.batch_size = 5;
  c.bag_size = 0;  // no lookups: output [0, D]
  expect_case(c);
  c.batch_size = 0;
  expect_case(c);
}

TEST_P(TbeForward, SingleRowTablesAndHotRows) {
  // E = 1 makes every lookup a duplicate of row 0; Zipf with large alpha concentrates on a few rows.
  TbeCase c;
  c.num_rows = {1, 50000};
  c.dims = {9, 33};
  c.batch_size = 17;
  c.bag_size = 25;
  c.alpha = 3.0;
  c.seed = 404;
  std::printf("seed %llu\n", static_cast<unsigned long long>(c.seed));
  for (PoolingMode pool : {PoolingMode::kSum, PoolingMode::kMean}) {
    c.pooling = pool;
    EXPECT_TRUE(expect_case(c));
  }
}

TEST_P(TbeForward, ExactForEveryDtypeCombination) {
  // Small-integer weights (and per-sample weights in {-2, -1, 0.5, 1, 3}) make the fp32 sums exact,
  // so the output must equal the exact sum rounded once to the output dtype.
  const uint64_t seed = 505;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  int n = 0;
  for (DType w : {DType::kF32, DType::kF16, DType::kBF16})
    for (DType o : {DType::kF32, DType::kF16, DType::kBF16})
      for (DType idx : {DType::kI32, DType::kI64})
        for (PoolingMode pool : {PoolingMode::kSum, PoolingMode::kMean, PoolingMode::kNone})
          for (bool weighted : {false, true}) {
            if (weighted && pool == PoolingMode::kMean) continue;
            TbeCase c;
            c.num_rows = {300, 41, 5};
            c.dims = pool == PoolingMode::kNone ? std::vector<int>{12, 12, 12} : std::vector<int>{12, 1, 67};
            c.batch_size = 11;
            c.bag_size = 40;  // sums reach several hundred: rounding to bf16 is exercised
            c.variable_bag_size = true;
            c.weights_dtype = w;
            c.output_dtype = o;
            c.index_dtype = idx;
            c.pooling = pool;
            c.weighted = weighted;
            c.integer_values = true;
            c.seed = seed + n++;
            EXPECT_TRUE(expect_case(c));
          }
}

// Plain calls (pooled, bounds checks off, no per-sample weights) where every feature takes one walk run
// the warp kernel (rows of 17 or more 16-byte vectors; two vectors a lane for 33..64) or the vector kernel
// (one 16-byte vector a lane): every row width either side of their limits, bags from empty to several
// chunks of 32 lookups (partial last steps), duplicate rows, every dtype combination, mixed widths.
TEST_P(TbeForward, PlainKernels) {
  struct Dims {
    DType weights;
    std::vector<int> dims;
  };
  const std::vector<Dims> sets = {
      // warp kernel, fp32: 17, 32, 33, 40, 48, 63, 64, 65, 128 vectors; mixed widths
      {DType::kF32, {68}}, {DType::kF32, {128, 128}}, {DType::kF32, {132}}, {DType::kF32, {160, 192}},
      {DType::kF32, {252}}, {DType::kF32, {256}}, {DType::kF32, {260}}, {DType::kF32, {512}},
      {DType::kF32, {128, 256, 160, 516}},
      // warp kernel, 16-bit weights: 17, 32, 33, 64, 65 vectors
      {DType::kF16, {136}}, {DType::kBF16, {256}}, {DType::kF16, {264}}, {DType::kBF16, {512}}, {DType::kF16, {520}},
      // vector kernel: 1..16 vectors, 16-vector rows next to whole-warp ones, and rows in passes of 32
      // vectors next to narrow ones
      {DType::kF32, {4}}, {DType::kF32, {8, 32}}, {DType::kF32, {64}}, {DType::kF32, {100, 128, 36}},
      {DType::kF16, {8, 64}}, {DType::kBF16, {128}}, {DType::kF32, {4, 512}}, {DType::kF32, {64, 260}},
      // neither: a row not a multiple of 16 bytes sends the call to the bags kernel
      {DType::kF32, {128, 6}},
  };
  const DType kOut[] = {DType::kF32, DType::kF16, DType::kBF16};
  const uint64_t seed = 707;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  int n = 0;
  for (const Dims& set : sets) {
    for (PoolingMode pool : {PoolingMode::kSum, PoolingMode::kMean}) {
      for (bool integer : {false, true}) {
        TbeCase c;
        c.dims = set.dims;
        for (size_t t = 0; t < set.dims.size(); ++t) c.num_rows.push_back(t % 2 == 0 ? 3000 : 2);
        c.batch_size = 23;
        c.bag_size = 70;  // 0..140 lookups: up to five chunks of 32, partial steps
        c.variable_bag_size = true;
        c.alpha = n % 3 == 0 ? 1.15 : 0.0;
        c.weights_dtype = set.weights;
        c.output_dtype = kOut[n % 3];
        c.index_dtype = n % 2 == 0 ? DType::kI64 : DType::kI32;
        c.pooling = pool;
        c.bounds = BoundsCheckMode::kOff;
        c.integer_values = integer;
        c.seed = seed + n++;
        EXPECT_TRUE(expect_case(c));
      }
    }
  }
  // Features sharing tables (feature_table_map), on each kernel.
  for (const std::vector<int>& dims : {std::vector<int>{128, 256}, std::vector<int>{32, 64}}) {
    TbeCase c;
    c.dims = dims;
    c.num_rows = {500, 40};
    c.feature_table = {1, 0, 1, 1, 0};
    c.batch_size = 19;
    c.bag_size = 40;
    c.variable_bag_size = true;
    c.alpha = 1.15;
    c.bounds = BoundsCheckMode::kOff;
    c.seed = seed + n++;
    EXPECT_TRUE(expect_case(c));
  }
}

TEST_P(TbeForward, ManyFeatures) {
  TbeCase c;
  for (int t = 0; t < 40; ++t) {
    c.num_rows.push_back(100 + 13 * t);
    c.dims.push_back(1 + (t * 37) % 70);
  }
  c.batch_size = 8;
  c.bag_size = 4;
  c.variable_bag_size = true;
  c.index_dtype = DType::kI32;
  c.weights_dtype = DType::kBF16;
  c.output_dtype = DType::kF16;
  c.seed = 606;
  std::printf("seed %llu\n", static_cast<unsigned long long>(c.seed));
  EXPECT_TRUE(expect_case(c));
}

INSTANTIATE_TEST_SUITE_P(Backends, TbeForward, ::testing::Values(Backend::kCpu, Backend::kCuda),
                         [](const ::testing::TestParamInfo<Backend>& info) { return std::string(backend_name(info.param)); });

}  // namespace
}  // namespace embscale
