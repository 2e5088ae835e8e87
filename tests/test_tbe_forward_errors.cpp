// TBE forward: bounds-check modes (error names feature, bag and position; skip counts exactly and
// pools only valid lookups; weights are never written), bad offsets, bad arguments and bad configs
// (each Status naming the argument), and 64-bit weight addressing.
#include <cmath>
#include <gtest/gtest.h>

#include <climits>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <utility>
#include <algorithm>
#include <string>
#include <vector>

#include "embscale/memory.h"
#include "embscale/tbe.h"
#include "reference_tbe.h"

namespace embscale {
namespace {

// A small valid problem in backend memory: 3 features over 2 tables (E = 50, 7; D = 6, 3),
// B = 4, fp32 weights equal to small integers so sums are exact.
struct Problem {
  Backend backend;
  Context ctx;
  std::unique_ptr<TableBatchedEmbedding> tbe;
  ref::Config rc;
  std::vector<float> weights;     // host copy
  std::vector<int64_t> indices;   // [N]
  std::vector<int64_t> offsets;   // [T*B+1]
  std::vector<float> psw;         // [N]
  int64_t B = 4;
  std::unique_ptr<Buffer> d_w, d_idx, d_off, d_psw, d_out, d_skipped;

  explicit Problem(Backend b) : backend(b), ctx(b == Backend::kCuda ? Context::cuda() : Context::cpu()) {
    TbeConfig cfg;
    cfg.tables = {TableSpec{50, 6}, TableSpec{7, 3}};
    cfg.feature_table_map = {0, 1, 0};
    EXPECT_TRUE(TableBatchedEmbedding::create(ctx, cfg, &tbe).ok());
    rc.num_rows = {50, 7};
    rc.dims = {6, 3};
    rc.feature_table = {0, 1, 0};
    weights.resize(static_cast<size_t>(tbe->num_weights()));
    for (size_t i = 0; i < weights.size(); ++i) weights[i] = static_cast<float>(static_cast<int>(i % 11) - 5);
    // Bag sizes 0..3 cycling; indices within each feature's table.
    offsets.push_back(0);
    for (int f = 0; f < 3; ++f)
      for (int64_t bag = 0; bag < B; ++bag) {
        const int len = static_cast<int>((f + bag) % 4);
        for (int p = 0; p < len; ++p) indices.push_back((f * 13 + bag * 5 + p * 3) % rc.num_rows[rc.feature_table[f]]);
        offsets.push_back(static_cast<int64_t>(indices.size()));
      }
    for (size_t i = 0; i < indices.size(); ++i) psw.push_back(static_cast<float>(i % 3) - 1.0f);
    d_w.reset(new Buffer(b, weights.size() * 4));
    d_out.reset(new Buffer(b, 64 * 1024));
    d_skipped.reset(new Buffer(b, 8));
    EXPECT_TRUE(copy_to_backend(ctx, d_w->data(), weights.data(), weights.size() * 4).ok());
    upload();
  }

  void upload() {
    d_idx.reset(new Buffer(backend, indices.size() * 8));
    d_off.reset(new Buffer(backend, offsets.size() * 8));
    d_psw.reset(new Buffer(backend, psw.size() * 4));
    EXPECT_TRUE(copy_to_backend(ctx, d_idx->data(), indices.data(), indices.size() * 8).ok());
    EXPECT_TRUE(copy_to_backend(ctx, d_off->data(), offsets.data(), offsets.size() * 8).ok());
    EXPECT_TRUE(copy_to_backend(ctx, d_psw->data(), psw.data(), psw.size() * 4).ok());
    EXPECT_TRUE(fill_bytes(ctx, d_out->data(), 0xff, d_out->bytes()).ok());
  }

  TbeForwardArgs args(PoolingMode pool = PoolingMode::kSum) const {
    TbeForwardArgs a;
    a.weights = TensorView::vec(d_w->data(), DType::kF32, tbe->num_weights());
    a.indices = TensorView::vec(d_idx->data(), DType::kI64, static_cast<int64_t>(indices.size()));
    a.offsets = TensorView::vec(d_off->data(), DType::kI64, static_cast<int64_t>(offsets.size()));
    a.batch_size = B;
    a.pooling = pool;
    a.output = pool == PoolingMode::kNone ? TensorView::mat(d_out->data(), DType::kF32, a.indices.numel(), 6)
                                          : TensorView::mat(d_out->data(), DType::kF32, B, tbe->total_dim());
    return a;
  }

  Status run(const TbeForwardArgs& a) {
    Status st = tbe->forward(ctx, a);
    const Status sync = synchronize(ctx);
    return st.ok() ? sync : st;
  }

  std::vector<float> output(int64_t n) const {
    std::vector<float> o(static_cast<size_t>(n));
    EXPECT_TRUE(copy_to_host(ctx, o.data(), d_out->data(), o.size() * 4).ok());
    return o;
  }

  void expect_weights_unchanged() const {
    std::vector<float> w(weights.size());
    ASSERT_TRUE(copy_to_host(ctx, w.data(), d_w->data(), w.size() * 4).ok());
    EXPECT_EQ(0, std::memcmp(w.data(), weights.data(), w.size() * 4)) << "weights were written";
  }

  // Position in `indices` of bag (f, bag)'s lookup p.
  int64_t pos(int f, int64_t bag, int64_t p) const { return offsets[f * B + bag] + p; }
};

class TbeForwardErrors : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (!backend_available(GetParam())) GTEST_SKIP() << backend_name(GetParam()) << " backend not available";
  }
};

void expect_contains(const Status& st, const std::string& what) {
  EXPECT_NE(st.message().find(what), std::string::npos) << "message \"" << st.message() << "\" lacks \"" << what << "\"";
}

TEST_P(TbeForwardErrors, ErrorModeNamesFeatureBagAndPosition) {
  for (int64_t bad_value : {int64_t{50}, int64_t{-1}, int64_t{1000012}}) {
    Problem pr(GetParam());
    // Feature 2 (table 0, 50 rows), bag 3 has (2 + 3) % 4 = 1 lookup; feature 2, bag 1 has 3.
    const int64_t at = pr.pos(2, 1, 2);
    pr.indices[at] = bad_value;
    pr.upload();
    const Status st = pr.run(pr.args());
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.to_string();
    expect_contains(st, "indices");
    expect_contains(st, "feature 2");
    expect_contains(st, "bag 1");
    expect_contains(st, "position 2");
    expect_contains(st, std::to_string(bad_value));
    expect_contains(st, "table 0");
    expect_contains(st, "50 rows");
    pr.expect_weights_unchanged();
  }
}

