// CUDA table-batched embedding backward: the launchers of the per-row kernels, one template over the
// weights dtype W in {fp32, fp16, bf16}, the gradient dtype dispatched inside. The three weights dtypes
// are explicitly instantiated in tbe_backward_rows_{f32,f16,bf16}.cu (one file each, so a 2-core build
// compiles them in parallel); tbe_backward.cu sees only these declarations.
#pragma once

#include <cuda_runtime.h>

#include "core/cuda/pdl.cuh"
#include "tbe/cuda/backward/tbe_backward_kernels.cuh"
#include "embscale/dtype.h"
#include "embscale/status.h"

namespace embscale {
namespace cuda {
namespace tbe_bwd {


// From the classify place kernel on, kernels are launched with launch_kernel (core/cuda/pdl.cuh), so each may
// be scheduled while the previous kernel in the stream still runs; their griddepcontrol calls keep what
// must stay ordered: the place kernel and the first row kernel wait for their predecessor before
// reading anything, the later row kernels (which work on other rows) only before they complete, and
// the combine before it reads the partials.

// Persistent grids: each row kernel gets (its resident blocks per SM, from the occupancy calculator) x
// (SM count) blocks, so every block is resident; they take their work from counters in key order.
struct RowGrids {
  int sms;            // multiprocessors of the device
  int block_threads;  // block size of the block and hot-part paths
};

// Enqueues, in order: grad_psw (when p.grad_psw is set), the warp rows, the block rows, the hot-row
// parts and the hot-row combine.
template <typename W>
Status launch_tbe_backward_rows(const RowParams& p, DType grad_dtype, const RowGrids& g, cudaStream_t stream);

extern template Status launch_tbe_backward_rows<float>(const RowParams&, DType, const RowGrids&, cudaStream_t);
extern template Status launch_tbe_backward_rows<fp16_t>(const RowParams&, DType, const RowGrids&, cudaStream_t);
extern template Status launch_tbe_backward_rows<bf16_t>(const RowParams&, DType, const RowGrids&, cudaStream_t);

}  // namespace tbe_bwd
}  // namespace cuda
}  // namespace embscale
