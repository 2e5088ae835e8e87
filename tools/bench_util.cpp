// Benchmark plumbing (bench_util.h). CUDA event timing lives in timer_cuda.cu so this file needs no
// CUDA headers.
#include "bench_util.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <limits>

#include <unistd.h>

#include <omp.h>

#include "embscale/memory.h"
#include "output.h"

namespace embscale {
namespace tools {

#if EMBSCALE_WITH_CUDA
// timer_cuda.cu: per-batch milliseconds of `batches` timed batches after `warmup` calls.
Status cuda_time_batches(void* stream, int warmup, int batches, int calls_per_batch,
                         const std::function<Status(int)>& op, std::vector<double>* batch_ms);
Status cuda_copy_async(void* dst, const void* src, size_t bytes, void* stream);
size_t cuda_l2_bytes();
size_t cuda_free_memory_bytes();
#endif

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

Status time_op(const Context& ctx, const TimingConfig& cfg, const std::function<Status(int)>& op, Timing* out) {
  if (cfg.repeats < 1 || cfg.calls_per_batch < 1 || cfg.warmup < 0)
    return invalid_argument("timing: repeats and calls_per_batch must be >= 1, warmup >= 0");
  std::vector<double> per_call_us;
  if (ctx.backend == Backend::kCuda) {
#if EMBSCALE_WITH_CUDA
    std::vector<double> ms;
    EMBSCALE_RETURN_IF_ERROR(cuda_time_batches(ctx.stream, cfg.warmup, cfg.repeats, cfg.calls_per_batch, op, &ms));
    for (double m : ms) per_call_us.push_back(m * 1000.0 / cfg.calls_per_batch);
#else
    return unsupported("timing: built without CUDA");
#endif
  } else {
    int call = 0;
    for (int i = 0; i < cfg.warmup; ++i) EMBSCALE_RETURN_IF_ERROR(op(call++));
    for (int r = 0; r < cfg.repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int c = 0; c < cfg.calls_per_batch; ++c) EMBSCALE_RETURN_IF_ERROR(op(call++));
      const auto t1 = std::chrono::steady_clock::now();
      per_call_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / cfg.calls_per_batch);
    }
  }
  out->median_us = median(per_call_us);
  out->min_us = *std::min_element(per_call_us.begin(), per_call_us.end());
  out->max_us = *std::max_element(per_call_us.begin(), per_call_us.end());
  if (cfg.warn_if_noisy && ctx.backend == Backend::kCpu && out->median_us > kNoisyMedianOverMin * out->min_us) {
    // A typical repeat much slower than the best one: other work shares the cores, or more threads run
    // than the machine gives this process. The figure is then the machine's load as much as the op's.
    std::fprintf(stderr,
                 "warning: repeated CPU timings differ by more than %.0f%% (best %.1f us, median %.1f us): the "
                 "machine is busy or runs more threads than it has free cores; try --threads 1 or an idle machine\n",
                 (kNoisyMedianOverMin - 1.0) * 100.0, out->min_us, out->median_us);
  }
  return Status::Ok();
}

// Host copy split across all threads, in 1 MiB pieces, so the CPU ceiling is the machine's and not one
// core's.
static void parallel_memcpy(void* dst, const void* src, size_t bytes) {
  constexpr size_t kPiece = size_t{1} << 20;
  const int64_t pieces = static_cast<int64_t>((bytes + kPiece - 1) / kPiece);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < pieces; ++i) {
    const size_t off = static_cast<size_t>(i) * kPiece;
    std::memcpy(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off, std::min(kPiece, bytes - off));
  }
}

static Status copy_async(const Context& ctx, void* dst, const void* src, size_t bytes) {
  if (ctx.backend == Backend::kCpu) {
    parallel_memcpy(dst, src, bytes);
    return Status::Ok();
  }
#if EMBSCALE_WITH_CUDA
  return cuda_copy_async(dst, src, bytes, ctx.stream);
#else
  return unsupported("copy bandwidth: built without CUDA");
#endif
}

