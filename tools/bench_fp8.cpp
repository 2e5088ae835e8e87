// `embscale bench fp8`: times the FP8 current-scaling ops (fp8.h) and, on the GPU, the amax peers
// (peers_fp8.h) in the same run, on the same inputs and with the same timing.
//
// What makes the numbers comparable:
//  * inputs are seeded random values (never zeros), replicated into enough copies that the copies,
//    padding included, together reach three times the last-level cache (the GPU's L2); calls rotate
//    through the copies (outputs too), so a size that fits in the cache is still measured from memory
//    while the copies of any size stay within a few times the cache;
//  * sizes are checked before anything is allocated: every derived byte count with checked
//    arithmetic, and the run's peak memory against what the machine has (cli_args.h);
//  * microsecond-scale ops run many back-to-back calls per timed batch; the median batch is reported
//    per call;
//  * GB/s counts the bytes an op must move (docs/bench.md), and pct_of_copy relates it to the copy
//    bandwidth measured at the start of the same run (emitted as op "copy");
//  * every amax result is compared with the host's exact amax of the input, so a fast wrong kernel
//    (ours or a peer's) fails the run instead of topping the table.
//
// The plan and the inputs are bench_fp8_plan.cpp and bench_fp8_inputs.cpp (bench_fp8.h).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench_fp8.h"
#include "bench_util.h"
#include "cli_args.h"
#include "embscale/fp8.h"
#include "embscale/memory.h"
#include "registry.h"
#if EMBSCALE_WITH_CUDA
#include "peers_fp8.h"
#endif

namespace embscale {
namespace tools {
namespace {

using namespace fp8_bench;

// ---- measuring ------------------------------------------------------------------------------------

struct Runner {
  const Plan& plan;
  Context ctx;
  double copy_gbps = 0;
  size_t cache_bytes = 0;
  int failures = 0;
  Buffer scalars;  // [kScalars] fp32 in backend memory: amax, scale, scale_inv, ...
  static constexpr int kScalars = 16;
  float* amax_ptr() const { return scalars.as<float>(); }
  float* scale_ptr() const { return scalars.as<float>() + 1; }
  float* scale_inv_ptr() const { return scalars.as<float>() + 2; }

  explicit Runner(const Plan& p) : plan(p) {
    ctx.backend = p.backend;
    ctx.stream = nullptr;
    ctx.num_threads = p.threads;
    cache_bytes = last_level_cache_bytes(p.backend);
    scalars = Buffer(p.backend, kScalars * sizeof(float));
  }

  void fail(const std::string& what, const Status& st) {
    ++failures;
    std::fprintf(stderr, "error: %s: %s\n", what.c_str(), st.to_string().c_str());
    std::fflush(stderr);
  }

  // Back-to-back calls per timed batch: enough for about 300 us of GPU work (2 ms on the CPU), so
  // launch gaps and timer resolution vanish into the median; at most 200. A short probe measures the
  // call first: an estimate from the byte count alone would be far off for an op far from the ceiling.
  Status measure(const std::function<Status(int)>& op, Timing* t, int* calls) {
    TimingConfig probe;
    probe.warmup = 1;
    probe.repeats = 3;
    probe.warn_if_noisy = false;  // a three-repeat estimate, not a figure
    Timing pt;
    EMBSCALE_RETURN_IF_ERROR(time_op(ctx, probe, op, &pt));
    const double target_us = plan.backend == Backend::kCuda ? 300.0 : 2000.0;
    TimingConfig cfg;
    cfg.calls_per_batch = static_cast<int>(std::max(1.0, std::min(200.0, std::ceil(target_us / std::max(pt.median_us, 0.5)))));
    cfg.warmup = std::max(1, plan.warmup * cfg.calls_per_batch);
    cfg.repeats = plan.iters;
    *calls = cfg.calls_per_batch;
    return time_op(ctx, cfg, op, t);
  }

