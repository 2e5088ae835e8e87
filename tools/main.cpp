// embscale command-line tool: `info`, `check [--backend cpu|cuda] [OP...]`, `bench [SUBCOMMAND]`.
// The check ops and bench subcommands register themselves (registry.h). Every command ends in main,
// through finish_stdout (output.h): results that could not be written make the exit status non-zero.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <iostream>
#include <new>
#include <thread>

#include "cli_args.h"
#include "embscale/context.h"
#include "embscale/memory.h"
#include "output.h"
#include "registry.h"

#ifndef EMBSCALE_VERSION
#define EMBSCALE_VERSION "0.1.0"
#endif

namespace embscale {
namespace tools {

std::vector<CheckOp>& check_ops() {
  static std::vector<CheckOp> ops;
  return ops;
}
std::vector<BenchCommand>& bench_commands() {
  static std::vector<BenchCommand> cmds;
  return cmds;
}

static Backend default_backend() { return backend_available(Backend::kCuda) ? Backend::kCuda : Backend::kCpu; }

static int run_info() {
  std::printf("embscale %s\n", EMBSCALE_VERSION);
  std::printf("backends: cpu%s\n", backend_compiled(Backend::kCuda) ? ", cuda" : " (built without CUDA)");
  std::printf("cpu: %s, %u hardware threads\n", device_name(Backend::kCpu).c_str(),
              std::thread::hardware_concurrency());
  if (backend_compiled(Backend::kCuda)) {
    if (backend_available(Backend::kCuda))
      std::printf("cuda: %s\n", device_name(Backend::kCuda).c_str());
    else
      std::printf("cuda: no device present\n");
  }
  std::printf("default backend: %s\n", backend_name(default_backend()));
  return 0;
}

static int run_check(const std::string& backend_str, uint64_t seed, bool verbose, bool list,
                     const std::vector<std::string>& names) {
  auto& ops = check_ops();
  std::sort(ops.begin(), ops.end(), [](const CheckOp& a, const CheckOp& b) { return a.name < b.name; });
  for (const auto& n : names) {
    if (std::none_of(ops.begin(), ops.end(), [&](const CheckOp& op) { return op.name == n; }))
      return refuse("ops", "unknown op '" + n + "' (see `embscale check --list`)");
  }
  if (list) {
    for (const auto& op : ops) std::printf("%-28s %s\n", op.name.c_str(), op.summary.c_str());
    return 0;
  }
  Backend backend = default_backend();
  if (!backend_str.empty() && !parse_backend(backend_str, &backend))
    return refuse("--backend", "unknown backend '" + backend_str + "' (expected cpu or cuda)");
  if (!backend_available(backend))
    return refuse("--backend", std::string(backend_name(backend)) + " is not available in this build or on this machine");
  std::printf("embscale check: backend %s, seed %llu\n", backend_name(backend),
              static_cast<unsigned long long>(seed));
  int failed = 0, ran = 0;
  for (const auto& op : ops) {
    if (!names.empty() && std::find(names.begin(), names.end(), op.name) == names.end()) continue;
    CheckArgs args;
    args.backend = backend;
    args.seed = seed;
    args.verbose = verbose;
    const CheckResult r = op.run(args);
    ++ran;
    if (!r.passed) ++failed;
    std::printf("%-4s %-28s %4d cases  %s\n", r.passed ? "ok" : "FAIL", op.name.c_str(), r.cases, r.detail.c_str());
    flush_stdout();
  }
  std::printf("%d ops checked, %d failed\n", ran, failed);
  return failed ? 1 : 0;
}

}  // namespace tools
}  // namespace embscale

int main(int argc, char** argv) {
  using namespace embscale;
  using namespace embscale::tools;
  CLI::App app{"embscale: table-batched embeddings and FP8 current scaling on CPU and CUDA"};
  app.require_subcommand(1);
  int status = 0;  // the exit status the command's callback stores

  app.add_subcommand("info", "Show the build, its backends and the devices present")->callback([&] {
    status = run_info();
  });

  auto* check = app.add_subcommand("check", "Run ops against the naive reference on seeded random inputs");
  std::string backend_str;
  uint64_t seed = 20261130;
  bool verbose = false, list = false;
  std::vector<std::string> names;
  add_text_option(check, "--backend", &backend_str, "cpu or cuda (default: cuda when a GPU is present)");
  add_unsigned_option(check, "--seed", &seed, "random seed (0..2^64-1)");
  check->add_flag("-v,--verbose", verbose, "print every case");
  check->add_flag("--list", list, "list the ops and exit");
  check->add_option("ops", names, "ops to check (default: all)");
  check->callback([&] { status = run_check(backend_str, seed, verbose, list, names); });

  auto* bench = app.add_subcommand("bench", "Benchmark ops (no subcommand: every benchmark with its defaults)");
  bench->require_subcommand(0, 1);
  for (const auto& cmd : bench_commands()) cmd.add(*bench, &status);
  bench->callback([&] {
    if (!bench->get_subcommands().empty()) return;  // the subcommand's own callback ran
    const Backend b = backend_available(Backend::kCuda) ? Backend::kCuda : Backend::kCpu;
    for (const auto& cmd : bench_commands()) status |= cmd.run_defaults(b);
  });

  // Every refusal exits 2 with "error: <flag>: <reason>" (cli_args.h); --help exits 0. The
  // subcommands run inside parse (their callbacks store the run's status), so a run that throws
  // (an allocation the machine cannot give) ends here too, with a message and status 1, never an abort.
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    status = app.exit(e);
  } catch (const CLI::ParseError& e) {
    status = report_parse_error(app, e);
  } catch (const BadArgument& e) {
    status = refuse(e.flag(), e.reason());
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: %s: out of memory (a host allocation failed); try smaller sizes\n",
                 command_path(app).c_str());
    status = kExitFailed;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s: %s\n", command_path(app).c_str(), e.what());
    status = kExitFailed;
  }
  return finish_stdout(status, command_path(app));
}