// Skip mode, and warn mode (skip without waiting for the device): the same count and output.
TEST_P(TbeForwardErrors, SkipModeCountsAndPoolsValidLookupsOnly) {
  for (BoundsCheckMode mode : {BoundsCheckMode::kSkip, BoundsCheckMode::kWarn}) {
    for (PoolingMode pool : {PoolingMode::kSum, PoolingMode::kMean}) {
      SCOPED_TRACE(bounds_check_mode_name(mode));
      Problem pr(GetParam());
      pr.indices[pr.pos(0, 1, 0)] = 50;       // table 0 has 50 rows
      pr.indices[pr.pos(1, 2, 2)] = 7;        // table 1 has 7 rows
      pr.indices[pr.pos(2, 3, 0)] = -3;
      pr.indices[pr.pos(1, 0, 0)] = 1 << 30;  // feature 1, bag 0 has a single lookup: now empty
      pr.upload();
      ASSERT_TRUE(fill_bytes(pr.ctx, pr.d_skipped->data(), 0xff, 8).ok());
      TbeForwardArgs a = pr.args(pool);
      a.bounds_check = mode;
      a.num_skipped = pr.d_skipped->as<int64_t>();
      // On the CPU any host memory takes the host copy of the count (CUDA: test_tbe_host_count_cuda.cu).
      int64_t host_count = INT64_MIN;
      if (pr.backend == Backend::kCpu) a.num_skipped_host = &host_count;
      ASSERT_TRUE(pr.run(a).ok());
      int64_t skipped = -1;
      ASSERT_TRUE(copy_to_host(pr.ctx, &skipped, pr.d_skipped->data(), 8).ok());
      EXPECT_EQ(skipped, 4);
      if (pr.backend == Backend::kCpu) EXPECT_EQ(host_count, 4);
      const ref::Result r = ref::tbe_forward(pr.rc, pr.weights.data(), pr.indices, pr.offsets, nullptr, pr.B, pool,
                                             BoundsCheckMode::kSkip);
      ASSERT_TRUE(r.ok);
      EXPECT_EQ(r.skipped, 4);
      const std::vector<float> got = pr.output(static_cast<int64_t>(r.out.size()));
      bool nonzero = false;
      for (size_t i = 0; i < r.out.size(); ++i) {
        nonzero |= r.out[i] != 0;
        // Integer weights: SUM is exact; MEAN's division is within the rounding bound.
        if (pool == PoolingMode::kSum)
          EXPECT_EQ(got[i], static_cast<float>(r.out[i])) << "output element " << i;
        else
          EXPECT_NEAR(got[i], r.out[i], ref::tolerance(r.out[i], r.abs_sum[i], r.terms[i], DType::kF32))
              << "output element " << i;
      }
      EXPECT_TRUE(nonzero);
      pr.expect_weights_unchanged();
    }
  }
}

TEST_P(TbeForwardErrors, SkipModeInSequenceWritesZeroRows) {
  Problem pr(GetParam());
  // Sequence mode needs one D: use features 0 and 2 only (both table 0, D = 6) via a new object.
  TbeConfig cfg;
  cfg.tables = {TableSpec{50, 6}};
  cfg.feature_table_map = {0, 0};
  std::unique_ptr<TableBatchedEmbedding> tbe;
  ASSERT_TRUE(TableBatchedEmbedding::create(pr.ctx, cfg, &tbe).ok());
  std::vector<int64_t> idx = {3, 49, 50, 0, -1, 7};
  std::vector<int64_t> off = {0, 2, 2, 5, 6};  // T = 2, B = 2
  Buffer d_idx(pr.backend, idx.size() * 8), d_off(pr.backend, off.size() * 8);
  ASSERT_TRUE(copy_to_backend(pr.ctx, d_idx.data(), idx.data(), idx.size() * 8).ok());
  ASSERT_TRUE(copy_to_backend(pr.ctx, d_off.data(), off.data(), off.size() * 8).ok());
  ASSERT_TRUE(fill_bytes(pr.ctx, pr.d_out->data(), 0xff, pr.d_out->bytes()).ok());
  TbeForwardArgs a;
  a.weights = TensorView::vec(pr.d_w->data(), DType::kF32, tbe->num_weights());
  a.indices = TensorView::vec(d_idx.data(), DType::kI64, 6);
  a.offsets = TensorView::vec(d_off.data(), DType::kI64, 5);
  a.batch_size = 2;
  a.pooling = PoolingMode::kNone;
  a.bounds_check = BoundsCheckMode::kSkip;
  a.num_skipped = pr.d_skipped->as<int64_t>();
  a.output = TensorView::mat(pr.d_out->data(), DType::kF32, 6, 6);
  ASSERT_TRUE(tbe->forward(pr.ctx, a).ok());
  ASSERT_TRUE(synchronize(pr.ctx).ok());
  int64_t skipped = -1;
  ASSERT_TRUE(copy_to_host(pr.ctx, &skipped, pr.d_skipped->data(), 8).ok());
  EXPECT_EQ(skipped, 2);
  const std::vector<float> got = pr.output(36);
  for (int i = 0; i < 6; ++i)
    for (int d = 0; d < 6; ++d) {
      const bool bad = idx[i] < 0 || idx[i] >= 50;
      const float want = bad ? 0.0f : pr.weights[static_cast<size_t>(idx[i] * 6 + d)];
      EXPECT_EQ(got[i * 6 + d], want) << "row " << i << ", column " << d;
    }
}

TEST_P(TbeForwardErrors, OffModeMatchesOnValidInput) {
  Problem pr(GetParam());
  TbeForwardArgs a = pr.args();
  a.bounds_check = BoundsCheckMode::kOff;
  a.per_sample_weights = TensorView::vec(pr.d_psw->data(), DType::kF32, static_cast<int64_t>(pr.psw.size()));
  int64_t host_count = INT64_MIN;  // off mode counts nothing: the host word is left alone
  if (pr.backend == Backend::kCpu) a.num_skipped_host = &host_count;
  ASSERT_TRUE(pr.run(a).ok());
  EXPECT_EQ(host_count, INT64_MIN);
  const ref::Result r = ref::tbe_forward(pr.rc, pr.weights.data(), pr.indices, pr.offsets, pr.psw.data(), pr.B,
                                         PoolingMode::kSum, BoundsCheckMode::kOff);
  const std::vector<float> got = pr.output(static_cast<int64_t>(r.out.size()));
  bool nonzero = false;
  for (size_t i = 0; i < r.out.size(); ++i) {
    nonzero |= r.out[i] != 0;
    EXPECT_EQ(got[i], static_cast<float>(r.out[i])) << "output element " << i;
  }
  EXPECT_TRUE(nonzero);
}

