// TBE backward fused with the optimizer against the naive reference (reference_tbe_backward.h) on every
// backend: seeded random configurations per optimizer (several steps, learning rate and step changed
// between steps), exact SGD on small-integer data, edge sizes, a hot row hit by more than 100,000
// lookups, determinism across runs and thread counts / tunings, and stochastic rounding (unbiased,
// reproducible). Errors and bad arguments are in test_tbe_backward_errors.cpp.
#include <gtest/gtest.h>

#if EMBSCALE_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include <cmath>
#include <cstdio>
#include <vector>

#include "core/numerics.h"
#include "tbe_backward_case.h"

namespace embscale {
namespace {

using testing_tbe::BwdCase;
using testing_tbe::BwdOutcome;
using testing_tbe::random_backward_case;
using testing_tbe::run_backward_case;

class TbeBackward : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (!backend_available(GetParam())) GTEST_SKIP() << backend_name(GetParam()) << " backend not available";
  }
  BwdOutcome expect_case(const BwdCase& c) {
    BwdOutcome o = run_backward_case(GetParam(), c);
    EXPECT_TRUE(o.failure.empty()) << o.failure;
    return o;
  }
  void random_configs(OptimizerType opt, uint64_t base, int cases) {
    std::printf("TbeBackward %s: seeds %llu..%llu\n", optimizer_name(opt), static_cast<unsigned long long>(base),
                static_cast<unsigned long long>(base + cases - 1));
    int nonzero = 0;
    for (int i = 0; i < cases; ++i) {
      const BwdOutcome o = expect_case(random_backward_case(base + i, opt));
      nonzero += o.reference_nonzero ? 1 : 0;
      if (!o.failure.empty()) break;
    }
    EXPECT_GT(nonzero, cases / 2) << "too few cases had a non-zero gradient";
  }
};

TEST_P(TbeBackward, RandomSgd) { random_configs(OptimizerType::kSgd, 7100000, 120); }
TEST_P(TbeBackward, RandomRowwiseAdagrad) { random_configs(OptimizerType::kRowwiseAdagrad, 7200000, 120); }
TEST_P(TbeBackward, RandomAdam) { random_configs(OptimizerType::kAdam, 7300000, 120); }
TEST_P(TbeBackward, RandomPartialRowwiseAdam) { random_configs(OptimizerType::kPartialRowwiseAdam, 7400000, 120); }
TEST_P(TbeBackward, RandomAdagrad) { random_configs(OptimizerType::kAdagrad, 7600000, 120); }
TEST_P(TbeBackward, RandomLamb) { random_configs(OptimizerType::kLamb, 7700000, 120); }
TEST_P(TbeBackward, RandomPartialRowwiseLamb) { random_configs(OptimizerType::kPartialRowwiseLamb, 7800000, 120); }
TEST_P(TbeBackward, RandomLarsSgd) { random_configs(OptimizerType::kLarsSgd, 7900000, 120); }
TEST_P(TbeBackward, RandomDense) { random_configs(OptimizerType::kNone, 7500000, 120); }

// 40 tables of mixed (odd) D, shared by 48 features; SGD with power-of-two learning rates on
// small-integer weights, gradients and per-sample weights is exact, so the comparison is exact.
TEST_P(TbeBackward, ExactSgdManyTables) {
  for (PoolingMode pool : {PoolingMode::kSum, PoolingMode::kNone}) {
    for (DType idx : {DType::kI32, DType::kI64}) {
      for (bool weighted : {false, true}) {
        BwdCase c;
        for (int t = 0; t < 40; ++t) {
          c.num_rows.push_back(1 + (t * 37) % 90);
          c.dims.push_back(pool == PoolingMode::kNone ? 13 : 1 + (t * 11) % 70);
        }
        for (int f = 0; f < 48; ++f) c.feature_table.push_back((f * 7) % 40);
        c.batch_size = 17;
        c.max_bag = 6;
        c.hot_fraction = 0.2;
        c.index_dtype = idx;
        c.pooling = pool;
        c.weighted = weighted;
        c.grad_psw = weighted;
        c.integer_values = true;
        c.opt.type = OptimizerType::kSgd;
        c.opt.learning_rate = 0.5f;
        c.steps = 3;
        c.seed = 4242 + (weighted ? 1 : 0) + (idx == DType::kI32 ? 2 : 0) + (pool == PoolingMode::kNone ? 4 : 0);
        expect_case(c);
      }
    }
  }
}

