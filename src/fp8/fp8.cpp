// Public FP8 entry points (fp8.h): names and parsing, the scalar scale rule, and for every op the
// argument checks followed by the dispatch to the CPU or CUDA backend (fp8/fp8_backend.h).
//
// Everything a backend may assume is established here, once: pointers are non-null where data is
// needed, dtypes are supported, element counts and 2-D shapes agree, data pointers are aligned to
// their element size, the workspace is large enough, and the amax algorithm is one of AmaxAlgo's.
// The arguments' own faults come first and the workspace's last, so that a call with both gets the same
// error on every backend (the workspace a call needs differs between them).
#include <cmath>
#include <string>

#include "core/check.h"
#include "fp8/fp8_backend.h"
#include "core/numerics.h"
#include "core/workspace.h"
#include "core/scaling.h"
#include "embscale/fp8.h"

namespace embscale {

float fp8_max(DType fp8_dtype) {
  if (fp8_dtype == DType::kF8E4M3) return kFp8E4M3Max;
  if (fp8_dtype == DType::kF8E5M2) return kFp8E5M2Max;
  return 0.0f;
}

const char* amax_algo_name(AmaxAlgo a) {
  switch (a) {
    case AmaxAlgo::kAuto: return "auto";
    case AmaxAlgo::kAtomic: return "atomic";
    case AmaxAlgo::kTwoStage: return "two_stage";
  }
  return "unknown";
}

bool parse_amax_algo(const std::string& name, AmaxAlgo* out) {
  AmaxAlgo a;
  if (name == "auto") {
    a = AmaxAlgo::kAuto;
  } else if (name == "atomic") {
    a = AmaxAlgo::kAtomic;
  } else if (name == "two_stage" || name == "two-stage") {
    a = AmaxAlgo::kTwoStage;
  } else {
    return false;
  }
  if (out) *out = a;
  return true;
}

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::kRelu: return "relu";
    case Activation::kGeluTanh: return "gelu_tanh";
    case Activation::kSilu: return "silu";
  }
  return "unknown";
}

bool parse_activation(const std::string& name, Activation* out) {
  Activation a;
  if (name == "relu") {
    a = Activation::kRelu;
  } else if (name == "gelu_tanh" || name == "gelu") {
    a = Activation::kGeluTanh;
  } else if (name == "silu" || name == "swish") {
    a = Activation::kSilu;
  } else {
    return false;
  }
  if (out) *out = a;
  return true;
}

float scale_from_amax(float amax, float fp8_max_value, const ScaleOptions& opts) {
  return scale_from_amax_rule(amax, fp8_max_value, opts.eps, opts.power_of_2);
}