TEST_P(TbeForwardErrors, BadOffsets) {
  // `ends`: only the first or last offset is bad, so on CUDA's off mode the clamped bags still pair
  // every lookup with its own feature (the others may move an index into another table's bag, which off
  // mode leaves undefined there).
  struct BadCase {
    const char* what;
    std::function<void(Problem&)> mutate;
    bool ends;
  };
  const std::vector<BadCase> cases = {
      {"decreasing", [](Problem& p) { p.offsets[5] = p.offsets[4] - 1; }, false},
      {"last below N", [](Problem& p) { p.offsets.back() -= 1; }, true},
      {"last above N", [](Problem& p) { p.offsets.back() += 1; }, true},
      {"negative first", [](Problem& p) { p.offsets[0] = -1; }, true},
      {"last far above N", [](Problem& p) { p.offsets.back() = int64_t{1} << 40; }, true},
      {"first far below 0", [](Problem& p) { p.offsets[0] = -(int64_t{1} << 40); }, true},
      {"middle far above N", [](Problem& p) { p.offsets[6] = int64_t{1} << 40; }, false},
  };
  for (const auto& bc : cases) {
    for (BoundsCheckMode mode :
         {BoundsCheckMode::kError, BoundsCheckMode::kSkip, BoundsCheckMode::kOff, BoundsCheckMode::kWarn}) {
      if (mode == BoundsCheckMode::kOff && GetParam() == Backend::kCuda && !bc.ends) continue;
      for (PoolingMode pool : {PoolingMode::kSum, PoolingMode::kNone}) {
        Problem pr(GetParam());
        bc.mutate(pr);
        pr.upload();
        TbeForwardArgs a = pr.args(pool);
        if (pool == PoolingMode::kNone) {  // sequence mode over the two D=6 features' table only
          a.output = TensorView::mat(pr.d_out->data(), DType::kF32, a.indices.numel(), 6);
        }
        a.bounds_check = mode;
        ASSERT_TRUE(fill_bytes(pr.ctx, pr.d_skipped->data(), 0x5a, 8).ok());
        a.num_skipped = pr.d_skipped->as<int64_t>();
        const Status st = pr.run(a);
        const std::string at = std::string(bc.what) + ", " + bounds_check_mode_name(mode) + ", " + pooling_mode_name(pool);
        if (pool == PoolingMode::kNone && st.code() == StatusCode::kInvalidArgument) continue;  // mixed D: refused
        if (mode == BoundsCheckMode::kWarn && GetParam() == Backend::kCuda) {
          // Warn mode on CUDA never waits for a report: the call succeeds and the count is -1.
          EXPECT_TRUE(st.ok()) << at << ": " << st.to_string();
          int64_t skipped = 0;
          ASSERT_TRUE(copy_to_host(pr.ctx, &skipped, pr.d_skipped->data(), 8).ok());
          EXPECT_EQ(skipped, -1) << at;
        } else if (mode == BoundsCheckMode::kOff && GetParam() == Backend::kCuda) {
          // Off mode on CUDA does not read a report back: bags are clamped in bounds (memcheck runs
          // this test to show nothing outside the buffers is touched), and the call succeeds.
          EXPECT_TRUE(st.ok()) << at << ": " << st.to_string();
        } else {
          // Error and skip modes everywhere, and every mode on the CPU (where the check costs nothing
          // next to the gathers and nothing is waited for), report bad offsets.
          EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << at << ": " << st.to_string();
          expect_contains(st, "offsets");
        }
        pr.expect_weights_unchanged();
      }
    }
  }
}

// Off mode on CUDA with broken offsets on the plain kernels (rows of a whole warp, one or two vectors a
// lane, and rows of one vector a lane): every bag is clamped to [0, N] (empty when its end is below its
// start) and pooled from the clamped range, nothing outside the indices is read (memcheck runs this test),
// the call succeeds. Every table has the same rows, so a clamped bag's lookups are valid in any table.
TEST_P(TbeForwardErrors, OffModeClampsBrokenOffsetsOnThePlainKernels) {
  if (GetParam() != Backend::kCuda) GTEST_SKIP() << "the CPU backend reports bad offsets in every mode";
  constexpr int64_t kRows = 40;
  constexpr int64_t B = 5;
  const uint64_t seed = 909;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  for (const std::vector<int>& dims : {std::vector<int>{128, 128}, std::vector<int>{160}, std::vector<int>{32, 32}}) {
    const Context ctx = Context::cuda();
    TbeConfig cfg;
    for (int d : dims) cfg.tables.push_back(TableSpec{kRows, d});
    std::unique_ptr<TableBatchedEmbedding> tbe;
    ASSERT_TRUE(TableBatchedEmbedding::create(ctx, cfg, &tbe).ok());
    const int T = static_cast<int>(dims.size());
    std::vector<float> w(static_cast<size_t>(tbe->num_weights()));
    for (float& x : w) x = static_cast<float>(static_cast<int>(rng() % 17) - 8);
    std::vector<int64_t> indices, offsets{0};
    for (int64_t item = 0; item < T * B; ++item) {
      for (int l = static_cast<int>(rng() % 41); l > 0; --l) indices.push_back(static_cast<int64_t>(rng() % kRows));
      offsets.push_back(static_cast<int64_t>(indices.size()));
    }
    const int64_t N = static_cast<int64_t>(indices.size());
    const std::vector<std::pair<const char*, std::function<void(std::vector<int64_t>&)>>> breaks = {
        {"first far below 0", [](std::vector<int64_t>& o) { o[0] = -(int64_t{1} << 40); }},
        {"last far above N", [](std::vector<int64_t>& o) { o.back() = int64_t{1} << 40; }},
        {"decreasing", [](std::vector<int64_t>& o) { o[3] = o[2] - 1; }},
        {"middle far above N", [](std::vector<int64_t>& o) { o[4] = int64_t{1} << 40; }},
        {"middle negative", [](std::vector<int64_t>& o) { o[2] = -7; }},
    };
    for (const auto& br : breaks) {
      std::vector<int64_t> off = offsets;
      br.second(off);
      for (PoolingMode pool : {PoolingMode::kSum, PoolingMode::kMean}) {
        Buffer d_w(GetParam(), w.size() * 4), d_idx(GetParam(), indices.size() * 8), d_off(GetParam(), off.size() * 8),
            d_out(GetParam(), static_cast<size_t>(B * tbe->total_dim()) * 4);
        ASSERT_TRUE(copy_to_backend(ctx, d_w.data(), w.data(), w.size() * 4).ok());
        ASSERT_TRUE(copy_to_backend(ctx, d_idx.data(), indices.data(), indices.size() * 8).ok());
        ASSERT_TRUE(copy_to_backend(ctx, d_off.data(), off.data(), off.size() * 8).ok());
        ASSERT_TRUE(fill_bytes(ctx, d_out.data(), 0xff, d_out.bytes()).ok());
        TbeForwardArgs a;
        a.weights = TensorView::vec(d_w.data(), DType::kF32, tbe->num_weights());
        a.indices = TensorView::vec(d_idx.data(), DType::kI64, N);
        a.offsets = TensorView::vec(d_off.data(), DType::kI64, static_cast<int64_t>(off.size()));
        a.batch_size = B;
        a.pooling = pool;
        a.bounds_check = BoundsCheckMode::kOff;
        a.output = TensorView::mat(d_out.data(), DType::kF32, B, tbe->total_dim());
        const std::string at = std::string(br.first) + ", D=" + std::to_string(dims[0]) + ", " + pooling_mode_name(pool);
        Status st = tbe->forward(ctx, a);
        if (st.ok()) st = synchronize(ctx);
        ASSERT_TRUE(st.ok()) << at << ": " << st.to_string();
        std::vector<float> got(static_cast<size_t>(B * tbe->total_dim()));
        ASSERT_TRUE(copy_to_host(ctx, got.data(), d_out.data(), got.size() * 4).ok());
        // The clamped bags, summed exactly (small integers) in double.
        int64_t col0 = 0;
        for (int f = 0; f < T; ++f) {
          const int64_t D = dims[f];
          for (int64_t b = 0; b < B; ++b) {
            const int64_t item = f * B + b;
            const int64_t start = std::min(std::max(off[item], int64_t{0}), N);
            const int64_t end = std::max(start, std::min(std::max(off[item + 1], int64_t{0}), N));
            for (int64_t d = 0; d < D; ++d) {
              double sum = 0;
              for (int64_t q = start; q < end; ++q) sum += w[tbe->weight_offset(f) + indices[q] * D + d];
              const double want = pool == PoolingMode::kMean && end > start ? static_cast<float>(sum) / static_cast<float>(end - start) : sum;
              ASSERT_EQ(got[b * tbe->total_dim() + col0 + d], static_cast<float>(want)) << at << ", bag " << item << ", column " << d;
            }
          }
          col0 += D;
        }
      }
    }
  }
}

