// Shared benchmark plumbing: timing (CUDA events on the GPU, steady_clock on the CPU), medians,
// the results record (one JSON object per measurement, the format of bench/results/*.jsonl) and the
// copy-bandwidth ceiling measured in the same run.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "embscale/context.h"
#include "embscale/status.h"

namespace embscale {
namespace tools {

struct TimingConfig {
  int warmup = 10;          // untimed calls first
  int repeats = 30;         // timed batches; the median batch is reported
  int calls_per_batch = 1;  // back-to-back calls inside one timed batch (for microsecond ops)
  bool warn_if_noisy = true;  // CPU: warn when the median is over kNoisyMedianOverMin x the best repeat
};

struct Timing {
  double median_us = 0;  // per call
  double min_us = 0;
  double max_us = 0;
};

// A CPU timing whose median is more than this factor above its best repeat prints a warning (stderr).
constexpr double kNoisyMedianOverMin = 1.10;

// Times `op(call_index)` on ctx. For CUDA, each batch is bracketed by events on ctx.stream; op must
// enqueue its work on that stream. call_index counts every call so op can rotate between input sets
// that together exceed the L2 cache.
Status time_op(const Context& ctx, const TimingConfig& cfg, const std::function<Status(int)>& op, Timing* out);

// Device-to-device (or host memcpy) copy bandwidth, bytes read + written per second, over `bytes`.
Status copy_bandwidth_gbps(const Context& ctx, size_t bytes, double* gbps);
// The same measurement with its timing: each timed call copies `bytes` one way (asynchronously on the
// GPU, so batches measure the copies and not host round trips; with all threads on the CPU).
Status copy_bandwidth(const Context& ctx, size_t bytes, Timing* t, double* gbps);

// Size of the cache that must be defeated for a measurement to reach memory: the GPU's L2, or the
// CPU's last-level cache (32 MiB when the system does not say).
size_t last_level_cache_bytes(Backend backend);

// Memory a benchmark may plan to use, for refusing sizes the machine cannot hold before allocating:
// the host's physical memory (lowered to the control group's limit when one is set), and for the CUDA
// backend the device's free memory. 0 when it cannot be determined (then no limit is applied).
size_t host_memory_bytes();
size_t usable_memory_bytes(Backend backend);

// Today's date as YYYY-MM-DD.
std::string today();

// A results record prefilled with date, device (as it names itself) and backend; on the CPU also the
// thread count the op ran with (`threads`, Context::num_threads; 0 means OpenMP's default).
nlohmann::json base_record(Backend backend, int threads = 0);

// Prints a record: as one JSON line when json is true, else via the caller's text line.
void emit(const nlohmann::json& record, bool json, const std::string& text_line);

double median(std::vector<double> v);

}  // namespace tools
}  // namespace embscale
