// Definition of launch_tbe_backward_rows, included only by the per-weights-dtype instantiation files.
#pragma once

#include "core/cuda/check.cuh"
#include "core/cuda/device.cuh"
#include "core/dispatch.h"
#include "tbe/cuda/backward/tbe_backward_launch.cuh"

namespace embscale {
namespace cuda {
namespace tbe_bwd {

using RowsKernel = void (*)(RowParams);

// The lane-group kernel of an optimizer (one per optimizer: group_update_row's element loops test none);
// null for those group_shape keeps off the lane groups (kElementStateLaneGroups).
template <typename W, typename G, int kRows, int kSlots>
RowsKernel group_kernel(OptimizerType opt) {
  return opt::visit_optimizer(opt, [](auto o) -> RowsKernel {
    constexpr OptimizerType t = decltype(o)::kType;
    if constexpr (!kElementStateLaneGroups && opt::has_elementwise_state(t)) return nullptr;
    else return tbe_backward_warp_rows_kernel<W, G, kRows, kSlots, t, VecAccess::kWhole>;
  });
}

// The kernel of a shape of group_shape's closed set.
template <typename W, typename G>
RowsKernel warp_rows_kernel(GroupShape shape, OptimizerType opt) {
  switch (shape.rows) {
    case 16: return group_kernel<W, G, 16, 2>(opt);
    case 8: return group_kernel<W, G, 8, 2>(opt);
    case 4: return group_kernel<W, G, 4, 4>(opt);
    case 2: return group_kernel<W, G, 2, 2>(opt);
    default: return group_kernel<W, G, 1, 1>(opt);
  }
}

// The row kernels of a call whose rows are accessed as kAccess says (kWhole: whole_vecs; only then do the
// lane groups run).
template <typename W, typename G, VecAccess kAccess>
Status launch_rows_typed(const RowParams& p, const RowGrids& g, cudaStream_t s) {
  const auto grid = [&](const void* fn, int threads) { return g.sms * blocks_per_sm(fn, threads); };
  if (p.grad_psw != nullptr) {
    const auto k = tbe_backward_grad_psw_kernel<W, G>;
    k<<<grid(reinterpret_cast<const void*>(k), kRowThreads), kRowThreads, 0, s>>>(grad_psw_params(p));
    EMBSCALE_CHECK_LAUNCH("tbe_backward_grad_psw_kernel");
  }
  {
    // Lane groups: 16 rows per warp up to 16 columns, 8 up to 32, 4 up to 128, 2 up to 256, 1 (all
    // passes in registers) up to 512; one kernel per optimizer. Then the whole-warp kernel for the
    // warp-path rows the lane groups do not take (all of them when the path is off).
    const GroupShape shape = group_shape(p);  // off unless whole_vecs, so kByFlag calls never take the lane groups
    const int rows = shape.rows;
    // The first row kernel waits for what classify (or grad_psw) wrote before it reads anything; the
    // later ones work on other rows and only wait for their predecessor before they complete.
    RowParams first = p;
    first.wait_at_start = 1;
    if constexpr (kAccess == VecAccess::kWhole) {
      if (rows != 0) {
        const auto k = warp_rows_kernel<W, G>(shape, p.opt.type);
        EMBSCALE_RETURN_IF_ERROR(launch_kernel("tbe_backward_warp_rows_kernel (lane groups)", k,
                                               dim3(grid(reinterpret_cast<const void*>(k), kRowThreads)),
                                               dim3(kRowThreads), 0, s, first));
      }
    }
    // The whole-warp kernel takes the warp rows longer than p.group_max_lookups (0 when the lane groups are
    // off: all of them).
    const bool warp_kernel = p.max_warp_segment > p.group_max_lookups;
    if (warp_kernel) {
      const auto k = tbe_backward_warp_rows_kernel<W, G, 0, 0, OptimizerType::kNone, kAccess>;
      EMBSCALE_RETURN_IF_ERROR(launch_kernel("tbe_backward_warp_rows_kernel", k,
                                             dim3(grid(reinterpret_cast<const void*>(k), kRowThreads)),
                                             dim3(kRowThreads), 0, s, rows != 0 ? p : first));
    }
    // the block-path kernel is the first row kernel when neither warp kernel runs
    const auto k = tbe_backward_block_work_kernel<W, G, kAccess>;
    EMBSCALE_RETURN_IF_ERROR(launch_kernel("tbe_backward_block_work_kernel", k,
                                           dim3(grid(reinterpret_cast<const void*>(k), g.block_threads)),
                                           dim3(g.block_threads), 0, s, rows != 0 || warp_kernel ? p : first));
  }
  {
    const auto k = tbe_backward_hot_combine_kernel<W, kAccess>;
    EMBSCALE_RETURN_IF_ERROR(launch_kernel("tbe_backward_hot_combine_kernel", k,
                                           dim3(grid(reinterpret_cast<const void*>(k), kRowThreads)),
                                           dim3(kRowThreads), 0, s, p));
  }
  return Status::Ok();
}

template <typename W>
Status launch_tbe_backward_rows(const RowParams& p, DType grad_dtype, const RowGrids& g, cudaStream_t s) {
  return dispatch_float(grad_dtype, "grad_output", [&](auto tg) {
    using G = typename decltype(tg)::type;
    return p.whole_vecs != 0 ? launch_rows_typed<W, G, VecAccess::kWhole>(p, g, s)
                             : launch_rows_typed<W, G, VecAccess::kByFlag>(p, g, s);
  });
}

}  // namespace tbe_bwd
}  // namespace cuda
}  // namespace embscale

#define EMBSCALE_TBE_BACKWARD_INSTANTIATE(W)                                                                 \
  namespace embscale {                                                                                       \
  namespace cuda {                                                                                           \
  namespace tbe_bwd {                                                                                        \
  template Status launch_tbe_backward_rows<W>(const RowParams&, DType, const RowGrids&, cudaStream_t);       \
  }                                                                                                          \
  }                                                                                                          \
  }
