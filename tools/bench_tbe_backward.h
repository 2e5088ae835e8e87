// The measuring loop of `embscale bench tbe-backward` and `embscale bench tbe-train`, shared with the
// dev tools (dev/), which time several tunings in turn and the CUDA backward's phases on the same inputs.
#pragma once

#include <CLI/CLI.hpp>
#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "embscale/tbe.h"
#include "tbe_bench_common.h"

namespace embscale {
namespace tools {

// The command line of the backward benchmarks: the forward's flags plus the optimizer and the tuning.
struct BwdArgs {
  tbe_bench::Args common;
  std::string optimizer = "rowwise_adagrad";
  int max_warp_segment = 0;
  int max_block_segment = 0;
  int block_threads = 0;
  float learning_rate = 0.1f;  // FBGEMM's benchmark default (row-wise Adagrad lr=0.1, eps=0.1)
  std::string rounding = "stochastic";  // fp16/bf16 weights: TbeBackwardArgs::rounding (the library's default)
};

// Adds BwdArgs's flags to a subcommand.
void add_backward_options(CLI::App* sub, BwdArgs* a);

// A tuning as the benchmarks pass it: a warp limit above the default block limit
// (TbeBackwardTuning::kDefaultMaxBlockSegment) alone raises the block limit to the same value.
TbeBackwardTuning bench_tuning(int max_warp, int max_block, int threads);

// "" or what is wrong with a tuning (max_warp, max_block, threads; 0: the default) on a backend, for a
// message after the flag that gave it.
std::string tuning_problem(int max_warp, int max_block, int threads, Backend backend);

// Phases of one backward timed on their own: (name, median microseconds), in launch order.
using PhaseTimes = std::vector<std::pair<std::string, double>>;
// Times the phases of the backward with these arguments, after one full call has run with them on
// this workspace; cfg gives the warmup and repeats of each.
using BackwardPhases = std::function<Status(const Context& ctx, const TableBatchedEmbedding& tbe,
                                            const TbeBackwardArgs& args, void* ws, size_t ws_bytes,
                                            const TimingConfig& cfg, PhaseTimes* out)>;

// What a dev tool adds to the CLI's run.
struct BackwardSweep {
  std::vector<TbeBackwardTuning> tunings;  // timed in turn, one record each;
                                           // empty: the one the tuning flags give
  std::string tunings_flag;                // the flag that gave them, named when the library refuses one
  BackwardPhases phases;                   // backward only; records gain "phases" ({name}_us) when set
};

// Builds the plan's module and input sets, checks the dense gradients of a sample of unique rows of
// set 0 against a host sum, then times each tuning in turn (one record each): the one the flags give,
// or the sweep's (the sweep may be null). Returns the process exit code.
int run_tbe_backward(const BwdArgs& a, bool train, const BackwardSweep* sweep);

}  // namespace tools
}  // namespace embscale
