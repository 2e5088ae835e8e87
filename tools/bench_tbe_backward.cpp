// The measuring loop of the backward benchmarks (bench_tbe_backward.h): the table-batched embedding
// backward fused with the optimizer, alone and after the forward, with the forward benchmark's flags
// (tools/tbe_bench_common.h) plus the optimizer and the backward's tuning. Reported as FBGEMM does:
// backward GB/s = 2 * forward bytes / t (training: 3 * forward bytes / t, forward + backward).
//  * Before timing, the summed gradients of a sample of unique rows (dense-gradient mode, optimizer
//    none, on input set 0) are compared with a host sum in double, and the number of unique rows with
//    the host's count, so a fast wrong kernel fails the run.
//  * Optimizer state starts at zero and the weights are updated by every timed call (as in training);
//    input sets rotate when one set would stay in the cache.
//  * --max-warp-segment above the default block limit (TbeBackwardTuning::kDefaultMaxBlockSegment)
//    without --max-block-segment raises the block limit to the same value (every longer segment then
//    goes to the multi-block path), so a warp-only limit can be tried on its own.
//  * Tunings are checked before anything is allocated (non-negative; on CUDA the block paths' thread
//    counts); one the library still refuses (its defaults for the values left at 0 depend on the
//    widest row) is reported as a refusal of the flag that gave it.
//  * A sweep (embscale-dev tbe-backward) times several tunings in turn on the same inputs (building
//    the inputs dominates a run) and the phases of each on their own.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "bench_tbe_backward.h"
#include "bench_util.h"
#include "cli_args.h"
#include "embscale/memory.h"
#include "embscale/tbe.h"
#include "reference_tbe.h"
#include "tbe_bench_common.h"

