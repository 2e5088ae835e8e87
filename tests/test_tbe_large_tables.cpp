// 64-bit weight addressing on the CPU with a real table of more than 2^31 elements: the weights buffer
// (fp16: 4 GiB, fp32: 8 GiB of address space) is an anonymous MAP_NORESERVE mapping, so only the pages of
// the rows the test writes cost memory. Table 0 (D = 87, so every column path of the CPU kernels runs:
// 32-, 16-, 4-wide chunks and a tail of 3) extends past element 2^31; table 1 starts beyond it. Lookups
// name rows beyond element 2^31 in both tables and a row far below it; the forward (pooled SUM and
// sequence, int32 and int64 indices) and one SGD backward step are compared with the reference
// (reference_tbe.h for the forward, the SGD rule worked out here for the update: integer data, exact).
// The rows next to each looked-up row are written too, as sentinels the backward must leave alone.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <vector>

#include "embscale/memory.h"
#include "embscale/tbe.h"
#include "reference_tbe.h"

namespace embscale {
namespace {

constexpr int kD = 87;
constexpr int64_t kTwo31 = int64_t{1} << 31;
constexpr int64_t kRows0 = kTwo31 / kD + 1000;  // table 0 ends 1000 rows (87,000 elements) past 2^31
constexpr int64_t kRows1 = 1024;

// An anonymous private mapping of `bytes` that reserves no memory: pages cost memory once written.
class SparseBuffer {
 public:
  explicit SparseBuffer(size_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : p;
  }
  ~SparseBuffer() {
    if (data_ != nullptr) munmap(data_, bytes_);
  }
  SparseBuffer(const SparseBuffer&) = delete;
  SparseBuffer& operator=(const SparseBuffer&) = delete;
  void* data() const { return data_; }

