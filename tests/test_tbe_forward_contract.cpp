// Parts of the TBE forward's contract (tbe.h) the other forward tests leave open, on every available
// backend:
//  * sequence mode: lookups before offsets[0] belong to no bag and their output rows are zeros; an
//    output not of shape [N, D] is refused before anything is written;
//  * kError with several bad indices reports the first one in (feature, bag, position) order, also
//    when two are in the same bag;
//  * int32 indices address at most 2^31 - 1 lookups: more are refused (invalid_argument naming indices)
//    before any value is read, by the forward and the backward; exactly 2^31 - 1 pass that check. The
//    indices live in an untouched MAP_NORESERVE mapping (8 GiB of address space, no memory).
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <climits>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "embscale/memory.h"
#include "embscale/tbe.h"
#include "reference_tbe.h"

namespace embscale {
namespace {

class TbeForwardContract : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (!backend_available(GetParam())) GTEST_SKIP() << backend_name(GetParam()) << " backend not available";
  }
  Backend backend() const { return GetParam(); }
  Context ctx() const { return GetParam() == Backend::kCuda ? Context::cuda() : Context::cpu(); }
};

// One table of 10 rows, D = 5 (a 4-wide chunk and a tail), shared by two features; fp32 weights w[i] = i.
struct TwoFeatures {
  Context ctx;
  std::unique_ptr<TableBatchedEmbedding> tbe;
  std::vector<float> w;
  Buffer d_w;
  explicit TwoFeatures(Backend b) : ctx(b == Backend::kCuda ? Context::cuda() : Context::cpu()) {
    TbeConfig cfg;
    cfg.tables = {TableSpec{10, 5}};
    cfg.feature_table_map = {0, 0};
    EXPECT_TRUE(TableBatchedEmbedding::create(ctx, cfg, &tbe).ok());
    for (int i = 0; i < 50; ++i) w.push_back(static_cast<float>(i));
    d_w = Buffer(b, 200);
    EXPECT_TRUE(copy_to_backend(ctx, d_w.data(), w.data(), 200).ok());
  }
};

TEST_P(TbeForwardContract, SequenceRowsBeforeTheFirstOffsetAreZeros) {
  TwoFeatures p(backend());
  const std::vector<int64_t> idx = {9, 8, 7, 1, 2, 3, 4, 0};
  const std::vector<int64_t> off = {3, 4, 6, 6, 8};  // T = 2, B = 2: lookups 0..2 belong to no bag
  const int64_t N = static_cast<int64_t>(idx.size());
  Buffer d_idx(backend(), N * 8), d_off(backend(), off.size() * 8), d_out(backend(), N * 5 * 4);
  ASSERT_TRUE(copy_to_backend(p.ctx, d_idx.data(), idx.data(), N * 8).ok());
  ASSERT_TRUE(copy_to_backend(p.ctx, d_off.data(), off.data(), off.size() * 8).ok());
  for (BoundsCheckMode mode :
       {BoundsCheckMode::kError, BoundsCheckMode::kSkip, BoundsCheckMode::kOff, BoundsCheckMode::kWarn}) {
    ASSERT_TRUE(fill_bytes(p.ctx, d_out.data(), 0x7f, d_out.bytes()).ok());
    TbeForwardArgs a;
    a.weights = TensorView::vec(p.d_w.data(), DType::kF32, 50);
    a.indices = TensorView::vec(d_idx.data(), DType::kI64, N);
    a.offsets = TensorView::vec(d_off.data(), DType::kI64, static_cast<int64_t>(off.size()));
    a.batch_size = 2;
    a.pooling = PoolingMode::kNone;
    a.bounds_check = mode;
    a.output = TensorView::mat(d_out.data(), DType::kF32, N, 5);
    const Status st = p.tbe->forward(p.ctx, a);
    ASSERT_TRUE(st.ok()) << bounds_check_mode_name(mode) << ": " << st.to_string();
    ASSERT_TRUE(synchronize(p.ctx).ok());
    std::vector<float> out(N * 5);
    ASSERT_TRUE(copy_to_host(p.ctx, out.data(), d_out.data(), out.size() * 4).ok());
    const ref::Result want = ref::tbe_forward({{10}, {5}, {0, 0}, DType::kF32}, p.w.data(), idx, off, nullptr, 2,
                                              PoolingMode::kNone, mode);
    ASSERT_TRUE(want.ok);
    for (int64_t i = 0; i < N * 5; ++i)
      EXPECT_EQ(out[i], want.out[i]) << bounds_check_mode_name(mode) << ": row " << i / 5 << ", column " << i % 5
                                     << (i < 15 ? " (before offsets[0]: zero)" : "");
  }
}

