// Cast kernels: quantize (x * scale -> fp8), dequantize (fp8 * scale_inv -> x), compute_scale, and the
// two shapes of quantize-with-current-scaling.
//
//  * Large inputs: amax (fp8_amax.cuh) then quantize_from_amax_kernel. Every block derives the scale
//    from the finished *amax with the shared rule (scaling.h), block 0 also stores scale and scale_inv,
//    so amax -> scale -> cast runs with no host round trip (the cast is PDL-launched after the amax kernels). The cast walks the vectors in
//    reverse so it starts on the part of x the amax pass read last, which may still sit in L2.
//  * Small inputs: quantize_current_scaling_cluster_kernel does everything in one launch: one cluster
//    loads x into registers (at most Fp8Policy::kQcsVecPerThread vectors per thread), reduces amax
//    across the cluster through distributed shared memory, derives the scale and casts from registers,
//    so x is read from memory once (up to Fp8Policy::kQcsClusterMaxBytes of input).
// The multiply x * scale is one fp32 rounding, then the fp8 conversion rounds to nearest even and
// saturates (numerics.h); a NaN input stays NaN.
#pragma once

#include "fp8/cuda/fp8_amax.cuh"
#include "fp8/cuda/fp8_common.cuh"
#include "fp8/cuda/fp8_policy.cuh"

