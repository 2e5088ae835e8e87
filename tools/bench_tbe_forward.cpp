// The measuring loop of the TBE forward benchmark (bench_tbe_forward.h); what it reports is described in
// bench_tbe.cpp, which registers `embscale bench tbe-forward`.
#include "bench_tbe_forward.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "embscale/memory.h"
#include "reference_tbe.h"

namespace embscale {
namespace tools {

using tbe_bench::InputSet;
using tbe_bench::fail;

int run_tbe_forward(const tbe_bench::Plan& p, const std::vector<TimedForward>& forwards,
                    const GatherCeiling& gather_ceiling) {
  const Context ctx = tbe_bench::context_for(p);
  std::unique_ptr<TableBatchedEmbedding> tbe;
  Status st = tbe_bench::create_tbe(ctx, p, &tbe);
  if (!st.ok()) return fail("create", st);

  // Copy ceiling first, while memory is quiet.
  const size_t cache = last_level_cache_bytes(p.backend);
  double copy_gbps = 0;
  st = tbe_bench::copy_ceiling(ctx, p.backend, &copy_gbps);
  if (!st.ok()) return fail("copy bandwidth", st);

  const uint64_t w_seed = p.seed * 7 + 1;
  Buffer weights(p.backend, static_cast<size_t>(tbe->num_weights()) * dtype_size(p.w_dtype));
  if (!weights.valid())
    return fail("weights", Status(StatusCode::kBackendError, "cannot allocate " +
                                                                 std::to_string(tbe->num_weights() * dtype_size(p.w_dtype)) + " bytes"));
  st = tbe_bench::init_values(ctx, p.w_dtype, tbe->num_weights(), 1.0f, w_seed, weights.data());
  if (!st.ok()) return fail("weights", st);

  // Lookups: one set, or more when one set would stay in the cache.
  std::vector<InputSet> sets;
  double bytes = 0;
  st = tbe_bench::make_input_sets(ctx, p, *tbe, cache, &sets, &bytes, "allocation failed");
  if (!st.ok()) return fail("inputs", st);
  const int64_t N0 = sets[0].host.num_indices();
  const bool sequence = p.pooling == PoolingMode::kNone;

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
    if (p.weighted) a.per_sample_weights = TensorView::vec(in.psw->data(), DType::kF32, in.host.num_indices());
    a.batch_size = p.B;
    a.pooling = p.pooling;
    a.bounds_check = p.bounds;
    a.output = sequence ? TensorView::mat(outs[s]->data(), p.out_dtype, in.host.num_indices(), p.D)
                        : TensorView::mat(outs[s]->data(), p.out_dtype, p.B, tbe->total_dim());
    return a;
  };

  // Each forward in turn on the same inputs: spot check, time, one record.
  double gather_us = -1;  // the bare-gather ceiling, timed once when asked for
  for (const TimedForward& fwd : forwards) {
    // Spot check set 0 against the reference on a sample of output rows, rebuilding only the weight
    // rows those bags read (the initialiser is counter-based).
    st = fwd.run(ctx, *tbe, make_args(0));
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
    st = time_op(ctx, tc, [&](int call) { return fwd.run(ctx, *tbe, make_args(static_cast<size_t>(call) % sets.size())); },
                 &t);
    if (!st.ok()) return fail("forward", st);

    const int64_t unique_rows = tbe_bench::unique_rows_of(p, sets[0].host);

    // The bare gather of set 0's rows, once (every record carries it).
    if (gather_ceiling && gather_us < 0) {
      Timing gather;
      const size_t es = dtype_size(p.w_dtype);
      const TbeInputs& h = sets[0].host;
      std::vector<int64_t> byte_offsets(static_cast<size_t>(N0));
      std::vector<int32_t> row_bytes(p.mixed ? static_cast<size_t>(N0) : 1, static_cast<int32_t>(p.dims[0] * es));
      for (int f = 0; f < p.T; ++f) {
        const int64_t table = tbe->weight_offset(tbe->feature_table(f)) * static_cast<int64_t>(es);
        const int64_t bytes_f = p.dims[f] * static_cast<int64_t>(es);
        for (int64_t i = h.offsets[static_cast<size_t>(f) * p.B]; i < h.offsets[static_cast<size_t>(f + 1) * p.B]; ++i) {
          byte_offsets[static_cast<size_t>(i)] = table + h.indices[static_cast<size_t>(i)] * bytes_f;
          if (p.mixed) row_bytes[static_cast<size_t>(i)] = static_cast<int32_t>(bytes_f);
        }
      }
      st = gather_ceiling(ctx, weights.data(), byte_offsets, row_bytes, tc, &gather);
      if (!st.ok()) return fail("gather ceiling", st);
      gather_us = gather.median_us;
    }

    const double gbps = bytes / (t.median_us * 1e-6) / 1e9;
    const tbe_bench::Floor floor = tbe_bench::byte_floor(bytes, copy_gbps, t.median_us);
    nlohmann::json rec = base_record(p.backend, p.threads);
    rec["op"] = "tbe_forward";
    rec["impl"] = "embscale";
    tbe_bench::config_fields(p, &rec);
    rec["num_lookups"] = N0;
    rec["unique_rows"] = unique_rows;
    rec["input_sets"] = sets.size();
    rec["bytes"] = bytes;
    rec["median_us"] = t.median_us;
    rec["min_us"] = t.min_us;
    rec["GBps"] = gbps;
    tbe_bench::floor_fields(copy_gbps, floor, &rec);
    std::string gather_note;
    if (gather_us > 0) {
      rec["gather_ceiling_us"] = gather_us;
      rec["pct_of_gather_ceiling"] = 100.0 * gather_us / t.median_us;
      char buf[96];
      std::snprintf(buf, sizeof buf, ", %.0f%% of a bare gather of its rows (%.1f us)", 100.0 * gather_us / t.median_us,
                    gather_us);
      gather_note = buf;
    }
    for (const auto& field : fwd.fields.items()) rec[field.key()] = field.value();
    const std::string label = fwd.label.empty() ? "" : " [" + fwd.label + "]";
    char line[512];
    std::snprintf(line, sizeof line,
                  "tbe_forward %s T=%d B=%lld D=%s L=%d%s E=%lld alpha=%g %s->%s idx=%s %s%s bounds=%s: %.1f us, "
                  "%.1f GB/s, %.0f%% of the byte floor (%.1f us at copy %.1f GB/s)%s, %lld lookups, %lld unique rows%s",
                  backend_name(p.backend), p.T, static_cast<long long>(p.B),
                  p.mixed ? "mixed" : std::to_string(p.D).c_str(), p.L, p.variable ? "(var)" : "",
                  static_cast<long long>(p.E), p.alpha, dtype_name(p.w_dtype), dtype_name(p.out_dtype),
                  dtype_name(p.idx_dtype), pooling_mode_name(p.pooling), p.weighted ? " weighted" : "",
                  bounds_check_mode_name(p.bounds), t.median_us, gbps, floor.pct, floor.us, copy_gbps,
                  gather_note.c_str(), static_cast<long long>(N0), static_cast<long long>(unique_rows),
                  label.c_str());
    emit(rec, p.json, line);
  }
  return 0;
}

}  // namespace tools
}  // namespace embscale
