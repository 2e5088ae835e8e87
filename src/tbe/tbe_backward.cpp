// Table-batched embeddings, API layer of the backward fused with the optimizer: optimizer names, and
// backward_workspace_size()/backward()'s host-side checks before dispatching to a backend.
//
// Everything the host can see is checked here, before a backend runs, so a refused call writes
// nothing: the lookup arguments as in the forward (tbe/tbe_validate.h), grad_output's shape and dtype
// per pooling mode, the optimizer's hyper-parameters (finite, in range), which state and output
// pointers are present (exactly those the optimizer uses) and the tuning hints. The workspace is checked
// by the backend against the layout it builds once per call (core/workspace.h), also before it writes.
// Values in backend memory (offsets, indices) are checked by the backend per args.bounds_check, also
// before it writes anything (tbe/tbe_backend.h).
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tbe/tbe_backend.h"
#include "tbe/tbe_validate.h"
#include "tbe/optimizer_table.h"
#include "embscale/tbe.h"

namespace embscale {

const char* optimizer_name(OptimizerType o) {
  const opt::OptimizerSpec* s = opt::optimizer_spec(o);
  return s != nullptr ? s->name : "unknown";
}

int num_optimizers() { return opt::kNumOptimizers; }

Status optimizer_info(OptimizerType optimizer, OptimizerInfo* out) {
  const opt::OptimizerSpec* s = opt::optimizer_spec(optimizer);
  if (s == nullptr) {
    return invalid_argument("optimizer: value " + std::to_string(static_cast<int>(optimizer)) + " is not one of 0.." +
                            std::to_string(opt::kNumOptimizers - 1));
  }
  if (out == nullptr) return invalid_argument("out: must not be null");
  const auto state = [](const opt::StateSpec& st) {
    return OptimizerStateInfo{static_cast<OptimizerStateLayout>(st.layout), st.name};
  };
  out->name = s->name;
  out->momentum1 = state(s->momentum1);
  out->momentum2 = state(s->momentum2);
  out->weight_decay = static_cast<OptimizerWeightDecay>(s->weight_decay);
  return Status::Ok();
}

bool parse_optimizer(const std::string& name, OptimizerType* out) {
  // The table's names, and FBGEMM's other names for the same optimizers (its EmbOptimType values:
  // "exact_sgd", "exact_row_wise_adagrad", "adam", "partial_row_wise_adam", "exact_adagrad", "lamb",
  // "partial_row_wise_lamb", "lars_sgd", "none").
  static const struct { const char* name; OptimizerType o; } kAliases[] = {
      {"dense", OptimizerType::kNone},
      {"exact_sgd", OptimizerType::kSgd},
      {"exact_rowwise_adagrad", OptimizerType::kRowwiseAdagrad},
      {"exact_row_wise_adagrad", OptimizerType::kRowwiseAdagrad},
      {"partial_row_wise_adam", OptimizerType::kPartialRowwiseAdam},
      {"exact_adagrad", OptimizerType::kAdagrad},
      {"partial_row_wise_lamb", OptimizerType::kPartialRowwiseLamb},
  };
  for (const opt::OptimizerSpec& s : opt::kOptimizerSpecs) {
    if (name == s.name) {
      if (out) *out = s.type;
      return true;
    }
  }
  for (const auto& e : kAliases) {
    if (name == e.name) {
      if (out) *out = e.o;
      return true;
    }
  }
  return false;
}

namespace {

// A hyper-parameter in a message: the shortest form that reads back as the same float (9 significant
// digits at most), so -1e-09 does not print as -0.000000.
std::string fstr(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(v));
  for (int digits = 1; digits < 9; ++digits) {
    char shorter[32];
    std::snprintf(shorter, sizeof shorter, "%.*g", digits, static_cast<double>(v));
    if (std::strtof(shorter, nullptr) == v) return shorter;
  }
  return buf;
}

}  // namespace

