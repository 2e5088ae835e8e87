// One TBE forward test case end to end, shared by the GoogleTest suite and `embscale check`: build the
// TableBatchedEmbedding, generate seeded inputs, upload them, poison the output (all-ones bytes, a NaN
// in every float format, so an element the backend forgets to write fails), run forward on the chosen
// backend and compare with the naive reference (reference_tbe.h).
//
// Two kinds of data: real-valued weights uniform in [-1, 1], compared within the fp32 accumulation
// bound of reference_tbe.h; and small-integer weights and per-sample weights, whose fp32 sums are
// exact, compared bit for bit against the reference rounded to the output dtype (not for MEAN, whose
// division is rounded).
#pragma once

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/numerics.h"
#include "embscale/memory.h"
#include "embscale/tbe.h"
#include "embscale/tbe_generator.h"
#include "reference_tbe.h"

namespace embscale {
namespace testing_tbe {

struct TbeCase {
  std::vector<int64_t> num_rows;  // [num_tables]
  std::vector<int> dims;          // [num_tables]
  std::vector<int> feature_table; // [T]; empty = one feature per table
  int64_t batch_size = 1;
  int bag_size = 1;
  bool variable_bag_size = false;
  double alpha = 0.0;
  DType weights_dtype = DType::kF32;
  DType output_dtype = DType::kF32;
  DType index_dtype = DType::kI64;
  PoolingMode pooling = PoolingMode::kSum;
  bool weighted = false;
  BoundsCheckMode bounds = BoundsCheckMode::kError;
  bool integer_values = false;
  uint64_t seed = 1;

  std::vector<int> features() const {
    if (!feature_table.empty()) return feature_table;
    std::vector<int> f(num_rows.size());
    for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<int>(i);
    return f;
  }

  std::string describe() const {
    std::string d;
    const auto ft = features();
    for (size_t f = 0; f < ft.size() && f < 6; ++f) d += (f ? "," : "") + std::to_string(dims[ft[f]]);
    if (ft.size() > 6) d += ",...";
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "seed=%" PRIu64 " T=%zu tables=%zu D=[%s] B=%" PRId64 " L=%d%s alpha=%g w=%s out=%s idx=%s pool=%s%s "
                  "bounds=%s%s",
                  seed, ft.size(), num_rows.size(), d.c_str(), batch_size, bag_size, variable_bag_size ? "(var)" : "",
                  alpha, dtype_name(weights_dtype), dtype_name(output_dtype), dtype_name(index_dtype),
                  pooling_mode_name(pooling), weighted ? " weighted" : "", bounds_check_mode_name(bounds),
                  integer_values ? " integer" : "");
    return buf;
  }
};

// Host weights of the whole buffer in `dtype`, as bytes.
inline std::vector<unsigned char> make_weights(const TbeCase& c, int64_t n, uint64_t seed) {
  std::vector<unsigned char> w(static_cast<size_t>(n) * dtype_size(c.weights_dtype));
  if (!c.integer_values) {
    (void)init_uniform_weights(c.weights_dtype, 1.0f, seed, 0, n, w.data());
    return w;
  }
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(static_cast<int>(rng() % 17) - 8);  // integers in [-8, 8]
    if (c.weights_dtype == DType::kF32) {
      std::memcpy(w.data() + 4 * i, &v, 4);
    } else {
      const uint16_t bits = c.weights_dtype == DType::kF16 ? float_to_fp16(v) : float_to_bf16(v);
      std::memcpy(w.data() + 2 * i, &bits, 2);
    }
  }
  return w;
}

struct CaseOutcome {
  std::string failure;     // empty when the case passed
  int64_t compared = 0;    // output elements compared
  bool reference_nonzero = false;
};

inline CaseOutcome fail(const TbeCase& c, const std::string& what) {
  CaseOutcome o;
  o.failure = c.describe() + ": " + what;
  return o;
}

// The forward call a case runs: TableBatchedEmbedding::forward, or another launch of it (dev/).
using ForwardCall = std::function<Status(const Context&, const TableBatchedEmbedding&, const TbeForwardArgs&)>;