namespace {

using check::shape_str;

Status check_context(const Context& ctx) { return check::context(ctx); }

// Shape sanity: ndim in [0, kMaxDims], no negative extent, numel representable.
Status check_shape(const char* name, const TensorView& t) { return check::shape(name, t, 0); }

// Data pointer: required unless the tensor is empty; aligned to the element size.
Status check_data(const char* name, const TensorView& t) { return check::data(name, t); }

Status check_float_tensor(const Context& ctx, const char* name, const TensorView& t, bool need_data) {
  if (!is_float_dtype(t.dtype))
    return invalid_argument(std::string(name) + ": dtype " + dtype_name(t.dtype) + " is not supported; expected fp32, fp16 or bf16");
  EMBSCALE_RETURN_IF_ERROR(check_shape(name, t));
  if (!need_data) return Status::Ok();
  EMBSCALE_RETURN_IF_ERROR(check_data(name, t));
  return check::memory(ctx, name, t.data);
}

Status check_fp8_tensor(const Context& ctx, const char* name, const TensorView& t) {
  if (!is_fp8_dtype(t.dtype))
    return invalid_argument(std::string(name) + ": dtype " + dtype_name(t.dtype) + " is not supported; expected fp8e4m3 or fp8e5m2");
  EMBSCALE_RETURN_IF_ERROR(check_shape(name, t));
  EMBSCALE_RETURN_IF_ERROR(check_data(name, t));
  return check::memory(ctx, name, t.data);
}

Status check_same_numel(const char* a_name, const TensorView& a, const char* b_name, const TensorView& b) {
  if (a.numel() == b.numel()) return Status::Ok();
  return invalid_argument(std::string(b_name) + ": shape " + shape_str(b) + " has " + std::to_string(b.numel()) +
                          " elements; expected " + std::to_string(a.numel()) + " to match " + a_name + " " + shape_str(a));
}

Status check_not_null(const char* name, const void* p) {
  if (p == nullptr) return invalid_argument(std::string(name) + ": must not be null");
  return Status::Ok();
}

// A required pointer into the backend's memory (a scalar the op reads or writes).
Status check_device_ptr(const Context& ctx, const char* name, const void* p) {
  EMBSCALE_RETURN_IF_ERROR(check_not_null(name, p));
  return check::memory(ctx, name, p);
}

Status check_fp8_dtype_arg(const char* name, DType t) {
  if (is_fp8_dtype(t)) return Status::Ok();
  return invalid_argument(std::string(name) + ": dtype " + dtype_name(t) + " is not an fp8 format; expected fp8e4m3 or fp8e5m2");
}

Status check_scale_options(const char* name, const ScaleOptions& o) {
  if (!(o.eps >= 0.0f) || !std::isfinite(o.eps))
    return invalid_argument(std::string(name) + ".eps: " + std::to_string(o.eps) + " is not allowed; expected a finite value >= 0");
  return Status::Ok();
}

Status check_activation(Activation act) {
  if (act == Activation::kRelu || act == Activation::kGeluTanh || act == Activation::kSilu) return Status::Ok();
  return invalid_argument("act: unknown activation value " + std::to_string(static_cast<int>(act)) +
                          "; expected relu, gelu_tanh or silu");
}

// The optional device flags of an amax (the non-finite output and the no-op input).
Status check_amax_flags(const Context& ctx, const char* prefix, const AmaxOptions& o) {
  EMBSCALE_RETURN_IF_ERROR(check::memory(ctx, (std::string(prefix) + "nonfinite_flag").c_str(), o.nonfinite_flag));
  return check::memory(ctx, (std::string(prefix) + "noop_flag").c_str(), o.noop_flag);
}

// What an op writes against everything else it is given (check::disjoint). The workspace counts only
// when the call uses one (needed > 0), with all the bytes the caller gave.
using check::region;
using check::scalar;
check::Region workspace_region(const void* ws, size_t ws_bytes, size_t needed) {
  return check::Region{"workspace", needed > 0 ? ws : nullptr, ws_bytes};
}

// The amax algorithm: one of AmaxAlgo's values (a C or Python caller may pass any integer).
Status check_algo(const char* name, AmaxAlgo algo) {
  if (algo == AmaxAlgo::kAuto || algo == AmaxAlgo::kAtomic || algo == AmaxAlgo::kTwoStage) return Status::Ok();
  return invalid_argument(std::string(name) + ": unknown value " + std::to_string(static_cast<int>(algo)) +
                          "; expected auto, atomic or two_stage");
}


}  // namespace

// One place per op picks the backend; check_context has already refused CUDA in a CPU-only build.
#if EMBSCALE_WITH_CUDA
#define EMBSCALE_FP8_DISPATCH(ctx, fn, ...) \
  return (ctx).backend == Backend::kCuda ? cuda::fn(__VA_ARGS__) : cpu::fn(__VA_ARGS__)
#else
#define EMBSCALE_FP8_DISPATCH(ctx, fn, ...) return cpu::fn(__VA_ARGS__)
#endif

// ---- amax -----------------------------------------------------------------------------------------

Status amax_workspace_size(const Context& ctx, const TensorView& x, const AmaxOptions& opts, size_t* bytes) {
  EMBSCALE_RETURN_IF_ERROR(check_context(ctx));
  EMBSCALE_RETURN_IF_ERROR(check_not_null("bytes", bytes));
  EMBSCALE_RETURN_IF_ERROR(check_float_tensor(ctx, "x", x, /*need_data=*/false));
  EMBSCALE_RETURN_IF_ERROR(check_algo("opts.algo", opts.algo));
  EMBSCALE_FP8_DISPATCH(ctx, amax_workspace_size, x, opts, bytes);
}