Status check_optimizer_params(const OptimizerParams& p) {
  const OptimizerType t = p.type;
  const opt::OptimizerSpec* spec = opt::optimizer_spec(t);
  if (spec == nullptr)
    return invalid_argument("optimizer.type: unknown optimizer " + std::to_string(static_cast<int>(t)));
  const std::string name = spec->name;
  if (!(std::isfinite(p.learning_rate) && p.learning_rate >= 0.0f))
    return invalid_argument("optimizer.learning_rate: " + fstr(p.learning_rate) + "; expected a finite value >= 0");
  if (p.step < 1) return invalid_argument("optimizer.step: " + std::to_string(p.step) + "; steps count from 1");
  if (spec->eps && !(std::isfinite(p.eps) && p.eps > 0.0f))
    return invalid_argument("optimizer.eps: " + fstr(p.eps) + "; " + name + " needs a finite eps > 0");
  if (spec->betas) {
    if (!(p.beta1 >= 0.0f && p.beta1 < 1.0f))
      return invalid_argument("optimizer.beta1: " + fstr(p.beta1) + " is outside [0, 1)");
    if (!(p.beta2 >= 0.0f && p.beta2 < 1.0f))
      return invalid_argument("optimizer.beta2: " + fstr(p.beta2) + " is outside [0, 1)");
  }
  const WeightDecayMode wm = p.weight_decay_mode;
  if (wm != WeightDecayMode::kNone && wm != WeightDecayMode::kL2 && wm != WeightDecayMode::kDecoupled)
    return invalid_argument("optimizer.weight_decay_mode: unknown mode " + std::to_string(static_cast<int>(wm)));
  if (!std::isfinite(p.weight_decay))
    return invalid_argument("optimizer.weight_decay: " + fstr(p.weight_decay) + " is not finite");
  if (spec->weight_decay == opt::DecayRule::kNone && wm != WeightDecayMode::kNone && p.weight_decay != 0.0f)
    return invalid_argument("optimizer.weight_decay: " + name + " applies no weight decay; set it to 0 or the mode to none");
  if (!(std::isfinite(p.max_norm) && p.max_norm >= 0.0f))
    return invalid_argument("optimizer.max_norm: " + fstr(p.max_norm) + "; expected a finite value >= 0");
  if (p.max_norm > 0.0f && !spec->max_norm)
    return invalid_argument("optimizer.max_norm: " + name + " does not support it");
  if (spec->lars) {
    if (!(std::isfinite(p.eta) && p.eta >= 0.0f))
      return invalid_argument("optimizer.eta: " + fstr(p.eta) + "; expected a finite value >= 0");
    if (!(p.momentum >= 0.0f && p.momentum < 1.0f))
      return invalid_argument("optimizer.momentum: " + fstr(p.momentum) + " is outside [0, 1)");
  }
  if (!(std::isfinite(p.gradient_clipping) && p.gradient_clipping >= 0.0f))
    return invalid_argument("optimizer.gradient_clipping: " + fstr(p.gradient_clipping) +
                            "; expected a finite value >= 0");
  if (t == OptimizerType::kNone && p.gradient_clipping > 0.0f)
    return invalid_argument("optimizer.gradient_clipping: dense-gradient mode (none) returns the unclipped gradient; "
                            "set it to 0");

  return Status::Ok();
}