// A small integer (|k| <= 8) as fp16 / bf16 bits (exact).
uint16_t small_int_bits(int k, DType dtype) {
  if (dtype == DType::kBF16) {
    const float f = static_cast<float>(k);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return static_cast<uint16_t>(u >> 16);
  }
  if (k == 0) return 0;
  const int a = k < 0 ? -k : k;
  int e = 0;
  while ((2 << e) <= a) ++e;  // 2^e <= a < 2^(e+1)
  const int mantissa = (a - (1 << e)) << (10 - e);
  return static_cast<uint16_t>((k < 0 ? 0x8000 : 0) | ((e + 15) << 10) | mantissa);
}

// Skip, warn and error modes on the plain kernels' checked forms (CUDA: rows of a whole warp, one or two
// vectors a lane or in passes, and rows of one vector a lane, alone or with passes; the CPU runs its own
// kernel on the same cases), every weights and output dtype: invalid indices spread over bags and 32-lookup
// chunks, among them values that are valid in their low 32 bits (2^32 + 3), against the reference: skip
// and warn pool the valid lookups (MEAN over their count) and count the rest, error mode names the first
// invalid lookup. Small-integer weights, so sums are exact before the output's rounding.
TEST_P(TbeForwardErrors, CheckedModesOnThePlainKernels) {
  constexpr int64_t kRows = 40;
  constexpr int64_t B = 6;
  const uint64_t seed = 919;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  const Context ctx = GetParam() == Backend::kCuda ? Context::cuda() : Context::cpu();
  struct Set {
    std::vector<int> dims;
    DType weights, output;
  };
  const std::vector<Set> sets = {
      {{128, 128}, DType::kF32, DType::kF32}, {{160}, DType::kF32, DType::kF32},  // warp: 1, 2 vectors a lane
      {{516}, DType::kF32, DType::kBF16},                                      // warp: passes
      {{32, 64}, DType::kF32, DType::kF32},   {{4}, DType::kF32, DType::kF16},   // vector kernel
      {{4, 512}, DType::kF32, DType::kF32},                                    // vector kernel with passes
      {{256}, DType::kF16, DType::kF16},      {{136}, DType::kBF16, DType::kF32},  // 16-bit weights: warp
      {{520}, DType::kF16, DType::kF32},      {{64, 8}, DType::kBF16, DType::kBF16},  // passes; vector
  };
  for (const Set& set : sets) {
    const std::vector<int>& dims = set.dims;
    for (DType index_dtype : {DType::kI64, DType::kI32}) {
      TbeConfig cfg;
      for (int d : dims) cfg.tables.push_back(TableSpec{kRows, d});
      cfg.weights_dtype = set.weights;
      std::unique_ptr<TableBatchedEmbedding> tbe;
      ASSERT_TRUE(TableBatchedEmbedding::create(ctx, cfg, &tbe).ok());
      const int T = static_cast<int>(dims.size());
      ref::Config rc;
      rc.num_rows.assign(dims.size(), kRows);
      rc.dims = dims;
      rc.weights_dtype = set.weights;
      for (int f = 0; f < T; ++f) rc.feature_table.push_back(f);
      const size_t w_size = dtype_size(set.weights);
      std::vector<unsigned char> w(static_cast<size_t>(tbe->num_weights()) * w_size);
      for (int64_t i = 0; i < tbe->num_weights(); ++i) {
        const int k = static_cast<int>(rng() % 17) - 8;
        if (set.weights == DType::kF32) {
          reinterpret_cast<float*>(w.data())[i] = static_cast<float>(k);
        } else {
          reinterpret_cast<uint16_t*>(w.data())[i] = small_int_bits(k, set.weights);
          ASSERT_EQ(ref::decode(w.data(), set.weights, i), k);
        }
      }
      std::vector<int64_t> indices, offsets{0};
      for (int64_t item = 0; item < T * B; ++item) {
        for (int l = static_cast<int>(rng() % 75); l > 0; --l) indices.push_back(static_cast<int64_t>(rng() % kRows));
        offsets.push_back(static_cast<int64_t>(indices.size()));
      }
      const int64_t N = static_cast<int64_t>(indices.size());
      ASSERT_GT(N, 100);
      const std::vector<int64_t> bad =
          index_dtype == DType::kI64
              ? std::vector<int64_t>{-1, kRows, (int64_t{1} << 32) + 3, int64_t{1} << 40, -(int64_t{1} << 33)}
              : std::vector<int64_t>{-1, kRows, INT32_MAX, INT32_MIN};
      for (int k = 0; k < 12; ++k) indices[static_cast<size_t>(rng() % N)] = bad[static_cast<size_t>(k) % bad.size()];
      const size_t out_size = dtype_size(set.output);
      Buffer d_w(GetParam(), w.size()), d_idx(GetParam(), static_cast<size_t>(N) * 8),
          d_off(GetParam(), offsets.size() * 8), d_out(GetParam(), static_cast<size_t>(B * tbe->total_dim()) * out_size),
          d_skipped(GetParam(), 8);
      ASSERT_TRUE(copy_to_backend(ctx, d_w.data(), w.data(), w.size()).ok());
      if (index_dtype == DType::kI64) {
        ASSERT_TRUE(copy_to_backend(ctx, d_idx.data(), indices.data(), indices.size() * 8).ok());
        ASSERT_TRUE(copy_to_backend(ctx, d_off.data(), offsets.data(), offsets.size() * 8).ok());
      } else {
        const std::vector<int32_t> i32(indices.begin(), indices.end()), o32(offsets.begin(), offsets.end());
        ASSERT_TRUE(copy_to_backend(ctx, d_idx.data(), i32.data(), i32.size() * 4).ok());
        ASSERT_TRUE(copy_to_backend(ctx, d_off.data(), o32.data(), o32.size() * 4).ok());
      }
      for (BoundsCheckMode mode : {BoundsCheckMode::kSkip, BoundsCheckMode::kWarn, BoundsCheckMode::kError}) {
        for (PoolingMode pool : {PoolingMode::kSum, PoolingMode::kMean}) {
          const std::string at = "D=" + std::to_string(dims[0]) + ", " + dtype_name(set.weights) + " -> " +
                                 dtype_name(set.output) + ", " + dtype_name(index_dtype) + ", " +
                                 bounds_check_mode_name(mode) + ", " + pooling_mode_name(pool);
          ASSERT_TRUE(fill_bytes(ctx, d_out.data(), 0xff, d_out.bytes()).ok());
          ASSERT_TRUE(fill_bytes(ctx, d_skipped.data(), 0xff, 8).ok());
          TbeForwardArgs a;
          a.weights = TensorView::vec(d_w.data(), set.weights, tbe->num_weights());
          a.indices = TensorView::vec(d_idx.data(), index_dtype, N);
          a.offsets = TensorView::vec(d_off.data(), index_dtype, static_cast<int64_t>(offsets.size()));
          a.batch_size = B;
          a.pooling = pool;
          a.bounds_check = mode;
          a.num_skipped = d_skipped.as<int64_t>();
          a.output = TensorView::mat(d_out.data(), set.output, B, tbe->total_dim());
          Status st = tbe->forward(ctx, a);
          const Status sync = synchronize(ctx);
          if (st.ok()) st = sync;
          // The reference's sums (exact integers) and counts of valid lookups; MEAN is formed from them below.
          const ref::Result r = ref::tbe_forward(rc, w.data(), indices, offsets, nullptr, B, PoolingMode::kSum, mode);
          if (mode == BoundsCheckMode::kError) {
            ASSERT_FALSE(r.ok) << at;
            ASSERT_EQ(st.code(), StatusCode::kOutOfRange) << at << ": " << st.to_string();
            expect_contains(st, "feature " + std::to_string(r.feature));
            expect_contains(st, "bag " + std::to_string(r.bag));
            expect_contains(st, "position " + std::to_string(r.position));
            expect_contains(st, std::to_string(r.value));
            continue;
          }
          ASSERT_TRUE(st.ok()) << at << ": " << st.to_string();
          ASSERT_TRUE(r.ok) << at;
          int64_t skipped = -1;
          ASSERT_TRUE(copy_to_host(ctx, &skipped, d_skipped.data(), 8).ok());
          EXPECT_EQ(skipped, r.skipped) << at;
          EXPECT_GT(r.skipped, 0) << at;
          std::vector<unsigned char> got(r.out.size() * out_size);
          ASSERT_TRUE(copy_to_host(ctx, got.data(), d_out.data(), got.size()).ok());
          for (size_t i = 0; i < r.out.size(); ++i) {
            // SUM: the exact integer; MEAN: the exact fp32 sum divided by the valid count (correctly rounded
            // in fp32); then rounded once to the output dtype.
            const float sum = static_cast<float>(r.out[i]);
            const float value =
                pool == PoolingMode::kMean && r.terms[i] > 0 ? sum / static_cast<float>(r.terms[i]) : sum;
            ASSERT_EQ(ref::decode(got.data(), set.output, static_cast<int64_t>(i)),
                      ref::round_to_dtype(value, set.output))
                << at << ", output element " << i;
          }
        }
      }
    }
  }
}

