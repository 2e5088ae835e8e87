// The phases of the CUDA TBE backward timed on their own, through the library's internal steps
// (src/tbe/cuda/backward/tbe_backward_steps.cuh): linearize, sort, encode + classify, rows.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "embscale/tbe.h"

namespace embscale {
namespace dev {

// (name, median microseconds) of each phase, in launch order (tools::PhaseTimes).
// Times each phase of the backward with these arguments on its own (cfg's warmup and repeats), after a
// full call has run with the same arguments and workspace: every timed call prepares the call as the
// library does (tuning, layout, parameters) and runs that one step; linearize also runs the finishing
// step (skip mode's report). Each repeat of rows is one more optimizer step.
Status time_backward_phases(const Context& ctx, const TableBatchedEmbedding& tbe, const TbeBackwardArgs& args, void* ws,
                            size_t ws_bytes, const tools::TimingConfig& cfg,
                            std::vector<std::pair<std::string, double>>* out);

}  // namespace dev
}  // namespace embscale