Status amax(const Context& ctx, const TensorView& x, float* amax, const AmaxOptions& opts, void* workspace,
            size_t workspace_bytes) {
  EMBSCALE_RETURN_IF_ERROR(check_context(ctx));
  EMBSCALE_RETURN_IF_ERROR(check_float_tensor(ctx, "x", x, /*need_data=*/true));
  EMBSCALE_RETURN_IF_ERROR(check_device_ptr(ctx, "amax", amax));
  EMBSCALE_RETURN_IF_ERROR(check_algo("opts.algo", opts.algo));
  size_t needed = 0;
  EMBSCALE_RETURN_IF_ERROR(amax_workspace_size(ctx, x, opts, &needed));
  EMBSCALE_RETURN_IF_ERROR(check_amax_flags(ctx, "opts.", opts));
  EMBSCALE_RETURN_IF_ERROR(check::disjoint(
      {scalar("amax", amax), scalar("opts.nonfinite_flag", opts.nonfinite_flag),
       workspace_region(workspace, workspace_bytes, needed)},
      {region("x", x), scalar("opts.noop_flag", opts.noop_flag)}));
  EMBSCALE_RETURN_IF_ERROR(check_workspace(ctx, workspace, workspace_bytes, needed, "amax_workspace_size()"));
  EMBSCALE_FP8_DISPATCH(ctx, amax, ctx, x, amax, opts, workspace, workspace_bytes);
}

// ---- scale ----------------------------------------------------------------------------------------

Status compute_scale(const Context& ctx, const float* amax, DType fp8_dtype, const ScaleOptions& opts, float* scale,
                     float* scale_inv, const float* noop_flag) {
  EMBSCALE_RETURN_IF_ERROR(check_context(ctx));
  EMBSCALE_RETURN_IF_ERROR(check_device_ptr(ctx, "amax", amax));
  EMBSCALE_RETURN_IF_ERROR(check_fp8_dtype_arg("fp8_dtype", fp8_dtype));
  EMBSCALE_RETURN_IF_ERROR(check_scale_options("opts", opts));
  EMBSCALE_RETURN_IF_ERROR(check_device_ptr(ctx, "scale", scale));
  EMBSCALE_RETURN_IF_ERROR(check_device_ptr(ctx, "scale_inv", scale_inv));
  EMBSCALE_RETURN_IF_ERROR(check::memory(ctx, "noop_flag", noop_flag));
  EMBSCALE_RETURN_IF_ERROR(check::disjoint({scalar("scale", scale), scalar("scale_inv", scale_inv)},
                                           {scalar("amax", amax), scalar("noop_flag", noop_flag)}));
  EMBSCALE_FP8_DISPATCH(ctx, compute_scale, ctx, amax, fp8_max(fp8_dtype), opts, scale, scale_inv, noop_flag);
}

// ---- casts ----------------------------------------------------------------------------------------

Status quantize(const Context& ctx, const TensorView& x, const float* scale, const TensorView& y,
                const float* noop_flag) {
  EMBSCALE_RETURN_IF_ERROR(check_context(ctx));
  EMBSCALE_RETURN_IF_ERROR(check_float_tensor(ctx, "x", x, /*need_data=*/true));
  EMBSCALE_RETURN_IF_ERROR(check_fp8_tensor(ctx, "y", y));
  EMBSCALE_RETURN_IF_ERROR(check_same_numel("x", x, "y", y));
  EMBSCALE_RETURN_IF_ERROR(check_device_ptr(ctx, "scale", scale));
  EMBSCALE_RETURN_IF_ERROR(check::memory(ctx, "noop_flag", noop_flag));
  EMBSCALE_RETURN_IF_ERROR(
      check::disjoint({region("y", y)}, {region("x", x), scalar("scale", scale), scalar("noop_flag", noop_flag)}));
  EMBSCALE_FP8_DISPATCH(ctx, quantize, ctx, x, scale, y, noop_flag);
}

