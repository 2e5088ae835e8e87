// embscale-dev: the laboratory of the CUDA kernels, kept out of the library and the `embscale` CLI.
//   embscale-dev tbe-forward [the flags of `embscale bench tbe-forward`] [--variants LIST|all]
//       [--order tile|feature] [--bags N] [--gather-ceiling] [--l2-fetch-bytes N]
// times the forward's compiled kernel shapes (tbe_forward_variants.cu), grid orders and bags per lane
// group in turn on the same inputs, with the same spot check and record fields as the CLI's benchmark
// plus the launch that was timed; optionally also a bare gather of the same rows (gather_ceiling.cu)
// and with the device's L2 fetch granularity hint set first. dev/README.md describes the workflow.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "bench_tbe_forward.h"
#include "cli_args.h"
#include "gather_ceiling.h"
#include "tbe_bench_common.h"
#include "tbe_forward_variants.h"

namespace embscale {
namespace dev {
namespace {

using tools::refuse;

struct ForwardArgs {
  tools::tbe_bench::Args common;
  std::string variants = "default";  // comma-separated names, or all
  std::string order = "tile";
  int bags = 0;
  bool gather_ceiling = false;
  int l2_fetch_bytes = -1;  // -1: leave the device's setting
};

// The launches to time, or what is wrong with the flags ("--flag: reason").
std::string make_launches(const ForwardArgs& a, std::vector<FwdLaunch>* out) {
  if (a.order != "tile" && a.order != "feature") return "--order: '" + a.order + "'; expected tile or feature";
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
    l.feature_inner = a.order == "feature";
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
    f.label = l.variant + (l.feature_inner ? ", feature order" : "") +
              (l.bags_per_group > 0 ? ", " + std::to_string(l.bags_per_group) + " bags/group" : "");
    f.fields["fwd_variant"] = l.variant;
    f.fields["fwd_order"] = l.feature_inner ? "feature" : "tile";
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
  tools::add_text_option(sub, "--order", &a->order, "grid order: tile (bag tiles, features) or feature");
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

}  // namespace
}  // namespace dev
}  // namespace embscale

int main(int argc, char** argv) {
  using namespace embscale;
  CLI::App app{"embscale-dev: kernel variants, sweeps and ceilings of the CUDA backend (never in the library)"};
  app.require_subcommand(1);
  auto forward_args = std::make_shared<dev::ForwardArgs>();
  dev::add_tbe_forward(app, forward_args.get());
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
