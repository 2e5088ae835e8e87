// `embscale bench tbe-forward`: times the table-batched embedding forward with FBGEMM's benchmark
// flags and reports it the way FBGEMM does, so figures compare:
//  * forward bytes = out_bytes * B * sum D + w_bytes * sum over lookups of D (= B * sum D * L for fixed
//    bags); sequence mode writes N * D outputs instead of B * sum D; GB/s = bytes / median time;
//  * pct_of_floor: the byte floor (bytes over the copy bandwidth, read + write, measured at the start
//    of the same run) as a share of the median time;
//  * weights are seeded uniform values (never zeros); when one set of lookups touches less than three
//    times the last-level cache, several seeded sets are generated and calls rotate through them;
//  * before timing, a sample of bags is recomputed on the host from the same seeds and compared, so a
//    fast wrong kernel fails the run.
// Defaults: CUDA, the headline configuration of ANCHORS.md (T=32, E=1e6, D=128, B=8192, L=20, fp32);
// CPU, a configuration that runs in seconds on a few cores (T=8, E=1e5, D=128, B=512, L=20).
// --alpha 0 means uniform rows and any alpha > 0 Zipf(alpha) (FBGEMM's script treats alpha <= 1 as
// uniform). --bounds-check defaults to off: the peers do not check, and on CUDA kError synchronises.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "api/tbe_tuning.h"
#include "bench_util.h"
#include "embscale/memory.h"
#include "embscale/tbe.h"
#include "embscale/tbe_generator.h"
#include "reference_tbe.h"
#include "registry.h"

