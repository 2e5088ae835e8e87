// Definition of launch_tbe_forward, included only by the per-weights-dtype instantiation files.
#pragma once

#include "core/cuda/check.cuh"
#include "tbe/cuda/forward/tbe_forward_launch.cuh"
#include "tbe/cuda/forward/tbe_forward_plain_kernels.cuh"

namespace embscale {
namespace cuda {
namespace tbe_fwd {

template <typename W, typename O, typename I>
Status launch_tbe_forward(const TbeForwardParams& p, dim3 grid, cudaStream_t stream) {
  using C = ForwardPolicy::Bags;
  using Warp = ForwardPolicy::Warp;
  const bool checked = p.check != kCheckOff;
  if (p.kernel == kKernelWarp) {
    if (checked) tbe_forward_warp_kernel<W, O, I, Warp, 16, true><<<grid, Warp::kBlock, 0, stream>>>(p);
    else tbe_forward_warp_kernel<W, O, I, Warp><<<grid, Warp::kBlock, 0, stream>>>(p);
    EMBSCALE_CHECK_LAUNCH("tbe_forward_warp_kernel");
  } else if (p.kernel == kKernelVector) {
    if (checked) tbe_forward_vector_kernel<W, O, I, C, true><<<grid, C::kBlock, 0, stream>>>(p);
    else tbe_forward_vector_kernel<W, O, I, C><<<grid, C::kBlock, 0, stream>>>(p);
    EMBSCALE_CHECK_LAUNCH("tbe_forward_vector_kernel");
  } else if (p.pooling == kPoolNone) {
    tbe_forward_bags_kernel<W, O, I, false, C><<<grid, C::kBlock, 0, stream>>>(p);
    EMBSCALE_CHECK_LAUNCH("tbe_forward_bags_kernel");
  } else {
    tbe_forward_bags_kernel<W, O, I, true, C><<<grid, C::kBlock, 0, stream>>>(p);
    EMBSCALE_CHECK_LAUNCH("tbe_forward_bags_kernel");
  }
  return Status::Ok();
}

}  // namespace tbe_fwd
}  // namespace cuda
}  // namespace embscale

// Instantiates the six output x index combinations for one weights dtype W.
#define EMBSCALE_TBE_FORWARD_INSTANTIATE(W)                                                                    \
  namespace embscale {                                                                                         \
  namespace cuda {                                                                                             \
  namespace tbe_fwd {                                                                                          \
  template Status launch_tbe_forward<W, float, int32_t>(const TbeForwardParams&, dim3, cudaStream_t);          \
  template Status launch_tbe_forward<W, float, int64_t>(const TbeForwardParams&, dim3, cudaStream_t);          \
  template Status launch_tbe_forward<W, fp16_t, int32_t>(const TbeForwardParams&, dim3, cudaStream_t);         \
  template Status launch_tbe_forward<W, fp16_t, int64_t>(const TbeForwardParams&, dim3, cudaStream_t);         \
  template Status launch_tbe_forward<W, bf16_t, int32_t>(const TbeForwardParams&, dim3, cudaStream_t);         \
  template Status launch_tbe_forward<W, bf16_t, int64_t>(const TbeForwardParams&, dim3, cudaStream_t);         \
  }                                                                                                            \
  }                                                                                                            \
  }
