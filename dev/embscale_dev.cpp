// embscale-dev: the laboratory of the CUDA kernels, kept out of the library and the `embscale` CLI.
//   embscale-dev tbe-forward [the flags of `embscale bench tbe-forward`] [--variants LIST|all]
//       [--bags N] [--gather-ceiling] [--l2-fetch-bytes N]
// times the forward's compiled kernel shapes (tbe_forward_variants.cu) and bags per lane group in turn on the same inputs, with the same spot check and record fields as the CLI's benchmark
// plus the launch that was timed; optionally also a bare gather of the same rows (gather_ceiling.cu)
// and with the device's L2 fetch granularity hint set first.
//   embscale-dev tbe-backward [the flags of `embscale bench tbe-backward`] [--sweep-thresholds W:B:T,...]
// times the backward (the one tuning its flags give, or each tuning of the list in turn on the same
// inputs) with the same spot check and record fields as the CLI's benchmark, and then each of its
// phases on its own (tbe_backward_phases.cu): the record gains "phases". dev/README.md describes the
// workflow.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "bench_tbe_backward.h"
#include "bench_tbe_forward.h"
#include "cli_args.h"
#include "gather_ceiling.h"
#include "tbe_backward_phases.h"
#include "tbe_bench_common.h"
#include "tbe_forward_variants.h"

