// Shared pieces of the TBE benchmarks: FBGEMM's benchmark flags, their validation into a Plan (the
// backend defaults: CUDA the headline configuration of ANCHORS.md, CPU one that runs in seconds),
// the module and seeded weight initialisation, the rotating input sets, the unique-row count and the
// configuration fields of a record. Numbers are read strictly (cli_args.h); before anything is
// allocated, the lookup count is checked and the run's peak memory is estimated with checked
// arithmetic and refused, naming a flag, when the machine cannot hold it.
// The semantics are those of `embscale bench tbe-forward` (tools/bench_tbe.cpp), so records of the
// forward, backward and training benchmarks compare field for field.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "cli_args.h"
#include "embscale/memory.h"
#include "embscale/tbe.h"
#include "embscale/tbe_generator.h"

namespace embscale {
namespace tools {
namespace tbe_bench {

// The command line as given; kUnset means "the backend's default" (no value given can be kUnset:
// the options' ranges below exclude it).
constexpr int64_t kUnset = INT64_MIN;
constexpr int64_t kMaxTables = 100000;
constexpr int64_t kMaxDim = 65536;
constexpr int64_t kMaxBagSize = int64_t{1} << 20;
constexpr int64_t kMaxLookups = int64_t{1} << 33;
constexpr int64_t kMaxCalls = 1000000;  // --iters, --warmup
struct Args {
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
  int64_t threads = 0;  // Context::num_threads (0: OpenMP's default)
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
  int threads = 0;  // Context::num_threads
};

// How --mixed-dim draws each table's D around --embedding-dim: any value in [D/2, 3D/2], or that value
// rounded up to a multiple of 4 when D >= 4 (as FBGEMM's benchmark; the forward benchmark's choice).
enum class MixedDims { kAny, kMultipleOf4 };

// The flags common to every TBE benchmark.
inline void add_options(CLI::App* sub, Args* a, MixedDims mixed = MixedDims::kAny) {
  constexpr int64_t kAny = INT64_MAX;
  add_text_option(sub, "--backend", &a->backend, "cpu or cuda (default: cuda when a GPU is present)");
  add_integer_option(sub, "--batch-size", &a->batch_size, 0, kAny, "B (default: 8192 on cuda, 512 on cpu)");
  add_integer_option(sub, "--num-tables", &a->num_tables, 1, kMaxTables,
                     "T, one feature per table (default: 32 on cuda, 8 on cpu)");
  add_integer_option(sub, "--embedding-dim", &a->embedding_dim, 1, kMaxDim, "D (default: 128)");
  sub->add_flag("--mixed-dim", a->mixed_dim,
                mixed == MixedDims::kMultipleOf4
                    ? "draw each table's D uniformly in [D/2, 3D/2], rounded up to a multiple of 4 (as FBGEMM's benchmark)"
                    : "draw each table's D uniformly in [D/2, 3D/2]");
  add_integer_option(sub, "--bag-size", &a->bag_size, 0, kMaxBagSize, "L, lookups per bag (default: 20)");
  sub->add_flag("--variable-bag-size", a->variable_bag_size, "bag sizes uniform in [0, 2L] instead of L");
  add_integer_option(sub, "--num-embeddings", &a->num_embeddings, 1, kAny,
                     "E, rows per table (default: 1000000 on cuda, 100000 on cpu)");
  add_real_option(sub, "--alpha", &a->alpha, 0.0, std::numeric_limits<double>::max(),
                  "0: uniform rows; > 0: Zipf(alpha), e.g. 1.15")
      ->default_str("0");
  sub->add_option("--weights-precision", a->weights_precision, "fp32, fp16 or bf16")->capture_default_str();
  add_text_option(sub, "--output-dtype", &a->output_dtype, "fp32, fp16 or bf16 (default: the weights precision)");
  sub->add_option("--pooling", a->pooling, one_of(pooling_mode_spellings()) + " (the upper-case names are FBGEMM's; none and sequence: no pooling)")
      ->capture_default_str();
  sub->add_flag("--weighted", a->weighted, "per-sample weights");
  sub->add_option("--indices-dtype", a->indices_dtype, "32 or 64")->capture_default_str();
  add_integer_option(sub, "--iters", &a->iters, 1, kMaxCalls,
                     "timed calls; the median is reported (default: 50 on cuda, 10 on cpu)");
  add_integer_option(sub, "--warmup", &a->warmup, 0, kMaxCalls, "untimed calls first (default: 10 on cuda, 2 on cpu)");
  sub->add_option("--bounds-check", a->bounds_check, one_of(bounds_check_mode_spellings()) + " (the upper-case names are FBGEMM's)")
      ->capture_default_str();
  add_unsigned_option(sub, "--seed", &a->seed, "input seed (0..2^64-1)");
  add_integer_option(sub, "--threads", &a->threads, 1, 1024, "CPU threads for the op (1..1024; default: OpenMP's, all cores); ignored on cuda");
  sub->add_flag("--json", a->json, "print one JSON record instead of a text line");
}

// Validates the flags into a plan; returns the first problem (naming its flag) or "".
inline std::string make_plan(const Args& a, Plan* p, MixedDims mixed = MixedDims::kAny) {
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
  if (T > kMaxTables)
    return "--num-tables: " + std::to_string(T) + " is more than this benchmark supports (" + std::to_string(kMaxTables) + ")";
  if (p->E < 1) return "--num-embeddings: " + std::to_string(p->E) + "; a table needs at least one row";
  if (D < 1 || D > kMaxDim) return "--embedding-dim: " + std::to_string(D) + "; expected 1.." + std::to_string(kMaxDim);
  if (L > kMaxBagSize) return "--bag-size: " + std::to_string(L) + " is too large (at most 2^20)";
  if (!(a.alpha >= 0) || !std::isfinite(a.alpha)) return "--alpha: expected 0 (uniform) or a finite value > 0";
  if (!parse_dtype(a.weights_precision, &p->w_dtype) || !is_float_dtype(p->w_dtype))
    return "--weights-precision: '" + a.weights_precision + "'; expected fp32, fp16 or bf16";
  p->out_dtype = p->w_dtype;
  if (!a.output_dtype.empty() && (!parse_dtype(a.output_dtype, &p->out_dtype) || !is_float_dtype(p->out_dtype)))
    return "--output-dtype: '" + a.output_dtype + "'; expected fp32, fp16 or bf16";
  if (!parse_dtype(a.indices_dtype, &p->idx_dtype) || !is_index_dtype(p->idx_dtype))
    return "--indices-dtype: '" + a.indices_dtype + "'; expected 32 or 64";
  if (!parse_pooling_mode(a.pooling, &p->pooling))
    return "--pooling: '" + a.pooling + "'; expected " + one_of(pooling_mode_spellings());
  if (!parse_bounds_check_mode(a.bounds_check, &p->bounds))
    return "--bounds-check: '" + a.bounds_check + "'; expected " + one_of(bounds_check_mode_spellings());
  if (a.weighted && p->pooling == PoolingMode::kMean) return "--weighted: not supported with --pooling mean";
  if (a.mixed_dim && p->pooling == PoolingMode::kNone) return "--mixed-dim: sequence mode (--pooling none) needs one D";
  const int64_t iters = given(a.iters, gpu ? 50 : 10), warmup = given(a.warmup, gpu ? 10 : 2);
  if (iters < 1 || iters > kMaxCalls) return "--iters: " + std::to_string(iters) + "; expected 1.." + std::to_string(kMaxCalls);
  if (warmup < 0 || warmup > kMaxCalls)
    return "--warmup: " + std::to_string(warmup) + "; expected 0.." + std::to_string(kMaxCalls);
  p->iters = static_cast<int>(iters);
  p->warmup = static_cast<int>(warmup);
  // At most 2^33 lookups (the largest bags when their sizes vary), counted without wrapping.
  const CheckedSize max_lookups = CheckedSize(static_cast<uint64_t>(T)) * static_cast<uint64_t>(p->B) *
                                  static_cast<uint64_t>(a.variable_bag_size ? 2 * L : L);
  if (!max_lookups.fits_in(static_cast<uint64_t>(kMaxLookups))) {
    const std::string flag = a.batch_size != kUnset ? "--batch-size" : a.bag_size != kUnset ? "--bag-size" : "--num-tables";
    return flag + ": " + std::to_string(T) + " tables x " + std::to_string(p->B) + " bags x " +
           std::to_string(a.variable_bag_size ? 2 * L : L) + (a.variable_bag_size ? " (2L)" : "") +
           " lookups is more than 2^33 lookups";
  }
  const int64_t lookups = static_cast<int64_t>(max_lookups.value());
  if (p->idx_dtype == DType::kI32 && lookups > INT32_MAX)
    return "--indices-dtype: 32: " + std::to_string(lookups) + " lookups do not fit in int32";
  if (p->idx_dtype == DType::kI32 && p->E - 1 > INT32_MAX)
    return "--indices-dtype: 32: " + std::to_string(p->E) + " rows (--num-embeddings) do not fit in int32";
  p->T = static_cast<int>(T);
  p->D = static_cast<int>(D);
  p->L = static_cast<int>(L);
  p->mixed = a.mixed_dim;
  p->variable = a.variable_bag_size;
  p->weighted = a.weighted;
  p->alpha = a.alpha;
  p->json = a.json;
  p->seed = a.seed;
  p->threads = static_cast<int>(a.threads);
  // Mixed dimensions as FBGEMM's benchmark draws them, around D (in [D/2, 3D/2]), but any D >= 1;
  // with MixedDims::kMultipleOf4 rounded up to a multiple of 4 (so mixed-D figures compare with FBGEMM's).
  p->dims.assign(T, p->D);
  if (p->mixed) {
    uint64_t s = a.seed ^ 0x2545f4914f6cdd1dull;
    for (auto& d : p->dims) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      const int64_t lo = std::max<int64_t>(1, D / 2), hi = std::max<int64_t>(lo, D + D / 2);
      d = static_cast<int>(lo + static_cast<int64_t>((s >> 33) % static_cast<uint64_t>(hi - lo + 1)));
      if (mixed == MixedDims::kMultipleOf4 && D >= 4) d = (d + 3) / 4 * 4;
    }
  }
  return "";
}

// Which part of the TBE benchmarks a footprint is for.
enum class Pass { kForward, kBackward, kTrain };

// "" when a run of plan p fits the machine, else why not, starting with the flag to blame: its peak
// memory, estimated with checked arithmetic before anything is allocated, against usable_memory_bytes
// (on CUDA backend memory and host memory each against their own; a limit of 0 is unknown and not
// applied). Counted: the weights; the rotating input sets (host lookups and their backend copies, as
// many sets as make_input_sets makes for the expected bytes); the outputs; the spot check's host
// copies; for the backward the gradient of the output (and the forward's output when training), the
// optimizer state (`state_floats` fp32 values) and the dense-gradient buffers. Not counted: the
// backward's workspace, which the library sizes later (a failed allocation of it is reported then).
inline std::string memory_refusal(const Args& a, const Plan& p, Pass pass, CheckedSize state_floats) {
  const bool sequence = p.pooling == PoolingMode::kNone;
  CheckedSize sum_dims = 0;
  int max_dim = 0;
  for (int d : p.dims) {
    sum_dims += static_cast<uint64_t>(d);
    max_dim = std::max(max_dim, d);
  }
  const CheckedSize T(static_cast<uint64_t>(p.T)), B(static_cast<uint64_t>(p.B)), L(static_cast<uint64_t>(p.L));
  const CheckedSize E(static_cast<uint64_t>(p.E));
  const CheckedSize w_es(dtype_size(p.w_dtype)), out_es(dtype_size(p.out_dtype)), idx_es(dtype_size(p.idx_dtype));
  const CheckedSize N = T * B * L;  // expected lookups of one set (variable bags average L)
  const CheckedSize bags = T * B + 1;
  const CheckedSize weights = E * sum_dims * w_es;
  const CheckedSize set_host = (N + bags) * 8 + (p.idx_dtype == DType::kI32 ? (N + bags) * 4 : 0) +
                               (p.weighted ? N * 4 : 0);
  const CheckedSize set_device = (N + bags) * idx_es + (p.weighted ? N * 4 : 0);
  const CheckedSize out = (sequence ? N * static_cast<uint64_t>(p.D) : B * sum_dims) * out_es;
  // Sets: until their forward bytes reach three times the cache, at most 16 (make_input_sets).
  const CheckedSize fwd_bytes = out + B * L * sum_dims * w_es;
  const uint64_t target = 3 * static_cast<uint64_t>(last_level_cache_bytes(p.backend));
  uint64_t sets = 16;
  if (fwd_bytes.overflow() || fwd_bytes.value() >= target)
    sets = 1;
  else if (fwd_bytes.value() > 0)
    sets = std::min<uint64_t>(16, (target + fwd_bytes.value() - 1) / fwd_bytes.value());
  CheckedSize lookups_device = CheckedSize(sets) * set_device, lookups_host = CheckedSize(sets) * set_host + N * 8;
  CheckedSize weights_device = weights;
  if (pass == Pass::kForward) {
    lookups_device += CheckedSize(sets) * out;
    lookups_host += out;
  } else {
    lookups_device += out * (pass == Pass::kTrain ? 2 : 1) + N * 8 + N * static_cast<uint64_t>(max_dim) * 4;
    lookups_host += out + N * 8;
    weights_device += state_floats * 4;
  }
  const CheckedSize device = weights_device + lookups_device;
  const CheckedSize host = lookups_host;

  // The flag to blame: of those behind the larger part, the first one given.
  const bool weights_part = weights_device.overflow() ||
                            (!lookups_device.overflow() && !lookups_host.overflow() &&
                             weights_device.value() >= (lookups_device + lookups_host).value());
  std::string flag;
  if (weights_part)
    flag = a.num_embeddings != kUnset ? "--num-embeddings" : a.embedding_dim != kUnset ? "--embedding-dim" : "--num-tables";
  else
    flag = a.batch_size != kUnset ? "--batch-size" : a.bag_size != kUnset ? "--bag-size"
         : a.num_tables != kUnset ? "--num-tables" : "--embedding-dim";
  const std::string parts = " (weights" + std::string(pass == Pass::kForward ? "" : " and optimizer state") + " " +
                            format_bytes(weights_device) + ", lookups and outputs " +
                            format_bytes(lookups_device + lookups_host) + ")";
  const uint64_t host_limit = host_memory_bytes();
  const uint64_t unknown = UINT64_MAX;
  if (p.backend == Backend::kCpu) {
    const CheckedSize total = device + host;
    if (!total.fits_in(host_limit ? host_limit : unknown))
      return flag + ": this configuration needs " + format_bytes(total) + " of memory" + parts + "; this machine has " +
             format_bytes(host_limit);
    return "";
  }
  const uint64_t device_limit = usable_memory_bytes(p.backend);
  if (!device.fits_in(device_limit ? device_limit : unknown))
    return flag + ": this configuration needs " + format_bytes(device) + " of device memory" + parts +
           "; the device has " + format_bytes(device_limit) + " free";
  if (!host.fits_in(host_limit ? host_limit : unknown))
    return flag + ": this configuration needs " + format_bytes(host) + " of host memory for its lookups; this machine has " +
           format_bytes(host_limit);
  return "";
}

// Prints "error: <what>: <status>" and returns the exit code of a failed run (1).
inline int fail(const std::string& what, const Status& st) {
  std::fprintf(stderr, "error: %s: %s\n", what.c_str(), st.to_string().c_str());
  return 1;
}

// The module of a plan: T tables of E rows, table t of dims[t] columns, in the weights precision.
// Where the plan's ops run: its backend, and on the CPU its thread count (--threads).
inline Context context_for(const Plan& p) {
  Context ctx = p.backend == Backend::kCuda ? Context::cuda() : Context::cpu();
  ctx.num_threads = p.threads;
  return ctx;
}

inline Status create_tbe(const Context& ctx, const Plan& p, std::unique_ptr<TableBatchedEmbedding>* tbe) {
  TbeConfig cfg;
  for (int t = 0; t < p.T; ++t) cfg.tables.push_back(TableSpec{p.E, p.dims[t]});
  cfg.weights_dtype = p.w_dtype;
  return TableBatchedEmbedding::create(ctx, cfg, tbe);
}

// Fills `n` backend elements from the counter-based initialiser, uniform in [-a, a] (host staging on CUDA).
inline Status init_values(const Context& ctx, DType dtype, int64_t n, float a, uint64_t seed, void* dst) {
  const size_t es = dtype_size(dtype);
  if (ctx.backend == Backend::kCpu) return init_uniform_weights(dtype, a, seed, 0, n, dst);
  const int64_t chunk = int64_t{1} << 24;
  std::vector<unsigned char> host(static_cast<size_t>(std::min(n, chunk)) * es);
  for (int64_t first = 0; first < n; first += chunk) {
    const int64_t count = std::min(chunk, n - first);
    EMBSCALE_RETURN_IF_ERROR(init_uniform_weights(dtype, a, seed, first, count, host.data()));
    EMBSCALE_RETURN_IF_ERROR(copy_to_backend(ctx, static_cast<unsigned char*>(dst) + first * es, host.data(), count * es));
  }
  return Status::Ok();
}

// One seeded set of lookups, on the host and in backend memory.
struct InputSet {
  TbeInputs host;
  std::unique_ptr<Buffer> idx, off, psw;
};

// Generates sets (seed p.seed + 1000003*s) until their forward bytes reach three times the cache (at
// most 16), as the forward benchmark does; *bytes: the forward bytes of set 0 by FBGEMM's formula.
// A failed buffer allocation returns a backend error with the message `alloc_failure`.
inline Status make_input_sets(const Context& ctx, const Plan& p, const TableBatchedEmbedding& tbe, size_t cache,
                              std::vector<InputSet>* sets, double* bytes,
                              const char* alloc_failure = "input allocation failed") {
  TbeInputSpec spec;
  spec.batch_size = p.B;
  spec.bag_size = p.L;
  spec.variable_bag_size = p.variable;
  spec.num_rows.assign(p.T, p.E);
  spec.alpha = p.alpha;
  spec.index_dtype = p.idx_dtype;
  spec.weighted = p.weighted;
  const bool sequence = p.pooling == PoolingMode::kNone;
  for (int s = 0; s < 16; ++s) {
    InputSet in;
    spec.seed = p.seed + 1000003ull * static_cast<uint64_t>(s);
    EMBSCALE_RETURN_IF_ERROR(generate_tbe_inputs(spec, &in.host));
    in.idx.reset(new Buffer(p.backend, in.host.indices_bytes()));
    in.off.reset(new Buffer(p.backend, in.host.offsets_bytes()));
    in.psw.reset(new Buffer(p.backend, in.host.per_sample_weights.size() * 4));
    if (!in.idx->valid() || !in.off->valid() || !in.psw->valid())
      return Status(StatusCode::kBackendError, alloc_failure);
    EMBSCALE_RETURN_IF_ERROR(copy_to_backend(ctx, in.idx->data(), in.host.indices_data(), in.host.indices_bytes()));
    EMBSCALE_RETURN_IF_ERROR(copy_to_backend(ctx, in.off->data(), in.host.offsets_data(), in.host.offsets_bytes()));
    EMBSCALE_RETURN_IF_ERROR(copy_to_backend(ctx, in.psw->data(), in.host.per_sample_weights.data(),
                                             in.host.per_sample_weights.size() * 4));
    if (s == 0) {
      const int64_t N0 = in.host.num_indices();
      double row_elems = 0;  // sum over lookups of D
      for (int f = 0; f < p.T; ++f)
        row_elems += static_cast<double>(in.host.offsets[(f + 1) * p.B] - in.host.offsets[f * p.B]) * p.dims[f];
      const double out_elems = sequence ? static_cast<double>(N0) * p.D : static_cast<double>(p.B) * tbe.total_dim();
      *bytes = out_elems * dtype_size(p.out_dtype) + row_elems * dtype_size(p.w_dtype);
    }
    sets->push_back(std::move(in));
    if (*bytes * static_cast<double>(sets->size()) >= 3.0 * static_cast<double>(cache)) break;
  }
  return Status::Ok();
}

// Unique (table, row) pairs of one set, as ANCHORS.md quotes them.
// The copy bandwidth (read + write) over a buffer well past the last-level cache: the ceiling a TBE
// record's byte floor is measured against. Measure it first, while memory is quiet.
inline Status copy_ceiling(const Context& ctx, Backend b, double* gbps) {
  return copy_bandwidth_gbps(ctx, std::max<size_t>(4 * last_level_cache_bytes(b), size_t{256} << 20), gbps);
}

// The byte floor of a record: `bytes` at the copy bandwidth, and the share of it a median reaches.
struct Floor {
  double us = 0, pct = 0;
};
inline Floor byte_floor(double bytes, double copy_gbps, double median_us) {
  Floor f;
  f.us = bytes / (copy_gbps * 1e9) * 1e6;
  f.pct = median_us > 0 ? 100.0 * f.us / median_us : 0.0;
  return f;
}

// copy_GBps, floor_us and pct_of_floor of a record.
inline void floor_fields(double copy_gbps, const Floor& f, nlohmann::json* rec) {
  (*rec)["copy_GBps"] = copy_gbps;
  (*rec)["floor_us"] = f.us;
  (*rec)["pct_of_floor"] = f.pct;
}

inline int64_t unique_rows_of(const Plan& p, const TbeInputs& in) {
  std::vector<int64_t> keys(in.indices.size());
  for (int f = 0; f < p.T; ++f)
    for (int64_t i = in.offsets[f * p.B]; i < in.offsets[(f + 1) * p.B]; ++i) keys[i] = f * p.E + in.indices[i];
  std::sort(keys.begin(), keys.end());
  return static_cast<int64_t>(std::unique(keys.begin(), keys.end()) - keys.begin());
}

// The configuration fields of a record, named as in the forward benchmark's records.
inline void config_fields(const Plan& p, nlohmann::json* rec) {
  nlohmann::json& r = *rec;
  r["num_tables"] = p.T;
  r["batch_size"] = p.B;
  if (p.mixed) {
    r["embedding_dim"] = "mixed";
    r["dims"] = p.dims;
  } else {
    r["embedding_dim"] = p.D;
  }
  r["bag_size"] = p.L;
  r["variable_bag_size"] = p.variable;
  r["num_embeddings"] = p.E;
  r["alpha"] = p.alpha;
  r["weights_precision"] = dtype_name(p.w_dtype);
  r["output_dtype"] = dtype_name(p.out_dtype);
  r["pooling"] = pooling_mode_name(p.pooling);
  r["weighted"] = p.weighted;
  r["indices_dtype"] = dtype_name(p.idx_dtype);
  r["bounds_check"] = bounds_check_mode_name(p.bounds);
}

}  // namespace tbe_bench
}  // namespace tools
}  // namespace embscale
