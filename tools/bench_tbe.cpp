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
// Flags, their validation, weights, input sets and record fields are shared with the backward and
// training benchmarks (tools/tbe_bench_common.h); the measuring loop with its spot check is
// bench_tbe_forward.cpp. Other launch shapes of the CUDA forward and the bare-gather ceiling are timed by
// embscale-dev (dev/README.md), never by this tool.
#include <CLI/CLI.hpp>

#include <memory>
#include <string>

#include "bench_tbe_forward.h"
#include "cli_args.h"
#include "embscale/tbe.h"
#include "registry.h"
#include "tbe_bench_common.h"

namespace embscale {
namespace tools {
namespace {

// Mixed dimensions are rounded up to a multiple of 4 (so mixed-D figures compare with FBGEMM's);
// --embedding-dim itself may be any D >= 1.
std::string forward_plan(const tbe_bench::Args& args, tbe_bench::Plan* p) {
  const std::string err = tbe_bench::make_plan(args, p, tbe_bench::MixedDims::kMultipleOf4);
  if (!err.empty()) return err;
  return tbe_bench::memory_refusal(args, *p, tbe_bench::Pass::kForward, 0);
}

int run_from_args(const tbe_bench::Args& a) {
  tbe_bench::Plan p;
  const std::string err = forward_plan(a, &p);
  if (!err.empty()) return refuse(err);
  TimedForward library;
  library.run = [](const Context& ctx, const TableBatchedEmbedding& tbe, const TbeForwardArgs& args) {
    return tbe.forward(ctx, args);
  };
  return run_tbe_forward(p, {library}, nullptr);
}

void add_tbe_bench(CLI::App& bench, int* status) {
  auto args = std::make_shared<tbe_bench::Args>();
  auto* sub = bench.add_subcommand("tbe-forward", "Table-batched embedding forward (FBGEMM benchmark flags)");
  tbe_bench::add_options(sub, args.get(), tbe_bench::MixedDims::kMultipleOf4);
  sub->callback([args, status] { *status = run_from_args(*args); });
}

// Plain `embscale bench`: the default configuration; on CUDA uniform and Zipf(1.15) as in ANCHORS.md.
int run_tbe_defaults(Backend backend) {
  tbe_bench::Args a;
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