  void emit_record(const std::string& op, const std::string& impl, DType dtype, int64_t n, bool two_d, double bytes,
                   const Timing& t, int calls, int copies, bool has_algo, const std::string& check) {
    nlohmann::json r = base_record(plan.backend, plan.threads);
    r["op"] = op;
    r["impl"] = impl;
    r["dtype"] = dtype_name(dtype);
    r["n"] = n;
    if (two_d) {
      r["rows"] = plan.rows;
      r["cols"] = plan.cols;
    }
    const double gbps = bytes / (t.median_us * 1e-6) / 1e9;
    r["median_us"] = t.median_us;
    r["min_us"] = t.min_us;
    r["max_us"] = t.max_us;
    r["bytes"] = bytes;
    r["GBps"] = gbps;
    r["pct_of_copy"] = 100.0 * gbps / copy_gbps;
    if (has_algo) r["algo"] = amax_algo_name(plan.algo);
    const Fp8Op o = std::find_if(std::begin(kOps), std::end(kOps), [&](const OpInfo& i) { return op == i.name; })->op;
    if (o != Fp8Op::kAmax && o != Fp8Op::kActivationAmax) r["fp8"] = dtype_name(plan.fp8);
    if (o == Fp8Op::kActivationAmax) r["activation"] = activation_name(plan.act);
    r["calls_per_batch"] = calls;
    r["repeats"] = plan.iters;
    r["copies"] = copies;
    if (!check.empty()) r["check"] = check;
    char line[320];
    const std::string size = two_d ? std::to_string(plan.rows) + "x" + std::to_string(plan.cols) : "n=" + std::to_string(n);
    std::snprintf(line, sizeof line, "%-24s %-13s %-5s %-13s %10.2f us %9.1f GB/s %6.1f%% of copy%s%s%s%s",
                  op.c_str(), impl.c_str(), dtype_name(dtype), size.c_str(), t.median_us, gbps, 100.0 * gbps / copy_gbps,
                  has_algo ? "  algo=" : "", has_algo ? amax_algo_name(plan.algo) : "",
                  check.empty() ? "" : "  check=", check.c_str());
    emit(r, plan.json, line);
  }

  void emit_copy(size_t bytes, const Timing& t) {
    nlohmann::json r = base_record(plan.backend, plan.threads);
    r["op"] = "copy";
    r["impl"] = plan.backend == Backend::kCuda ? "cudaMemcpyAsync" : "memcpy";
    r["dtype"] = "u8";
    r["n"] = bytes;
    r["bytes"] = 2.0 * static_cast<double>(bytes);
    r["median_us"] = t.median_us;
    r["min_us"] = t.min_us;
    r["max_us"] = t.max_us;
    r["GBps"] = copy_gbps;
    r["pct_of_copy"] = 100.0;
    char line[200];
    std::snprintf(line, sizeof line, "%-24s %-13s %-5s %-13s %10.2f us %9.1f GB/s (read + write; the ceiling)", "copy",
                  r["impl"].get<std::string>().c_str(), "u8", ("n=" + std::to_string(bytes)).c_str(), t.median_us,
                  copy_gbps);
    emit(r, plan.json, line);
  }

  // "ok" when the amax in backend memory equals `expect` bit for bit, else a description.
  std::string check_amax(float expect) {
    float got = -1;
    Status st = synchronize(ctx);
    if (st.ok()) st = copy_to_host(ctx, &got, amax_ptr(), sizeof got);
    if (!st.ok()) return "unreadable";
    if (std::memcmp(&got, &expect, sizeof got) == 0) return "ok";
    char buf[96];
    std::snprintf(buf, sizeof buf, "mismatch (got %.9g, expected %.9g)", got, expect);
    return buf;
  }

  void note_check(const std::string& what, const std::string& check) {
    if (check == "ok" || check.empty()) return;
    ++failures;
    std::fprintf(stderr, "error: %s: amax %s\n", what.c_str(), check.c_str());
  }

