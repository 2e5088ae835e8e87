// `embscale bench tbe-backward` and `embscale bench tbe-train`: the library's backward fused with the
// optimizer, alone and after the forward, timed by the loop of bench_tbe_backward.h with the tuning the
// flags give. Sweeps of several tunings and the CUDA backward's phases on their own are
// `embscale-dev tbe-backward` (dev/).
#include <CLI/CLI.hpp>

#include <memory>

#include "bench_tbe_backward.h"
#include "registry.h"

namespace embscale {
namespace tools {
namespace {

void add_command(CLI::App& bench, int* status, bool train) {
  auto args = std::make_shared<BwdArgs>();
  auto* sub = bench.add_subcommand(train ? "tbe-train" : "tbe-backward",
                                   train ? "Table-batched embedding forward + backward + optimizer step"
                                         : "Table-batched embedding backward fused with the optimizer");
  add_backward_options(sub, args.get());
  sub->callback([args, status, train] { *status = run_tbe_backward(*args, train, nullptr); });
}

// Plain `embscale bench`: the default configuration (row-wise Adagrad); on CUDA uniform and Zipf(1.15).
int run_defaults(Backend backend, bool train) {
  BwdArgs a;
  a.common.backend = backend_name(backend);
  int rc = run_tbe_backward(a, train, nullptr);
  if (backend == Backend::kCuda) {
    a.common.alpha = 1.15;
    rc |= run_tbe_backward(a, train, nullptr);
  }
  return rc;
}

const RegisterBench kRegisterBackward({"tbe-backward", [](CLI::App& b, int* status) { add_command(b, status, false); },
                                       [](Backend be) { return run_defaults(be, false); }});
const RegisterBench kRegisterTrain({"tbe-train", [](CLI::App& b, int* status) { add_command(b, status, true); },
                                    [](Backend be) { return run_defaults(be, true); }});

}  // namespace
}  // namespace tools
}  // namespace embscale