// Runs one case on `backend` through `forward` (null: tbe.forward). Inputs are generated valid (bounds
// modes must then all agree).
inline CaseOutcome run_tbe_case(Backend backend, const TbeCase& c, const ForwardCall& forward = nullptr) {
  const Context ctx = backend == Backend::kCuda ? Context::cuda() : Context::cpu();
  TbeConfig cfg;
  for (size_t t = 0; t < c.num_rows.size(); ++t) cfg.tables.push_back(TableSpec{c.num_rows[t], c.dims[t]});
  cfg.feature_table_map = c.feature_table;
  cfg.weights_dtype = c.weights_dtype;
  std::unique_ptr<TableBatchedEmbedding> tbe;
  Status st = TableBatchedEmbedding::create(ctx, cfg, &tbe);
  if (!st.ok()) return fail(c, "create: " + st.to_string());
  const std::vector<int> ft = c.features();
  const int T = static_cast<int>(ft.size());

  TbeInputSpec spec;
  spec.batch_size = c.batch_size;
  spec.bag_size = c.bag_size;
  spec.variable_bag_size = c.variable_bag_size;
  for (int f = 0; f < T; ++f) spec.num_rows.push_back(c.num_rows[ft[f]]);
  spec.alpha = c.alpha;
  spec.index_dtype = c.index_dtype;
  spec.weighted = c.weighted;
  spec.seed = c.seed;
  TbeInputs in;
  st = generate_tbe_inputs(spec, &in);
  if (!st.ok()) return fail(c, "generate: " + st.to_string());
  if (c.integer_values && c.weighted) {
    // Per-sample weights from {-2, -1, 0.5, 1, 3}: every product and sum stays exact in fp32.
    static const float kVals[] = {-2.0f, -1.0f, 0.5f, 1.0f, 3.0f};
    std::mt19937_64 rng(c.seed ^ 0x77);
    for (auto& w : in.per_sample_weights) w = kVals[rng() % 5];
  }
  const int64_t N = in.num_indices();
  const std::vector<unsigned char> weights = make_weights(c, tbe->num_weights(), c.seed * 31 + 7);

  const bool sequence = c.pooling == PoolingMode::kNone;
  const int64_t out_rows = sequence ? N : c.batch_size;
  const int64_t out_cols = sequence ? (T > 0 ? tbe->feature_dim(0) : 0) : tbe->total_dim();
  const size_t out_bytes = static_cast<size_t>(out_rows * out_cols) * dtype_size(c.output_dtype);

  Buffer d_w(backend, weights.size()), d_idx(backend, in.indices_bytes()), d_off(backend, in.offsets_bytes()),
      d_psw(backend, in.per_sample_weights.size() * sizeof(float)), d_out(backend, out_bytes);
  if (!d_w.valid() || !d_idx.valid() || !d_off.valid() || !d_psw.valid() || !d_out.valid())
    return fail(c, "allocation failed");
  if (!(st = copy_to_backend(ctx, d_w.data(), weights.data(), weights.size())).ok() ||
      !(st = copy_to_backend(ctx, d_idx.data(), in.indices_data(), in.indices_bytes())).ok() ||
      !(st = copy_to_backend(ctx, d_off.data(), in.offsets_data(), in.offsets_bytes())).ok() ||
      !(st = copy_to_backend(ctx, d_psw.data(), in.per_sample_weights.data(), in.per_sample_weights.size() * 4)).ok() ||
      !(st = fill_bytes(ctx, d_out.data(), 0xff, out_bytes)).ok())
    return fail(c, "upload: " + st.to_string());

  TbeForwardArgs args;
  args.weights = TensorView::vec(d_w.data(), c.weights_dtype, tbe->num_weights());
  args.indices = TensorView::vec(d_idx.data(), c.index_dtype, N);
  args.offsets = TensorView::vec(d_off.data(), c.index_dtype, static_cast<int64_t>(in.offsets.size()));
  if (c.weighted) args.per_sample_weights = TensorView::vec(d_psw.data(), DType::kF32, N);
  args.batch_size = c.batch_size;
  args.pooling = c.pooling;
  args.bounds_check = c.bounds;
  args.output = TensorView::mat(d_out.data(), c.output_dtype, out_rows, out_cols);
  st = forward ? forward(ctx, *tbe, args) : tbe->forward(ctx, args);
  if (st.ok()) st = synchronize(ctx);
  if (!st.ok()) return fail(c, "forward: " + st.to_string());
  std::vector<unsigned char> got(out_bytes);
  if (!(st = copy_to_host(ctx, got.data(), d_out.data(), out_bytes)).ok()) return fail(c, "download: " + st.to_string());

  ref::Config rc;
  rc.num_rows = c.num_rows;
  rc.dims = c.dims;
  rc.feature_table = ft;
  rc.weights_dtype = c.weights_dtype;
  const ref::Result r = ref::tbe_forward(rc, weights.data(), in.indices, in.offsets,
                                         c.weighted ? in.per_sample_weights.data() : nullptr, c.batch_size, c.pooling,
                                         c.bounds);
  if (!r.ok) return fail(c, "the reference rejected generated inputs");

  CaseOutcome o;
  const bool exact = c.integer_values && c.pooling != PoolingMode::kMean;
  for (size_t i = 0; i < r.out.size(); ++i) {
    const double g = ref::decode(got.data(), c.output_dtype, static_cast<int64_t>(i));
    const double want = r.out[i];
    if (want != 0) o.reference_nonzero = true;
    bool good;
    double tol = 0;
    if (exact) {
      good = g == ref::round_to_dtype(want, c.output_dtype);
    } else {
      tol = ref::tolerance(want, r.abs_sum[i], r.terms[i], c.output_dtype);
      good = std::fabs(g - want) <= tol;  // false for NaN (poison left in place)
    }
    if (!good) {
      const int64_t row = out_cols ? static_cast<int64_t>(i) / out_cols : 0;
      const int64_t col = out_cols ? static_cast<int64_t>(i) % out_cols : 0;
      char buf[256];
      std::snprintf(buf, sizeof buf, "output[%" PRId64 ", %" PRId64 "] = %.9g, reference %.9g (%s, tolerance %.3g)", row,
                    col, g, want, exact ? "exact" : "bound", tol);
      o.failure = c.describe() + ": " + buf;
      return o;
    }
  }
  o.compared = static_cast<int64_t>(r.out.size());
  return o;
}