// Off mode on the CPU drops a bad index instead of reading it (the sanitizer build runs this test to
// check the buffers' bounds): the call succeeds. The CUDA forward trusts indices in off mode (tbe.h).
TEST_P(TbeForwardErrors, OffModeBadIndicesStayInsideTheTables) {
  if (GetParam() != Backend::kCpu) GTEST_SKIP() << "the CUDA forward trusts the indices in off mode";
  for (int64_t bad : {int64_t{-1}, int64_t{50}, int64_t{1} << 31, int64_t{1} << 40, -(int64_t{1} << 40)}) {
    for (PoolingMode pool : {PoolingMode::kSum, PoolingMode::kMean}) {
      for (bool weighted : {false, true}) {
        if (weighted && pool == PoolingMode::kMean) continue;  // refused: weighted mean
        Problem pr(GetParam());
        pr.indices[1] = bad;
        pr.indices.back() = bad;
        pr.upload();
        TbeForwardArgs a = pr.args(pool);
        a.bounds_check = BoundsCheckMode::kOff;
        if (weighted) a.per_sample_weights = TensorView::vec(pr.d_psw->data(), DType::kF32, a.indices.numel());
        const Status st = pr.run(a);
        EXPECT_TRUE(st.ok()) << bad << ": " << st.to_string();
        pr.expect_weights_unchanged();
      }
    }
  }
}