TEST_P(TbeForwardContract, ErrorModeReportsTheFirstOfSeveralBadIndices) {
  TwoFeatures p(backend());
  // Feature 0, bag 1 holds two bad indices (positions 1 and 3), feature 1, bag 0 another: the report
  // names feature 0, bag 1, position 1.
  const std::vector<int64_t> idx = {1, 2, 10, 3, -4, 5, 11, 7};
  const std::vector<int64_t> off = {0, 1, 5, 7, 8};
  const int64_t N = static_cast<int64_t>(idx.size());
  Buffer d_idx(backend(), N * 8), d_off(backend(), off.size() * 8), d_out(backend(), N * 5 * 4);
  ASSERT_TRUE(copy_to_backend(p.ctx, d_idx.data(), idx.data(), N * 8).ok());
  ASSERT_TRUE(copy_to_backend(p.ctx, d_off.data(), off.data(), off.size() * 8).ok());
  for (PoolingMode pool : {PoolingMode::kSum, PoolingMode::kMean, PoolingMode::kNone}) {
    TbeForwardArgs a;
    a.weights = TensorView::vec(p.d_w.data(), DType::kF32, 50);
    a.indices = TensorView::vec(d_idx.data(), DType::kI64, N);
    a.offsets = TensorView::vec(d_off.data(), DType::kI64, static_cast<int64_t>(off.size()));
    a.batch_size = 2;
    a.pooling = pool;
    a.output = pool == PoolingMode::kNone ? TensorView::mat(d_out.data(), DType::kF32, N, 5)
                                          : TensorView::mat(d_out.data(), DType::kF32, 2, 10);
    const Status st = p.tbe->forward(p.ctx, a);
    EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << pooling_mode_name(pool) << ": " << st.to_string();
    EXPECT_NE(st.message().find("feature 0, bag 1, position 1 (indices[2]): index 10"), std::string::npos)
        << pooling_mode_name(pool) << ": " << st.message();
  }
}

TEST_P(TbeForwardContract, SequenceOutputOfTheWrongShapeIsRefused) {
  TwoFeatures p(backend());
  const std::vector<int64_t> idx = {9, 8, 7, 1};
  const std::vector<int64_t> off = {0, 1, 2, 3, 4};
  Buffer d_idx(backend(), idx.size() * 8), d_off(backend(), off.size() * 8), d_out(backend(), 64 * 4);
  ASSERT_TRUE(copy_to_backend(p.ctx, d_idx.data(), idx.data(), idx.size() * 8).ok());
  ASSERT_TRUE(copy_to_backend(p.ctx, d_off.data(), off.data(), off.size() * 8).ok());
  // [N, D] = [4, 5] is right; narrower or wider rows, fewer or more rows, or a flat view are not.
  const int64_t shapes[][2] = {{4, 4}, {4, 6}, {3, 5}, {5, 5}, {20, 1}};
  for (const auto& sh : shapes) {
    ASSERT_TRUE(fill_bytes(p.ctx, d_out.data(), 0x7f, d_out.bytes()).ok());
    TbeForwardArgs a;
    a.weights = TensorView::vec(p.d_w.data(), DType::kF32, 50);
    a.indices = TensorView::vec(d_idx.data(), DType::kI64, 4);
    a.offsets = TensorView::vec(d_off.data(), DType::kI64, 5);
    a.batch_size = 2;
    a.pooling = PoolingMode::kNone;
    a.output = TensorView::mat(d_out.data(), DType::kF32, sh[0], sh[1]);
    const Status st = p.tbe->forward(p.ctx, a);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << sh[0] << "x" << sh[1] << ": " << st.to_string();
    EXPECT_EQ(st.message().rfind("output", 0), 0u) << st.message();
    std::vector<unsigned char> out(d_out.bytes());
    ASSERT_TRUE(copy_to_host(p.ctx, out.data(), d_out.data(), out.size()).ok());
    for (unsigned char v : out) ASSERT_EQ(v, 0x7f) << sh[0] << "x" << sh[1] << ": output written on error";
  }
}