// B = 0, empty bags, D = 1, a single row, every optimizer and weights dtype.
TEST_P(TbeBackward, EdgeSizes) {
  for (OptimizerType opt : {OptimizerType::kNone, OptimizerType::kSgd, OptimizerType::kRowwiseAdagrad,
                            OptimizerType::kAdam, OptimizerType::kPartialRowwiseAdam}) {
    for (DType wd : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (int shape = 0; shape < 4; ++shape) {
        BwdCase c;
        c.opt.type = opt;
        c.opt.eps = 0.01f;
        c.weights_dtype = wd;
        c.seed = 900 + shape;
        c.num_rows = {shape == 3 ? 1 : 5, 3};
        c.dims = {1, shape == 2 ? 1 : 5};
        c.batch_size = shape == 0 ? 0 : 3;
        c.max_bag = shape == 1 ? 0 : 3;
        c.steps = 2;
        expect_case(c);
      }
    }
  }
}

// Adam and partial row-wise Adam apply FBGEMM's decoupled weight decay (w -= lr * (update + wd*w)) whenever
// weight_decay != 0, whatever weight_decay_mode says, as FBGEMM's ADAM and PARTIAL_ROWWISE_ADAM (which take no
// mode): the three modes give bit-identical tables and state, equal to the reference's, and differ from no decay.
TEST_P(TbeBackward, AdamWeightDecayIsDecoupledWhateverTheMode) {
  for (OptimizerType opt : {OptimizerType::kAdam, OptimizerType::kPartialRowwiseAdam}) {
    BwdCase c;
    c.opt.type = opt;
    c.opt.learning_rate = 0.05f;
    c.opt.eps = 1e-3f;
    c.num_rows = {20, 9};
    c.dims = {12, 5};
    c.batch_size = 6;
    c.steps = 3;
    c.seed = 5151;
    std::printf("AdamWeightDecayIsDecoupledWhateverTheMode %s: seed %llu\n", optimizer_name(opt),
                static_cast<unsigned long long>(c.seed));
    c.opt.weight_decay = 0.0f;
    const BwdOutcome none = expect_case(c);
    c.opt.weight_decay = 0.25f;
    c.opt.weight_decay_mode = WeightDecayMode::kDecoupled;
    const BwdOutcome decoupled = expect_case(c);
    EXPECT_NE(decoupled.weights, none.weights) << optimizer_name(opt) << ": the decay changed nothing";
    for (WeightDecayMode mode : {WeightDecayMode::kNone, WeightDecayMode::kL2}) {
      c.opt.weight_decay_mode = mode;
      const BwdOutcome o = expect_case(c);
      EXPECT_EQ(o.weights, decoupled.weights) << optimizer_name(opt) << " mode " << static_cast<int>(mode);
      EXPECT_EQ(o.m1, decoupled.m1) << optimizer_name(opt) << " mode " << static_cast<int>(mode);
      EXPECT_EQ(o.m2, decoupled.m2) << optimizer_name(opt) << " mode " << static_cast<int>(mode);
    }
  }
}

// One row hit by more than 100,000 lookups (on CUDA: the block path and the multi-block combine),
// exact integer data so the comparison of its gradient is exact.
TEST_P(TbeBackward, HotRow) {
  for (OptimizerType opt : {OptimizerType::kSgd, OptimizerType::kRowwiseAdagrad, OptimizerType::kNone}) {
    BwdCase c;
    c.num_rows = {1000, 50};
    c.dims = {64, 3};
    c.batch_size = 1000;
    c.max_bag = 240;
    c.hot_fraction = 0.95;
    c.integer_values = true;
    c.opt.type = opt;
    c.opt.learning_rate = 0.25f;
    c.opt.eps = 0.125f;
    c.seed = 31337;
    const BwdOutcome o = expect_case(c);
    EXPECT_TRUE(o.reference_nonzero);
  }
}

// The same hot row (on CUDA: the block path and the multi-block combine) for the optimizers with element-wise
// state and those whose row needs norms (LAMB's trust ratio, LARS's rate), on exact integer data too.
TEST_P(TbeBackward, HotRowNormalisedOptimizers) {
  for (OptimizerType opt : {OptimizerType::kAdam, OptimizerType::kAdagrad, OptimizerType::kLamb,
                            OptimizerType::kPartialRowwiseLamb, OptimizerType::kLarsSgd}) {
    BwdCase c;
    c.num_rows = {1000, 50};
    c.dims = {64, 3};
    c.batch_size = 1000;
    c.max_bag = 240;
    c.hot_fraction = 0.95;
    c.integer_values = true;
    c.opt.type = opt;
    c.opt.learning_rate = 0.01f;
    c.opt.eps = 1e-3f;
    c.opt.eta = 0.5f;
    c.steps = 2;
    c.seed = 31338 + static_cast<int>(opt);
    std::printf("HotRowNormalisedOptimizers %s: seed %llu\n", optimizer_name(opt),
                static_cast<unsigned long long>(c.seed));
    const BwdOutcome o = expect_case(c);
    EXPECT_TRUE(o.reference_nonzero);
  }
}