TEST_P(TbeForwardErrors, BadArgumentsNameTheArgument) {
  Problem pr(GetParam());
  struct BadCase {
    const char* name;
    std::function<void(TbeForwardArgs&)> mutate;
  };
  const std::vector<BadCase> cases = {
      {"weights", [](TbeForwardArgs& a) { a.weights.data = nullptr; }},
      {"weights", [](TbeForwardArgs& a) { a.weights.dtype = DType::kF16; }},
      {"weights", [](TbeForwardArgs& a) { a.weights.shape[0] -= 1; }},
      {"indices", [](TbeForwardArgs& a) { a.indices.data = nullptr; }},
      {"indices", [](TbeForwardArgs& a) { a.indices.dtype = DType::kF32; }},
      {"indices", [](TbeForwardArgs& a) { a.indices.shape[0] = -2; }},
      {"offsets", [](TbeForwardArgs& a) { a.offsets.data = nullptr; }},
      {"offsets", [](TbeForwardArgs& a) { a.offsets.dtype = DType::kI32; }},
      {"offsets", [](TbeForwardArgs& a) { a.offsets.shape[0] += 1; }},
      {"batch_size", [](TbeForwardArgs& a) { a.batch_size = -1; }},
      {"offsets", [](TbeForwardArgs& a) { a.batch_size = 5; }},
      {"output", [](TbeForwardArgs& a) { a.output.data = nullptr; }},
      {"output", [](TbeForwardArgs& a) { a.output.dtype = DType::kI32; }},
      {"output", [](TbeForwardArgs& a) { a.output.dtype = DType::kF8E4M3; }},
      {"output", [](TbeForwardArgs& a) { a.output.shape[1] += 1; }},
      {"output", [](TbeForwardArgs& a) { a.output.shape[0] += 1; }},
      {"output", [](TbeForwardArgs& a) { a.output.ndim = 1; }},
      {"per_sample_weights", [&](TbeForwardArgs& a) {
         a.pooling = PoolingMode::kMean;
         a.per_sample_weights = TensorView::vec(pr.d_psw->data(), DType::kF32, static_cast<int64_t>(pr.psw.size()));
       }},
      {"pooling", [](TbeForwardArgs& a) {  // sequence mode with features of D 6 and 3
         a.pooling = PoolingMode::kNone;
         a.output = TensorView::mat(a.output.data, DType::kF32, a.indices.numel(), 6);
       }},
      {"pooling", [](TbeForwardArgs& a) { a.pooling = static_cast<PoolingMode>(7); }},
      {"bounds_check", [](TbeForwardArgs& a) { a.bounds_check = static_cast<BoundsCheckMode>(9); }},
      // per-sample weights of the wrong length (a short buffer would be read past its end) or dtype
      {"per_sample_weights", [&](TbeForwardArgs& a) {
         a.per_sample_weights = TensorView::vec(pr.d_psw->data(), DType::kF32, a.indices.numel() - 1);
       }},
      {"per_sample_weights", [&](TbeForwardArgs& a) {
         a.per_sample_weights = TensorView::vec(pr.d_psw->data(), DType::kF32, a.indices.numel() + 1);
       }},
      {"per_sample_weights", [&](TbeForwardArgs& a) {
         a.per_sample_weights = TensorView::vec(pr.d_psw->data(), DType::kF16, a.indices.numel());
       }},
      {"per_sample_weights", [&](TbeForwardArgs& a) {
         a.per_sample_weights = TensorView::vec(pr.d_psw->data(), DType::kF32, 0);
       }},
      // the output may not share memory with an input (a table would be overwritten)
      {"output", [](TbeForwardArgs& a) { a.output.data = a.weights.data; }},
      {"output", [](TbeForwardArgs& a) { a.output.data = a.indices.data; }},
      // shapes whose element count overflows int64
      {"indices", [](TbeForwardArgs& a) {
         a.indices.ndim = 2;
         a.indices.shape[0] = a.indices.shape[1] = int64_t{1} << 40;
       }},
      {"weights", [](TbeForwardArgs& a) { a.weights.shape[0] = int64_t{1} << 62; }},
  };
  for (const auto& bc : cases) {
    ASSERT_TRUE(fill_bytes(pr.ctx, pr.d_out->data(), 0x7f, pr.d_out->bytes()).ok());
    TbeForwardArgs a = pr.args();
    bc.mutate(a);
    const Status st = pr.run(a);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bc.name << ": " << st.to_string();
    EXPECT_EQ(st.message().rfind(bc.name, 0), 0u) << "message \"" << st.message() << "\" should start with " << bc.name;
    // Nothing was written: the output still holds the fill pattern.
    std::vector<unsigned char> out(pr.d_out->bytes());
    ASSERT_TRUE(copy_to_host(pr.ctx, out.data(), pr.d_out->data(), out.size()).ok());
    for (unsigned char v : out) ASSERT_EQ(v, 0x7f) << bc.name << ": output written on error";
  }
  pr.expect_weights_unchanged();
  // The context must be of the object's backend.
  const Context other = GetParam() == Backend::kCpu ? Context::cuda() : Context::cpu();
  const Status st = pr.tbe->forward(other, pr.args());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message().rfind("ctx", 0), 0u) << st.message();
}

// A CPU context asking for a negative or absurd number of OpenMP threads is refused before any
// thread is started (the runtime would crash, or exit the process, trying to create 2^20 of them).
TEST(TbeContext, ThreadCountsOutsideTheRangeAreRefused) {
  TbeConfig cfg;
  cfg.tables = {TableSpec{4, 2}};
  std::unique_ptr<TableBatchedEmbedding> tbe;
  ASSERT_TRUE(TableBatchedEmbedding::create(Context::cpu(), cfg, &tbe).ok());
  std::vector<float> w(8, 1.0f), out(2, 0.0f), m1(4, 0.0f);
  std::vector<int64_t> idx = {1}, off = {0, 1};
  TbeForwardArgs a;
  a.weights = TensorView::vec(w.data(), DType::kF32, 8);
  a.indices = TensorView::vec(idx.data(), DType::kI64, 1);
  a.offsets = TensorView::vec(off.data(), DType::kI64, 2);
  a.batch_size = 1;
  a.output = TensorView::mat(out.data(), DType::kF32, 1, 2);
  TbeBackwardArgs b;
  b.weights = a.weights;
  b.indices = a.indices;
  b.offsets = a.offsets;
  b.batch_size = 1;
  b.grad_output = a.output;
  b.momentum1 = TensorView::vec(m1.data(), DType::kF32, 4);
  for (int threads : {-1, 1 << 20, INT32_MAX}) {
    const Status f = tbe->forward(Context::cpu(threads), a);
    EXPECT_EQ(f.code(), StatusCode::kInvalidArgument) << threads;
    EXPECT_EQ(f.message().rfind("ctx.num_threads", 0), 0u) << f.message();
    size_t bytes = 0;
    const Status s = tbe->backward_workspace_size(Context::cpu(threads), b, &bytes);
    EXPECT_EQ(s.message().rfind("ctx.num_threads", 0), 0u) << s.message();
    const Status g = tbe->backward(Context::cpu(threads), b, nullptr, 0);
    EXPECT_EQ(g.message().rfind("ctx.num_threads", 0), 0u) << g.message();
  }
  for (float v : w) EXPECT_EQ(v, 1.0f);
  EXPECT_TRUE(tbe->forward(Context::cpu(1024), a).ok());
}

// On CUDA, a host buffer where device memory is needed is refused before any kernel runs (a kernel
// would fault on it and leave the context unusable); so is a buffer of another GPU.
TEST_P(TbeForwardErrors, CudaRefusesHostMemory) {
  if (GetParam() != Backend::kCuda) GTEST_SKIP() << "runs on the CUDA backend only";
  Problem pr(GetParam());
  std::vector<float> host_out(64 * 1024 / 4, 0.0f);
  const struct {
    const char* name;
    std::function<void(TbeForwardArgs&)> mutate;
  } cases[] = {
      {"weights", [&](TbeForwardArgs& a) { a.weights.data = pr.weights.data(); }},
      {"indices", [&](TbeForwardArgs& a) { a.indices.data = pr.indices.data(); }},
      {"offsets", [&](TbeForwardArgs& a) { a.offsets.data = pr.offsets.data(); }},
      {"per_sample_weights", [&](TbeForwardArgs& a) {
         a.per_sample_weights = TensorView::vec(pr.psw.data(), DType::kF32, static_cast<int64_t>(pr.psw.size()));
       }},
      {"output", [&](TbeForwardArgs& a) { a.output.data = host_out.data(); }},
  };
  for (const auto& c : cases) {
    TbeForwardArgs a = pr.args();
    c.mutate(a);
    const Status st = pr.run(a);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.name << ": " << st.to_string();
    EXPECT_EQ(st.message().rfind(std::string(c.name) + ": host memory", 0), 0u) << st.message();
  }
  for (float v : host_out) ASSERT_EQ(v, 0.0f);
  pr.expect_weights_unchanged();
  ASSERT_TRUE(pr.run(pr.args()).ok()) << "the context must still work after the refusals";
}

