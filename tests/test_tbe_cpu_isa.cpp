// The CPU TBE forward at every instruction-set level this CPU supports (x86-64-v2, and v3 / v4 where
// present; the others are skipped) against a reference written from the definition: each bag's terms
// (weight decoded to fp32, times its per-sample weight when weighted, rounded to fp32) added in lookup
// order to an fp32 zero, divided by the valid count for MEAN, rounded once to the output dtype. The
// weights are real-valued (uniform in [-1, 1]), so any change of order, width-dependent partial sums or
// FMA contraction shows as a bit difference. Dims cover every column block (64, 32, 16, 4, tail).
// Likewise the backward's gradient sums (dense-gradient mode): per unique row, 0 + each lookup's scale *
// its grad_output row, in (row, lookup) order, in fp32.
#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "core/numerics.h"
#include "embscale/tbe.h"
#include "embscale/tbe_generator.h"
#include "tbe/cpu/cpu_isa.h"

namespace embscale {
namespace {

using cpu::CpuIsa;

float decode(const std::vector<unsigned char>& w, DType dtype, int64_t i) {
  if (dtype == DType::kF32) {
    float f;
    std::memcpy(&f, w.data() + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, w.data() + 2 * i, 2);
  return dtype == DType::kF16 ? fp16_to_float(h) : bf16_to_float(h);
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float output_value(const std::vector<unsigned char>& out, DType dtype, int64_t i) { return decode(out, dtype, i); }

float round_to(float v, DType dtype) {
  if (dtype == DType::kF16) return fp16_to_float(float_to_fp16(v));
  if (dtype == DType::kBF16) return bf16_to_float(float_to_bf16(v));
  return v;
}

struct IsaCase {
  std::vector<int> dims;  // one table per dim, one feature per table
  DType weights_dtype, output_dtype, index_dtype;
  PoolingMode pooling;
  bool weighted;
  uint64_t seed;
};

// Runs the case at every supported level; returns the number of mismatching outputs.
int64_t check_case(const IsaCase& c) {
  const Context ctx = Context::cpu();
  TbeConfig cfg;
  for (int d : c.dims) cfg.tables.push_back(TableSpec{997, d});
  cfg.weights_dtype = c.weights_dtype;
  std::unique_ptr<TableBatchedEmbedding> tbe;
  EXPECT_TRUE(TableBatchedEmbedding::create(ctx, cfg, &tbe).ok());
  const int T = static_cast<int>(c.dims.size());
  const int64_t B = 13;
  TbeInputSpec spec;
  spec.batch_size = B;
  spec.bag_size = 9;
  spec.variable_bag_size = true;
  spec.num_rows.assign(T, 997);
  spec.alpha = c.seed % 2 ? 1.15 : 0.0;
  spec.index_dtype = c.index_dtype;
  spec.weighted = c.weighted;
  spec.seed = c.seed;
  TbeInputs in;
  EXPECT_TRUE(generate_tbe_inputs(spec, &in).ok());
  // Some lookups out of range, skipped (the kernel's checked path).
  std::mt19937_64 rng(c.seed);
  for (int64_t i = 0; i < in.num_indices(); ++i)
    if (rng() % 11 == 0) in.indices[i] = rng() % 2 ? -1 : 997 + static_cast<int64_t>(rng() % 5);
  for (size_t i = 0; i < in.indices32.size(); ++i) in.indices32[i] = static_cast<int32_t>(in.indices[i]);
  const int64_t N = in.num_indices();
  std::vector<unsigned char> weights(static_cast<size_t>(tbe->num_weights()) * dtype_size(c.weights_dtype));
  EXPECT_TRUE(init_uniform_weights(c.weights_dtype, 1.0f, c.seed * 7 + 1, 0, tbe->num_weights(), weights.data()).ok());

  const bool sequence = c.pooling == PoolingMode::kNone;
  const int64_t rows = sequence ? N : B;
  const int64_t cols = sequence ? c.dims[0] : tbe->total_dim();
  // Reference: fp32 sums in lookup order.
  std::vector<float> want(static_cast<size_t>(rows * cols), 0.0f);
  int64_t col0 = 0;
  for (int f = 0; f < T; ++f) {
    const int64_t D = c.dims[f];
    const int64_t base = tbe->weight_offset(f);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t start = in.offsets[f * B + b], end = in.offsets[f * B + b + 1];
      for (int64_t d = 0; d < D; ++d) {
        float acc = 0.0f;
        int64_t count = 0;
        for (int64_t pos = start; pos < end; ++pos) {
          const int64_t r = in.indices[pos];
          float term = 0.0f;
          if (r >= 0 && r < 997) {
            ++count;
            term = decode(weights, c.weights_dtype, base + r * D + d);
            if (c.weighted) term = term * in.per_sample_weights[pos];
          } else if (!sequence) {
            continue;
          }
          if (sequence) {
            want[pos * cols + d] = round_to(term, c.output_dtype);
          } else {
            acc = acc + term;
          }
        }
        if (!sequence) {
          if (c.pooling == PoolingMode::kMean && count > 0) acc = acc / static_cast<float>(count);
          want[b * cols + col0 + d] = round_to(acc, c.output_dtype);
        }
      }
    }
    col0 += D;
  }

  int64_t bad = 0;
  for (CpuIsa isa : {CpuIsa::kX86_64_v2, CpuIsa::kX86_64_v3, CpuIsa::kX86_64_v4}) {
    if (!cpu::set_cpu_isa_for_testing(isa)) {
      std::printf("  %s: not supported by this CPU, skipped\n", cpu::cpu_isa_name(isa));
      continue;
    }
    std::vector<unsigned char> out(static_cast<size_t>(rows * cols) * dtype_size(c.output_dtype), 0xff);
    TbeForwardArgs args;
    args.weights = TensorView::vec(weights.data(), c.weights_dtype, tbe->num_weights());
    args.indices = TensorView::vec(const_cast<void*>(in.indices_data()), c.index_dtype, N);
    args.offsets = TensorView::vec(const_cast<void*>(in.offsets_data()), c.index_dtype,
                                   static_cast<int64_t>(in.offsets.size()));
    if (c.weighted) args.per_sample_weights = TensorView::vec(in.per_sample_weights.data(), DType::kF32, N);
    args.batch_size = B;
    args.pooling = c.pooling;
    args.bounds_check = BoundsCheckMode::kSkip;
    args.output = TensorView::mat(out.data(), c.output_dtype, rows, cols);
    const Status st = tbe->forward(ctx, args);
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) return bad + 1;
    for (int64_t i = 0; i < rows * cols; ++i) {
      const float got = output_value(out, c.output_dtype, i);
      if (bits_of(got) != bits_of(want[i]) && bad++ < 5)
        ADD_FAILURE() << cpu::cpu_isa_name(isa) << " seed " << c.seed << ": output " << i << " (row " << i / cols
                      << ", column " << i % cols << ") is " << got << ", want " << want[i];
    }
  }
  cpu::set_cpu_isa_for_testing(CpuIsa::kX86_64_v2);
  return bad;
}

class CpuIsaLevels : public ::testing::Test {
 protected:
  // Back to the detected (widest) level for the tests that follow.
  void TearDown() override {
    for (CpuIsa isa : {CpuIsa::kX86_64_v4, CpuIsa::kX86_64_v3, CpuIsa::kX86_64_v2})
      if (cpu::set_cpu_isa_for_testing(isa)) break;
  }
};

TEST_F(CpuIsaLevels, ForwardMatchesTheOrderedFp32SumAtEveryLevel) {
  const uint64_t kSeed = 1717;
  std::printf("CpuIsaLevels: seeds from %" PRIu64 "; levels supported:", kSeed);
  for (CpuIsa isa : {CpuIsa::kX86_64_v2, CpuIsa::kX86_64_v3, CpuIsa::kX86_64_v4})
    if (cpu::cpu_isa_supported(isa)) std::printf(" %s", cpu::cpu_isa_name(isa));
  std::printf("\n");
  const std::vector<int> dims = {1, 3, 4, 8, 12, 16, 20, 32, 36, 48, 52, 64, 100, 128, 160, 200, 512};
  const DType fl[] = {DType::kF32, DType::kF16, DType::kBF16};
  uint64_t seed = kSeed;
  int64_t bad = 0;
  for (DType w : fl)
    for (DType o : fl)
      for (PoolingMode pool : {PoolingMode::kSum, PoolingMode::kMean})
        for (bool weighted : {false, true}) {
          if (weighted && pool == PoolingMode::kMean) continue;  // refused: per-sample weights need SUM
          IsaCase c{dims, w, o, seed % 3 ? DType::kI64 : DType::kI32, pool, weighted, seed};
          bad += check_case(c);
          ++seed;
        }
  // Sequence (no pooling): every lookup's row, one dim for all features.
  for (int d : {4, 37, 128})
    for (DType w : fl) {
      IsaCase c{{d, d}, w, DType::kF32, DType::kI64, PoolingMode::kNone, seed % 2 == 0, seed};
      bad += check_case(c);
      ++seed;
    }
  EXPECT_EQ(bad, 0);
}

// The dense-gradient backward at every supported level; returns the number of mismatching values.
int64_t check_backward_case(const std::vector<int>& dims, DType grad_dtype, bool weighted, uint64_t seed) {
  const Context ctx = Context::cpu();
  const int64_t E = 97;  // few rows: many lookups per unique row
  TbeConfig cfg;
  for (int d : dims) cfg.tables.push_back(TableSpec{E, d});
  std::unique_ptr<TableBatchedEmbedding> tbe;
  EXPECT_TRUE(TableBatchedEmbedding::create(ctx, cfg, &tbe).ok());
  const int T = static_cast<int>(dims.size());
  const int64_t B = 11;
  TbeInputSpec spec;
  spec.batch_size = B;
  spec.bag_size = 7;
  spec.variable_bag_size = true;
  spec.num_rows.assign(T, E);
  spec.alpha = seed % 2 ? 1.15 : 0.0;
  spec.weighted = weighted;
  spec.seed = seed;
  TbeInputs in;
  EXPECT_TRUE(generate_tbe_inputs(spec, &in).ok());
  const int64_t N = in.num_indices();
  const int64_t cols = tbe->total_dim();
  std::vector<unsigned char> go(static_cast<size_t>(B * cols) * dtype_size(grad_dtype));
  EXPECT_TRUE(init_uniform_weights(grad_dtype, 1.0f, seed * 3 + 5, 0, B * cols, go.data()).ok());
  std::vector<float> weights(static_cast<size_t>(tbe->num_weights()), 0.0f);

  // Reference: lookups grouped by linearised row (ascending), each group in lookup order.
  std::vector<std::vector<int64_t>> lookups(static_cast<size_t>(tbe->total_rows()));
  std::vector<int> feature_of(N);
  std::vector<int64_t> bag_of(N);
  for (int f = 0; f < T; ++f)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t pos = in.offsets[f * B + b]; pos < in.offsets[f * B + b + 1]; ++pos) {
        lookups[tbe->row_offset(f) + in.indices[pos]].push_back(pos);
        feature_of[pos] = f;
        bag_of[pos] = b;
      }
  std::vector<int64_t> want_rows;
  std::vector<float> want;  // [unique, max_dim]
  const int max_dim = tbe->max_dim();
  int64_t col0[64] = {};
  for (int f = 1; f < T; ++f) col0[f] = col0[f - 1] + dims[f - 1];
  for (int64_t key = 0; key < tbe->total_rows(); ++key) {
    if (lookups[key].empty()) continue;
    want_rows.push_back(key);
    std::vector<float> g(static_cast<size_t>(max_dim), 0.0f);
    const int f = feature_of[lookups[key][0]];
    for (size_t j = 0; j < lookups[key].size(); ++j) {
      const int64_t pos = lookups[key][j];
      const float s = weighted ? in.per_sample_weights[pos] : 1.0f;
      for (int d = 0; d < dims[f]; ++d) {
        const float term = s * decode(go, grad_dtype, bag_of[pos] * cols + col0[f] + d);
        g[d] = j == 0 ? 0.0f + term : g[d] + term;
      }
    }
    want.insert(want.end(), g.begin(), g.end());
  }

