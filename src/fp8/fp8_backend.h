// What each backend implements for fp8.h. The public functions in fp8/fp8.cpp validate every
// argument (null pointers, dtypes, sizes, workspace size, the amax algorithm) and only then call these,
// so backends may assume valid arguments:
//   * x/y dtypes are the supported ones and element counts match; n may be 0;
//   * scalar pointers (amax, scale, scale_inv) are non-null and live in the backend's memory;
//   * opts.algo is one of AmaxAlgo's values (kAuto: the backend chooses);
//   * workspace_bytes >= the backend's own *_workspace_size for the same arguments.
#pragma once

#include <cstddef>

#include "embscale/fp8.h"

namespace embscale {

#define EMBSCALE_FP8_BACKEND_DECLS                                                                         \
  Status amax_workspace_size(const TensorView& x, const AmaxOptions& opts, size_t* bytes);                \
  Status amax(const Context& ctx, const TensorView& x, float* amax, const AmaxOptions& opts, void* ws,   \
              size_t ws_bytes);                                                                            \
  Status compute_scale(const Context& ctx, const float* amax, float fp8_max_value, const ScaleOptions& opts, \
                       float* scale, float* scale_inv, const float* noop_flag);                           \
  Status quantize(const Context& ctx, const TensorView& x, const float* scale, const TensorView& y,       \
                  const float* noop_flag);                                                                 \
  Status dequantize(const Context& ctx, const TensorView& y, const float* scale_inv, const TensorView& x,  \
                    const float* noop_flag);                                                               \
  Status quantize_current_scaling_workspace_size(const TensorView& x, const CurrentScalingOptions& opts,   \
                                                 size_t* bytes);                                           \
  Status quantize_current_scaling(const Context& ctx, const TensorView& x, const TensorView& y,           \
                                  float* amax, float* scale, float* scale_inv,                             \
                                  const CurrentScalingOptions& opts, void* ws, size_t ws_bytes);           \
  Status activation_amax_workspace_size(const TensorView& x, const AmaxOptions& opts, size_t* bytes);     \
  Status activation_amax(const Context& ctx, Activation act, const TensorView& x, const TensorView& y,   \
                         float* amax, const AmaxOptions& opts, void* ws, size_t ws_bytes);                 \
  Status cast_transpose(const Context& ctx, const TensorView& x, const float* scale, const TensorView& y, \
                        const TensorView& yt, const float* noop_flag);

namespace cpu {
EMBSCALE_FP8_BACKEND_DECLS
}  // namespace cpu

#if EMBSCALE_WITH_CUDA
namespace cuda {
EMBSCALE_FP8_BACKEND_DECLS
}  // namespace cuda
#endif

#undef EMBSCALE_FP8_BACKEND_DECLS

}  // namespace embscale
