// How the CLI's pieces find each other: each capability's check and bench file registers itself with
// a static Registrar, so adding an op never edits main.cpp.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "embscale/context.h"

namespace CLI {
class App;
}

namespace embscale {
namespace tools {

struct CheckArgs {
  Backend backend = Backend::kCpu;
  uint64_t seed = 0;
  bool verbose = false;
};

struct CheckResult {
  bool passed = true;
  int cases = 0;       // how many (dtype, size, option) combinations ran
  std::string detail;  // first mismatch, or a short summary
};

// Counts one case of a check whose outcome has a `failure` ("" when it passed) and whose case has a
// describe(): prints it with --verbose and keeps the first failure as the detail.
template <typename Outcome, typename Case>
void record_case(const CheckArgs& args, const Outcome& o, const Case& c, CheckResult* res) {
  ++res->cases;
  if (args.verbose) std::printf("  %s %s\n", o.failure.empty() ? "ok  " : "FAIL", c.describe().c_str());
  if (!o.failure.empty() && res->passed) {
    res->passed = false;
    res->detail = o.failure;
  }
}

// One `embscale check` op: runs the backend against the naive reference on seeded random inputs.
struct CheckOp {
  std::string name;     // e.g. "amax", "tbe_forward"
  std::string summary;  // one line for --list
  std::function<CheckResult(const CheckArgs&)> run;
};

// One `embscale bench` subcommand. `add` creates the subcommand under `bench`: its options, and a callback
// that runs it and stores the run's exit status in *status (main ends the command with it);
// `run_defaults` runs it with its defaults on `backend` (plain `embscale bench` runs all of them).
struct BenchCommand {
  std::string name;
  std::function<void(CLI::App& bench, int* status)> add;
  std::function<int(Backend backend)> run_defaults;
};

std::vector<CheckOp>& check_ops();
std::vector<BenchCommand>& bench_commands();

struct RegisterCheck {
  explicit RegisterCheck(CheckOp op) { check_ops().push_back(std::move(op)); }
};
struct RegisterBench {
  explicit RegisterBench(BenchCommand cmd) { bench_commands().push_back(std::move(cmd)); }
};

}  // namespace tools
}  // namespace embscale