// A random valid case; `budget` bounds T*B*L*max D so the reference stays fast.
inline TbeCase random_case(uint64_t seed, int64_t budget = 3000000) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(n)); };
  static const int kDims[] = {1, 2, 3, 4, 5, 7, 8, 16, 31, 64, 127, 128, 160, 192, 256, 320, 1000, 2048};
  constexpr int kNumDims = sizeof(kDims) / sizeof(kDims[0]);
  static const DType kFloat[] = {DType::kF32, DType::kF16, DType::kBF16};
  static const PoolingMode kPool[] = {PoolingMode::kSum, PoolingMode::kMean, PoolingMode::kNone};
  static const BoundsCheckMode kBounds[] = {BoundsCheckMode::kError, BoundsCheckMode::kSkip, BoundsCheckMode::kOff,
                                            BoundsCheckMode::kWarn};

  TbeCase c;
  c.seed = seed;
  c.pooling = kPool[pick(3)];
  const int T = pick(4) == 0 ? static_cast<int>(1 + pick(40)) : static_cast<int>(1 + pick(8));
  const bool shared = pick(3) == 0;
  const int num_tables = shared ? static_cast<int>(1 + pick(T)) : T;
  const int seq_dim = kDims[pick(kNumDims)];
  for (int t = 0; t < num_tables; ++t) {
    c.num_rows.push_back(pick(5) == 0 ? 1 + pick(4) : 1 + pick(3000));  // tiny tables force duplicates
    int d = pick(3) == 0 ? kDims[pick(kNumDims)] : static_cast<int>(1 + pick(70));
    if (c.pooling == PoolingMode::kNone) d = seq_dim;
    c.dims.push_back(d);
  }
  if (shared)
    for (int f = 0; f < T; ++f) c.feature_table.push_back(f < num_tables ? f : static_cast<int>(pick(num_tables)));
  const int64_t b_kind = pick(8);
  c.batch_size = b_kind == 0 ? 0 : b_kind == 1 ? 1 : 1 + pick(64);
  const int64_t l_kind = pick(8);
  c.bag_size = l_kind == 0 ? 0 : l_kind == 1 ? 1 : static_cast<int>(1 + pick(30));
  c.variable_bag_size = pick(2) == 0;
  c.alpha = pick(3) == 0 ? 1.15 : 0.0;
  c.weights_dtype = kFloat[pick(3)];
  c.output_dtype = kFloat[pick(3)];
  c.index_dtype = pick(2) ? DType::kI32 : DType::kI64;
  c.weighted = c.pooling != PoolingMode::kMean && pick(2) == 0;
  c.bounds = kBounds[pick(4)];
  c.integer_values = pick(4) == 0;
  int max_dim = 1;
  for (int d : c.dims) max_dim = std::max(max_dim, d);
  const int64_t lmax = std::max<int64_t>(1, c.variable_bag_size ? 2 * c.bag_size : c.bag_size);
  while (c.batch_size > 1 && static_cast<int64_t>(T) * c.batch_size * lmax * max_dim > budget) c.batch_size /= 2;
  return c;
}

}  // namespace testing_tbe
}  // namespace embscale