namespace embscale {
namespace cuda {

struct ScaleRule {
  float fp8_max;
  float eps;
  bool power_of_2;
};

struct CastParams {
  const void* x;  // [n] input of the cast
  void* y;        // [n] output of the cast
  RangeSplit split;
  const float* scale;      // quantize: scale; dequantize: scale_inv; from-amax: unused
  const float* amax;       // from-amax variant: [1] finished amax
  float* amax_out;         // cluster variant: [1]
  int32_t* nonfinite_flag; // cluster variant: optional output
  float* scale_out;        // from-amax and cluster variants: [1]
  float* scale_inv_out;    // from-amax and cluster variants: [1]
  ScaleRule rule;
  const float* noop_flag;
  bool reverse = true;     // from-amax variant: walk the vectors last to first (see above)
};

// y = fp8(x * s) over vectors [first, first + count) of the body, this thread's from start by stride
// (relative to first), last to first with reverse. kStreaming: loads that do not allocate in L1 and
// evict-first stores (the output does not push the input out of L2 before it is read;
// Fp8Policy::kQcsStreamingMaxBytes).
template <typename Tin, typename Tout, int kUnroll, bool kStreaming = false>
__device__ __forceinline__ void cast_vectors(const CastParams& p, float s, int64_t first, int64_t count, int64_t start,
                                             int64_t stride, bool reverse) {
  constexpr LoadHint kLoad = kStreaming ? LoadHint::kReadOnlyNoL1 : LoadHint::kReadOnly;
  constexpr StoreHint kStore = kStreaming ? StoreHint::kStreaming : StoreHint::kDefault;
  constexpr int kN = Vec16<Tin>::kN;
  const void* xb = static_cast<const char*>(p.x) + (p.split.head + first * kN) * static_cast<int64_t>(sizeof(Tin));
  void* yb = static_cast<char*>(p.y) + (p.split.head + first * kN) * static_cast<int64_t>(sizeof(Tout));
  stream_vectors<Tin, kUnroll, kLoad>(xb, count, start, stride, reverse, [&](int64_t i, const Vec16<Tin>& v) {
    OutPack<Tout, kN> o;
#pragma unroll
    for (int k = 0; k < kN; ++k) o.set(k, from_float<Tout>(load_float(v.elem(k)) * s));
    o.template store<kStore>(yb, i);
  });
}

// y = fp8(x * s) over the scalar head and tail, this thread's elements from start by stride.
template <typename Tin, typename Tout>
__device__ __forceinline__ void cast_scalars(const CastParams& p, float s, int64_t start, int64_t stride) {
  stream_scalars(p.split, start, stride, [&](int64_t i) {
    const float v = load_float(load_elem<Tin>(p.x, i, p.split.in_aligned));
    store_elem<Tout>(p.y, i, from_float<Tout>(v * s), p.split.out_aligned);
  });
}

// The whole range, grid-stride: this thread's vectors and scalars from start by stride.
template <typename Tin, typename Tout, int kUnroll, bool kStreaming = false>
__device__ __forceinline__ void cast_range(const CastParams& p, float s, int64_t start, int64_t stride,
                                           bool reverse) {
  cast_vectors<Tin, Tout, kUnroll, kStreaming>(p, s, 0, p.split.nvec, start, stride, reverse);
  cast_scalars<Tin, Tout>(p, s, start, stride);
}

// y = fp8(x * *scale). With Fp8Policy::kQuantizeBlockContiguous, block b casts the contiguous vectors
// [b * kCastThreads * kCastUnroll, (b + 1) * kCastThreads * kCastUnroll) (the grid covers the input once),
// so the blocks resident at once read and write one contiguous stretch; else the vectors grid-stride.
template <typename Tin, typename Tout>
__global__ void __launch_bounds__(Fp8Policy::kCastThreads) quantize_scaled_kernel(CastParams p) {
  if (kernel_prologue_skip(p.noop_flag)) return;
  const float s = *p.scale;
  const int64_t gstart = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t gstride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  if constexpr (Fp8Policy::kQuantizeBlockContiguous) {
    static_assert(!Fp8Policy::kQuantizeGridCapped, "contiguous blocks need a grid that covers the input");
    const int64_t per = static_cast<int64_t>(blockDim.x) * Fp8Policy::kCastUnroll;
    const int64_t b0 = static_cast<int64_t>(blockIdx.x) * per;
    const int64_t first = b0 < p.split.nvec ? b0 : p.split.nvec;
    const int64_t count = (first + per < p.split.nvec ? first + per : p.split.nvec) - first;
    cast_vectors<Tin, Tout, Fp8Policy::kCastUnroll>(p, s, first, count, threadIdx.x, blockDim.x, false);
    cast_scalars<Tin, Tout>(p, s, gstart, gstride);
  } else {
    cast_range<Tin, Tout, Fp8Policy::kCastUnroll>(p, s, gstart, gstride, false);
  }
}

// scale = rule(*amax); block 0 stores scale and scale_inv; y = fp8(x * scale).
template <typename Tin, typename Tout, bool kStreaming>
__global__ void __launch_bounds__(Fp8Policy::kCastThreads) quantize_from_amax_kernel(CastParams p) {
  if (kernel_prologue_skip(p.noop_flag)) return;
  const float s = scale_from_amax_rule(*p.amax, p.rule.fp8_max, p.rule.eps, p.rule.power_of_2);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *p.scale_out = s;
    *p.scale_inv_out = scale_inv_from_scale(s);
  }
  cast_range<Tin, Tout, Fp8Policy::kCastUnroll, kStreaming>(p, s, static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x,
                                                 static_cast<int64_t>(gridDim.x) * blockDim.x, p.reverse);
}

// x = float(y) * *scale_inv, rounded to x's dtype. Here p.x is the fp8 input and p.y the output.
template <typename Tin, typename Tout>
__global__ void __launch_bounds__(Fp8Policy::kCastThreads) dequantize_kernel(CastParams p) {
  if (kernel_prologue_skip(p.noop_flag)) return;
  const float s = *p.scale;
  cast_range<Tin, Tout, Fp8Policy::kDequantUnroll>(p, s, static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x,
                                        static_cast<int64_t>(gridDim.x) * blockDim.x, false);
}

// One thread: scale and scale_inv from *amax.
__global__ void compute_scale_kernel(const float* amax, ScaleRule rule, float* scale, float* scale_inv,
                                     const float* noop_flag) {
  if (kernel_prologue_skip(noop_flag)) return;
  if (threadIdx.x == 0) {
    const float s = scale_from_amax_rule(*amax, rule.fp8_max, rule.eps, rule.power_of_2);
    *scale = s;
    *scale_inv = scale_inv_from_scale(s);
  }
}

// One cluster (gridDim.x == cluster size) holding x on chip; the host guarantees
// nvec <= Fp8Policy::kQcsVecPerThread * gridDim.x * blockDim.x.
template <typename Tin, typename Tout>
__global__ void __launch_bounds__(Fp8Policy::kClusterThreads, 1) quantize_current_scaling_cluster_kernel(CastParams p) {
  if (kernel_prologue_skip(p.noop_flag)) return;
  constexpr int kN = Vec16<Tin>::kN;
  const int64_t start = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const void* xb = static_cast<const char*>(p.x) + p.split.head * static_cast<int64_t>(sizeof(Tin));
  void* yb = static_cast<char*>(p.y) + p.split.head * static_cast<int64_t>(sizeof(Tout));

  Vec16<Tin> v[Fp8Policy::kQcsVecPerThread];
  MagAcc<Tin> acc;
#pragma unroll
  for (int k = 0; k < Fp8Policy::kQcsVecPerThread; ++k) {
    const int64_t i = start + k * stride;
    if (i < p.split.nvec) v[k] = load_vec<Tin>(xb, i);
  }
#pragma unroll
  for (int k = 0; k < Fp8Policy::kQcsVecPerThread; ++k) {
    if (start + k * stride < p.split.nvec) acc.add_vec(v[k]);
  }
  stream_scalars(p.split, start, stride,
                 [&](int64_t i) { acc.add_bits(elem_bits(load_elem<Tin>(p.x, i, p.split.in_aligned))); });

  const AmaxPartial total = cluster_reduce_amax(block_reduce_amax(acc.result()));
  cluster_done_reading();
  const float amax = bits_float(total.bits);
  const float s = scale_from_amax_rule(amax, p.rule.fp8_max, p.rule.eps, p.rule.power_of_2);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *p.amax_out = amax;
    if (p.nonfinite_flag != nullptr) *p.nonfinite_flag = total.nonfinite != 0 ? 1 : 0;
    *p.scale_out = s;
    *p.scale_inv_out = scale_inv_from_scale(s);
  }
#pragma unroll
  for (int k = 0; k < Fp8Policy::kQcsVecPerThread; ++k) {
    const int64_t i = start + k * stride;
    if (i < p.split.nvec) {
      OutPack<Tout, kN> o;
#pragma unroll
      for (int e = 0; e < kN; ++e) o.set(e, from_float<Tout>(load_float(v[k].elem(e)) * s));
      o.store(yb, i);
    }
  }
  stream_scalars(p.split, start, stride, [&](int64_t i) {
    const float xv = load_float(load_elem<Tin>(p.x, i, p.split.in_aligned));
    store_elem<Tout>(p.y, i, from_float<Tout>(xv * s), p.split.out_aligned);
  });
  cluster_wait_before_exit();
}

}  // namespace cuda
}  // namespace embscale