namespace {

// The buffers a backward call writes and those it only reads (the workspace aside: backward() checks it
// against all of these).
struct BackwardRegions {
  std::array<check::Region, 8> written;
  std::array<check::Region, 5> read;
};
BackwardRegions backward_regions(const TbeBackwardArgs& a) {
  using check::region;
  return BackwardRegions{
      {region("weights", a.weights), region("momentum1", a.momentum1), region("momentum2", a.momentum2),
       region("grad_per_sample_weights", a.grad_per_sample_weights), region("unique_rows", a.unique_rows),
       region("unique_grads", a.unique_grads), check::scalar("num_unique", a.num_unique),
       check::scalar("num_skipped", a.num_skipped)},
      {region("indices", a.indices), region("offsets", a.offsets), region("per_sample_weights", a.per_sample_weights),
       region("grad_output", a.grad_output), region("rounding_bases", a.rounding_bases)}};
}

// State and dense-gradient outputs: present exactly when the optimizer uses them, fp32 (int64 for the
// unique rows) and of the length the layout gives.
Status check_buffers(const TableBatchedEmbedding& tbe, const TbeBackwardArgs& a) {
  using tbe_validate::check_view;
  const OptimizerType t = a.optimizer.type;
  const opt::OptimizerSpec& spec = *opt::optimizer_spec(t);  // check_optimizer_params ran first
  const std::string name = spec.name;
  const int64_t N = a.indices.numel();
  const struct { const char* name; const TensorView* v; opt::StateLayout layout; const char* what; } state[] = {
      {"momentum1", &a.momentum1, spec.momentum1.layout, "first moment"},
      {"momentum2", &a.momentum2, spec.momentum2.layout, "second moment"}};
  for (const auto& m : state) {
    const bool used = m.layout != opt::StateLayout::kAbsent, rowwise = m.layout == opt::StateLayout::kRowwise;
    const bool given = m.v->data != nullptr;
    if (used && !given) return invalid_argument(std::string(m.name) + ": absent, but " + name + " keeps a " + m.what);
    if (!used && given) return invalid_argument(std::string(m.name) + ": given, but " + name + " keeps no " + m.what);
    if (used)
      EMBSCALE_RETURN_IF_ERROR(tbe_validate::check_optional_f32(
          m.name, *m.v, rowwise ? tbe.total_rows() : tbe.num_weights(),
          rowwise ? "total_rows() (row-wise state)" : "num_weights() (element-wise state)"));
  }

  // Dense-gradient outputs: exactly in kNone mode. [N]-sized ones may be absent when there are no
  // lookups, as an empty tensor's data may be null.
  const bool dense = t == OptimizerType::kNone;
  const struct { const char* name; bool given; } outs[] = {{"unique_rows", a.unique_rows.data != nullptr},
                                                           {"num_unique", a.num_unique != nullptr},
                                                           {"unique_grads", a.unique_grads.data != nullptr}};
  for (const auto& o : outs) {
    const bool may_be_absent = N == 0 && std::string(o.name) != "num_unique";
    if (dense && !o.given && !may_be_absent)
      return invalid_argument(std::string(o.name) + ": absent, but dense-gradient mode (optimizer none) writes it");
    if (!dense && o.given)
      return invalid_argument(std::string(o.name) + ": given, but only dense-gradient mode (optimizer none) writes it; " +
                              name + " updates the weights instead");
  }
  if (a.unique_rows.data != nullptr) {
    EMBSCALE_RETURN_IF_ERROR(check_view("unique_rows", a.unique_rows));
    if (a.unique_rows.dtype != DType::kI64 || a.unique_rows.numel() != N)
      return invalid_argument(std::string("unique_rows: ") + dtype_name(a.unique_rows.dtype) + " with " +
                              std::to_string(a.unique_rows.numel()) + " elements; expected int64 [N] = [" +
                              std::to_string(N) + "]");
  }
  EMBSCALE_RETURN_IF_ERROR(tbe_validate::check_optional_f32("unique_grads", a.unique_grads, N * tbe.max_dim(),
                                                            "N * max_dim()"));
  if (a.grad_per_sample_weights.data != nullptr && a.per_sample_weights.data == nullptr)
    return invalid_argument("grad_per_sample_weights: given without per_sample_weights (the lookups are unweighted)");
  EMBSCALE_RETURN_IF_ERROR(tbe_validate::check_optional_f32("grad_per_sample_weights", a.grad_per_sample_weights, N,
                                                            "N (the number of indices)"));

  if (a.rounding_bases.data != nullptr) {
    EMBSCALE_RETURN_IF_ERROR(check_view("rounding_bases", a.rounding_bases));
    if (a.rounding_bases.dtype != DType::kI64 || a.rounding_bases.numel() != tbe.total_rows())
      return invalid_argument(std::string("rounding_bases: ") + dtype_name(a.rounding_bases.dtype) + " with " +
                              std::to_string(a.rounding_bases.numel()) + " elements; expected int64 [total_rows()] = [" +
                              std::to_string(tbe.total_rows()) + "]");
  }

  // What the backward writes must not share memory with anything else it reads or writes.
  const BackwardRegions r = backward_regions(a);
  return check::disjoint(r.written.data(), r.written.size(), r.read.data(), r.read.size());
}

// Every buffer in memory the backend can use (on CUDA: the current device's), each asked about once per handle.
Status check_memory(const TableBatchedEmbedding& tbe, const Context& ctx, const TbeBackwardArgs& a) {
  const struct { const char* name; const void* p; } all[] = {
      {"weights", a.weights.data},
      {"indices", a.indices.data},
      {"offsets", a.offsets.data},
      {"per_sample_weights", a.per_sample_weights.data},
      {"grad_output", a.grad_output.data},
      {"momentum1", a.momentum1.data},
      {"momentum2", a.momentum2.data},
      {"grad_per_sample_weights", a.grad_per_sample_weights.data},
      {"unique_rows", a.unique_rows.data},
      {"num_unique", a.num_unique},
      {"unique_grads", a.unique_grads.data},
      {"num_skipped", a.num_skipped},
      {"rounding_bases", a.rounding_bases.data}};
  for (const auto& b : all) EMBSCALE_RETURN_IF_ERROR(check::memory(ctx, b.name, b.p, tbe.known_pointers()));
  return Status::Ok();
}

// Everything but the workspace.
Status check_backward(const TableBatchedEmbedding& tbe, const Context& ctx, const TbeBackwardArgs& a) {
  EMBSCALE_RETURN_IF_ERROR(tbe_validate::check_lookup_args(
      tbe, ctx,
      {&a.weights, &a.indices, &a.offsets, &a.per_sample_weights, a.batch_size, a.pooling, a.bounds_check}));
  const int64_t B = a.batch_size;
  const int64_t N = a.indices.numel();

  EMBSCALE_RETURN_IF_ERROR(tbe_validate::check_output("grad_output", a.grad_output, tbe, a.pooling, B, N));

  EMBSCALE_RETURN_IF_ERROR(check_optimizer_params(a.optimizer));
  EMBSCALE_RETURN_IF_ERROR(check_buffers(tbe, a));
  EMBSCALE_RETURN_IF_ERROR(check_memory(tbe, ctx, a));
  if (a.rounding != WeightRounding::kNearest && a.rounding != WeightRounding::kStochastic)
    return invalid_argument("rounding: unknown mode " + std::to_string(static_cast<int>(a.rounding)));
  if (a.tuning.max_warp_segment < 0)
    return invalid_argument("tuning.max_warp_segment: " + std::to_string(a.tuning.max_warp_segment) + " is negative");
  if (a.tuning.max_block_segment < 0)
    return invalid_argument("tuning.max_block_segment: " + std::to_string(a.tuning.max_block_segment) + " is negative");
  if (a.tuning.block_threads < 0)
    return invalid_argument("tuning.block_threads: " + std::to_string(a.tuning.block_threads) + " is negative");
  return Status::Ok();
}

Status dispatch_workspace_size(const TableBatchedEmbedding& tbe, const Context& ctx, const TbeBackwardArgs& a,
                               size_t* bytes) {
  if (ctx.backend == Backend::kCpu) return cpu::tbe_backward_workspace_size(tbe, a, bytes);
#if EMBSCALE_WITH_CUDA
  return cuda::tbe_backward_workspace_size(tbe, a, bytes);
#else
  return unsupported("ctx: this build of embscale has no CUDA backend");
#endif
}

}  // namespace