// The skip count is written too: over the weights, an input or the output it is refused, naming
// num_skipped (or the output it overlaps), and nothing is written.
TEST_P(TbeForwardErrors, NumSkippedOverlappingAnotherBufferIsRefused) {
  Problem pr(GetParam());
  auto at = [](const Buffer& b, size_t byte) { return reinterpret_cast<int64_t*>(static_cast<char*>(b.data()) + byte); };
  const struct {
    const char* what;
    int64_t* num_skipped;
  } cases[] = {
      {"num_skipped: overlaps weights", at(*pr.d_w, 8)},
      {"num_skipped: overlaps indices", at(*pr.d_idx, 0)},
      {"num_skipped: overlaps offsets", at(*pr.d_off, 8)},
      {"output: overlaps num_skipped", at(*pr.d_out, 16)},
  };
  for (const auto& c : cases) {
    TbeForwardArgs a = pr.args();
    a.bounds_check = BoundsCheckMode::kSkip;
    a.num_skipped = c.num_skipped;
    const Status st = pr.run(a);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.what << ": " << st.to_string();
    EXPECT_EQ(st.message().rfind(c.what, 0), 0u) << "message \"" << st.message() << "\" should start with " << c.what;
  }
  pr.expect_weights_unchanged();
  for (float v : pr.output(16)) EXPECT_TRUE(std::isnan(v)) << "a refused call wrote the output";  // 0xff bytes
  std::vector<int64_t> idx(pr.indices.size()), off(pr.offsets.size());
  ASSERT_TRUE(copy_to_host(pr.ctx, idx.data(), pr.d_idx->data(), idx.size() * 8).ok());
  ASSERT_TRUE(copy_to_host(pr.ctx, off.data(), pr.d_off->data(), off.size() * 8).ok());
  EXPECT_EQ(idx, pr.indices);
  EXPECT_EQ(off, pr.offsets);
  TbeForwardArgs ok = pr.args();
  ok.bounds_check = BoundsCheckMode::kSkip;
  ok.num_skipped = static_cast<int64_t*>(pr.d_skipped->data());
  ASSERT_TRUE(pr.run(ok).ok());
}

// The host copy of the count likewise (on the CPU, where any memory may take it; on CUDA device memory is
// refused outright: test_tbe_host_count_cuda.cu).
TEST_P(TbeForwardErrors, NumSkippedHostOverlappingAnotherBufferIsRefused) {
  if (GetParam() != Backend::kCpu) GTEST_SKIP() << "CUDA takes only pinned host memory here";
  Problem pr(GetParam());
  auto at = [](const Buffer& b, size_t byte) { return reinterpret_cast<int64_t*>(static_cast<char*>(b.data()) + byte); };
  const struct {
    const char* what;
    int64_t* host;
  } cases[] = {
      {"num_skipped_host: overlaps weights", at(*pr.d_w, 8)},
      {"num_skipped_host: overlaps offsets", at(*pr.d_off, 8)},
      {"num_skipped: overlaps num_skipped_host", at(*pr.d_skipped, 0)},
  };
  for (const auto& c : cases) {
    TbeForwardArgs a = pr.args();
    a.bounds_check = BoundsCheckMode::kWarn;
    a.num_skipped = pr.d_skipped->as<int64_t>();
    a.num_skipped_host = c.host;
    const Status st = pr.run(a);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.what << ": " << st.to_string();
    EXPECT_EQ(st.message().rfind(c.what, 0), 0u) << "message \"" << st.message() << "\" should start with " << c.what;
  }
  pr.expect_weights_unchanged();
  for (float v : pr.output(16)) EXPECT_TRUE(std::isnan(v)) << "a refused call wrote the output";  // 0xff bytes
  std::vector<int64_t> off(pr.offsets.size());
  ASSERT_TRUE(copy_to_host(pr.ctx, off.data(), pr.d_off->data(), off.size() * 8).ok());
  EXPECT_EQ(off, pr.offsets);
}

TEST_P(TbeForwardErrors, NullIndicesAllowedWhenEmpty) {
  Problem pr(GetParam());
  std::vector<int64_t> off(3 * 2 + 1, 0);
  Buffer d_off(pr.backend, off.size() * 8);
  ASSERT_TRUE(copy_to_backend(pr.ctx, d_off.data(), off.data(), off.size() * 8).ok());
  ASSERT_TRUE(fill_bytes(pr.ctx, pr.d_out->data(), 0xff, pr.d_out->bytes()).ok());
  TbeForwardArgs a = pr.args();
  a.indices = TensorView::vec(nullptr, DType::kI64, 0);
  a.offsets = TensorView::vec(d_off.data(), DType::kI64, 7);
  a.batch_size = 2;
  a.output = TensorView::mat(pr.d_out->data(), DType::kF32, 2, pr.tbe->total_dim());
  ASSERT_TRUE(pr.run(a).ok());
  for (float v : pr.output(2 * pr.tbe->total_dim())) EXPECT_EQ(v, 0.0f);
}

TEST_P(TbeForwardErrors, BadConfigsNameTheField) {
  const Context ctx = GetParam() == Backend::kCuda ? Context::cuda() : Context::cpu();
  struct BadCase {
    const char* name;
    TbeConfig cfg;
  };
  std::vector<BadCase> cases;
  cases.push_back({"cfg.tables", TbeConfig{}});
  TbeConfig c;
  c.tables = {TableSpec{10, 4}, TableSpec{0, 4}};
  cases.push_back({"cfg.tables[1].num_rows", c});
  c.tables = {TableSpec{10, 0}};
  cases.push_back({"cfg.tables[0].dim", c});
  c.tables = {TableSpec{10, 4}, TableSpec{3, 2}};
  c.feature_table_map = {0, 1, 2};
  cases.push_back({"cfg.feature_table_map[2]", c});
  c.feature_table_map = {-1};
  cases.push_back({"cfg.feature_table_map[0]", c});
  c.feature_table_map = {};
  for (DType bad : {DType::kI32, DType::kF8E4M3, DType::kI64}) {
    c.weights_dtype = bad;
    cases.push_back({"cfg.weights_dtype", c});
  }
  c.weights_dtype = DType::kF32;
  c.tables = {TableSpec{int64_t{1} << 40, 1 << 30}};
  cases.push_back({"cfg.tables[0]", c});
  for (const auto& bc : cases) {
    std::unique_ptr<TableBatchedEmbedding> tbe;
    const Status st = TableBatchedEmbedding::create(ctx, bc.cfg, &tbe);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << bc.name << ": " << st.to_string();
    EXPECT_EQ(st.message().rfind(bc.name, 0), 0u) << "message \"" << st.message() << "\" should start with " << bc.name;
    EXPECT_EQ(tbe, nullptr);
  }
}