  Status run_one_d(Fp8Op op, const InputSet& in);
  Status run_two_d(Fp8Op op, const InputSet& in);
  Status run_amax_peers(const InputSet& in);
};

Status Runner::run_one_d(Fp8Op op, const InputSet& in) {
  const int64_t n = in.n;
  const size_t es = dtype_size(in.dtype);
  const std::string what = std::string(op_info(op).name) + " " + dtype_name(in.dtype) + " n=" + std::to_string(n);
  AmaxOptions aopts;
  aopts.algo = plan.algo;
  Timing t;
  int calls = 0;
  std::string check;
  if (op == Fp8Op::kAmax) {
    size_t ws_bytes = 0;
    EMBSCALE_RETURN_IF_ERROR(amax_workspace_size(ctx, TensorView::vec(in.copy(0), in.dtype, n), aopts, &ws_bytes));
    Buffer ws(plan.backend, ws_bytes);
    const double bytes = static_cast<double>(n) * es;
    EMBSCALE_RETURN_IF_ERROR(measure([&](int c) {
      return amax(ctx, TensorView::vec(in.copy(c), in.dtype, n), amax_ptr(), aopts, ws.data(), ws_bytes);
    }, &t, &calls));
    check = check_amax(in.amax);
    note_check(what, check);
    emit_record("amax", "embscale", in.dtype, n, false, bytes, t, calls, in.copies, true, check);
    return Status::Ok();
  }
  if (op == Fp8Op::kDequantize) {
    InputSet q;
    EMBSCALE_RETURN_IF_ERROR(
        make_fp8_input(ctx, plan.fp8, n, copies_for(round_up(n) + round_up(n * es), cache_bytes), plan.seed + 1, &q));
    OutputSet out;
    EMBSCALE_RETURN_IF_ERROR(make_output(plan.backend, n * es, q.copies, &out));
    const float scale_inv = 1.0f / 16.0f;
    EMBSCALE_RETURN_IF_ERROR(copy_to_backend(ctx, scale_inv_ptr(), &scale_inv, sizeof scale_inv));
    const double bytes = static_cast<double>(n) * (1 + es);
    EMBSCALE_RETURN_IF_ERROR(measure([&](int c) {
      return dequantize(ctx, TensorView::vec(q.copy(c), plan.fp8, n), scale_inv_ptr(),
                        TensorView::vec(out.copy(c), in.dtype, n));
    }, &t, &calls));
    emit_record("dequantize", "embscale", in.dtype, n, false, bytes, t, calls, q.copies, false, "");
    return Status::Ok();
  }
  OutputSet out;
  EMBSCALE_RETURN_IF_ERROR(make_output(plan.backend, n, in.copies, &out));
  if (op == Fp8Op::kQuantize) {
    // The scale a current-scaling step would use for this input.
    const float scale = fp8_max(plan.fp8) / in.amax;
    EMBSCALE_RETURN_IF_ERROR(copy_to_backend(ctx, scale_ptr(), &scale, sizeof scale));
    const double bytes = static_cast<double>(n) * (es + 1);
    EMBSCALE_RETURN_IF_ERROR(measure([&](int c) {
      return quantize(ctx, TensorView::vec(in.copy(c), in.dtype, n), scale_ptr(), TensorView::vec(out.copy(c), plan.fp8, n));
    }, &t, &calls));
    emit_record("quantize", "embscale", in.dtype, n, false, bytes, t, calls, in.copies, false, "");
    return Status::Ok();
  }
  // Current scaling: the two-pass floor (read x for amax, read it again for the cast, write fp8).
  CurrentScalingOptions copts;
  copts.amax = aopts;
  size_t ws_bytes = 0;
  EMBSCALE_RETURN_IF_ERROR(
      quantize_current_scaling_workspace_size(ctx, TensorView::vec(in.copy(0), in.dtype, n), copts, &ws_bytes));
  Buffer ws(plan.backend, ws_bytes);
  const double bytes = static_cast<double>(n) * (2 * es + 1);
  EMBSCALE_RETURN_IF_ERROR(measure([&](int c) {
    return quantize_current_scaling(ctx, TensorView::vec(in.copy(c), in.dtype, n), TensorView::vec(out.copy(c), plan.fp8, n),
                                    amax_ptr(), scale_ptr(), scale_inv_ptr(), copts, ws.data(), ws_bytes);
  }, &t, &calls));
  check = check_amax(in.amax);
  note_check(what, check);
  emit_record("quantize_current_scaling", "embscale", in.dtype, n, false, bytes, t, calls, in.copies, true, check);
  return Status::Ok();
}

Status Runner::run_two_d(Fp8Op op, const InputSet& in) {
  const int64_t rows = plan.rows, cols = plan.cols, n = rows * cols;
  const size_t es = dtype_size(in.dtype);
  const TensorView x0 = TensorView::mat(in.copy(0), in.dtype, rows, cols);
  Timing t;
  int calls = 0;
  if (op == Fp8Op::kActivationAmax) {
    AmaxOptions aopts;
    aopts.algo = plan.algo;
    size_t ws_bytes = 0;
    EMBSCALE_RETURN_IF_ERROR(activation_amax_workspace_size(ctx, x0, aopts, &ws_bytes));
    Buffer ws(plan.backend, ws_bytes);
    OutputSet out;
    EMBSCALE_RETURN_IF_ERROR(make_output(plan.backend, n * es, in.copies, &out));
    const double bytes = static_cast<double>(n) * 2 * es;
    EMBSCALE_RETURN_IF_ERROR(measure([&](int c) {
      return activation_amax(ctx, plan.act, TensorView::mat(in.copy(c), in.dtype, rows, cols),
                             TensorView::mat(out.copy(c), in.dtype, rows, cols), amax_ptr(), aopts, ws.data(), ws_bytes);
    }, &t, &calls));
    emit_record("activation_amax", "embscale", in.dtype, n, true, bytes, t, calls, in.copies, true, "");
    return Status::Ok();
  }
  const float scale = fp8_max(plan.fp8) / in.amax;
  EMBSCALE_RETURN_IF_ERROR(copy_to_backend(ctx, scale_ptr(), &scale, sizeof scale));
  OutputSet y, yt;
  EMBSCALE_RETURN_IF_ERROR(make_output(plan.backend, n, in.copies, &y));
  EMBSCALE_RETURN_IF_ERROR(make_output(plan.backend, n, in.copies, &yt));
  const double bytes = static_cast<double>(n) * (es + 2);
  EMBSCALE_RETURN_IF_ERROR(measure([&](int c) {
    return cast_transpose(ctx, TensorView::mat(in.copy(c), in.dtype, rows, cols), scale_ptr(),
                          TensorView::mat(y.copy(c), plan.fp8, rows, cols), TensorView::mat(yt.copy(c), plan.fp8, cols, rows));
  }, &t, &calls));
  emit_record("cast_transpose", "embscale", in.dtype, n, true, bytes, t, calls, in.copies, false, "");
  return Status::Ok();
}

Status Runner::run_amax_peers(const InputSet& in) {
#if EMBSCALE_WITH_CUDA
  const double bytes = static_cast<double>(in.n) * dtype_size(in.dtype);
  for (const peers::AmaxPeer p : peers::all_amax_peers()) {
    const std::string what = std::string("amax ") + peers::amax_peer_name(p) + " " + dtype_name(in.dtype) +
                             " n=" + std::to_string(in.n);
    size_t ws_bytes = 0;
    Status st = peers::amax_peer_workspace_size(p, in.dtype, in.n, &ws_bytes);
    if (st.code() == StatusCode::kUnsupported) {  // e.g. cub's 32-bit item count: not a failure of ours
      std::fprintf(stderr, "note: %s skipped: %s\n", what.c_str(), st.message().c_str());
      continue;
    }
    if (!st.ok()) {
      fail(what, st);
      continue;
    }
    Buffer ws(plan.backend, ws_bytes);
    Timing t;
    int calls = 0;
    st = measure([&](int c) {
      return peers::amax_peer(p, in.copy(c), in.dtype, in.n, amax_ptr(), ws.data(), ws_bytes, ctx.stream);
    }, &t, &calls);
    if (!st.ok()) {
      fail(what, st);
      continue;
    }
    const std::string check = check_amax(in.amax);
    note_check(what, check);
    emit_record("amax", peers::amax_peer_name(p), in.dtype, in.n, false, bytes, t, calls, in.copies, false, check);
  }
#else
  (void)in;
#endif
  return Status::Ok();
}

int run_fp8_bench(const Plan& plan) {
  Runner r(plan);
  if (!r.scalars.valid()) {
    std::fprintf(stderr, "error: could not allocate scalars on %s\n", backend_name(plan.backend));
    return 1;
  }
  // The ceiling: one copy of a buffer well beyond the cache.
  const size_t copy_bytes = std::max<size_t>(plan.backend == Backend::kCuda ? size_t{512} << 20 : size_t{128} << 20,
                                             4 * r.cache_bytes);
  Timing ct;
  const Status cst = copy_bandwidth(r.ctx, copy_bytes, &ct, &r.copy_gbps);
  if (!cst.ok() || !(r.copy_gbps > 0)) {
    r.fail("copy bandwidth", cst.ok() ? Status(StatusCode::kBackendError, "no bandwidth measured") : cst);
    return 1;
  }
  if (!plan.json)
    std::printf("embscale bench fp8: backend %s (%s), fp8 %s, algo %s, %d timed batches after %d warm-up\n",
                backend_name(plan.backend), device_name(plan.backend).c_str(), dtype_name(plan.fp8),
                amax_algo_name(plan.algo), plan.iters, plan.warmup);
  r.emit_copy(copy_bytes, ct);

  bool any_1d = false, any_2d = false;
  for (const Fp8Op op : plan.ops) (op_info(op).two_d ? any_2d : any_1d) = true;
  for (const DType dtype : plan.dtypes) {
    const size_t es = dtype_size(dtype);
    for (const int64_t n : any_1d ? plan.sizes : std::vector<int64_t>{}) {
      InputSet in;
      // Copies sized by the input alone (padding included); every op's outputs rotate with them.
      Status st = make_input(r.ctx, dtype, n, copies_for(round_up(static_cast<size_t>(n) * es), r.cache_bytes), plan.seed, &in);
      if (!st.ok()) {
        r.fail(std::string("input ") + dtype_name(dtype) + " n=" + std::to_string(n), st);
        continue;
      }
      for (const Fp8Op op : plan.ops) {
        if (op_info(op).two_d) continue;
        st = r.run_one_d(op, in);
        if (!st.ok()) r.fail(std::string(op_info(op).name) + " " + dtype_name(dtype) + " n=" + std::to_string(n), st);
        if (op == Fp8Op::kAmax && plan.peers) (void)r.run_amax_peers(in);
      }
    }
    if (any_2d) {
      const int64_t n = plan.rows * plan.cols;
      InputSet in;
      Status st = make_input(r.ctx, dtype, n, copies_for(round_up(static_cast<size_t>(n) * es), r.cache_bytes), plan.seed, &in);
      if (!st.ok()) {
        r.fail(std::string("input ") + dtype_name(dtype) + " " + std::to_string(plan.rows) + "x" + std::to_string(plan.cols), st);
        continue;
      }
      for (const Fp8Op op : plan.ops) {
        if (!op_info(op).two_d) continue;
        st = r.run_two_d(op, in);
        if (!st.ok())
          r.fail(std::string(op_info(op).name) + " " + dtype_name(dtype) + " " + std::to_string(plan.rows) + "x" +
                     std::to_string(plan.cols), st);
      }
    }
  }
  if (r.failures) std::fprintf(stderr, "embscale bench fp8: %d measurement(s) failed\n", r.failures);
  return r.failures ? 1 : 0;
}

// --dry-run: what each size would take (rotating copies, peak memory), as records with op "plan",
// without allocating or measuring anything.
int print_plan(const Plan& plan) {
  const size_t cache = last_level_cache_bytes(plan.backend);
  bool any_1d = false, any_2d = false;
  for (const Fp8Op op : plan.ops) (op_info(op).two_d ? any_2d : any_1d) = true;
  auto one = [&](DType dtype, int64_t n, bool two_d) {
    const size_t stride = round_up(static_cast<size_t>(n) * dtype_size(dtype));
    const MemoryNeed need = memory_need(plan.ops, two_d, n, dtype, cache);
    nlohmann::json r = base_record(plan.backend, plan.threads);
    r["op"] = "plan";
    r["dtype"] = dtype_name(dtype);
    r["n"] = n;
    if (two_d) {
      r["rows"] = plan.rows;
      r["cols"] = plan.cols;
    }
    r["copies"] = copies_for(stride, cache);
    r["stride_bytes"] = stride;
    r["cache_bytes"] = cache;
    r["peak_bytes"] = need.total.value();  // backend and host memory together (the same memory on the CPU)
    r["peak_device_bytes"] = need.device.value();
    r["peak_host_bytes"] = need.host.value();
    r["memory_bytes"] = usable_memory_bytes(plan.backend);
    const std::string size = two_d ? std::to_string(plan.rows) + "x" + std::to_string(plan.cols) : "n=" + std::to_string(n);
    emit(r, plan.json,
         "plan " + std::string(dtype_name(dtype)) + " " + size + ": " + std::to_string(copies_for(stride, cache)) +
             " rotating copies of " + format_bytes(stride) + ", peak " + format_bytes(need.total) + " (cache " +
             format_bytes(cache) + ")");
  };
  for (const DType dtype : plan.dtypes) {
    for (const int64_t n : any_1d ? plan.sizes : std::vector<int64_t>{}) one(dtype, n, false);
    if (any_2d) one(dtype, plan.rows * plan.cols, true);
  }
  return 0;
}

int run_from_args(const Fp8BenchArgs& args) {
  Plan plan;
  const Status st = make_plan(args, &plan);
  if (!st.ok()) return refuse(st.message());
  return args.dry_run ? print_plan(plan) : run_fp8_bench(plan);
}

void add_fp8_bench(CLI::App& bench, int* status) {
  auto args = std::make_shared<Fp8BenchArgs>();
  auto* sub = bench.add_subcommand("fp8", "FP8 current-scaling ops (and, on the GPU, the amax peers)");
  add_text_option(sub, "--backend", &args->backend, "cpu or cuda (default: cuda when a GPU is present)");
  add_list_option(sub, "--ops", &args->ops, "ops to time, comma-separated: " + join_names() + " (default: all)");
  add_list_option(sub, "--sizes", &args->sizes,
                  "element counts for the 1-D ops, e.g. 2^16,2^20,65536,64K (default: 2^16..2^28 on cuda, "
                  "2^16..2^24 on cpu)");
  add_list_option(sub, "--dtypes", &args->dtypes, "input dtypes: fp32, bf16, fp16 (default: fp32,bf16)");
  sub->add_option("--algo", args->algo, "amax algorithm: auto, atomic or two_stage")->capture_default_str();
  sub->add_option("--fp8", args->fp8, "fp8 format: e4m3 or e5m2")->capture_default_str();
  sub->add_option("--activation", args->activation, "activation_amax's activation: relu, gelu_tanh or silu")
      ->capture_default_str();
  add_text_option(sub, "--shape", &args->shape, "ROWSxCOLS for the 2-D ops (default: 8192x8192 on cuda, 2048x2048 on cpu)");
  add_integer_option(sub, "--warmup", &args->warmup, 0, kMaxBatches,
                     "untimed batches before timing (default: 3 on cuda, 1 on cpu)");
  add_integer_option(sub, "--iters", &args->iters, 1, kMaxBatches,
                     "timed batches; the median is reported (default: 30 on cuda, 7 on cpu)");
  add_unsigned_option(sub, "--seed", &args->seed, "input seed (0..2^64-1)");
  add_integer_option(sub, "--threads", &args->threads, 1, 1024, "CPU threads for the op (1..1024; default: OpenMP's, all cores); ignored on cuda");
  sub->add_flag("--json", args->json, "print one JSON record per measurement instead of text lines");
  sub->add_flag("--no-peers", args->no_peers, "skip the amax peers (te_atomic, te_two_stage, cub)");
  sub->add_flag("--dry-run", args->dry_run,
                "check the arguments and print each size's plan (rotating copies, peak memory) without running");
  sub->callback([args, status] { *status = run_from_args(*args); });
}

int run_fp8_defaults(Backend backend) {
  Fp8BenchArgs args;
  args.backend = backend_name(backend);
  return run_from_args(args);
}

const RegisterBench kRegisterFp8Bench({"fp8", add_fp8_bench, run_fp8_defaults});

}  // namespace
}  // namespace tools
}  // namespace embscale
