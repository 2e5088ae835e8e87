#include "tbe_backward_phases.h"

#include <string>
#include <utility>
#include <vector>

#include "tbe/cuda/backward/tbe_backward_steps.cuh"

namespace embscale {
namespace dev {

Status time_backward_phases(const Context& ctx, const TableBatchedEmbedding& tbe, const TbeBackwardArgs& args, void* ws,
                            size_t ws_bytes, const tools::TimingConfig& cfg,
                            std::vector<std::pair<std::string, double>>* out) {
  using Step = Status (*)(const cuda::TbeBackwardCall&);
  const struct {
    const char* name;
    Step step;
    bool finish;  // also the finishing step (skip mode reads its report back after linearize)
  } kPhases[] = {{"linearize", cuda::tbe_backward_linearize, true},
                 {"sort", cuda::tbe_backward_sort, false},
                 {"encode", cuda::tbe_backward_encode, false},
                 {"rows", cuda::tbe_backward_rows, false}};
  out->clear();
  for (const auto& ph : kPhases) {
    tools::Timing t;
    const Status st = tools::time_op(
        ctx, cfg,
        [&](int) {
          cuda::TbeBackwardCall call;
          EMBSCALE_RETURN_IF_ERROR(cuda::tbe_backward_prepare(ctx, tbe, args, ws, ws_bytes, &call));
          EMBSCALE_RETURN_IF_ERROR(ph.step(call));
          return ph.finish ? cuda::tbe_backward_finish(call) : Status::Ok();
        },
        &t);
    if (!st.ok()) return Status(st.code(), std::string("phase ") + ph.name + ": " + st.message());
    out->emplace_back(ph.name, t.median_us);
  }
  return Status::Ok();
}

}  // namespace dev
}  // namespace embscale
