// Activation + amax: y = act(x) rounded to y's dtype, and amax = max |y| of the values as stored, in one
// pass over x (read x, write y). The reduction and its finish are the amax kernels' (fp8_amax.cuh):
// one cluster for small inputs; otherwise amax_init_kernel + this grid with one native atomicMax per
// block (atomic), or this grid with one slot per block + the one-block slot reduction (two-stage), so
// the workspace contract is the same as amax's.
//
// The activations themselves are fp8/activation.h, shared with the CPU backend (fp32 math in forms
// that neither overflow nor cancel; device code uses the hardware exp2 / reciprocal approximations
// there). 16-bit outputs are converted two at a time with the hardware round-to-nearest-even cvt.
#pragma once

#include "fp8/activation.h"
#include "fp8/cuda/fp8_amax.cuh"
#include "fp8/cuda/fp8_common.cuh"

namespace embscale {
namespace cuda {

struct ActParams {
  const void* x;  // [n] input
  void* y;        // [n] output
  RangeSplit split;
  const float* noop_flag;
  AmaxOutputs out;
};

// Two fp32 values rounded to a 16-bit format (nearest even, as from_float; a NaN stays a NaN, possibly
// with another payload) and packed low, high.
template <typename T>
__device__ __forceinline__ uint32_t pack2_rn(float lo, float hi) {
#if __CUDA_ARCH__ >= 800
  uint32_t r;
  if constexpr (std::is_same_v<T, bf16_t>) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  }
  return r;
#else
  return elem_bits(from_float<T>(lo)) | elem_bits(from_float<T>(hi)) << 16;
#endif
}

template <typename Tin, typename Tout, Activation kAct>
__device__ __forceinline__ AmaxPartial activation_thread_partial(const ActParams& p, int64_t start, int64_t stride) {
  constexpr int kN = Vec16<Tin>::kN;
  MagAcc<Tout> acc;
  const void* xb = static_cast<const char*>(p.x) + p.split.head * static_cast<int64_t>(sizeof(Tin));
  void* yb = static_cast<char*>(p.y) + p.split.head * static_cast<int64_t>(sizeof(Tout));
  stream_vectors<Tin, Fp8Policy::kAmaxUnroll>(xb, p.split.nvec, start, stride, false, [&](int64_t i, const Vec16<Tin>& v) {
    OutPack<Tout, kN> o;
    if constexpr (sizeof(Tout) == 2) {
#pragma unroll
      for (int k = 0; k < kN; k += 2) {
        o.w[k / 2] = pack2_rn<Tout>(activation_f<kAct>(load_float(v.elem(k))),
                                    activation_f<kAct>(load_float(v.elem(k + 1))));
      }
    } else {
#pragma unroll
      for (int k = 0; k < kN; ++k) o.set(k, from_float<Tout>(activation_f<kAct>(load_float(v.elem(k)))));
    }
#pragma unroll
    for (int w = 0; w < OutPack<Tout, kN>::kWords; ++w) acc.add_word(o.w[w]);  // amax of y as stored
    o.store(yb, i);
  });
  stream_scalars(p.split, start, stride, [&](int64_t i) {
    const Tout r = from_float<Tout>(activation_f<kAct>(load_float(load_elem<Tin>(p.x, i, p.split.in_aligned))));
    acc.add_bits(elem_bits(r));
    store_elem<Tout>(p.y, i, r, p.split.out_aligned);
  });
  return acc.result();
}

// Grid path; two_stage selects the finish (uniform, so only the tail differs).
template <typename Tin, typename Tout, Activation kAct>
__global__ void __launch_bounds__(Fp8Policy::kAmaxGridThreads)
    activation_amax_grid_kernel(ActParams p, bool two_stage) {
  if (kernel_prologue_skip(p.noop_flag)) return;
  const int64_t start = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const AmaxPartial r = block_reduce_amax(activation_thread_partial<Tin, Tout, kAct>(p, start, stride));
  if (two_stage) {
    finish_grid<true>(r, p.out);
  } else {
    finish_grid<false>(r, p.out);
  }
}

// Launched as exactly one cluster.
template <typename Tin, typename Tout, Activation kAct>
__global__ void __launch_bounds__(Fp8Policy::kClusterThreads, 1) activation_amax_cluster_kernel(ActParams p) {
  if (kernel_prologue_skip(p.noop_flag)) return;
  const int64_t start = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const AmaxPartial r = block_reduce_amax(activation_thread_partial<Tin, Tout, kAct>(p, start, stride));
  const AmaxPartial total = cluster_reduce_amax(r);
  cluster_done_reading();
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *p.out.amax = bits_float(total.bits);
    if (p.out.nonfinite_flag != nullptr) *p.out.nonfinite_flag = total.nonfinite != 0 ? 1 : 0;
  }
  cluster_wait_before_exit();
}

}  // namespace cuda
}  // namespace embscale
