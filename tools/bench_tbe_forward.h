// The measuring loop of `embscale bench tbe-forward`, shared with the dev tools (dev/), which time other
// launch shapes of the CUDA forward and a bare-gather ceiling on the same inputs.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "embscale/tbe.h"
#include "tbe_bench_common.h"

namespace embscale {
namespace tools {

// One forward to time: the library's (empty label and fields) or another launch of it.
struct TimedForward {
  std::string label;      // "" or a name appended to the text line in brackets
  nlohmann::json fields;  // extra record fields (an object; may be empty)
  std::function<Status(const Context&, const TableBatchedEmbedding&, const TbeForwardArgs&)> run;
};

// A bare gather of the looked-up rows: byte_offsets [N] of each row in `weights` (device memory),
// row_bytes one size or one per row. Times cfg's calls into *t.
using GatherCeiling = std::function<Status(const Context& ctx, const void* weights,
                                           const std::vector<int64_t>& byte_offsets,
                                           const std::vector<int32_t>& row_bytes, const TimingConfig& cfg, Timing* t)>;

// Builds the plan's module and input sets, then for each forward in turn: a spot check of set 0 against
// the host reference, the timing, one record. With a gather ceiling (may be empty) its time is measured
// once and every record states the forward as a share of it. Returns the process exit code.
int run_tbe_forward(const tbe_bench::Plan& p, const std::vector<TimedForward>& forwards,
                    const GatherCeiling& gather_ceiling);

}  // namespace tools
}  // namespace embscale