  int64_t bad = 0;
  for (CpuIsa isa : {CpuIsa::kX86_64_v2, CpuIsa::kX86_64_v3, CpuIsa::kX86_64_v4}) {
    if (!cpu::set_cpu_isa_for_testing(isa)) continue;
    std::vector<int64_t> rows(static_cast<size_t>(N), -1);
    std::vector<float> grads(static_cast<size_t>(N * max_dim), -1.0f);
    int64_t num_unique = -1;
    TbeBackwardArgs a;
    a.weights = TensorView::vec(weights.data(), DType::kF32, tbe->num_weights());
    a.indices = TensorView::vec(const_cast<void*>(in.indices_data()), in.index_dtype, N);
    a.offsets = TensorView::vec(const_cast<void*>(in.offsets_data()), in.index_dtype,
                                static_cast<int64_t>(in.offsets.size()));
    if (weighted) a.per_sample_weights = TensorView::vec(in.per_sample_weights.data(), DType::kF32, N);
    a.batch_size = B;
    a.grad_output = TensorView::mat(go.data(), grad_dtype, B, cols);
    a.optimizer.type = OptimizerType::kNone;
    a.unique_rows = TensorView::vec(rows.data(), DType::kI64, N);
    a.num_unique = &num_unique;
    a.unique_grads = TensorView::vec(grads.data(), DType::kF32, N * max_dim);
    size_t ws_bytes = 0;
    EXPECT_TRUE(tbe->backward_workspace_size(ctx, a, &ws_bytes).ok());
    std::vector<unsigned char> ws(ws_bytes + 1);
    const Status st = tbe->backward(ctx, a, ws.data(), ws_bytes);
    EXPECT_TRUE(st.ok()) << st.to_string();
    if (!st.ok()) return bad + 1;
    EXPECT_EQ(num_unique, static_cast<int64_t>(want_rows.size()));
    if (num_unique != static_cast<int64_t>(want_rows.size())) return bad + 1;
    for (int64_t u = 0; u < num_unique; ++u) {
      if (rows[u] != want_rows[u] && bad++ < 5)
        ADD_FAILURE() << cpu::cpu_isa_name(isa) << " seed " << seed << ": unique row " << u << " is " << rows[u]
                      << ", want " << want_rows[u];
      for (int d = 0; d < max_dim; ++d) {
        const float got = grads[u * max_dim + d], w = want[u * max_dim + d];
        if (bits_of(got) != bits_of(w) && bad++ < 5)
          ADD_FAILURE() << cpu::cpu_isa_name(isa) << " seed " << seed << ": gradient of unique row " << u
                        << " column " << d << " is " << got << ", want " << w;
      }
    }
  }
  return bad;
}

TEST_F(CpuIsaLevels, BackwardGradientSumsMatchTheOrderedFp32SumAtEveryLevel) {
  const uint64_t kSeed = 2717;
  std::printf("CpuIsaLevels backward: seeds from %" PRIu64 "\n", kSeed);
  uint64_t seed = kSeed;
  int64_t bad = 0;
  for (DType g : {DType::kF32, DType::kF16, DType::kBF16})
    for (bool weighted : {false, true}) bad += check_backward_case({1, 5, 16, 33, 64, 100, 128, 260}, g, weighted, seed++);
  EXPECT_EQ(bad, 0);
}

TEST_F(CpuIsaLevels, BaselineIsAlwaysSupportedAndNamed) {
  EXPECT_TRUE(cpu::cpu_isa_supported(CpuIsa::kX86_64_v2));
  EXPECT_STREQ(cpu::cpu_isa_name(CpuIsa::kX86_64_v2), "x86-64-v2");
  EXPECT_STREQ(cpu::cpu_isa_name(CpuIsa::kX86_64_v4), "x86-64-v4");
  EXPECT_TRUE(cpu::set_cpu_isa_for_testing(CpuIsa::kX86_64_v2));
  EXPECT_EQ(cpu::active_cpu_isa(), CpuIsa::kX86_64_v2);
}

}  // namespace
}  // namespace embscale
