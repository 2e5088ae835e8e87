// TbeForwardArgs::num_skipped_host on CUDA: pinned host memory that the device itself stores the skip count
// to, which the host polls without an event or a copy (the Python module's warn mode). Checked: the word
// receives the count of skip and warn calls (and -1 for broken offsets in warn mode) equal to
// *num_skipped; a host that polls it without synchronising sees the count arrive; off mode leaves it
// alone; device memory and plain host memory are refused naming the argument, before anything is written.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "embscale/context.h"
#include "embscale/memory.h"
#include "embscale/tbe.h"

namespace embscale {
namespace {

bool have_device() { return backend_available(Backend::kCuda); }

// Two tables (E = 40, 9; D = 8, 4), three features, B = 64 bags of 0..5 lookups, a fixed number of them
// replaced by indices outside their tables.
struct HostCountProblem {
  Context ctx = Context::cuda();
  std::unique_ptr<TableBatchedEmbedding> tbe;
  std::vector<int64_t> indices, offsets;
  int64_t B = 64, bad = 0;
  std::unique_ptr<Buffer> d_w, d_idx, d_off, d_out, d_skipped;

  explicit HostCountProblem(uint32_t seed) {
    std::printf("seed %u\n", seed);
    TbeConfig cfg;
    cfg.tables = {TableSpec{40, 8}, TableSpec{9, 4}};
    cfg.feature_table_map = {0, 1, 0};
    EXPECT_TRUE(TableBatchedEmbedding::create(ctx, cfg, &tbe).ok());
    std::mt19937 rng(seed);
    const int64_t rows[3] = {40, 9, 40};
    offsets.push_back(0);
    for (int f = 0; f < 3; ++f)
      for (int64_t b = 0; b < B; ++b) {
        const int len = static_cast<int>(rng() % 6);
        for (int p = 0; p < len; ++p) {
          const bool out_of_table = rng() % 7 == 0;
          bad += out_of_table ? 1 : 0;
          indices.push_back(out_of_table ? (rng() % 2 ? -1 - static_cast<int64_t>(rng() % 5) : rows[f] + rng() % 5)
                                         : static_cast<int64_t>(rng() % rows[f]));
        }
        offsets.push_back(static_cast<int64_t>(indices.size()));
      }
    std::vector<float> w(static_cast<size_t>(tbe->num_weights()), 0.5f);
    d_w.reset(new Buffer(Backend::kCuda, w.size() * 4));
    d_idx.reset(new Buffer(Backend::kCuda, indices.size() * 8));
    d_off.reset(new Buffer(Backend::kCuda, offsets.size() * 8));
    d_out.reset(new Buffer(Backend::kCuda, static_cast<size_t>(B * tbe->total_dim()) * 4));
    d_skipped.reset(new Buffer(Backend::kCuda, 8));
    EXPECT_TRUE(copy_to_backend(ctx, d_w->data(), w.data(), w.size() * 4).ok());
    upload();
  }

  void upload() {
    EXPECT_TRUE(copy_to_backend(ctx, d_idx->data(), indices.data(), indices.size() * 8).ok());
    EXPECT_TRUE(copy_to_backend(ctx, d_off->data(), offsets.data(), offsets.size() * 8).ok());
  }

  TbeForwardArgs args(BoundsCheckMode mode, int64_t* host) const {
    TbeForwardArgs a;
    a.weights = TensorView::vec(d_w->data(), DType::kF32, tbe->num_weights());
    a.indices = TensorView::vec(d_idx->data(), DType::kI64, static_cast<int64_t>(indices.size()));
    a.offsets = TensorView::vec(d_off->data(), DType::kI64, static_cast<int64_t>(offsets.size()));
    a.batch_size = B;
    a.bounds_check = mode;
    a.output = TensorView::mat(d_out->data(), DType::kF32, B, tbe->total_dim());
    a.num_skipped = d_skipped->as<int64_t>();
    a.num_skipped_host = host;
    return a;
  }

  int64_t device_count() const {
    int64_t v = 0;
    EXPECT_TRUE(copy_to_host(ctx, &v, d_skipped->data(), 8).ok());
    return v;
  }
};

struct PinnedWord {
  int64_t* p = nullptr;
  PinnedWord() { EXPECT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&p), 8, cudaHostAllocDefault), cudaSuccess); }
  ~PinnedWord() { cudaFreeHost(p); }
};