Status dequantize(const Context& ctx, const TensorView& y, const float* scale_inv, const TensorView& x,
                  const float* noop_flag) {
  EMBSCALE_RETURN_IF_ERROR(check_context(ctx));
  EMBSCALE_RETURN_IF_ERROR(check_fp8_tensor(ctx, "y", y));
  EMBSCALE_RETURN_IF_ERROR(check_float_tensor(ctx, "x", x, /*need_data=*/true));
  EMBSCALE_RETURN_IF_ERROR(check_same_numel("y", y, "x", x));
  EMBSCALE_RETURN_IF_ERROR(check_device_ptr(ctx, "scale_inv", scale_inv));
  EMBSCALE_RETURN_IF_ERROR(check::memory(ctx, "noop_flag", noop_flag));
  EMBSCALE_RETURN_IF_ERROR(check::disjoint(
      {region("x", x)}, {region("y", y), scalar("scale_inv", scale_inv), scalar("noop_flag", noop_flag)}));
  EMBSCALE_FP8_DISPATCH(ctx, dequantize, ctx, y, scale_inv, x, noop_flag);
}

Status quantize_current_scaling_workspace_size(const Context& ctx, const TensorView& x,
                                               const CurrentScalingOptions& opts, size_t* bytes) {
  EMBSCALE_RETURN_IF_ERROR(check_context(ctx));
  EMBSCALE_RETURN_IF_ERROR(check_not_null("bytes", bytes));
  EMBSCALE_RETURN_IF_ERROR(check_float_tensor(ctx, "x", x, /*need_data=*/false));
  EMBSCALE_RETURN_IF_ERROR(check_algo("opts.amax.algo", opts.amax.algo));
  EMBSCALE_FP8_DISPATCH(ctx, quantize_current_scaling_workspace_size, x, opts, bytes);
}

Status quantize_current_scaling(const Context& ctx, const TensorView& x, const TensorView& y, float* amax,
                                float* scale, float* scale_inv, const CurrentScalingOptions& opts, void* workspace,
                                size_t workspace_bytes) {
  EMBSCALE_RETURN_IF_ERROR(check_context(ctx));
  EMBSCALE_RETURN_IF_ERROR(check_float_tensor(ctx, "x", x, /*need_data=*/true));
  EMBSCALE_RETURN_IF_ERROR(check_fp8_tensor(ctx, "y", y));
  EMBSCALE_RETURN_IF_ERROR(check_same_numel("x", x, "y", y));
  EMBSCALE_RETURN_IF_ERROR(check_device_ptr(ctx, "amax", amax));
  EMBSCALE_RETURN_IF_ERROR(check_device_ptr(ctx, "scale", scale));
  EMBSCALE_RETURN_IF_ERROR(check_device_ptr(ctx, "scale_inv", scale_inv));
  EMBSCALE_RETURN_IF_ERROR(check_scale_options("opts.scale", opts.scale));
  EMBSCALE_RETURN_IF_ERROR(check_algo("opts.amax.algo", opts.amax.algo));
  size_t needed = 0;
  EMBSCALE_RETURN_IF_ERROR(quantize_current_scaling_workspace_size(ctx, x, opts, &needed));
  EMBSCALE_RETURN_IF_ERROR(check_amax_flags(ctx, "opts.amax.", opts.amax));
  EMBSCALE_RETURN_IF_ERROR(check::disjoint(
      {region("y", y), scalar("amax", amax), scalar("scale", scale), scalar("scale_inv", scale_inv),
       scalar("opts.amax.nonfinite_flag", opts.amax.nonfinite_flag),
       workspace_region(workspace, workspace_bytes, needed)},
      {region("x", x), scalar("opts.amax.noop_flag", opts.amax.noop_flag)}));
  EMBSCALE_RETURN_IF_ERROR(
      check_workspace(ctx, workspace, workspace_bytes, needed, "quantize_current_scaling_workspace_size()"));
  EMBSCALE_FP8_DISPATCH(ctx, quantize_current_scaling, ctx, x, y, amax, scale, scale_inv, opts, workspace,
                        workspace_bytes);
}

// ---- fusions --------------------------------------------------------------------------------------

Status activation_amax_workspace_size(const Context& ctx, const TensorView& x, const AmaxOptions& opts,
                                      size_t* bytes) {
  EMBSCALE_RETURN_IF_ERROR(check_context(ctx));
  EMBSCALE_RETURN_IF_ERROR(check_not_null("bytes", bytes));
  EMBSCALE_RETURN_IF_ERROR(check_float_tensor(ctx, "x", x, /*need_data=*/false));
  EMBSCALE_RETURN_IF_ERROR(check_algo("opts.algo", opts.algo));
  EMBSCALE_FP8_DISPATCH(ctx, activation_amax_workspace_size, x, opts, bytes);
}

