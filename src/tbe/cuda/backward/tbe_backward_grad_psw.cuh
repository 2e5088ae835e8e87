// CUDA TBE backward, phase 4 (first, before any weight is written): the gradient with respect to the
// per-sample weights.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/arch_traits.cuh"
#include "tbe/cuda/backward/tbe_backward_grad_sums.cuh"
#include "tbe/cuda/backward/tbe_backward_io.cuh"
#include "tbe/cuda/backward/tbe_backward_params.cuh"

namespace embscale {
namespace cuda {
namespace tbe_bwd {

// What the kernel reads (pointers are device memory).
struct GradPswParams {
  const void* weights;             // [num_weights] of W
  const void* grad_output;         // pooled [B, total_dim] / sequence [N, D] of G
  const int64_t* weight_offsets;   // [T]
  const int32_t* dims;             // [T]
  const int32_t* output_offsets;   // [T+1]
  const int64_t* row_offsets;      // [T]
  const void* keys_in;             // [N] of K, in lookup order
  const uint32_t* bag_of;          // [N] bag item of each lookup (kNoBag: dropped)
  float* grad_psw;                 // [N]
  const int64_t* skip_report;      // skip mode: the bounds-check report word (see rows_disabled); else null
  int64_t batch_size;              // B
  int64_t num_indices;             // N
  int64_t grad_stride;             // grad_output row stride (elements)
  int key64;                       // keys are uint64 (else uint32)
  int sequence;                    // grad_output is [N, D]
  int w_vec;                       // weights rows allow kVec-element vector access
  int g_vec;                       // grad_output rows allow kVec-element vector access
};

// Its parameters, from the row kernels'. Host only.
inline GradPswParams grad_psw_params(const RowParams& r) {
  GradPswParams p;
  p.weights = r.weights;
  p.grad_output = r.grad_output;
  p.weight_offsets = r.weight_offsets;
  p.dims = r.dims;
  p.output_offsets = r.output_offsets;
  p.row_offsets = r.row_offsets;
  p.keys_in = r.keys_in;
  p.bag_of = r.bag_of;
  p.grad_psw = r.grad_psw;
  p.skip_report = r.skip_report;
  p.batch_size = r.batch_size;
  p.num_indices = r.num_indices;
  p.grad_stride = r.grad_stride;
  p.key64 = r.key64;
  p.sequence = r.sequence;
  p.w_vec = r.w_vec;
  p.g_vec = r.g_vec;
  return p;
}

// A warp per 32 consecutive lookups (persistent): lookup i -> dot(weight row of i, gradient row of its
// bag or sequence row), lane partials over the lane's columns, then a fixed xor tree. Runs before any
// weight is written. Invalid (skipped) lookups and lookups outside every bag get 0.
template <typename W, typename G>
__global__ void __launch_bounds__(kRowThreads) tbe_backward_grad_psw_kernel(const GradPswParams p) {
  if (rows_disabled(p.skip_report)) {
    // Broken offsets (skip and warn modes): no lookup belongs to a bag, so every gradient is 0.
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.num_indices;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x)
      p.grad_psw[i] = 0.0f;
    return;
  }
  const int lane = static_cast<int>(threadIdx.x) & (ArchTraits::kWarpSize - 1);
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kRowThreads / ArchTraits::kWarpSize);
  const G* grad = static_cast<const G*>(p.grad_output);
  const W* weights = static_cast<const W*>(p.weights);
  for (int64_t g0 = (static_cast<int64_t>(blockIdx.x) * (kRowThreads / ArchTraits::kWarpSize) +
                     threadIdx.x / ArchTraits::kWarpSize) * ArchTraits::kWarpSize;
       g0 < p.num_indices; g0 += warps * ArchTraits::kWarpSize) {
    const int n = static_cast<int>(p.num_indices - g0 < ArchTraits::kWarpSize ? p.num_indices - g0 : ArchTraits::kWarpSize);
    int64_t goff = 0, woff = -1;
    int d = 0;
    if (lane < n) {
      const int64_t i = g0 + lane;
      const uint32_t item = p.bag_of[i];
      if (item != kNoBag) {
        const int64_t key = p.key64 ? static_cast<int64_t>(static_cast<const uint64_t*>(p.keys_in)[i])
                                    : static_cast<int64_t>(static_cast<const uint32_t*>(p.keys_in)[i]);
        const uint32_t f = item / static_cast<uint32_t>(p.batch_size);
        d = p.dims[f];
        woff = p.weight_offsets[f] + (key - p.row_offsets[f]) * d;
        if (p.sequence) {
          goff = i * p.grad_stride;
        } else {
          const int64_t b = static_cast<int64_t>(item) - static_cast<int64_t>(f) * p.batch_size;
          goff = b * p.grad_stride + p.output_offsets[f];
        }
      }
    }
    for (int j = 0; j < n; ++j) {
      const int64_t wo = Warp::shfl(woff, j);
      const int64_t go = Warp::shfl(goff, j);
      const int D = Warp::shfl(d, j);
      float s = 0.0f;
      if (wo >= 0) {
        for (int pass = 0; pass * kPassCols < D; ++pass) {
          int col, ncols;
          lane_cols(pass, D, &col, &ncols);
          if (ncols > 0) {
            float w[kVec], x[kVec];
            load_vec<W, false>(weights + wo + col, p.w_vec != 0, ncols, w);
            load_vec<G, true>(grad + go + col, p.g_vec != 0, ncols, x);
#pragma unroll
            for (int k = 0; k < kVec; ++k)
              if (k < ncols) s = __fadd_rn(s, __fmul_rn(w[k], x[k]));
          }
        }
      }
      s = warp_sum(s);
      if (lane == 0) p.grad_psw[g0 + j] = s;
    }
  }
}

}  // namespace tbe_bwd
}  // namespace cuda
}  // namespace embscale