Status copy_bandwidth(const Context& ctx, size_t bytes, Timing* t, double* gbps) {
  if (bytes == 0) return invalid_argument("copy bandwidth: bytes must be > 0");
  Buffer a(ctx.backend, bytes), b(ctx.backend, bytes);
  if (!a.valid() || !b.valid()) return Status(StatusCode::kBackendError, "copy bandwidth: allocation failed");
  EMBSCALE_RETURN_IF_ERROR(fill_bytes(ctx, a.data(), 1, bytes));
  EMBSCALE_RETURN_IF_ERROR(fill_bytes(ctx, b.data(), 2, bytes));
  TimingConfig cfg;
  cfg.warmup = 3;
  cfg.repeats = ctx.backend == Backend::kCuda ? 20 : 7;
  EMBSCALE_RETURN_IF_ERROR(time_op(ctx, cfg, [&](int i) {
    return (i % 2) ? copy_async(ctx, a.data(), b.data(), bytes) : copy_async(ctx, b.data(), a.data(), bytes);
  }, t));
  *gbps = 2.0 * static_cast<double>(bytes) / (t->median_us * 1e-6) / 1e9;
  return Status::Ok();
}

Status copy_bandwidth_gbps(const Context& ctx, size_t bytes, double* gbps) {
  Timing t;
  return copy_bandwidth(ctx, bytes, &t, gbps);
}

size_t last_level_cache_bytes(Backend backend) {
  if (backend == Backend::kCuda) {
#if EMBSCALE_WITH_CUDA
    const size_t l2 = cuda_l2_bytes();
    if (l2 > 0) return l2;
#endif
    return size_t{60} << 20;
  }
  // The largest cache index the kernel lists for cpu0 (sizes like "32768K" or "32M").
  size_t best = 0;
  for (int idx = 0; idx < 8; ++idx) {
    std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(idx) + "/size");
    std::string text;
    if (!(in >> text) || text.empty()) continue;
    size_t value = 0, pos = 0;
    while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') value = value * 10 + (text[pos++] - '0');
    if (pos < text.size() && (text[pos] == 'K' || text[pos] == 'k')) value <<= 10;
    if (pos < text.size() && (text[pos] == 'M' || text[pos] == 'm')) value <<= 20;
    best = std::max(best, value);
  }
  return best > 0 ? best : size_t{32} << 20;
}

// A limit in bytes from a control-group file ("max" or unreadable: none).
static size_t cgroup_limit(const char* path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text.empty() || text.find_first_not_of("0123456789") != std::string::npos || text.size() > 19)
    return 0;
  return static_cast<size_t>(std::stoull(text));
}

size_t host_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  size_t bytes = 0;
  if (pages > 0 && page > 0 && static_cast<size_t>(pages) <= std::numeric_limits<size_t>::max() / static_cast<size_t>(page))
    bytes = static_cast<size_t>(pages) * static_cast<size_t>(page);
  // cgroup v2, then v1 (which reports a huge number when unlimited; the minimum takes care of it).
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    const size_t limit = cgroup_limit(path);
    if (limit > 0) bytes = bytes > 0 ? std::min(bytes, limit) : limit;
  }
  return bytes;
}

size_t usable_memory_bytes(Backend backend) {
  if (backend == Backend::kCuda) {
#if EMBSCALE_WITH_CUDA
    return cuda_free_memory_bytes();
#else
    return 0;
#endif
  }
  return host_memory_bytes();
}

std::string today() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

nlohmann::json base_record(Backend backend, int threads) {
  nlohmann::json r;
  r["date"] = today();
  r["device"] = device_name(backend);
  r["backend"] = backend_name(backend);
  if (backend == Backend::kCpu) r["threads"] = threads > 0 ? threads : omp_get_max_threads();
  return r;
}

void emit(const nlohmann::json& record, bool json, const std::string& text_line) {
  if (json)
    std::printf("%s\n", record.dump().c_str());
  else
    std::printf("%s\n", text_line.c_str());
  flush_stdout();
}

}  // namespace tools
}  // namespace embscale