Status activation_amax(const Context& ctx, Activation act, const TensorView& x, const TensorView& y, float* amax,
                       const AmaxOptions& opts, void* workspace, size_t workspace_bytes) {
  EMBSCALE_RETURN_IF_ERROR(check_context(ctx));
  EMBSCALE_RETURN_IF_ERROR(check_activation(act));
  EMBSCALE_RETURN_IF_ERROR(check_float_tensor(ctx, "x", x, /*need_data=*/true));
  EMBSCALE_RETURN_IF_ERROR(check_float_tensor(ctx, "y", y, /*need_data=*/true));
  EMBSCALE_RETURN_IF_ERROR(check_same_numel("x", x, "y", y));
  EMBSCALE_RETURN_IF_ERROR(check_device_ptr(ctx, "amax", amax));
  EMBSCALE_RETURN_IF_ERROR(check_algo("opts.algo", opts.algo));
  size_t needed = 0;
  EMBSCALE_RETURN_IF_ERROR(activation_amax_workspace_size(ctx, x, opts, &needed));
  EMBSCALE_RETURN_IF_ERROR(check_amax_flags(ctx, "opts.", opts));
  EMBSCALE_RETURN_IF_ERROR(check::disjoint(
      {region("y", y), scalar("amax", amax), scalar("opts.nonfinite_flag", opts.nonfinite_flag),
       workspace_region(workspace, workspace_bytes, needed)},
      {region("x", x), scalar("opts.noop_flag", opts.noop_flag)}));
  EMBSCALE_RETURN_IF_ERROR(
      check_workspace(ctx, workspace, workspace_bytes, needed, "activation_amax_workspace_size()"));
  EMBSCALE_FP8_DISPATCH(ctx, activation_amax, ctx, act, x, y, amax, opts, workspace, workspace_bytes);
}

Status cast_transpose(const Context& ctx, const TensorView& x, const float* scale, const TensorView& y,
                      const TensorView& yt, const float* noop_flag) {
  EMBSCALE_RETURN_IF_ERROR(check_context(ctx));
  EMBSCALE_RETURN_IF_ERROR(check_float_tensor(ctx, "x", x, /*need_data=*/true));
  if (x.ndim != 2)
    return invalid_argument("x: shape " + shape_str(x) + " is not 2-D; expected [rows, cols]");
  EMBSCALE_RETURN_IF_ERROR(check_fp8_tensor(ctx, "y", y));
  EMBSCALE_RETURN_IF_ERROR(check_fp8_tensor(ctx, "yt", yt));
  const int64_t rows = x.shape[0], cols = x.shape[1];
  if (y.ndim != 2 || y.shape[0] != rows || y.shape[1] != cols)
    return invalid_argument("y: shape " + shape_str(y) + " does not match x; expected [" + std::to_string(rows) +
                            ", " + std::to_string(cols) + "]");
  if (yt.ndim != 2 || yt.shape[0] != cols || yt.shape[1] != rows)
    return invalid_argument("yt: shape " + shape_str(yt) + " is not the transpose of x " + shape_str(x) +
                            "; expected [" + std::to_string(cols) + ", " + std::to_string(rows) + "]");
  if (yt.dtype != y.dtype)
    return invalid_argument(std::string("yt: dtype ") + dtype_name(yt.dtype) + " differs from y's " +
                            dtype_name(y.dtype) + "; both must be the same fp8 format");
  EMBSCALE_RETURN_IF_ERROR(check_device_ptr(ctx, "scale", scale));
  EMBSCALE_RETURN_IF_ERROR(check::memory(ctx, "noop_flag", noop_flag));
  EMBSCALE_RETURN_IF_ERROR(check::disjoint({region("y", y), region("yt", yt)},
                                           {region("x", x), scalar("scale", scale), scalar("noop_flag", noop_flag)}));
  EMBSCALE_FP8_DISPATCH(ctx, cast_transpose, ctx, x, scale, y, yt, noop_flag);
}

#undef EMBSCALE_FP8_DISPATCH

}  // namespace embscale
