// CUDA table-batched embedding forward: the launchers of the bags kernel, one template over the closed
// set weights {fp32, fp16, bf16} x output {fp32, fp16, bf16} x index {int32, int64}. The set is
// explicitly instantiated in tbe_forward_{f32,f16,bf16}.cu (one file per weights dtype, so a 2-core
// build compiles them in parallel); tbe_forward.cu sees only these declarations.
#pragma once

#include <cuda_runtime.h>

#include "tbe/cuda/forward/tbe_forward_kernels.cuh"
#include "embscale/status.h"

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

// Compiled shapes of the pooled fp32 -> fp32, int64-index kernel (tbe_forward_variants.cu), to compare
// on one build. Index 0 is DefaultFwdConfig (the launcher above); grid sizing needs block and vecs.
struct FwdVariant {
  const char* name;
  const char* what;
  int block;  // threads per block
  int vecs;   // FwdConfig::kVecs
  Status (*launch)(const TbeForwardParams& p, dim3 grid, cudaStream_t stream);  // pooled only
};
int num_fwd_variants();
const FwdVariant& fwd_variant(int i);

}  // namespace tbe_fwd
}  // namespace cuda
}  // namespace embscale