namespace embscale {
namespace tools {
namespace {

using tbe_bench::InputSet;
using tbe_bench::Plan;
using tbe_bench::fail;

// The CUDA block paths' threads per block: a multiple of the warp size up to their launch bound
// (tbe_bwd::kMaxBlockThreads).
constexpr int kWarpSize = 32;
constexpr int kMaxBlockThreads = 512;

// The layout of an optimizer's momentum1 (first) or momentum2 buffer, from the library's table.
OptimizerStateLayout state_layout(OptimizerType o, bool first) {
  OptimizerInfo info;
  if (!optimizer_info(o, &info).ok()) return OptimizerStateLayout::kAbsent;
  return (first ? info.momentum1 : info.momentum2).layout;
}

// fp32 values of an optimizer's momentum1 (first) or momentum2 buffer for this module.
size_t state_floats(OptimizerType o, bool first, const TableBatchedEmbedding& tbe) {
  switch (state_layout(o, first)) {
    case OptimizerStateLayout::kRowwise: return static_cast<size_t>(tbe.total_rows());
    case OptimizerStateLayout::kElementwise: return static_cast<size_t>(tbe.num_weights());
    default: return 0;
  }
}

// The optimizer state a run keeps, in fp32 values (as state_floats counts them once the module exists).
CheckedSize state_values(OptimizerType o, const Plan& p) {
  CheckedSize dims = 0;
  for (int d : p.dims) dims += static_cast<uint64_t>(d);
  const CheckedSize rows = CheckedSize(static_cast<uint64_t>(p.T)) * static_cast<uint64_t>(p.E);
  const CheckedSize weights = CheckedSize(static_cast<uint64_t>(p.E)) * dims;
  CheckedSize total = 0;
  for (bool first : {true, false}) {
    const OptimizerStateLayout l = state_layout(o, first);
    if (l == OptimizerStateLayout::kRowwise) total += rows;
    if (l == OptimizerStateLayout::kElementwise) total += weights;
  }
  return total;
}

// The flag a tuning the library refused came from ("tuning.block_threads: ..." names the field).
std::string tuning_flag(const BackwardSweep* sweep, const std::string& message) {
  if (sweep != nullptr && !sweep->tunings.empty()) return sweep->tunings_flag;
  if (message.find("block_threads") != std::string::npos) return "--block-threads";
  if (message.find("max_block_segment") != std::string::npos) return "--max-block-segment";
  return "--max-warp-segment";
}

}  // namespace

TbeBackwardTuning bench_tuning(int max_warp, int max_block, int threads) {
  TbeBackwardTuning t;
  t.max_warp_segment = max_warp;
  t.max_block_segment =
      max_block == 0 && max_warp > TbeBackwardTuning::kDefaultMaxBlockSegment ? max_warp : max_block;
  t.block_threads = threads;
  return t;
}

std::string tuning_problem(int max_warp, int max_block, int threads, Backend backend) {
  if (backend != Backend::kCuda) return "";  // the CPU backward takes any non-negative tuning (and ignores it)
  if (threads != 0 && (threads < kWarpSize || threads > kMaxBlockThreads || threads % kWarpSize != 0))
    return "block_threads " + std::to_string(threads) + ": the CUDA backend takes 0 (default) or a multiple of " +
           std::to_string(kWarpSize) + " in " + std::to_string(kWarpSize) + ".." + std::to_string(kMaxBlockThreads);
  if (max_warp != 0 && max_block != 0 && max_block < max_warp)
    return "max_block_segment " + std::to_string(max_block) + " is less than max_warp_segment " + std::to_string(max_warp);
  return "";
}

int run_tbe_backward(const BwdArgs& a, bool train, const BackwardSweep* sweep) {
  Plan p;
  const std::string err = tbe_bench::make_plan(a.common, &p);
  if (!err.empty()) return refuse(err);
  OptimizerType otype;
  if (!parse_optimizer(a.optimizer, &otype))
    return refuse("--optimizer", "'" + a.optimizer + "'; expected sgd, rowwise_adagrad, adam, partial_rowwise_adam, "
                                 "adagrad, lamb, partial_rowwise_lamb, lars_sgd or none");
  if (!(a.learning_rate >= 0.0f) || !std::isfinite(a.learning_rate))
    return refuse("--learning-rate", "expected a finite value >= 0");
  if (a.rounding != "nearest" && a.rounding != "stochastic")
    return refuse("--rounding", "'" + a.rounding + "'; expected nearest or stochastic");
  const WeightRounding rounding = a.rounding == "nearest" ? WeightRounding::kNearest : WeightRounding::kStochastic;
  std::vector<TbeBackwardTuning> tunings;
  if (sweep == nullptr || sweep->tunings.empty()) {
    if (a.max_warp_segment < 0 || a.max_block_segment < 0 || a.block_threads < 0)
      return refuse(a.max_warp_segment < 0 ? "--max-warp-segment" : a.max_block_segment < 0 ? "--max-block-segment" : "--block-threads",
                    "expected an integer >= 0 (0: default)");
    const std::string problem = tuning_problem(a.max_warp_segment, a.max_block_segment, a.block_threads, p.backend);
    if (!problem.empty())
      return refuse(problem.compare(0, 13, "block_threads") == 0 ? "--block-threads" : "--max-block-segment", problem);
    tunings.push_back(bench_tuning(a.max_warp_segment, a.max_block_segment, a.block_threads));
  } else {
    tunings = sweep->tunings;
  }
  const std::string memory =
      tbe_bench::memory_refusal(a.common, p, train ? tbe_bench::Pass::kTrain : tbe_bench::Pass::kBackward,
                                state_values(otype, p));
  if (!memory.empty()) return refuse(memory);
  TbeBackwardTuning tuning = tunings[0];
  const Context ctx = tbe_bench::context_for(p);
  std::unique_ptr<TableBatchedEmbedding> tbe;
  Status st = tbe_bench::create_tbe(ctx, p, &tbe);
  if (!st.ok()) return fail("create", st);
  // Copy ceiling first, while memory is quiet (the byte floor, as the forward bench reports it).
  const size_t cache = last_level_cache_bytes(p.backend);
  double copy_gbps = 0;
  st = tbe_bench::copy_ceiling(ctx, p.backend, &copy_gbps);
  if (!st.ok()) return fail("copy bandwidth", st);

  const uint64_t w_seed = p.seed * 7 + 1, g_seed = p.seed * 7 + 3;
  Buffer weights(p.backend, static_cast<size_t>(tbe->num_weights()) * dtype_size(p.w_dtype));
  if (!weights.valid()) return fail("weights", Status(StatusCode::kBackendError, "allocation failed"));
  st = tbe_bench::init_values(ctx, p.w_dtype, tbe->num_weights(), 1.0f, w_seed, weights.data());
  if (!st.ok()) return fail("weights", st);

  std::vector<InputSet> sets;
  double fwd_bytes = 0;
  st = tbe_bench::make_input_sets(ctx, p, *tbe, cache, &sets, &fwd_bytes);
  if (!st.ok()) return fail("inputs", st);
  const bool sequence = p.pooling == PoolingMode::kNone;
  int64_t max_n = 0;
  for (const auto& s : sets) max_n = std::max(max_n, s.host.num_indices());
  const int64_t go_rows = sequence ? max_n : p.B;
  const int64_t go_cols = sequence ? p.D : tbe->total_dim();
  Buffer grad_out(p.backend, static_cast<size_t>(go_rows * go_cols) * dtype_size(p.out_dtype));
  Buffer fwd_out(p.backend, train ? static_cast<size_t>(go_rows * go_cols) * dtype_size(p.out_dtype) : 0);
  if (!grad_out.valid() || !fwd_out.valid()) return fail("grad_output", Status(StatusCode::kBackendError, "allocation failed"));
  st = tbe_bench::init_values(ctx, p.out_dtype, go_rows * go_cols, 0.5f, g_seed, grad_out.data());
  if (!st.ok()) return fail("grad_output", st);

  Buffer m1(p.backend, state_floats(otype, true, *tbe) * 4), m2(p.backend, state_floats(otype, false, *tbe) * 4);
  Buffer dense_rows(p.backend, static_cast<size_t>(max_n) * 8), dense_count(p.backend, 8);
  Buffer dense_grads(p.backend, static_cast<size_t>(max_n) * tbe->max_dim() * 4);
  if (!m1.valid() || !m2.valid() || !dense_rows.valid() || !dense_count.valid() || !dense_grads.valid())
    return fail("state", Status(StatusCode::kBackendError, "allocation failed"));

  auto make_args = [&](size_t s, OptimizerType o) {
    const InputSet& in = sets[s];
    TbeBackwardArgs b;
    b.weights = TensorView::vec(weights.data(), p.w_dtype, tbe->num_weights());
    b.indices = TensorView::vec(in.idx->data(), p.idx_dtype, in.host.num_indices());
    b.offsets = TensorView::vec(in.off->data(), p.idx_dtype, static_cast<int64_t>(in.host.offsets.size()));
    if (p.weighted) b.per_sample_weights = TensorView::vec(in.psw->data(), DType::kF32, in.host.num_indices());
    b.batch_size = p.B;
    b.pooling = p.pooling;
    b.bounds_check = p.bounds;
    b.grad_output = sequence ? TensorView::mat(grad_out.data(), p.out_dtype, in.host.num_indices(), p.D)
                             : TensorView::mat(grad_out.data(), p.out_dtype, p.B, tbe->total_dim());
    b.optimizer.type = o;
    b.optimizer.learning_rate = a.learning_rate;
    b.rounding = rounding;
    if (o == OptimizerType::kRowwiseAdagrad) b.optimizer.eps = 0.1f;  // FBGEMM's benchmark default
    const int64_t n1 = static_cast<int64_t>(state_floats(o, true, *tbe)), n2 = static_cast<int64_t>(state_floats(o, false, *tbe));
    if (n1 > 0) b.momentum1 = TensorView::vec(m1.data(), DType::kF32, n1);
    if (n2 > 0) b.momentum2 = TensorView::vec(m2.data(), DType::kF32, n2);
    if (o == OptimizerType::kNone) {
      const int64_t n = in.host.num_indices();
      b.unique_rows = TensorView::vec(dense_rows.data(), DType::kI64, n);
      b.num_unique = dense_count.as<int64_t>();
      b.unique_grads = TensorView::vec(dense_grads.data(), DType::kF32, n * tbe->max_dim());
    }
    b.tuning = tuning;
    return b;
  };

  size_t ws_bytes = 0;
  for (const TbeBackwardTuning& tu : tunings) {
    tuning = tu;
    for (size_t s = 0; s < sets.size(); ++s) {
      for (OptimizerType o : {otype, OptimizerType::kNone}) {
        size_t b = 0;
        st = tbe->backward_workspace_size(ctx, make_args(s, o), &b);
        if (st.code() == StatusCode::kInvalidArgument && st.message().compare(0, 7, "tuning.") == 0)
          return refuse(tuning_flag(sweep, st.message()), st.message());
        if (!st.ok()) return fail("workspace size", st);
        ws_bytes = std::max(ws_bytes, b);
      }
    }
  }
  tuning = tunings[0];
  Buffer ws(p.backend, ws_bytes);
  if (!ws.valid()) return fail("workspace", Status(StatusCode::kBackendError, "cannot allocate " + std::to_string(ws_bytes) + " bytes"));

  // Spot check: dense gradients of set 0 against a host sum over a sample of unique rows.
  const int64_t host_unique = tbe_bench::unique_rows_of(p, sets[0].host);
  {
    st = tbe->backward(ctx, make_args(0, OptimizerType::kNone), ws.data(), ws_bytes);
    if (st.ok()) st = synchronize(ctx);
    if (!st.ok()) return fail("backward (dense check)", st);
    int64_t U = 0;
    st = copy_to_host(ctx, &U, dense_count.data(), 8);
    if (!st.ok()) return fail("download", st);
    if (U != host_unique) {
      std::fprintf(stderr, "error: %lld unique rows; expected %lld\n", static_cast<long long>(U),
                   static_cast<long long>(host_unique));
      return 1;
    }
    const TbeInputs& in = sets[0].host;
    std::vector<int64_t> rows(static_cast<size_t>(U));
    st = copy_to_host(ctx, rows.data(), dense_rows.data(), rows.size() * 8);
    if (!st.ok()) return fail("download", st);
    std::vector<unsigned char> go(static_cast<size_t>(go_rows * go_cols) * dtype_size(p.out_dtype));
    st = copy_to_host(ctx, go.data(), grad_out.data(), go.size());
    if (!st.ok()) return fail("download", st);
    const int md = tbe->max_dim();
    std::unordered_map<int64_t, int64_t> sample;  // key -> sample slot
    const int64_t step = std::max<int64_t>(1, U / 64);
    for (int64_t u = 0; u < U; u += step) sample.emplace(rows[u], static_cast<int64_t>(sample.size()));
    std::vector<double> want(sample.size() * md, 0.0), mag(sample.size() * md, 0.0);
    std::vector<int64_t> terms(sample.size(), 0);
    for (int f = 0; f < p.T; ++f) {
      for (int64_t b = 0; b < p.B; ++b) {
        const int64_t s0 = in.offsets[f * p.B + b], s1 = in.offsets[f * p.B + b + 1];
        for (int64_t i = s0; i < s1; ++i) {
          auto it = sample.find(tbe->row_offset(f) + in.indices[i]);
          if (it == sample.end()) continue;
          const double scale = p.pooling == PoolingMode::kMean ? 1.0 / static_cast<double>(s1 - s0)
                               : p.weighted                    ? in.per_sample_weights[i]
                                                               : 1.0;
          const int64_t row = sequence ? i : b, col0 = sequence ? 0 : tbe->output_offset(f);
          ++terms[it->second];
          for (int d = 0; d < p.dims[f]; ++d) {
            const double v = scale * ref::decode(go.data(), p.out_dtype, row * go_cols + col0 + d);
            want[it->second * md + d] += v;
            mag[it->second * md + d] += std::fabs(v);
          }
        }
      }
    }
    bool nonzero = false;
    for (int64_t u = 0; u < U; u += step) {
      const int64_t slot = sample.at(rows[u]);
      std::vector<float> got(md);
      st = copy_to_host(ctx, got.data(), dense_grads.as<float>() + u * md, md * 4);
      if (!st.ok()) return fail("download", st);
      for (int d = 0; d < md; ++d) {
        const double w = want[slot * md + d];
        const double tol = 1e-6 * (1.0 + static_cast<double>(terms[slot])) * mag[slot * md + d] + 1e-30;
        nonzero |= got[d] != 0.0f;
        if (!(std::fabs(got[d] - w) <= tol)) {
          std::fprintf(stderr, "error: dense gradient of row %lld, column %d is %.9g; expected %.9g\n",
                       static_cast<long long>(rows[u]), d, got[d], w);
          return 1;
        }
      }
    }
    if (U > 0 && !nonzero) {
      std::fprintf(stderr, "error: the sampled gradients are all zero\n");
      return 1;
    }
  }

  int rc = 0;
  for (const TbeBackwardTuning& tu : tunings) {
    tuning = tu;
    // Timed: the optimizer step (and the forward first when training), state from zero.
    if (m1.bytes() > 0 && !(st = fill_bytes(ctx, m1.data(), 0, m1.bytes())).ok()) return fail("state", st);
    if (m2.bytes() > 0 && !(st = fill_bytes(ctx, m2.data(), 0, m2.bytes())).ok()) return fail("state", st);
    TimingConfig tc;
    tc.warmup = p.warmup;
    tc.repeats = p.iters;
    Timing t;
    st = time_op(ctx, tc,
                 [&](int call) {
                   const size_t s = static_cast<size_t>(call) % sets.size();
                   if (train) {
                     TbeForwardArgs f;
                     const InputSet& in = sets[s];
                     f.weights = TensorView::vec(weights.data(), p.w_dtype, tbe->num_weights());
                     f.indices = TensorView::vec(in.idx->data(), p.idx_dtype, in.host.num_indices());
                     f.offsets = TensorView::vec(in.off->data(), p.idx_dtype, static_cast<int64_t>(in.host.offsets.size()));
                     if (p.weighted) f.per_sample_weights = TensorView::vec(in.psw->data(), DType::kF32, in.host.num_indices());
                     f.batch_size = p.B;
                     f.pooling = p.pooling;
                     f.bounds_check = p.bounds;
                     f.output = sequence ? TensorView::mat(fwd_out.data(), p.out_dtype, in.host.num_indices(), p.D)
                                         : TensorView::mat(fwd_out.data(), p.out_dtype, p.B, tbe->total_dim());
                     EMBSCALE_RETURN_IF_ERROR(tbe->forward(ctx, f));
                   }
                   return tbe->backward(ctx, make_args(s, otype), ws.data(), ws_bytes);
                 },
                 &t);
    if (!st.ok()) return fail(train ? "train step" : "backward", st);

    nlohmann::json rec = base_record(p.backend, p.threads);
    const std::string op = std::string(train ? "tbe_train_" : "tbe_backward_") + optimizer_name(otype);
    rec["op"] = op;
    rec["impl"] = "embscale";
    tbe_bench::config_fields(p, &rec);
    rec["optimizer"] = optimizer_name(otype);
    rec["learning_rate"] = a.learning_rate;
    rec["rounding"] = a.rounding;
    rec["max_warp_segment"] = tuning.max_warp_segment;
    rec["max_block_segment"] = tuning.max_block_segment;
    rec["block_threads"] = tuning.block_threads;
    rec["num_lookups"] = sets[0].host.num_indices();
    rec["unique_rows"] = host_unique;
    rec["input_sets"] = sets.size();
    rec["workspace_bytes"] = ws_bytes;
    const double factor = train ? 3.0 : 2.0;  // forward bytes once, backward twice
    rec["bytes"] = factor * fwd_bytes;
    rec["median_us"] = t.median_us;
    rec["min_us"] = t.min_us;
    const double gbps = factor * fwd_bytes / (t.median_us * 1e-6) / 1e9;
    rec["GBps"] = gbps;
    const tbe_bench::Floor floor = tbe_bench::byte_floor(factor * fwd_bytes, copy_gbps, t.median_us);
    tbe_bench::floor_fields(copy_gbps, floor, &rec);

    std::string phase_note;
    if (!train && sweep != nullptr && sweep->phases) {
      // Phases on their own, on set 0, after one full call left its state in the workspace.
      st = tbe->backward(ctx, make_args(0, otype), ws.data(), ws_bytes);
      if (!st.ok()) return fail("backward", st);
      PhaseTimes times;
      st = sweep->phases(ctx, *tbe, make_args(0, otype), ws.data(), ws_bytes, tc, &times);
      if (!st.ok()) return fail("phases", st);
      nlohmann::json phases;
      for (const auto& [name, us] : times) {
        phases[name + "_us"] = us;
        char buf[64];
        std::snprintf(buf, sizeof buf, "%s%s %.1f", phase_note.empty() ? " [" : ", ", name.c_str(), us);
        phase_note += buf;
      }
      phase_note += " us]";
      rec["phases"] = phases;
    }
    char tune_note[112] = "";
    if (tuning.max_warp_segment != 0 || tuning.max_block_segment != 0 || tuning.block_threads != 0)
      std::snprintf(tune_note, sizeof tune_note, " warp<=%d block<=%d threads=%d", tuning.max_warp_segment,
                    tuning.max_block_segment, tuning.block_threads);
    if (rounding == WeightRounding::kNearest && p.w_dtype != DType::kF32)
      std::strncat(tune_note, " nearest", sizeof tune_note - std::strlen(tune_note) - 1);
    char line[768];
    std::snprintf(line, sizeof line,
                  "%s %s T=%d B=%lld D=%s L=%d%s E=%lld alpha=%g %s grad=%s idx=%s %s%s bounds=%s lr=%g%s: %.1f us, "
                  "%.1f GB/s, %.0f%% of the byte floor (%.1f us at copy %.1f GB/s), %lld lookups, %lld unique rows%s",
                  op.c_str(), backend_name(p.backend), p.T, static_cast<long long>(p.B),
                  p.mixed ? "mixed" : std::to_string(p.D).c_str(), p.L, p.variable ? "(var)" : "",
                  static_cast<long long>(p.E), p.alpha, dtype_name(p.w_dtype), dtype_name(p.out_dtype),
                  dtype_name(p.idx_dtype), pooling_mode_name(p.pooling), p.weighted ? " weighted" : "",
                  bounds_check_mode_name(p.bounds), a.learning_rate, tune_note, t.median_us, gbps, floor.pct,
                  floor.us, copy_gbps, static_cast<long long>(sets[0].host.num_indices()), static_cast<long long>(host_unique),
                  phase_note.c_str());
    emit(rec, p.json, line);
  }
  return rc;
}

void add_backward_options(CLI::App* sub, BwdArgs* a) {
  tbe_bench::add_options(sub, &a->common);
  sub->add_option("--optimizer", a->optimizer,
                  "sgd, rowwise_adagrad, adam, partial_rowwise_adam, adagrad, lamb, partial_rowwise_lamb, lars_sgd or "
                  "none")
      ->capture_default_str();
  add_integer_option(sub, "--max-warp-segment", &a->max_warp_segment, 0, INT_MAX,
                     "segments up to this many lookups: a warp per row (0: default)");
  add_integer_option(sub, "--max-block-segment", &a->max_block_segment, 0, INT_MAX,
                     "segments up to this: a block per row; longer: split across blocks (0: default)");
  add_integer_option(sub, "--block-threads", &a->block_threads, 0, INT_MAX,
                     "threads per block of the block paths (0: default; cuda: a multiple of 32 up to 512)");
  add_real_option(sub, "--learning-rate", &a->learning_rate, 0.0f, FLT_MAX, "learning rate (finite, >= 0)")
      ->default_str("0.1");
  sub->add_option("--rounding", a->rounding, "fp16/bf16 weights after an update: stochastic or nearest")
      ->capture_default_str();
}

}  // namespace tools
}  // namespace embscale