Status TableBatchedEmbedding::backward_workspace_size(const Context& ctx, const TbeBackwardArgs& args,
                                                      size_t* bytes) const {
  if (bytes == nullptr) return invalid_argument("bytes: must not be null");
  *bytes = 0;
  EMBSCALE_RETURN_IF_ERROR(check_backward(*this, ctx, args));
  return dispatch_workspace_size(*this, ctx, args, bytes);
}

Status TableBatchedEmbedding::backward(const Context& ctx, const TbeBackwardArgs& args, void* workspace,
                                       size_t workspace_bytes) const {
  EMBSCALE_RETURN_IF_ERROR(check_backward(*this, ctx, args));
  // The workspace is written too: none of its bytes may be another argument's.
  const BackwardRegions r = backward_regions(args);
  const check::Region ws{"workspace", workspace, workspace_bytes};
  EMBSCALE_RETURN_IF_ERROR(check::disjoint(&ws, 1, r.written.data(), r.written.size()));
  EMBSCALE_RETURN_IF_ERROR(check::disjoint(&ws, 1, r.read.data(), r.read.size()));
  // The backend builds the workspace layout of this call once and checks the workspace against it.
  if (ctx.backend == Backend::kCpu) return cpu::tbe_backward(ctx, *this, args, workspace, workspace_bytes);
#if EMBSCALE_WITH_CUDA
  return cuda::tbe_backward(ctx, *this, args, workspace, workspace_bytes);
#else
  return unsupported("ctx: this build of embscale has no CUDA backend");
#endif
}

}  // namespace embscale