 private:
  size_t bytes_;
  void* data_;
};

double get(const void* w, DType t, int64_t i) { return ref::decode(w, t, i); }
void put(void* w, DType t, int64_t i, double v) {
  if (t == DType::kF32) {
    static_cast<float*>(w)[i] = static_cast<float>(v);
  } else {  // fp16: the test's values are small integers and halves, exact
    const float f = static_cast<float>(v);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    const uint32_t h = a == 0 ? 0u : (((a >> 23) - 112u) << 10) | ((a >> 13) & 0x3ffu);
    static_cast<uint16_t*>(w)[i] = static_cast<uint16_t>(sign | h);
  }
}

class TbeLargeTableCpu : public ::testing::TestWithParam<DType> {};

TEST_P(TbeLargeTableCpu, ForwardAndSgdBeyond2To31Elements) {
  const DType wt = GetParam();
  if (sizeof(void*) < 8) GTEST_SKIP() << "needs a 64-bit address space";
  const Context ctx = Context::cpu();
  TbeConfig cfg;
  cfg.tables = {TableSpec{kRows0, kD}, TableSpec{kRows1, kD}};
  cfg.feature_table_map = {0, 1, 0};
  cfg.weights_dtype = wt;
  std::unique_ptr<TableBatchedEmbedding> tbe;
  ASSERT_TRUE(TableBatchedEmbedding::create(ctx, cfg, &tbe).ok());
  const int64_t NW = tbe->num_weights();
  ASSERT_GT(tbe->weight_offset(1), kTwo31);
  ASSERT_EQ(NW, (kRows0 + kRows1) * kD);
  SparseBuffer buf(static_cast<size_t>(NW) * dtype_size(wt));
  if (buf.data() == nullptr) GTEST_SKIP() << "no address space for a " << NW * dtype_size(wt) << "-byte mapping";
  void* w = buf.data();

  const uint64_t seed = 20261201;
  std::printf("[ seed     ] %" PRIu64 "\n", seed);
  std::mt19937_64 rng(seed);
  const int64_t first_beyond = kTwo31 / kD + 1;  // the first row of table 0 that starts past element 2^31
  // Rows looked up (table, row): beyond 2^31 in table 0 (the row straddling it, the last rows), all of
  // table 1 (it starts beyond), and row 3 of table 0 far below.
  const std::vector<int64_t> rows0 = {first_beyond - 1, first_beyond, kRows0 - 2, kRows0 - 1, 3};
  const std::vector<int64_t> rows1 = {0, 1, 511, kRows1 - 1};
  std::set<int64_t> written;  // element offsets of the rows given values (looked up, and their neighbours)
  auto fill_row = [&](int t, int64_t r) {
    if (r < 0 || r >= (t == 0 ? kRows0 : kRows1)) return;
    const int64_t e0 = tbe->weight_offset(t) + r * kD;
    for (int d = 0; d < kD; ++d) put(w, wt, e0 + d, static_cast<double>(static_cast<int>(rng() % 33) - 16));
    written.insert(e0);
  };
  for (int64_t r : rows0)
    for (int64_t n : {r - 1, r, r + 1}) fill_row(0, n);
  for (int64_t r : rows1)
    for (int64_t n : {r - 1, r, r + 1}) fill_row(1, n);

  // B = 3 bags per feature.
  const int64_t B = 3;
  std::vector<int64_t> idx, off = {0};
  const std::vector<std::vector<int64_t>> bags = {
      {kRows0 - 1, first_beyond - 1}, {first_beyond, 3, kRows0 - 2}, {kRows0 - 1},  // feature 0: table 0
      {kRows1 - 1, 0}, {511}, {1, 1, kRows1 - 1},                                    // feature 1: table 1
      {3}, {}, {kRows0 - 2, first_beyond - 1, kRows0 - 1}};                          // feature 2: table 0
  for (const auto& bag : bags) {
    idx.insert(idx.end(), bag.begin(), bag.end());
    off.push_back(static_cast<int64_t>(idx.size()));
  }
  const int64_t N = static_cast<int64_t>(idx.size());
  ref::Config rc{{kRows0, kRows1}, {kD, kD}, {0, 1, 0}, wt};

  for (DType it : {DType::kI64, DType::kI32}) {
    SCOPED_TRACE(std::string("indices ") + dtype_name(it));
    std::vector<unsigned char> d_idx(N * dtype_size(it)), d_off(off.size() * dtype_size(it));
    for (int64_t i = 0; i < N; ++i) {
      if (it == DType::kI64) reinterpret_cast<int64_t*>(d_idx.data())[i] = idx[i];
      else reinterpret_cast<int32_t*>(d_idx.data())[i] = static_cast<int32_t>(idx[i]);
    }
    for (size_t i = 0; i < off.size(); ++i) {
      if (it == DType::kI64) reinterpret_cast<int64_t*>(d_off.data())[i] = off[i];
      else reinterpret_cast<int32_t*>(d_off.data())[i] = static_cast<int32_t>(off[i]);
    }
    for (PoolingMode pool : {PoolingMode::kSum, PoolingMode::kNone}) {
      const bool seq = pool == PoolingMode::kNone;
      const int64_t rows = seq ? N : B, cols = seq ? kD : tbe->total_dim();
      std::vector<float> out(rows * cols, -12345.0f);
      TbeForwardArgs a;
      a.weights = TensorView::vec(w, wt, NW);
      a.indices = TensorView::vec(d_idx.data(), it, N);
      a.offsets = TensorView::vec(d_off.data(), it, static_cast<int64_t>(off.size()));
      a.batch_size = B;
      a.pooling = pool;
      a.output = TensorView::mat(out.data(), DType::kF32, rows, cols);
      const Status st = tbe->forward(ctx, a);
      ASSERT_TRUE(st.ok()) << st.to_string();
      const ref::Result want = ref::tbe_forward(rc, w, idx, off, nullptr, B, pool, BoundsCheckMode::kError);
      ASSERT_TRUE(want.ok);
      int bad = 0;
      for (size_t i = 0; i < out.size(); ++i)  // integer sums of a few terms: exact
        if (out[i] != want.out[i] && ++bad <= 5)
          ADD_FAILURE() << pooling_mode_name(pool) << " output[" << i / cols << ", " << i % cols << "] = " << out[i]
                        << ", expected " << want.out[i];
      EXPECT_EQ(bad, 0);
    }
  }

  // One SGD step (lr = 0.5, integer gradients: exact) on the pooled lookups with int64 indices.
  std::vector<float> go(B * tbe->total_dim());
  for (float& g : go) g = static_cast<float>(static_cast<int>(rng() % 9) - 4);
  std::map<int64_t, std::vector<double>> grad;  // element offset of a looked-up row -> its summed gradient
  for (int f = 0; f < 3; ++f) {
    const int t = cfg.feature_table_map[f];
    for (int64_t b = 0; b < B; ++b)
      for (int64_t p = off[f * B + b]; p < off[f * B + b + 1]; ++p) {
        std::vector<double>& g = grad[tbe->weight_offset(t) + idx[p] * kD];
        g.resize(kD, 0.0);
        for (int d = 0; d < kD; ++d) g[d] += go[b * tbe->total_dim() + tbe->output_offset(f) + d];
      }
  }
  std::map<int64_t, double> before;
  for (int64_t e0 : written)
    for (int d = 0; d < kD; ++d) before[e0 + d] = get(w, wt, e0 + d);
  TbeBackwardArgs b;
  b.weights = TensorView::vec(w, wt, NW);
  b.indices = TensorView::vec(idx.data(), DType::kI64, N);
  b.offsets = TensorView::vec(off.data(), DType::kI64, static_cast<int64_t>(off.size()));
  b.batch_size = B;
  b.grad_output = TensorView::mat(go.data(), DType::kF32, B, tbe->total_dim());
  b.optimizer.type = OptimizerType::kSgd;
  b.optimizer.learning_rate = 0.5f;
  b.rounding = WeightRounding::kNearest;
  size_t ws_bytes = 0;
  ASSERT_TRUE(tbe->backward_workspace_size(ctx, b, &ws_bytes).ok());
  std::vector<unsigned char> ws(ws_bytes);
  const Status st = tbe->backward(ctx, b, ws.data(), ws_bytes);
  ASSERT_TRUE(st.ok()) << st.to_string();
  int bad = 0, updated = 0;
  for (const auto& kv : before) {
    const int64_t e = kv.first;
    const int t = e >= tbe->weight_offset(1) ? 1 : 0;
    const int64_t row_start = tbe->weight_offset(t) + (e - tbe->weight_offset(t)) / kD * kD;
    const auto g = grad.find(row_start);
    const double want = g == grad.end() ? kv.second : kv.second - 0.5 * g->second[e - row_start];
    updated += g != grad.end() && want != kv.second;
    if (get(w, wt, e) != want && ++bad <= 5)
      ADD_FAILURE() << "weights[" << e << "] (table " << t << ", row " << (e - tbe->weight_offset(t)) / kD << ") = "
                    << get(w, wt, e) << ", expected " << want << (g == grad.end() ? " (a row no lookup names)" : "");
  }
  EXPECT_EQ(bad, 0);
  EXPECT_GT(updated, 9 * kD / 2) << "the 9 looked-up rows must change (where their gradient is not 0)";
}

INSTANTIATE_TEST_SUITE_P(Weights, TbeLargeTableCpu, ::testing::Values(DType::kF16, DType::kF32),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

}  // namespace
}  // namespace embscale