TEST(TbeHostCountCuda, SkipAndWarnStoreTheCountToPinnedHostMemory) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  for (BoundsCheckMode mode : {BoundsCheckMode::kSkip, BoundsCheckMode::kWarn}) {
    SCOPED_TRACE(bounds_check_mode_name(mode));
    HostCountProblem pr(20261203u + static_cast<uint32_t>(mode));
    ASSERT_GT(pr.bad, 0);
    PinnedWord word;
    *word.p = INT64_MIN;
    ASSERT_TRUE(pr.tbe->forward(pr.ctx, pr.args(mode, word.p)).ok());
    ASSERT_TRUE(synchronize(pr.ctx).ok());
    EXPECT_EQ(*word.p, pr.bad);
    EXPECT_EQ(pr.device_count(), pr.bad);
  }
}

TEST(TbeHostCountCuda, AHostPollingWithoutSynchronisingSeesTheCount) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  HostCountProblem pr(20261204u);
  PinnedWord word;
  volatile int64_t* host = word.p;
  *host = INT64_MIN;
  ASSERT_TRUE(pr.tbe->forward(pr.ctx, pr.args(BoundsCheckMode::kWarn, word.p)).ok());
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (*host == INT64_MIN && std::chrono::steady_clock::now() < give_up) {
  }
  EXPECT_EQ(*host, pr.bad);  // read before any synchronisation
  ASSERT_TRUE(synchronize(pr.ctx).ok());
}

TEST(TbeHostCountCuda, WarnModeStoresMinusOneForBrokenOffsets) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  HostCountProblem pr(20261205u);
  pr.offsets[5] = pr.offsets[4] - 1;  // decreasing
  if (pr.offsets[5] < 0) pr.offsets[5] = 0, pr.offsets[4] = 1;
  pr.upload();
  PinnedWord word;
  *word.p = INT64_MIN;
  ASSERT_TRUE(pr.tbe->forward(pr.ctx, pr.args(BoundsCheckMode::kWarn, word.p)).ok());
  ASSERT_TRUE(synchronize(pr.ctx).ok());
  EXPECT_EQ(*word.p, -1);
  EXPECT_EQ(pr.device_count(), -1);
}

TEST(TbeHostCountCuda, OffModeLeavesTheWordAlone) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  HostCountProblem pr(20261206u);
  for (auto& i : pr.indices) i = i < 0 ? 0 : i % 9;  // valid in both tables
  pr.upload();
  PinnedWord word;
  *word.p = INT64_MIN;
  ASSERT_TRUE(pr.tbe->forward(pr.ctx, pr.args(BoundsCheckMode::kOff, word.p)).ok());
  ASSERT_TRUE(synchronize(pr.ctx).ok());
  EXPECT_EQ(*word.p, INT64_MIN);
}

TEST(TbeHostCountCuda, MemoryTheHostCannotPollIsRefusedByName) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  HostCountProblem pr(20261207u);
  std::vector<float> before(static_cast<size_t>(pr.B * pr.tbe->total_dim()), 7.0f);
  ASSERT_TRUE(copy_to_backend(pr.ctx, pr.d_out->data(), before.data(), before.size() * 4).ok());
  Buffer device_word(Backend::kCuda, 8);
  int64_t heap_word = INT64_MIN;
  for (int64_t* bad : {device_word.as<int64_t>(), &heap_word}) {
    const Status st = pr.tbe->forward(pr.ctx, pr.args(BoundsCheckMode::kWarn, bad));
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("num_skipped_host"), std::string::npos) << st.message();
  }
  ASSERT_TRUE(synchronize(pr.ctx).ok());
  std::vector<float> after(before.size());
  ASSERT_TRUE(copy_to_host(pr.ctx, after.data(), pr.d_out->data(), after.size() * 4).ok());
  EXPECT_EQ(after, before) << "the output was written by a refused call";
  EXPECT_EQ(heap_word, INT64_MIN);
}

}  // namespace
}  // namespace embscale
