// CUDA table-batched embedding forward: the launchers of the bags kernel, one template over the closed
// set weights {fp32, fp16, bf16} x output {fp32, fp16, bf16} x index {int32, int64}. The set is
// explicitly instantiated in tbe_forward_{f32,f16,bf16}.cu (one file per weights dtype, so a 2-core
// build compiles them in parallel); tbe_forward.cu sees only these declarations. Also the
// forward's steps, which dev/ runs around kernels of its own.
#pragma once

#include <cuda_runtime.h>

#include "tbe/cuda/forward/tbe_forward_kernels.cuh"
#include "embscale/status.h"
#include "embscale/tbe.h"

namespace embscale {
namespace cuda {
namespace tbe_fwd {

template <typename W, typename O, typename I>
Status launch_tbe_forward(const TbeForwardParams& p, dim3 grid, cudaStream_t stream);

#define EMBSCALE_TBE_FORWARD_EXTERN(W)                                                            \
  extern template Status launch_tbe_forward<W, float, int32_t>(const TbeForwardParams&, dim3, cudaStream_t);  \
  extern template Status launch_tbe_forward<W, float, int64_t>(const TbeForwardParams&, dim3, cudaStream_t);  \
  extern template Status launch_tbe_forward<W, fp16_t, int32_t>(const TbeForwardParams&, dim3, cudaStream_t); \
  extern template Status launch_tbe_forward<W, fp16_t, int64_t>(const TbeForwardParams&, dim3, cudaStream_t); \
  extern template Status launch_tbe_forward<W, bf16_t, int32_t>(const TbeForwardParams&, dim3, cudaStream_t); \
  extern template Status launch_tbe_forward<W, bf16_t, int64_t>(const TbeForwardParams&, dim3, cudaStream_t);
EMBSCALE_TBE_FORWARD_EXTERN(float)
EMBSCALE_TBE_FORWARD_EXTERN(fp16_t)
EMBSCALE_TBE_FORWARD_EXTERN(bf16_t)
#undef EMBSCALE_TBE_FORWARD_EXTERN

// The forward in three steps (tbe_forward runs them in order): the call's parameters and grid, the
// kernel, the bounds-check protocol. dev/ launches kernels of its own between the first and the last.
struct ForwardLaunch {
  TbeForwardParams p;      // p.kernel: the kernel forward_plan.h picks
  dim3 grid;               // (bag tiles, features), each folded past its limit
  bool any_bags = false;   // T > 0 and B > 0: a kernel runs
  bool capturing = false;  // the stream is being captured
};

// The parameters and grid of a call whose arguments tbe.cpp has validated. `shape` gives the block, the
// bags kernel's vectors per lane, the bags per lane group and whether the launch may run the plain kernels
// (ForwardPolicy's shape, plain allowed, for the library); whether the call is one they can take is
// decided here.
Status begin_forward(const Context& ctx, const TableBatchedEmbedding& tbe, const TbeForwardArgs& args,
                     CallShape shape, ForwardLaunch* out);
// The library's kernel for l.p.kernel and the call's dtypes (nothing when there are no bags).
Status launch_forward(const ForwardLaunch& l, const TbeForwardArgs& args, cudaStream_t stream);
// The bounds-check finalize kernel and, where the mode asks for it, the report read back as a Status.
Status end_forward(const Context& ctx, const TableBatchedEmbedding& tbe, const TbeForwardArgs& args,
                   const ForwardLaunch& l);

}  // namespace tbe_fwd
}  // namespace cuda
}  // namespace embscale