#if EMBSCALE_WITH_CUDA
// Runs `call` captured in a CUDA graph on a new stream (after the case's uploads on ctx finished), then
// replays the graph once: the backward allocates nothing, never synchronises and keeps no host state.
Status run_in_graph(const Context& ctx, const std::function<Status(const Context&)>& call) {
  const auto err = [](cudaError_t e, const char* what) {
    return Status(StatusCode::kBackendError, std::string(what) + ": " + cudaGetErrorString(e));
  };
  Status st = synchronize(ctx);
  if (!st.ok()) return st;
  cudaStream_t stream = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) return err(e, "cudaStreamCreateWithFlags");
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  if (e == cudaSuccess) {
    st = call(Context::cuda(stream));
    e = cudaStreamEndCapture(stream, &graph);
  }
  if (e == cudaSuccess && st.ok()) e = cudaGraphInstantiate(&exec, graph, 0);
  if (e == cudaSuccess && st.ok()) e = cudaGraphLaunch(exec, stream);
  if (e == cudaSuccess && st.ok()) e = cudaStreamSynchronize(stream);
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  if (!st.ok()) return st;
  return e == cudaSuccess ? Status::Ok() : err(e, "CUDA graph capture / launch");
}
#endif

// The CUDA backward captured in a CUDA graph (every step captured and replayed) gives the reference's
// results: hot rows (block path and multi-block combine), each lane-group optimizer and Adam, skip-mode
// bounds checking (error mode reads the report back, which a capture refuses).
TEST_P(TbeBackward, CudaGraph) {
#if EMBSCALE_WITH_CUDA
  if (GetParam() != Backend::kCuda) GTEST_SKIP() << "CUDA graphs: CUDA backend only";
  const uint64_t base = 7600000;
  std::printf("TbeBackward.CudaGraph: seeds %llu..\n", static_cast<unsigned long long>(base));
  int k = 0;
  for (OptimizerType opt : {OptimizerType::kSgd, OptimizerType::kRowwiseAdagrad, OptimizerType::kAdam,
                            OptimizerType::kNone}) {
    for (int dim : {3, 128, 300}) {
      BwdCase c;
      c.num_rows = {5000, 40, 70000};
      c.dims = {dim, 16, dim};
      c.batch_size = 700;
      c.max_bag = 40;
      c.hot_fraction = 0.15;  // row 0 of each table: ~1000..3000 lookups (block rows, superchunk slots)
      c.bad_fraction = 0.01;
      c.bounds = BoundsCheckMode::kSkip;
      // small-integer data: the hot rows' sums of ~2000 terms are exact, so the harness's state
      // tolerance (made for short segments) also holds for Adam's element-wise state
      c.integer_values = true;
      c.opt.type = opt;
      c.opt.learning_rate = 0.5f;
      c.steps = 2;
      c.seed = base + k++;
      c.runner = run_in_graph;
      const BwdOutcome o = expect_case(c);
      EXPECT_TRUE(o.reference_nonzero);
    }
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// Bit-identical results across runs and thread counts (CPU) or tunings (CUDA).
TEST_P(TbeBackward, Deterministic) {
  for (OptimizerType opt : {OptimizerType::kRowwiseAdagrad, OptimizerType::kAdam, OptimizerType::kPartialRowwiseAdam}) {
    BwdCase c;
    c.num_rows = {300, 20};
    c.dims = {37, 128};
    c.batch_size = 200;
    c.max_bag = 30;
    c.hot_fraction = 0.3;
    c.weights_dtype = DType::kBF16;
    c.rounding = WeightRounding::kStochastic;
    c.opt.type = opt;
    c.opt.eps = 1e-3f;
    c.steps = 2;
    c.seed = 55;
    c.integer_values = true;  // hot rows sum hundreds of terms: exact integer sums keep the reference check tight
    const BwdOutcome a = expect_case(c);
    c.threads = 1;
    c.tuning.max_warp_segment = 4;
    c.tuning.max_block_segment = 64;
    c.tuning.block_threads = 64;
    const BwdOutcome b = expect_case(c);
    c.threads = 3;
    c.tuning = TbeBackwardTuning{};
    const BwdOutcome d = expect_case(c);
    EXPECT_TRUE(a.weights == b.weights && a.weights == d.weights) << optimizer_name(opt) << ": weights differ";
    EXPECT_TRUE(a.m1 == b.m1 && a.m1 == d.m1) << optimizer_name(opt) << ": momentum1 differs";
    EXPECT_TRUE(a.m2 == b.m2 && a.m2 == d.m2) << optimizer_name(opt) << ": momentum2 differs";
  }
}

// Key spaces of 17..18 and 25..27 bits take 9-bit radix digits on CUDA (one sort pass fewer than
// 8-bit digits): tables of 70,000 + 60,000 rows (a 17-bit key) and 2^24 + 5 + 1,000 rows (25 bits),
// with a hot row (block and multi-block paths) in each table.
TEST_P(TbeBackward, WideKeySpaces) {
  const std::vector<std::vector<int64_t>> row_sets = {{70000, 60000}, {(int64_t{1} << 24) + 5, 1000}};
  for (const auto& rows : row_sets) {
    for (OptimizerType opt : {OptimizerType::kSgd, OptimizerType::kRowwiseAdagrad}) {
      BwdCase c;
      c.num_rows = rows;
      c.dims = {1, 12};
      c.batch_size = 600;
      c.max_bag = 20;
      c.hot_fraction = 0.3;
      c.opt.type = opt;
      c.opt.learning_rate = 0.25f;
      c.opt.eps = 0.125f;
      c.seed = 2424 + rows[0] % 7 + (opt == OptimizerType::kSgd ? 0 : 10);
      c.integer_values = true;
      const BwdOutcome o = expect_case(c);
      EXPECT_TRUE(o.reference_nonzero);
    }
  }
}

// Every lane-group shape on CUDA: rows wider than 128 columns (up to 512) by groups of 16 or 32 lanes,
// rows of up to 32 columns by the narrow shapes (16 rows of 2 lanes up to 16 columns, 8 rows of 4 lanes
// up to 32), and rows narrower than their shape's widest (empty vectors). The lane groups take calls
// whose every D is a multiple of 4 (whole vectors), one set per shape: (16, 2), (8, 2), (4, 4),
// (2, 2), (1, 1); the sets with odd widths (partial vectors) take the whole-warp path instead. Every
// optimizer: those with element-wise state hold it in the lane groups' registers, LAMB's take their
// trust ratio there, LARS's its weight norm. The results must match the reference and be bit-identical
// (weights and both state buffers) to the block and multi-block paths.
TEST_P(TbeBackward, LaneGroupShapesDeterministic) {
  const std::vector<std::vector<int>> dim_sets = {{16, 8, 4},  {32, 12, 28}, {128, 64, 36}, {256, 160},
                                                  {512, 320, 40}, {160, 37},  {256, 3},     {320, 512, 129},
                                                  {16, 9, 1},  {32, 17, 5},  {24, 31}};
  for (int i = 0; i < num_optimizers(); ++i) {
    const auto opt = static_cast<OptimizerType>(i);
    if (opt == OptimizerType::kNone) continue;  // dense mode: RandomDense and the dense tests
    const bool plain = opt == OptimizerType::kSgd || opt == OptimizerType::kRowwiseAdagrad;
    for (const auto& dims : dim_sets) {
      BwdCase c;
      c.dims = dims;
      c.num_rows.assign(dims.size(), 40);
      c.batch_size = 96;
      c.max_bag = 12;
      c.hot_fraction = 0.2;
      c.opt.type = opt;
      c.opt.learning_rate = plain ? 0.125f : 0.01f;
      c.opt.eps = plain ? 0.1f : 1e-3f;
      if (opt == OptimizerType::kRowwiseAdagrad) c.opt.max_norm = 40.0f;
      if (!plain && opt != OptimizerType::kAdagrad) {
        c.opt.weight_decay = 0.05f;
        c.opt.weight_decay_mode = WeightDecayMode::kDecoupled;
      }
      if (opt == OptimizerType::kLarsSgd) c.opt.eta = 0.5f;
      c.steps = 2;
      c.seed = 91 + dims[0] + (plain ? 0 : 1000 * i);
      c.integer_values = true;
      const BwdOutcome a = expect_case(c);
      c.tuning.max_warp_segment = 2;
      c.tuning.max_block_segment = 6;
      c.tuning.block_threads = 64;
      const BwdOutcome b = expect_case(c);
      EXPECT_TRUE(a.weights == b.weights && a.m1 == b.m1 && a.m2 == b.m2)
          << optimizer_name(opt) << " D0=" << dims[0] << ": paths differ bit-wise";
    }
  }
}

// Rows of at most 64 columns made of whole vectors: on CUDA the block path and the hot-row parts sum
// several chunks of a segment side by side (chunk groups of 4, 8 or 16 lanes, by D), the warp path one
// chunk at a time. Real-valued data (sums whose bits depend on the order of the adds), segments of up to
// ~1500 lookups (many chunks, partial last chunks, several superchunks), plain, weighted and MEAN
// contributions, fp32 and (one set) bf16 gradients: a tuning that gives the long rows to the warp path, one
// that gives them to the block path and one that splits them into superchunk parts must give the same bits,
// and match the reference.
TEST_P(TbeBackward, ChunkGroupsDeterministic) {
  const std::vector<std::vector<int>> dim_sets = {{4, 8}, {16, 12}, {32, 20}, {64, 36}, {48, 64, 4}, {32, 8}};
  int k = 0;
  for (const auto& dims : dim_sets) {
    for (int contrib = 0; contrib < 3; ++contrib) {
      BwdCase c;
      c.dims = dims;
      if (&dims == &dim_sets.back()) c.grad_dtype = DType::kBF16;
      c.num_rows.assign(dims.size(), 30);
      c.batch_size = 700;
      c.max_bag = 8;
      c.hot_fraction = 0.5;  // row 0 of each table: ~1400 lookups (two superchunks)
      c.weighted = contrib == 1;
      c.pooling = contrib == 2 ? PoolingMode::kMean : PoolingMode::kSum;
      c.opt.type = k % 2 == 0 ? OptimizerType::kRowwiseAdagrad : OptimizerType::kSgd;
      // A small step keeps the weights within the harness's fp32 tolerance of the double reference after
      // sums of ~1400 real terms; row-wise Adagrad's state (the row's sum of squares, compared bit for
      // bit) shows any change in a sum's bits.
      c.opt.learning_rate = 0.03125f;
      c.opt.eps = 0.1f;
      c.seed = 8100 + k++;
      std::printf("TbeBackward.ChunkGroupsDeterministic: %s\n", c.describe().c_str());
      c.tuning.max_warp_segment = 2048;
      c.tuning.max_block_segment = 4096;
      const BwdOutcome warp = expect_case(c);
      EXPECT_TRUE(warp.reference_nonzero);
      c.tuning.max_warp_segment = 8;
      const BwdOutcome block = expect_case(c);
      c.tuning.max_block_segment = 40;
      c.tuning.block_threads = 64;
      const BwdOutcome parts = expect_case(c);
      EXPECT_TRUE(warp.weights == block.weights && warp.m1 == block.m1) << c.describe() << ": warp and block paths differ";
      EXPECT_TRUE(warp.weights == parts.weights && warp.m1 == parts.m1)
          << c.describe() << ": warp path and superchunk parts differ";
    }
  }
}

// Stochastic rounding: every element of a table starts at w0 and receives one SGD update to the exact
// fp32 value x between two neighbours; the mean of the rounded results must match x (unbiased, within
// 6 standard errors), the same seed must reproduce the bits, and another seed must change them.
TEST_P(TbeBackward, StochasticRounding) {
  const Backend backend = GetParam();
  const Context ctx = backend == Backend::kCuda ? Context::cuda() : Context::cpu();
  struct Case {
    DType dtype;
    float w0;
    float delta;  // x = w0 + delta
  };
  const Case cases[] = {
      {DType::kBF16, 1.0f, 0.3f * 0.0078125f},          // 0.3 ulp above 1
      {DType::kBF16, -3.0f, -0.71f * 0.015625f},        // magnitude up by 0.71 ulp
      {DType::kF16, 1.0f, 0.45f * 0.0009765625f},       // fp16 normal
      {DType::kF16, 1.0f / 65536.0f, 0.2f / 16777216.0f}  // fp16 subnormal (2^-16 + 0.2 * 2^-24)
  };
  const int64_t E = 2048, D = 64;
  for (const Case& k : cases) {
    TbeConfig cfg;
    cfg.tables = {TableSpec{E, static_cast<int>(D)}};
    cfg.weights_dtype = k.dtype;
    std::unique_ptr<TableBatchedEmbedding> tbe;
    ASSERT_TRUE(TableBatchedEmbedding::create(ctx, cfg, &tbe).ok());
    const uint16_t w0 = k.dtype == DType::kBF16 ? float_to_bf16(k.w0) : float_to_fp16(k.w0);
    const std::vector<uint16_t> w_init(E * D, w0);
    std::vector<int64_t> idx(E), off(E + 1);
    for (int64_t i = 0; i < E; ++i) idx[i] = i;
    for (int64_t i = 0; i <= E; ++i) off[i] = i;
    const std::vector<float> go(E * D, -k.delta);  // lr = 1: w - (-delta)
    const float x = k.w0 + k.delta;                 // the exact fp32 update
    Buffer d_w(backend, E * D * 2), d_idx(backend, E * 8), d_off(backend, (E + 1) * 8), d_go(backend, E * D * 4);
    ASSERT_TRUE(copy_to_backend(ctx, d_idx.data(), idx.data(), E * 8).ok());
    ASSERT_TRUE(copy_to_backend(ctx, d_off.data(), off.data(), (E + 1) * 8).ok());
    ASSERT_TRUE(copy_to_backend(ctx, d_go.data(), go.data(), E * D * 4).ok());
    auto run = [&](uint64_t seed, std::vector<uint16_t>* out) {
      ASSERT_TRUE(copy_to_backend(ctx, d_w.data(), w_init.data(), E * D * 2).ok());
      TbeBackwardArgs a;
      a.weights = TensorView::vec(d_w.data(), k.dtype, E * D);
      a.indices = TensorView::vec(d_idx.data(), DType::kI64, E);
      a.offsets = TensorView::vec(d_off.data(), DType::kI64, E + 1);
      a.batch_size = E;
      a.grad_output = TensorView::mat(d_go.data(), DType::kF32, E, D);
      a.optimizer.type = OptimizerType::kSgd;
      a.optimizer.learning_rate = 1.0f;
      a.optimizer.step = 7;
      a.rounding = WeightRounding::kStochastic;
      a.seed = seed;
      size_t bytes = 0;
      ASSERT_TRUE(tbe->backward_workspace_size(ctx, a, &bytes).ok());
      Buffer ws(backend, bytes);
      const Status st = tbe->backward(ctx, a, ws.data(), bytes);
      ASSERT_TRUE(st.ok()) << st.to_string();
      ASSERT_TRUE(synchronize(ctx).ok());
      out->resize(E * D);
      ASSERT_TRUE(copy_to_host(ctx, out->data(), d_w.data(), E * D * 2).ok());
    };
    std::vector<uint16_t> r1, r2, r3;
    run(123, &r1);
    run(123, &r2);
    run(124, &r3);
    EXPECT_EQ(r1, r2) << "same seed and step must reproduce the bits";
    EXPECT_NE(r1, r3) << "another seed must change the rounding";
    double sum = 0, lo_v = 1e300, hi_v = -1e300;
    for (uint16_t v : r1) {
      const double d = k.dtype == DType::kBF16 ? ref::decode_bf16(v) : ref::decode_fp16(v);
      sum += d;
      lo_v = std::min(lo_v, d);
      hi_v = std::max(hi_v, d);
    }
    const double n = static_cast<double>(E * D);
    const double mean = sum / n;
    const double spacing = hi_v - lo_v;  // the two neighbours
    ASSERT_GT(spacing, 0.0) << "all elements rounded the same way";
    const double p = (std::fabs(static_cast<double>(x)) - std::fabs(lo_v < 0 ? hi_v : lo_v)) / spacing;
    const double se = spacing * std::sqrt(p * (1 - p) / n);
    std::printf("  %s x=%.10g mean=%.10g neighbours %.10g %.10g (std error %.3g)\n", dtype_name(k.dtype), x, mean, lo_v,
                hi_v, se);
    EXPECT_LE(std::fabs(mean - static_cast<double>(x)), 6 * se + 1e-6 * spacing) << dtype_name(k.dtype);
    EXPECT_LE(hi_v - lo_v, testing_tbe::dtype_ulp(k.dtype, x) * 1.0000001) << "values beyond the two neighbours";
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, TbeBackward, ::testing::Values(Backend::kCpu, Backend::kCuda),
                         [](const ::testing::TestParamInfo<Backend>& i) { return std::string(backend_name(i.param)); });

}  // namespace
}  // namespace embscale