TEST_P(TbeForwardErrors, WeightOffsetsAre64Bit) {
  // Offsets past 2^31 and 2^32 elements are computed without allocating the tables.
  const Context ctx = GetParam() == Backend::kCuda ? Context::cuda() : Context::cpu();
  TbeConfig cfg;
  cfg.tables = {TableSpec{int64_t{1} << 21, 1024}, TableSpec{3, 5}, TableSpec{int64_t{3} << 20, 1000}, TableSpec{1, 7}};
  cfg.feature_table_map = {2, 3, 0, 3};
  std::unique_ptr<TableBatchedEmbedding> tbe;
  ASSERT_TRUE(TableBatchedEmbedding::create(ctx, cfg, &tbe).ok());
  const int64_t t1 = (int64_t{1} << 21) * 1024;  // 2^31
  EXPECT_EQ(tbe->weight_offset(0), 0);
  EXPECT_EQ(tbe->weight_offset(1), t1);
  EXPECT_EQ(tbe->weight_offset(2), t1 + 15);
  EXPECT_EQ(tbe->weight_offset(3), t1 + 15 + (int64_t{3} << 20) * 1000);
  EXPECT_EQ(tbe->num_weights(), t1 + 15 + (int64_t{3} << 20) * 1000 + 7);
  EXPECT_GT(tbe->num_weights(), int64_t{1} << 32);
  EXPECT_EQ(tbe->num_features(), 4);
  EXPECT_EQ(tbe->output_offset(1), 1000);
  EXPECT_EQ(tbe->output_offset(2), 1007);
  EXPECT_EQ(tbe->output_offset(3), 2031);
  EXPECT_EQ(tbe->total_dim(), 2038);
  EXPECT_EQ(tbe->max_dim(), 1024);
  // DeviceMeta holds the per-feature view of the same numbers.
  const auto& m = tbe->device_meta();
  std::vector<int64_t> w_off(4), rows(4);
  std::vector<int32_t> dims(4), o_off(5);
  ASSERT_TRUE(copy_to_host(ctx, w_off.data(), m.weight_offsets, 32).ok());
  ASSERT_TRUE(copy_to_host(ctx, rows.data(), m.num_rows, 32).ok());
  ASSERT_TRUE(copy_to_host(ctx, dims.data(), m.dims, 16).ok());
  ASSERT_TRUE(copy_to_host(ctx, o_off.data(), m.output_offsets, 20).ok());
  EXPECT_EQ(w_off, (std::vector<int64_t>{t1 + 15, t1 + 15 + (int64_t{3} << 20) * 1000, 0, t1 + 15 + (int64_t{3} << 20) * 1000}));
  EXPECT_EQ(rows, (std::vector<int64_t>{int64_t{3} << 20, 1, int64_t{1} << 21, 1}));
  EXPECT_EQ(dims, (std::vector<int32_t>{1000, 7, 1024, 7}));
  EXPECT_EQ(o_off, (std::vector<int32_t>{0, 1000, 1007, 2031, 2038}));
  std::vector<int64_t> scratch(TableBatchedEmbedding::kScratchWords, -1);
  ASSERT_TRUE(copy_to_host(ctx, scratch.data(), m.scratch, scratch.size() * 8).ok());
  for (int64_t s : scratch) EXPECT_EQ(s, 0);
}

TEST_P(TbeForwardErrors, RealBufferBeyond2To31Elements) {
  // CUDA only (the host here is shared): a bf16 buffer of 2^31 + 2^16 elements, lookups in the last
  // rows of table 0 and in table 1, which starts past element 2^31.
  if (GetParam() != Backend::kCuda) GTEST_SKIP() << "runs on the CUDA backend only";
  const Context ctx = Context::cuda();
  constexpr int D = 64;
  const int64_t rows0 = (int64_t{1} << 31) / D;  // table 0 ends exactly at element 2^31
  TbeConfig cfg;
  cfg.tables = {TableSpec{rows0, D}, TableSpec{1024, D}};
  cfg.weights_dtype = DType::kBF16;
  std::unique_ptr<TableBatchedEmbedding> tbe;
  ASSERT_TRUE(TableBatchedEmbedding::create(ctx, cfg, &tbe).ok());
  Buffer w(Backend::kCuda, static_cast<size_t>(tbe->num_weights()) * 2);
  if (!w.valid()) GTEST_SKIP() << "device lacks memory for " << tbe->num_weights() * 2 << " bytes";
  // Rows rows0-2, rows0-1 of table 0 and rows 0, 1023 of table 1 get value (row tag + d) in bf16 (exact
  // for small integers); everything else stays unread.
  auto put_row = [&](int64_t element, float base) {
    std::vector<uint16_t> row(D);
    for (int d = 0; d < D; ++d) {
      const float v = base + static_cast<float>(d);
      uint32_t u;
      std::memcpy(&u, &v, 4);
      row[d] = static_cast<uint16_t>(u >> 16);  // exact: small integers
    }
    ASSERT_TRUE(copy_to_backend(ctx, w.as<uint16_t>() + element, row.data(), D * 2).ok());
  };
  put_row((rows0 - 2) * D, 1.0f);
  put_row((rows0 - 1) * D, 100.0f);
  put_row(tbe->weight_offset(1), -50.0f);
  put_row(tbe->weight_offset(1) + 1023 * D, 7.0f);
  const std::vector<int64_t> idx = {rows0 - 1, rows0 - 2, rows0 - 1, 1023, 0, 1023};
  const std::vector<int64_t> off = {0, 2, 3, 5, 6};  // T = 2, B = 2
  Buffer d_idx(Backend::kCuda, idx.size() * 8), d_off(Backend::kCuda, off.size() * 8), d_out(Backend::kCuda, 2 * 2 * D * 4);
  ASSERT_TRUE(copy_to_backend(ctx, d_idx.data(), idx.data(), idx.size() * 8).ok());
  ASSERT_TRUE(copy_to_backend(ctx, d_off.data(), off.data(), off.size() * 8).ok());
  ASSERT_TRUE(fill_bytes(ctx, d_out.data(), 0xff, d_out.bytes()).ok());
  TbeForwardArgs a;
  a.weights = TensorView::vec(w.data(), DType::kBF16, tbe->num_weights());
  a.indices = TensorView::vec(d_idx.data(), DType::kI64, 6);
  a.offsets = TensorView::vec(d_off.data(), DType::kI64, 5);
  a.batch_size = 2;
  a.output = TensorView::mat(d_out.data(), DType::kF32, 2, 2 * D);
  ASSERT_TRUE(tbe->forward(ctx, a).ok());
  ASSERT_TRUE(synchronize(ctx).ok());
  std::vector<float> out(2 * 2 * D);
  ASSERT_TRUE(copy_to_host(ctx, out.data(), d_out.data(), out.size() * 4).ok());
  for (int d = 0; d < D; ++d) {
    EXPECT_EQ(out[d], 101.0f + 2 * d);              // feature 0, bag 0: rows0-1 + rows0-2
    EXPECT_EQ(out[2 * D + d], 100.0f + d);          // feature 0, bag 1: rows0-1
    EXPECT_EQ(out[D + d], 7.0f + d + (-50.0f + d)); // feature 1, bag 0: 1023 + 0
    EXPECT_EQ(out[3 * D + d], 7.0f + d);            // feature 1, bag 1: 1023
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, TbeForwardErrors, ::testing::Values(Backend::kCpu, Backend::kCuda),
                         [](const ::testing::TestParamInfo<Backend>& info) { return std::string(backend_name(info.param)); });

}  // namespace
}  // namespace embscale