namespace embscale {
namespace tools {
namespace {

// The command line as given; kUnset means "the backend's default".
constexpr int64_t kUnset = INT64_MIN;
struct TbeBenchArgs {
  std::string backend;
  int64_t batch_size = kUnset;
  int64_t num_tables = kUnset;
  int64_t embedding_dim = kUnset;
  bool mixed_dim = false;
  int64_t bag_size = kUnset;
  int64_t num_embeddings = kUnset;
  double alpha = 0.0;
  std::string weights_precision = "fp32";
  std::string output_dtype;  // default: weights precision
  std::string pooling = "sum";
  bool weighted = false;
  std::string indices_dtype = "64";
  int64_t iters = kUnset;
  int64_t warmup = kUnset;
  bool json = false;
  std::string bounds_check = "off";
  bool variable_bag_size = false;
  uint64_t seed = 20261130;
  std::string sweep;  // CUDA: comma-separated forward variants ("all": every compiled one)
};

struct Plan {
  Backend backend = Backend::kCpu;
  int T = 0;
  int64_t B = 0, E = 0;
  int D = 0, L = 0;
  bool mixed = false, variable = false, weighted = false;
  std::vector<int> dims;  // [T]
  double alpha = 0;
  DType w_dtype = DType::kF32, out_dtype = DType::kF32, idx_dtype = DType::kI64;
  PoolingMode pooling = PoolingMode::kSum;
  BoundsCheckMode bounds = BoundsCheckMode::kOff;
  int iters = 0, warmup = 0;
  bool json = false;
  uint64_t seed = 0;
  std::vector<std::string> sweep;  // forward variants to time in turn on the same inputs
};

std::string make_plan(const TbeBenchArgs& a, Plan* p) {
  p->backend = backend_available(Backend::kCuda) ? Backend::kCuda : Backend::kCpu;
  if (!a.backend.empty() && !parse_backend(a.backend, &p->backend))
    return "--backend: unknown backend '" + a.backend + "' (expected cpu or cuda)";
  if (!backend_available(p->backend)) return std::string("--backend: ") + backend_name(p->backend) + " is not available";
  const bool gpu = p->backend == Backend::kCuda;
  auto given = [](int64_t v, int64_t dflt) { return v == kUnset ? dflt : v; };
  const int64_t T = given(a.num_tables, gpu ? 32 : 8);
  p->B = given(a.batch_size, gpu ? 8192 : 512);
  p->E = given(a.num_embeddings, gpu ? 1000000 : 100000);
  const int64_t D = given(a.embedding_dim, 128);
  const int64_t L = given(a.bag_size, 20);
  if (p->B < 0) return "--batch-size: " + std::to_string(p->B) + " is negative";
  if (L < 0) return "--bag-size: " + std::to_string(L) + " is negative";
  if (T < 1) return "--num-tables: " + std::to_string(T) + "; at least one table is needed";
  if (T > 100000) return "--num-tables: " + std::to_string(T) + " is more than this benchmark supports (100000)";
  if (p->E < 1) return "--num-embeddings: " + std::to_string(p->E) + "; a table needs at least one row";
  if (D < 1 || D > 65536) return "--embedding-dim: " + std::to_string(D) + "; expected 1..65536";
  if (L > (int64_t{1} << 20)) return "--bag-size: " + std::to_string(L) + " is too large";
  if (!(a.alpha >= 0) || !std::isfinite(a.alpha)) return "--alpha: expected 0 (uniform) or a finite value > 0";
  if (!parse_dtype(a.weights_precision, &p->w_dtype) || !is_float_dtype(p->w_dtype))
    return "--weights-precision: '" + a.weights_precision + "'; expected fp32, fp16 or bf16";
  p->out_dtype = p->w_dtype;
  if (!a.output_dtype.empty() && (!parse_dtype(a.output_dtype, &p->out_dtype) || !is_float_dtype(p->out_dtype)))
    return "--output-dtype: '" + a.output_dtype + "'; expected fp32, fp16 or bf16";
  if (!parse_dtype(a.indices_dtype, &p->idx_dtype) || !is_index_dtype(p->idx_dtype))
    return "--indices-dtype: '" + a.indices_dtype + "'; expected 32 or 64";
  if (!parse_pooling_mode(a.pooling, &p->pooling)) return "--pooling: '" + a.pooling + "'; expected sum, mean or none";
  if (!parse_bounds_check_mode(a.bounds_check, &p->bounds))
    return "--bounds-check: '" + a.bounds_check + "'; expected error, skip or off";
  if (a.weighted && p->pooling == PoolingMode::kMean) return "--weighted: not supported with --pooling mean";
  if (a.mixed_dim && p->pooling == PoolingMode::kNone) return "--mixed-dim: sequence mode (--pooling none) needs one D";
  const int64_t iters = given(a.iters, gpu ? 50 : 10), warmup = given(a.warmup, gpu ? 10 : 2);
  if (iters < 1 || iters > 1000000) return "--iters: " + std::to_string(iters) + "; expected 1..1000000";
  if (warmup < 0 || warmup > 1000000) return "--warmup: " + std::to_string(warmup) + "; expected 0..1000000";
  p->iters = static_cast<int>(iters);
  p->warmup = static_cast<int>(warmup);
  const int64_t lookups = T * p->B * (a.variable_bag_size ? 2 * L : L);
  if (lookups > (int64_t{1} << 33)) return "the configuration has more than 2^33 lookups";
  if (p->idx_dtype == DType::kI32 && (lookups > INT32_MAX || p->E - 1 > INT32_MAX))
    return "--indices-dtype 32: the lookups or rows do not fit in int32";
  p->T = static_cast<int>(T);
  p->D = static_cast<int>(D);
  p->L = static_cast<int>(L);
  p->mixed = a.mixed_dim;
  p->variable = a.variable_bag_size;
  p->weighted = a.weighted;
  p->alpha = a.alpha;
  p->json = a.json;
  p->seed = a.seed;
  if (!a.sweep.empty()) {
#if EMBSCALE_WITH_CUDA
    if (!gpu) return "--sweep: the forward variants are CUDA kernels; use --backend cuda";
    const std::vector<std::string> all = cuda::tbe_forward_variant_names();
    if (a.sweep == "all") {
      p->sweep = all;
    } else {
      size_t pos = 0;
      while (pos <= a.sweep.size()) {
        const size_t comma = std::min(a.sweep.find(',', pos), a.sweep.size());
        const std::string name = a.sweep.substr(pos, comma - pos);
        if (std::find(all.begin(), all.end(), name) == all.end()) {
          std::string list;
          for (const auto& n : all) list += (list.empty() ? "" : ", ") + n;
          return "--sweep: unknown variant '" + name + "'; expected all or a list of " + list;
        }
        p->sweep.push_back(name);
        pos = comma + 1;
      }
    }
#else
    return "--sweep: this build has no CUDA backend";
#endif
  }
  // Mixed dimensions as FBGEMM's benchmark draws them: uniform in [D/2, 3D/2], rounded up to a
  // multiple of 4 (so mixed-D figures compare with FBGEMM's); --embedding-dim itself may be any D >= 1.
  p->dims.assign(T, p->D);
  if (p->mixed) {
    uint64_t s = a.seed ^ 0x2545f4914f6cdd1dull;
    for (auto& d : p->dims) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      const int64_t lo = std::max<int64_t>(1, D / 2), hi = std::max<int64_t>(lo, D + D / 2);
      d = static_cast<int>(lo + static_cast<int64_t>((s >> 33) % static_cast<uint64_t>(hi - lo + 1)));
      if (D >= 4) d = (d + 3) / 4 * 4;
    }
  }
  return "";
}

// Fills the backend weights in chunks from the counter-based initialiser (host staging on CUDA).
Status init_weights(const Context& ctx, DType dtype, int64_t n, uint64_t seed, void* dst) {
  const size_t es = dtype_size(dtype);
  if (ctx.backend == Backend::kCpu) return init_uniform_weights(dtype, 1.0f, seed, 0, n, dst);
  const int64_t chunk = int64_t{1} << 24;
  std::vector<unsigned char> host(static_cast<size_t>(std::min(n, chunk)) * es);
  for (int64_t first = 0; first < n; first += chunk) {
    const int64_t count = std::min(chunk, n - first);
    EMBSCALE_RETURN_IF_ERROR(init_uniform_weights(dtype, 1.0f, seed, first, count, host.data()));
    EMBSCALE_RETURN_IF_ERROR(copy_to_backend(ctx, static_cast<unsigned char*>(dst) + first * es, host.data(), count * es));
  }
  return Status::Ok();
}

struct InputSet {
  TbeInputs host;
  std::unique_ptr<Buffer> idx, off, psw;
};

int run_plan(const Plan& p) {
  const Context ctx = p.backend == Backend::kCuda ? Context::cuda() : Context::cpu();
  auto fail = [](const std::string& what, const Status& st) {
    std::fprintf(stderr, "error: %s: %s\n", what.c_str(), st.to_string().c_str());
    return 1;
  };
  TbeConfig cfg;
  for (int t = 0; t < p.T; ++t) cfg.tables.push_back(TableSpec{p.E, p.dims[t]});
  cfg.weights_dtype = p.w_dtype;
  std::unique_ptr<TableBatchedEmbedding> tbe;
  Status st = TableBatchedEmbedding::create(ctx, cfg, &tbe);
  if (!st.ok()) return fail("create", st);

  // Copy ceiling first, while memory is quiet.
  const size_t cache = last_level_cache_bytes(p.backend);
  double copy_gbps = 0;
  st = copy_bandwidth_gbps(ctx, std::max<size_t>(4 * cache, size_t{256} << 20), &copy_gbps);
  if (!st.ok()) return fail("copy bandwidth", st);

  const uint64_t w_seed = p.seed * 7 + 1;
  Buffer weights(p.backend, static_cast<size_t>(tbe->num_weights()) * dtype_size(p.w_dtype));
  if (!weights.valid())
    return fail("weights", Status(StatusCode::kBackendError, "cannot allocate " +
                                                                 std::to_string(tbe->num_weights() * dtype_size(p.w_dtype)) + " bytes"));
  st = init_weights(ctx, p.w_dtype, tbe->num_weights(), w_seed, weights.data());
  if (!st.ok()) return fail("weights", st);

  // Lookups: one set, or more when one set would stay in the cache.
  TbeInputSpec spec;
  spec.batch_size = p.B;
  spec.bag_size = p.L;
  spec.variable_bag_size = p.variable;
  spec.num_rows.assign(p.T, p.E);
  spec.alpha = p.alpha;
  spec.index_dtype = p.idx_dtype;
  spec.weighted = p.weighted;
  const bool sequence = p.pooling == PoolingMode::kNone;
  std::vector<InputSet> sets;
  double bytes = 0;
  int64_t N0 = 0;
  for (int s = 0; s < 16; ++s) {
    InputSet in;
    spec.seed = p.seed + 1000003ull * static_cast<uint64_t>(s);
    st = generate_tbe_inputs(spec, &in.host);
    if (!st.ok()) return fail("inputs", st);
    in.idx.reset(new Buffer(p.backend, in.host.indices_bytes()));
    in.off.reset(new Buffer(p.backend, in.host.offsets_bytes()));
    in.psw.reset(new Buffer(p.backend, in.host.per_sample_weights.size() * 4));
    if (!in.idx->valid() || !in.off->valid() || !in.psw->valid())
      return fail("inputs", Status(StatusCode::kBackendError, "allocation failed"));
    if (!(st = copy_to_backend(ctx, in.idx->data(), in.host.indices_data(), in.host.indices_bytes())).ok() ||
        !(st = copy_to_backend(ctx, in.off->data(), in.host.offsets_data(), in.host.offsets_bytes())).ok() ||
        !(st = copy_to_backend(ctx, in.psw->data(), in.host.per_sample_weights.data(), in.host.per_sample_weights.size() * 4)).ok())
      return fail("inputs", st);
    if (s == 0) {
      N0 = in.host.num_indices();
      double row_elems = 0;  // sum over lookups of D
      for (int f = 0; f < p.T; ++f)
        row_elems += static_cast<double>(in.host.offsets[(f + 1) * p.B] - in.host.offsets[f * p.B]) * p.dims[f];
      const double out_elems = sequence ? static_cast<double>(N0) * p.D : static_cast<double>(p.B) * tbe->total_dim();
      bytes = out_elems * dtype_size(p.out_dtype) + row_elems * dtype_size(p.w_dtype);
    }
    sets.push_back(std::move(in));
    if (bytes * static_cast<double>(sets.size()) >= 3.0 * static_cast<double>(cache)) break;
  }

  // Outputs rotate with the inputs (sequence outputs differ in rows per set when bags vary).
  std::vector<std::unique_ptr<Buffer>> outs;
  for (const auto& in : sets) {
    const int64_t rows = sequence ? in.host.num_indices() : p.B;
    const int64_t cols = sequence ? p.D : tbe->total_dim();
    outs.emplace_back(new Buffer(p.backend, static_cast<size_t>(rows * cols) * dtype_size(p.out_dtype)));
    if (!outs.back()->valid()) return fail("output", Status(StatusCode::kBackendError, "allocation failed"));
  }
  auto make_args = [&](size_t s) {
    const InputSet& in = sets[s];
    TbeForwardArgs a;
    a.weights = TensorView::vec(weights.data(), p.w_dtype, tbe->num_weights());
    a.indices = TensorView::vec(in.idx->data(), p.idx_dtype, in.host.num_indices());
    a.offsets = TensorView::vec(in.off->data(), p.idx_dtype, static_cast<int64_t>(in.host.offsets.size()));
    a.per_sample_weights = p.weighted ? in.psw->as<float>() : nullptr;
    a.batch_size = p.B;
    a.pooling = p.pooling;
    a.bounds_check = p.bounds;
    a.output = sequence ? TensorView::mat(outs[s]->data(), p.out_dtype, in.host.num_indices(), p.D)
                        : TensorView::mat(outs[s]->data(), p.out_dtype, p.B, tbe->total_dim());
    return a;
  };

  // With --sweep, each variant in turn: set it, spot check, time, one record.
  const std::vector<std::string> variants = p.sweep.empty() ? std::vector<std::string>{""} : p.sweep;
  for (const std::string& variant : variants) {
#if EMBSCALE_WITH_CUDA
    if (!variant.empty()) {
      cuda::TbeForwardTuning tu;
      st = cuda::tbe_forward_tuning(&tu);
      if (st.ok()) {
        tu.variant = variant;
        st = cuda::set_tbe_forward_tuning(tu);
      }
      if (!st.ok()) return fail("--sweep", st);
    }
#endif
    // Spot check set 0 against the reference on a sample of output rows, rebuilding only the weight
    // rows those bags read (the initialiser is counter-based).
    st = tbe->forward(ctx, make_args(0));
    if (st.ok()) st = synchronize(ctx);
    if (!st.ok()) return fail("forward", st);
    {
      const TbeInputs& in = sets[0].host;
      const int64_t out_rows = sequence ? in.num_indices() : p.B;
      const int64_t cols = sequence ? p.D : tbe->total_dim();
      std::vector<unsigned char> got(static_cast<size_t>(out_rows * cols) * dtype_size(p.out_dtype));
      st = copy_to_host(ctx, got.data(), outs[0]->data(), got.size());
      if (!st.ok()) return fail("download", st);
      bool nonzero = false;
      const int64_t step = std::max<int64_t>(1, out_rows / 64);
      const size_t es = dtype_size(p.w_dtype);
      std::vector<unsigned char> row(static_cast<size_t>(std::max(p.D, tbe->max_dim())) * es);
      for (int64_t r = 0; r < out_rows; r += step) {
        for (int g = 0; g < (sequence ? 1 : p.T); ++g) {
          int f = g;
          if (sequence)  // the feature whose bags hold position r
            while (f + 1 < p.T && in.offsets[static_cast<size_t>(f + 1) * p.B] <= r) ++f;
          const int64_t D = p.dims[f];
          std::vector<double> want(static_cast<size_t>(D), 0.0), abs(static_cast<size_t>(D), 0.0);
          int64_t begin, end, col0;
          if (sequence) {
            begin = r;
            end = r + 1;
            col0 = 0;
          } else {
            begin = in.offsets[f * p.B + r];
            end = in.offsets[f * p.B + r + 1];
            col0 = tbe->output_offset(f);
          }
          for (int64_t i = begin; i < end; ++i) {
            (void)init_uniform_weights(p.w_dtype, 1.0f, w_seed, tbe->weight_offset(f) + in.indices[i] * D, D, row.data());
            const double w = p.weighted ? in.per_sample_weights[i] : 1.0;
            for (int64_t d = 0; d < D; ++d) {
              const double v = w * ref::decode(row.data(), p.w_dtype, d);
              want[d] += v;
              abs[d] += std::fabs(v);
            }
          }
          const int64_t n = end - begin;
          const double div = (p.pooling == PoolingMode::kMean && n > 0) ? static_cast<double>(n) : 1.0;
          for (int64_t d = 0; d < D; ++d) {
            const double g = ref::decode(got.data(), p.out_dtype, r * cols + col0 + d);
            const double tol = ref::tolerance(want[d] / div, abs[d] / div, n, p.out_dtype);
            nonzero |= g != 0;
            if (!(std::fabs(g - want[d] / div) <= tol)) {
              std::fprintf(stderr, "error: forward output row %lld, feature %d, column %lld is %.9g; expected %.9g\n",
                           static_cast<long long>(r), f, static_cast<long long>(d), g, want[d] / div);
              return 1;
            }
          }
        }
      }
      if (out_rows > 0 && cols > 0 && N0 > 0 && !nonzero) {
        std::fprintf(stderr, "error: the sampled forward outputs are all zero\n");
        return 1;
      }
    }

    TimingConfig tc;
    tc.warmup = p.warmup;
    tc.repeats = p.iters;
    Timing t;
    st = time_op(ctx, tc, [&](int call) { return tbe->forward(ctx, make_args(static_cast<size_t>(call) % sets.size())); }, &t);
    if (!st.ok()) return fail("forward", st);

    // Unique (table, row) pairs of set 0, as ANCHORS.md quotes them.
    int64_t unique_rows = 0;
    {
      const TbeInputs& in = sets[0].host;
      std::vector<int64_t> keys(in.indices.size());
      for (int f = 0; f < p.T; ++f)
        for (int64_t i = in.offsets[f * p.B]; i < in.offsets[(f + 1) * p.B]; ++i) keys[i] = f * p.E + in.indices[i];
      std::sort(keys.begin(), keys.end());
      unique_rows = static_cast<int64_t>(std::unique(keys.begin(), keys.end()) - keys.begin());
    }

    const double gbps = bytes / (t.median_us * 1e-6) / 1e9;
    const double floor_us = bytes / (copy_gbps * 1e9) * 1e6;
    const double pct = t.median_us > 0 ? 100.0 * floor_us / t.median_us : 0.0;
    nlohmann::json rec = base_record(p.backend);
    rec["op"] = "tbe_forward";
    rec["impl"] = "embscale";
    rec["num_tables"] = p.T;
    rec["batch_size"] = p.B;
    if (p.mixed) {
      rec["embedding_dim"] = "mixed";
      rec["dims"] = p.dims;
    } else {
      rec["embedding_dim"] = p.D;
    }
    rec["bag_size"] = p.L;
    rec["variable_bag_size"] = p.variable;
    rec["num_embeddings"] = p.E;
    rec["alpha"] = p.alpha;
    rec["weights_precision"] = dtype_name(p.w_dtype);
    rec["output_dtype"] = dtype_name(p.out_dtype);
    rec["pooling"] = pooling_mode_name(p.pooling);
    rec["weighted"] = p.weighted;
    rec["indices_dtype"] = dtype_name(p.idx_dtype);
    rec["bounds_check"] = bounds_check_mode_name(p.bounds);
    rec["num_lookups"] = N0;
    rec["unique_rows"] = unique_rows;
    rec["input_sets"] = sets.size();
    rec["bytes"] = bytes;
    rec["median_us"] = t.median_us;
    rec["min_us"] = t.min_us;
    rec["GBps"] = gbps;
    rec["copy_GBps"] = copy_gbps;
    rec["floor_us"] = floor_us;
    rec["pct_of_floor"] = pct;
    // The CUDA forward's tuning (EMBSCALE_TBE_FWD_VARIANT / _ORDER / _BAGS), so sweep records name it.
    std::string tuning_note;
#if EMBSCALE_WITH_CUDA
    if (p.backend == Backend::kCuda) {
      cuda::TbeForwardTuning tu;
      if (cuda::tbe_forward_tuning(&tu).ok()) {
        rec["fwd_variant"] = tu.variant;
        rec["fwd_order"] = tu.feature_inner ? "feature" : "tile";
        rec["fwd_bags_per_group"] = tu.bags_per_group;
        tuning_note = " [" + tu.variant + (tu.feature_inner ? ", feature order" : "") +
                      (tu.bags_per_group > 1 ? ", " + std::to_string(tu.bags_per_group) + " bags/group" : "") + "]";
      }
    }
#endif
    char line[512];
    std::snprintf(line, sizeof line,
                  "tbe_forward %s T=%d B=%lld D=%s L=%d%s E=%lld alpha=%g %s->%s idx=%s %s%s bounds=%s: %.1f us, "
                  "%.1f GB/s, %.0f%% of the byte floor (%.1f us at copy %.1f GB/s), %lld lookups, %lld unique rows%s",
                  backend_name(p.backend), p.T, static_cast<long long>(p.B),
                  p.mixed ? "mixed" : std::to_string(p.D).c_str(), p.L, p.variable ? "(var)" : "",
                  static_cast<long long>(p.E), p.alpha, dtype_name(p.w_dtype), dtype_name(p.out_dtype),
                  dtype_name(p.idx_dtype), pooling_mode_name(p.pooling), p.weighted ? " weighted" : "",
                  bounds_check_mode_name(p.bounds), t.median_us, gbps, pct, floor_us, copy_gbps,
                  static_cast<long long>(N0), static_cast<long long>(unique_rows), tuning_note.c_str());
    emit(rec, p.json, line);
  }
  return 0;
}

int run_from_args(const TbeBenchArgs& a) {
  Plan p;
  const std::string err = make_plan(a, &p);
  if (!err.empty()) {
    std::fprintf(stderr, "error: %s\n", err.c_str());
    return 2;
  }
  return run_plan(p);
}

void add_tbe_bench(CLI::App& bench) {
  auto args = std::make_shared<TbeBenchArgs>();
  auto* sub = bench.add_subcommand("tbe-forward", "Table-batched embedding forward (FBGEMM benchmark flags)");
  sub->add_option("--backend", args->backend, "cpu or cuda (default: cuda when a GPU is present)");
  sub->add_option("--batch-size", args->batch_size, "B (default: 8192 on cuda, 512 on cpu)");
  sub->add_option("--num-tables", args->num_tables, "T, one feature per table (default: 32 on cuda, 8 on cpu)");
  sub->add_option("--embedding-dim", args->embedding_dim, "D (default: 128)");
  sub->add_flag("--mixed-dim", args->mixed_dim, "draw each table's D uniformly in [D/2, 3D/2], rounded up to a multiple of 4 (as FBGEMM's benchmark)");
  sub->add_option("--bag-size", args->bag_size, "L, lookups per bag (default: 20)");
  sub->add_flag("--variable-bag-size", args->variable_bag_size, "bag sizes uniform in [0, 2L] instead of L");
  sub->add_option("--num-embeddings", args->num_embeddings, "E, rows per table (default: 1000000 on cuda, 100000 on cpu)");
  sub->add_option("--alpha", args->alpha, "0: uniform rows; > 0: Zipf(alpha), e.g. 1.15")->capture_default_str();
  sub->add_option("--weights-precision", args->weights_precision, "fp32, fp16 or bf16")->capture_default_str();
  sub->add_option("--output-dtype", args->output_dtype, "fp32, fp16 or bf16 (default: the weights precision)");
  sub->add_option("--pooling", args->pooling, "sum, mean or none")->capture_default_str();
  sub->add_flag("--weighted", args->weighted, "per-sample weights");
  sub->add_option("--indices-dtype", args->indices_dtype, "32 or 64")->capture_default_str();
  sub->add_option("--iters", args->iters, "timed calls; the median is reported (default: 50 on cuda, 10 on cpu)");
  sub->add_option("--warmup", args->warmup, "untimed calls first (default: 10 on cuda, 2 on cpu)");
  sub->add_option("--bounds-check", args->bounds_check, "error, skip or off")->capture_default_str();
  sub->add_option("--seed", args->seed, "input seed")->capture_default_str();
  sub->add_flag("--json", args->json, "print one JSON record instead of a text line");
  sub->add_option("--sweep", args->sweep,
                  "cuda: time these forward variants in turn on the same inputs (comma-separated names, or all; "
                  "see EMBSCALE_TBE_FWD_VARIANT)");
  sub->callback([args] { std::exit(run_from_args(*args)); });
}

// Plain `embscale bench`: the default configuration; on CUDA uniform and Zipf(1.15) as in ANCHORS.md.
int run_tbe_defaults(Backend backend) {
  TbeBenchArgs a;
  a.backend = backend_name(backend);
  int rc = run_from_args(a);
  a.alpha = 1.15;
  rc |= run_from_args(a);
  return rc;
}

const RegisterBench kRegisterTbeBench({"tbe-forward", add_tbe_bench, run_tbe_defaults});

}  // namespace
}  // namespace tools
}  // namespace embscale
