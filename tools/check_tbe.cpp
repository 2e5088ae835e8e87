// `embscale check tbe_forward`: the TBE forward on the chosen backend against the naive reference
// (tests/reference_tbe.h) over seeded random configurations (mixed D, shared tables, both index
// dtypes, every pooling mode, weighted and not, every weights/output dtype, every bounds mode), plus a
// sweep over all dtype combinations with exact small-integer data and one out-of-range index per
// bounds mode.
#include <cstdio>
#include <string>

#include "registry.h"
#include "tbe_case.h"

namespace embscale {
namespace tools {
namespace {

using testing_tbe::CaseOutcome;
using testing_tbe::TbeCase;

// One bad index in bag (1, 2) of a small problem: kError must name it, kSkip must count it.
std::string check_bounds(Backend backend) {
  const Context ctx = backend == Backend::kCuda ? Context::cuda() : Context::cpu();
  TbeConfig cfg;
  cfg.tables = {TableSpec{20, 5}, TableSpec{9, 3}};
  std::unique_ptr<TableBatchedEmbedding> tbe;
  Status st = TableBatchedEmbedding::create(ctx, cfg, &tbe);
  if (!st.ok()) return "bounds: create: " + st.to_string();
  const std::vector<int32_t> idx = {1, 2, 3, 4, 5, 6, 7, 9, 8};  // 9 is outside table 1 (9 rows)
  const std::vector<int32_t> off = {0, 1, 2, 3, 5, 6, 9};        // T = 2, B = 3
  const std::vector<float> w(static_cast<size_t>(tbe->num_weights()), 1.0f);
  Buffer d_w(backend, w.size() * 4), d_idx(backend, idx.size() * 4), d_off(backend, off.size() * 4),
      d_out(backend, 3 * 8 * 4), d_skip(backend, 8);
  if (!(st = copy_to_backend(ctx, d_w.data(), w.data(), w.size() * 4)).ok() ||
      !(st = copy_to_backend(ctx, d_idx.data(), idx.data(), idx.size() * 4)).ok() ||
      !(st = copy_to_backend(ctx, d_off.data(), off.data(), off.size() * 4)).ok())
    return "bounds: upload: " + st.to_string();
  TbeForwardArgs a;
  a.weights = TensorView::vec(d_w.data(), DType::kF32, tbe->num_weights());
  a.indices = TensorView::vec(d_idx.data(), DType::kI32, 9);
  a.offsets = TensorView::vec(d_off.data(), DType::kI32, 7);
  a.batch_size = 3;
  a.output = TensorView::mat(d_out.data(), DType::kF32, 3, 8);
  a.bounds_check = BoundsCheckMode::kError;
  st = tbe->forward(ctx, a);
  if (st.ok()) st = synchronize(ctx);
  if (st.code() != StatusCode::kOutOfRange || st.message().find("feature 1, bag 2, position 1") == std::string::npos)
    return "bounds: error mode gave \"" + st.to_string() + "\"; expected feature 1, bag 2, position 1";
  a.bounds_check = BoundsCheckMode::kSkip;
  a.num_skipped = d_skip.as<int64_t>();
  st = tbe->forward(ctx, a);
  if (st.ok()) st = synchronize(ctx);
  int64_t skipped = -1;
  if (st.ok()) st = copy_to_host(ctx, &skipped, d_skip.data(), 8);
  if (!st.ok() || skipped != 1) return "bounds: skip mode: " + st.to_string() + ", skipped " + std::to_string(skipped);
  return "";
}

CheckResult run_check(const CheckArgs& args) {
  CheckResult res;
  auto record = [&](const CaseOutcome& o, const TbeCase& c) { record_case(args, o, c, &res); };
  // Random configurations.
  constexpr int kRandom = 60;
  for (int i = 0; i < kRandom; ++i) {
    const TbeCase c = testing_tbe::random_case(args.seed * 1000003ull + static_cast<uint64_t>(i));
    record(testing_tbe::run_tbe_case(args.backend, c), c);
  }
  // Every dtype combination, exact integer data, mixed D.
  int n = 0;
  for (DType w : {DType::kF32, DType::kF16, DType::kBF16})
    for (DType o : {DType::kF32, DType::kF16, DType::kBF16})
      for (PoolingMode pool : {PoolingMode::kSum, PoolingMode::kMean, PoolingMode::kNone}) {
        TbeCase c;
        c.num_rows = {1000, 17, 3};
        c.dims = pool == PoolingMode::kNone ? std::vector<int>{160, 160, 160} : std::vector<int>{1, 160, 127};
        c.feature_table = {0, 1, 2, 0};
        c.batch_size = 33;
        c.bag_size = 12;
        c.variable_bag_size = true;
        c.weights_dtype = w;
        c.output_dtype = o;
        c.index_dtype = (n % 2) ? DType::kI32 : DType::kI64;
        c.pooling = pool;
        c.weighted = pool != PoolingMode::kMean && (n % 3) != 0;
        c.integer_values = true;
        c.seed = args.seed + static_cast<uint64_t>(n++);
        record(testing_tbe::run_tbe_case(args.backend, c), c);
      }
  const std::string bounds = check_bounds(args.backend);
  ++res.cases;
  if (!bounds.empty() && res.passed) {
    res.passed = false;
    res.detail = bounds;
  }
  if (res.passed) res.detail = "random configs, every dtype combination, bounds modes";
  return res;
}

const RegisterCheck kRegister(CheckOp{"tbe_forward", "TBE forward (pooled sum/mean, sequence) vs the naive reference",
                                      run_check});

}  // namespace
}  // namespace tools
}  // namespace embscale