namespace embscale {
namespace dev {
namespace {

using tools::refuse;

struct ForwardArgs {
  tools::tbe_bench::Args common;
  std::string variants = "default";  // comma-separated names, or all
  int bags = 0;
  bool gather_ceiling = false;
  int l2_fetch_bytes = -1;  // -1: leave the device's setting
};

// The launches to time, or what is wrong with the flags ("--flag: reason").
std::string make_launches(const ForwardArgs& a, std::vector<FwdLaunch>* out) {
  std::vector<std::string> names;
  if (a.variants == "all") {
    for (const FwdVariant& v : fwd_variants()) names.emplace_back(v.name);
  } else {
    size_t pos = 0;
    while (pos <= a.variants.size()) {
      const size_t comma = std::min(a.variants.find(',', pos), a.variants.size());
      names.push_back(a.variants.substr(pos, comma - pos));
      pos = comma + 1;
    }
  }
  for (const std::string& name : names) {
    if (find_fwd_variant(name) == nullptr) {
      std::string list;
      for (const FwdVariant& v : fwd_variants()) list += (list.empty() ? "" : ", ") + std::string(v.name);
      return "--variants: unknown variant '" + name + "'; expected all or a list of " + list;
    }
    FwdLaunch l;
    l.variant = name;
    l.bags_per_group = a.bags;  // 0..64, checked when parsed
    out->push_back(l);
  }
  return "";
}

int run_tbe_forward(const ForwardArgs& a) {
  std::vector<FwdLaunch> launches;
  std::string err = make_launches(a, &launches);
  if (!err.empty()) return refuse(err);
  tools::tbe_bench::Plan p;
  err = tools::tbe_bench::make_plan(a.common, &p, tools::tbe_bench::MixedDims::kMultipleOf4);
  if (err.empty()) err = tools::tbe_bench::memory_refusal(a.common, p, tools::tbe_bench::Pass::kForward, 0);
  if (!err.empty()) return refuse(err);
  if (p.backend != Backend::kCuda) return refuse("--backend", "the forward's launch shapes are CUDA kernels; use cuda");
  if (a.gather_ceiling) {
    for (int f = 0; f < p.T; ++f) {
      const int64_t row_bytes = static_cast<int64_t>(p.dims[f]) * static_cast<int64_t>(dtype_size(p.w_dtype));
      if (row_bytes % 4 != 0)
        return refuse("--gather-ceiling", "needs rows of a multiple of 4 bytes (D * weight bytes = " +
                                              std::to_string(row_bytes) + ")");
    }
  }
  if (a.l2_fetch_bytes >= 0) {
    const Status st = set_l2_fetch_granularity(a.l2_fetch_bytes);
    if (!st.ok()) return tools::tbe_bench::fail("--l2-fetch-bytes", st);
  }
  std::vector<tools::TimedForward> forwards;
  for (const FwdLaunch& l : launches) {
    tools::TimedForward f;
    f.label = l.variant + (l.bags_per_group > 0 ? ", " + std::to_string(l.bags_per_group) + " bags/group" : "");
    f.fields["fwd_variant"] = l.variant;
    f.fields["fwd_bags_per_group"] = l.bags_per_group;
    if (a.l2_fetch_bytes >= 0) f.fields["l2_fetch_bytes"] = a.l2_fetch_bytes;
    f.run = [l](const Context& ctx, const TableBatchedEmbedding& tbe, const TbeForwardArgs& args) {
      return variant_forward(ctx, tbe, args, l);
    };
    forwards.push_back(f);
  }
  return tools::run_tbe_forward(p, forwards, a.gather_ceiling ? tools::GatherCeiling(gather_ceiling) : nullptr);
}

void add_tbe_forward(CLI::App& app, ForwardArgs* a) {
  auto* sub = app.add_subcommand("tbe-forward", "Time launch shapes of the CUDA TBE forward on the same inputs");
  tools::tbe_bench::add_options(sub, &a->common, tools::tbe_bench::MixedDims::kMultipleOf4);
  tools::add_text_option(sub, "--variants", &a->variants,
                         "compiled kernel shapes to time in turn (comma-separated names, or all; default: default)");
  tools::add_integer_option(sub, "--bags", &a->bags, 0, 64,
                            "bags each lane group walks (1..64; 0, the default: the policy's rule)");
  sub->add_flag("--gather-ceiling", a->gather_ceiling,
                "also time a bare gather of the same rows (no bags, no output) and report the forward as a share "
                "of it (rows a multiple of 4 bytes; mixed D allowed)");
  tools::add_integer_option(sub, "--l2-fetch-bytes", &a->l2_fetch_bytes, 0, 128,
                            "set the device's L2 fetch granularity hint (0..128 bytes) first; a device-wide "
                            "setting the library itself never changes (default: leave it)");
  sub->callback([a] { std::exit(run_tbe_forward(*a)); });
}

struct BackwardArgs {
  tools::BwdArgs bwd;
  std::string sweep_thresholds;  // "W:B:T,..." tunings timed in turn on the same inputs
};

// "W:B:T,W:B:T" -> tunings: every item exactly three fields, each an integer in 0..INT_MAX (0: the
// default). "" or what is wrong, for a message after --sweep-thresholds.
std::string parse_tunings(const std::string& text, std::vector<TbeBackwardTuning>* out) {
  const std::string form = "; expected W:B:T[,W:B:T...], three integers >= 0 per item (0: default)";
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    std::vector<std::string> fields;
    for (size_t at = 0;;) {
      const size_t colon = std::min(item.find(':', at), item.size());
      fields.push_back(item.substr(at, colon - at));
      if (colon == item.size()) break;
      at = colon + 1;
    }
    if (item.empty()) return "'" + text + "' has an empty item" + form;
    if (fields.size() != 3)
      return "'" + item + "' has " + std::to_string(fields.size()) + (fields.size() == 1 ? " field" : " fields") + form;
    int64_t v[3] = {0, 0, 0};
    for (int k = 0; k < 3; ++k) {
      std::string why;
      if (!tools::read_integer(fields[k], 0, INT_MAX, &v[k], &why)) return "item '" + item + "': " + why;
    }
    const int w = static_cast<int>(v[0]), b = static_cast<int>(v[1]), t = static_cast<int>(v[2]);
    const std::string problem = tools::tuning_problem(w, b, t, Backend::kCuda);
    if (!problem.empty()) return "item '" + item + "': " + problem;
    out->push_back(tools::bench_tuning(w, b, t));
    pos = comma + 1;
  }
  return "";
}

int run_tbe_backward(const BackwardArgs& a) {
  tools::BackwardSweep sweep;
  if (!a.sweep_thresholds.empty()) {
    const std::string problem = parse_tunings(a.sweep_thresholds, &sweep.tunings);
    if (!problem.empty()) return refuse("--sweep-thresholds", problem);
    sweep.tunings_flag = "--sweep-thresholds";
  }
  tools::tbe_bench::Plan p;
  const std::string err = tools::tbe_bench::make_plan(a.bwd.common, &p);
  if (!err.empty()) return refuse(err);
  if (p.backend != Backend::kCuda) return refuse("--backend", "the backward's phases are CUDA steps; use cuda");
  sweep.phases = time_backward_phases;
  return tools::run_tbe_backward(a.bwd, false, &sweep);
}

void add_tbe_backward(CLI::App& app, BackwardArgs* a) {
  auto* sub = app.add_subcommand("tbe-backward", "Time the CUDA TBE backward's tunings and phases on the same inputs");
  tools::add_backward_options(sub, &a->bwd);
  tools::add_text_option(sub, "--sweep-thresholds", &a->sweep_thresholds,
                         "W:B:T[,W:B:T...]: time each (max_warp_segment, max_block_segment, block_threads) in turn "
                         "on the same inputs (three integers >= 0 per item, 0: default; overrides the three "
                         "tuning options)");
  sub->callback([a] { std::exit(run_tbe_backward(*a)); });
}

}  // namespace
}  // namespace dev
}  // namespace embscale

int main(int argc, char** argv) {
  using namespace embscale;
  CLI::App app{"embscale-dev: kernel variants, sweeps and ceilings of the CUDA backend (never in the library)"};
  app.require_subcommand(1);
  auto forward_args = std::make_shared<dev::ForwardArgs>();
  dev::add_tbe_forward(app, forward_args.get());
  auto backward_args = std::make_shared<dev::BackwardArgs>();
  dev::add_tbe_backward(app, backward_args.get());
  // Refusals as in the embscale CLI: "error: <flag>: <reason>", exit 2 (tools/cli_args.h).
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return tools::report_parse_error(app, e);
  } catch (const tools::BadArgument& e) {
    return tools::refuse(e.flag(), e.reason());
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: %s: out of memory (a host allocation failed)\n", tools::command_path(app).c_str());
    return tools::kExitFailed;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s: %s\n", tools::command_path(app).c_str(), e.what());
    return tools::kExitFailed;
  }
  return 0;
}
