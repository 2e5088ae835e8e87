// CUDA table-batched embedding forward: the launchers of the bags kernel, one template over the closed
// set weights {fp32, fp16, bf16} x output {fp32, fp16, bf16} x index {int32, int64}. The set is
// explicitly instantiated in tbe_forward_{f32,f16,bf16}.cu (one file per weights dtype, so a 2-core
// build compiles them in parallel); tbe_forward.cu sees only these declarations. Also the shaped
// forward dev/ measures other launch shapes with.
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

// How the bags kernel is launched. The library runs ForwardPolicy (forward_policy.cuh) for every call;
// dev/ passes other kernel shapes, grid orders and bags per lane group, so that they are measured on
// the library's own grid sizing, bounds-check protocol and report.
struct ForwardShape {
  int block;            // threads per block of the bags kernel
  int vecs;             // its FwdConfig::kVecs (the grid is sized with the kernel's own row plan)
  bool feature_inner;   // grid (features, bag tiles) instead of (bag tiles, features)
  int bags_per_group;   // bags each lane group walks, 1..64; 0: ForwardPolicy's rule
  // Launches the bags kernel; null: the library's launchers (ForwardPolicy::Bags, every dtype).
  Status (*launch)(const TbeForwardParams& p, dim3 grid, cudaStream_t stream);
  // Whether `launch` runs the plain kernels where forward_plan.h picks them (TbeForwardParams::kernel):
  // the library's launchers do; a launcher that runs only the bags kernel does not, and then the grid
  // follows the bags kernel's rule and p.kernel is kKernelBags.
  bool plain_kernels;
};

// The forward of tbe_backend.h with an explicit shape (arguments already validated by tbe.cpp); an
// out-of-range bags_per_group is an invalid_argument naming it.
Status tbe_forward_shaped(const Context& ctx, const TableBatchedEmbedding& tbe, const TbeForwardArgs& args,
                          const ForwardShape& shape);

}  // namespace tbe_fwd
}  // namespace cuda
}  // namespace embscale
