// The C API's FP8 entry points (embscale/embscale_c.h): amax, scales, casts, current scaling, fused
// activation + amax and cast + transpose, each converted (capi_internal.h) and passed to embscale/fp8.h.
#include "capi/capi_internal.h"

using namespace embscale::capi;  // NOLINT: the entry points below are written in its helpers' names
using embscale::Status;

extern "C" {

int embscale_amax_workspace_size(const embscale_context* ctx, const embscale_tensor* x, int32_t algo,
                                 size_t* bytes) {
  return guarded([&]() -> Status {
    AmaxCall a;
    EMBSCALE_RETURN_IF_ERROR(to_amax_call(ctx, x, algo, &a));
    return embscale::amax_workspace_size(a.ctx, a.x, a.opts, bytes);
  });
}

int embscale_amax(const embscale_context* ctx, const embscale_tensor* x, float* amax, int32_t algo,
                  int32_t* nonfinite_flag, void* workspace, size_t workspace_bytes, const float* noop_flag) {
  return guarded([&]() -> Status {
    AmaxCall a;
    EMBSCALE_RETURN_IF_ERROR(to_amax_call(ctx, x, algo, &a));
    a.opts.nonfinite_flag = nonfinite_flag;
    a.opts.noop_flag = noop_flag;
    return embscale::amax(a.ctx, a.x, amax, a.opts, workspace, workspace_bytes);
  });
}

int embscale_compute_scale(const embscale_context* ctx, const float* amax, int32_t fp8_dtype, float eps,
                           int32_t power_of_2, float* scale, float* scale_inv, const float* noop_flag) {
  return guarded([&]() -> Status {
    embscale::Context c;
    EMBSCALE_RETURN_IF_ERROR(to_context(ctx, &c));
    embscale::DType fp8;
    EMBSCALE_RETURN_IF_ERROR(to_enum("fp8_dtype", fp8_dtype, &fp8));
    embscale::ScaleOptions opts;
    opts.eps = eps;
    opts.power_of_2 = power_of_2 != 0;
    return embscale::compute_scale(c, amax, fp8, opts, scale, scale_inv, noop_flag);
  });
}

int embscale_quantize(const embscale_context* ctx, const embscale_tensor* x, const float* scale,
                      const embscale_tensor* y, const float* noop_flag) {
  return guarded([&]() -> Status {
    embscale::Context c;
    embscale::TensorView xv, yv;
    EMBSCALE_RETURN_IF_ERROR(to_context(ctx, &c));
    EMBSCALE_RETURN_IF_ERROR(to_tensor("x", x, &xv));
    EMBSCALE_RETURN_IF_ERROR(to_tensor("y", y, &yv));
    return embscale::quantize(c, xv, scale, yv, noop_flag);
  });
}

int embscale_dequantize(const embscale_context* ctx, const embscale_tensor* y, const float* scale_inv,
                        const embscale_tensor* x, const float* noop_flag) {
  return guarded([&]() -> Status {
    embscale::Context c;
    embscale::TensorView xv, yv;
    EMBSCALE_RETURN_IF_ERROR(to_context(ctx, &c));
    EMBSCALE_RETURN_IF_ERROR(to_tensor("y", y, &yv));
    EMBSCALE_RETURN_IF_ERROR(to_tensor("x", x, &xv));
    return embscale::dequantize(c, yv, scale_inv, xv, noop_flag);
  });
}

int embscale_quantize_current_scaling_workspace_size(const embscale_context* ctx, const embscale_tensor* x,
                                                     int32_t algo, size_t* bytes) {
  return guarded([&]() -> Status {
    AmaxCall a;
    EMBSCALE_RETURN_IF_ERROR(to_amax_call(ctx, x, algo, &a));
    embscale::CurrentScalingOptions opts;
    opts.amax = a.opts;
    return embscale::quantize_current_scaling_workspace_size(a.ctx, a.x, opts, bytes);
  });
}

int embscale_quantize_current_scaling(const embscale_context* ctx, const embscale_tensor* x, const embscale_tensor* y,
                                      float* amax, float* scale, float* scale_inv, int32_t algo, float eps,
                                      int32_t power_of_2, int32_t* nonfinite_flag, void* workspace,
                                      size_t workspace_bytes, const float* noop_flag) {
  return guarded([&]() -> Status {
    AmaxCall a;
    embscale::TensorView yv;
    EMBSCALE_RETURN_IF_ERROR(to_amax_call(ctx, x, algo, &a));
    EMBSCALE_RETURN_IF_ERROR(to_tensor("y", y, &yv));
    embscale::CurrentScalingOptions opts;
    opts.amax = a.opts;
    opts.amax.nonfinite_flag = nonfinite_flag;
    opts.amax.noop_flag = noop_flag;
    opts.scale.eps = eps;
    opts.scale.power_of_2 = power_of_2 != 0;
    return embscale::quantize_current_scaling(a.ctx, a.x, yv, amax, scale, scale_inv, opts, workspace,
                                              workspace_bytes);
  });
}

int embscale_activation_amax_workspace_size(const embscale_context* ctx, const embscale_tensor* x, int32_t algo,
                                            size_t* bytes) {
  return guarded([&]() -> Status {
    AmaxCall a;
    EMBSCALE_RETURN_IF_ERROR(to_amax_call(ctx, x, algo, &a));
    return embscale::activation_amax_workspace_size(a.ctx, a.x, a.opts, bytes);
  });
}

int embscale_activation_amax(const embscale_context* ctx, int32_t activation, const embscale_tensor* x,
                             const embscale_tensor* y, float* amax, int32_t algo, void* workspace,
                             size_t workspace_bytes, const float* noop_flag) {
  return guarded([&]() -> Status {
    AmaxCall a;
    embscale::TensorView yv;
    EMBSCALE_RETURN_IF_ERROR(to_amax_call(ctx, x, algo, &a));
    embscale::Activation act;
    EMBSCALE_RETURN_IF_ERROR(to_enum("activation", activation, &act));
    EMBSCALE_RETURN_IF_ERROR(to_tensor("y", y, &yv));
    a.opts.noop_flag = noop_flag;
    return embscale::activation_amax(a.ctx, act, a.x, yv, amax, a.opts, workspace, workspace_bytes);
  });
}

int embscale_cast_transpose(const embscale_context* ctx, const embscale_tensor* x, const float* scale,
                            const embscale_tensor* y, const embscale_tensor* yt, const float* noop_flag) {
  return guarded([&]() -> Status {
    embscale::Context c;
    embscale::TensorView xv, yv, ytv;
    EMBSCALE_RETURN_IF_ERROR(to_context(ctx, &c));
    EMBSCALE_RETURN_IF_ERROR(to_tensor("x", x, &xv));
    EMBSCALE_RETURN_IF_ERROR(to_tensor("y", y, &yv));
    EMBSCALE_RETURN_IF_ERROR(to_tensor("yt", yt, &ytv));
    return embscale::cast_transpose(c, xv, scale, yv, ytv, noop_flag);
  });
}

}  // extern "C"
