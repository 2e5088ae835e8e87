// Definition of launch_tbe_backward_rows, included only by the per-weights-dtype instantiation files.
#pragma once

#include <string>

#include "cuda/check.cuh"
#include "cuda/tbe_backward_launch.cuh"

namespace embscale {
namespace cuda {
namespace tbe_bwd {

template <typename W, typename G>
Status launch_rows_typed(const BwdParams& p, const RowGrids& g, cudaStream_t s) {
  if (p.grad_psw != nullptr) {
    tbe_backward_grad_psw_kernel<W, G><<<g.grad_psw, kRowThreads, 0, s>>>(p);
    EMBSCALE_CHECK_LAUNCH("tbe_backward_grad_psw_kernel");
  }
  tbe_backward_warp_rows_kernel<W, G><<<g.warp_rows, kRowThreads, 0, s>>>(p);
  EMBSCALE_CHECK_LAUNCH("tbe_backward_warp_rows_kernel");
  tbe_backward_block_rows_kernel<W, G><<<g.block_rows, g.block_threads, 0, s>>>(p);
  EMBSCALE_CHECK_LAUNCH("tbe_backward_block_rows_kernel");
  tbe_backward_hot_parts_kernel<G><<<g.hot_parts, g.block_threads, 0, s>>>(p);
  EMBSCALE_CHECK_LAUNCH("tbe_backward_hot_parts_kernel");
  tbe_backward_hot_combine_kernel<W><<<g.combine, kRowThreads, 0, s>>>(p);
  EMBSCALE_CHECK_LAUNCH("tbe_backward_hot_combine_kernel");
  return Status::Ok();
}

template <typename W>
Status launch_tbe_backward_rows(const BwdParams& p, DType grad_dtype, const RowGrids& g, cudaStream_t s) {
  switch (grad_dtype) {
    case DType::kF32: return launch_rows_typed<W, float>(p, g, s);
    case DType::kF16: return launch_rows_typed<W, fp16_t>(p, g, s);
    case DType::kBF16: return launch_rows_typed<W, bf16_t>(p, g, s);
    default: break;
  }
  return invalid_argument(std::string("grad_output: dtype ") + dtype_name(grad_dtype) +
                          " is not supported; expected fp32, fp16 or bf16");
}

}  // namespace tbe_bwd
}  // namespace cuda
}  // namespace embscale

#define EMBSCALE_TBE_BACKWARD_INSTANTIATE(W)                                                                 \
  namespace embscale {                                                                                       \
  namespace cuda {                                                                                           \
  namespace tbe_bwd {                                                                                        \
  template Status launch_tbe_backward_rows<W>(const BwdParams&, DType, const RowGrids&, cudaStream_t);       \
  }                                                                                                          \
  }                                                                                                          \
  }