// An anonymous mapping that reserves no memory and is never touched here.
struct Reserved {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Reserved(size_t n) : bytes(n) {
    void* q = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    p = q == MAP_FAILED ? nullptr : q;
  }
  ~Reserved() {
    if (p != nullptr) munmap(p, bytes);
  }
};

TEST_P(TbeForwardContract, Int32IndicesAddressAtMost2To31Minus1Lookups) {
  if (sizeof(void*) < 8) GTEST_SKIP() << "needs a 64-bit address space";
  TwoFeatures p(backend());
  const int64_t too_many = int64_t{INT32_MAX} + 1;
  Reserved idx(static_cast<size_t>(too_many) * 4);  // host memory, never read
  if (idx.p == nullptr) GTEST_SKIP() << "no address space for " << too_many * 4 << " bytes";
  const std::vector<int32_t> off = {0, 1, 2, 3, 4};  // T = 2, B = 2 (never read either)
  Buffer d_off(backend(), off.size() * 4), d_out(backend(), 2 * 10 * 4), d_m1(backend(), 10 * 4);
  ASSERT_TRUE(copy_to_backend(p.ctx, d_off.data(), off.data(), off.size() * 4).ok());
  TbeForwardArgs a;
  a.weights = TensorView::vec(p.d_w.data(), DType::kF32, 50);
  a.indices = TensorView::vec(idx.p, DType::kI32, too_many);
  a.offsets = TensorView::vec(d_off.data(), DType::kI32, static_cast<int64_t>(off.size()));
  a.batch_size = 2;
  a.output = TensorView::mat(d_out.data(), DType::kF32, 2, 10);
  Status st = p.tbe->forward(p.ctx, a);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_EQ(st.message().rfind("indices", 0), 0u) << st.message();
  EXPECT_NE(st.message().find("int32"), std::string::npos) << st.message();
  TbeBackwardArgs b;
  b.weights = a.weights;
  b.indices = a.indices;
  b.offsets = a.offsets;
  b.batch_size = 2;
  b.grad_output = a.output;
  b.optimizer.type = OptimizerType::kRowwiseAdagrad;
  b.momentum1 = TensorView::vec(d_m1.data(), DType::kF32, 10);
  size_t bytes = 0;
  st = p.tbe->backward_workspace_size(p.ctx, b, &bytes);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_EQ(st.message().rfind("indices", 0), 0u) << st.message();
  st = p.tbe->backward(p.ctx, b, nullptr, 0);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_EQ(st.message().rfind("indices", 0), 0u) << st.message();
  std::vector<float> w(50);
  ASSERT_TRUE(copy_to_host(p.ctx, w.data(), p.d_w.data(), 200).ok());
  EXPECT_EQ(w, p.w);

  // 2^31 - 1 int32-addressed lookups pass the argument checks: the CPU backend then reads the offsets
  // (only they), and refuses them since the last one is not N.
  if (backend() == Backend::kCpu) {
    a.indices.shape[0] = INT32_MAX;
    a.offsets = TensorView::vec(const_cast<int32_t*>(off.data()), DType::kI32, static_cast<int64_t>(off.size()));
    std::vector<float> out(20);
    a.weights = TensorView::vec(p.w.data(), DType::kF32, 50);
    a.output = TensorView::mat(out.data(), DType::kF32, 2, 10);
    st = p.tbe->forward(p.ctx, a);
    EXPECT_EQ(st.code(), StatusCode::kOutOfRange) << st.to_string();
    EXPECT_EQ(st.message().rfind("offsets", 0), 0u) << st.message();
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, TbeForwardContract, ::testing::Values(Backend::kCpu, Backend::kCuda),
                         [](const ::testing::TestParamInfo<Backend>& i) { return std::string(backend_name(i.param)); });

}  // namespace
}  // namespace embscale
