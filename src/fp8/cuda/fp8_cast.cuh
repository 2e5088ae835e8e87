// Cast kernels: quantize (x * scale -> fp8), dequantize (fp8 * scale_inv -> x), compute_scale, and the
// two shapes of quantize-with-current-scaling.
//
//  * Large inputs: amax (fp8_amax.cuh) then quantize_from_amax_kernel. Every block derives the scale
//    from the finished *amax with the shared rule (scaling.h), block 0 also stores scale and scale_inv,
//    so amax -> scale -> cast runs with no host round trip (the cast is PDL-launched after the amax kernels). The cast walks the vectors in
//    reverse so it starts on the part of x the amax pass read last, which may still sit in L2.
//  * Inputs about the size of L2 (kAuto, Fp8Policy::kQcsRunsMaxBytes): the same two steps with
//    amax_runs_kernel and quantize_from_amax_runs_kernel, one grid of contiguous runs for both, so each
//    SM casts the run it read for the amax and finds it in the L2 partition beside it. The amax pass
//    leaves one partial per block in the workspace and the cast reduces them: two launches a call.
//  * Mid-size inputs (kAuto, Fp8Policy::kQcsResident*): quantize_current_scaling_resident_kernel, one
//    cooperative grid of one block per SM that holds x in registers, so x is read from memory once; the
//    blocks' amax partials meet in a workspace across one grid barrier.
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
  int vecs_per_thread = 0; // resident variant: vectors each thread holds in registers
  uint32_t* partials = nullptr; // resident and runs variants: [2 * gridDim.x] workspace, the blocks' amax bits, then flags
};

// Vector i of y's body = fp8(v * s): v's kN elements packed into one wide store (H: its cache hint).
template <typename Tin, typename Tout, StoreHint H = StoreHint::kDefault>
__device__ __forceinline__ void cast_vector(const Vec16<Tin>& v, float s, void* yb, int64_t i) {
  constexpr int kN = Vec16<Tin>::kN;
  OutPack<Tout, kN> o;
#pragma unroll
  for (int k = 0; k < kN; ++k) o.set(k, from_float<Tout>(load_float(v.elem(k)) * s));
  o.template store<H>(yb, i);
}

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
  stream_vectors<Tin, kUnroll, kLoad>(xb, count, start, stride, reverse,
                                      [&](int64_t i, const Vec16<Tin>& v) { cast_vector<Tin, Tout, kStore>(v, s, yb, i); });
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

// y = fp8(x * *scale). Block b casts the contiguous vectors [b * kCastThreads * kCastUnroll, (b + 1) *
// kCastThreads * kCastUnroll) (the grid covers the input once), so the blocks resident at once read and write
// one contiguous stretch (docs/tuning.md#fp8-quantize-contiguous-blocks).
template <typename Tin, typename Tout>
__global__ void __launch_bounds__(Fp8Policy::kCastThreads) quantize_scaled_kernel(CastParams p) {
  static_assert(!Fp8Policy::kQuantizeGridCapped, "contiguous blocks need a grid that covers the input");
  if (kernel_prologue_skip(p.noop_flag)) return;
  const float s = *p.scale;
  const int64_t gstart = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t gstride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t per = static_cast<int64_t>(blockDim.x) * Fp8Policy::kCastUnroll;
  const int64_t b0 = static_cast<int64_t>(blockIdx.x) * per;
  const int64_t first = b0 < p.split.nvec ? b0 : p.split.nvec;
  const int64_t count = (first + per < p.split.nvec ? first + per : p.split.nvec) - first;
  cast_vectors<Tin, Tout, Fp8Policy::kCastUnroll>(p, s, first, count, threadIdx.x, blockDim.x, false);
  cast_scalars<Tin, Tout>(p, s, gstart, gstride);
}

// The from-amax casts' scale: rule(*p.amax), which block 0's thread 0 also stores with scale_inv.
__device__ __forceinline__ float scale_from_finished_amax(const CastParams& p) {
  const float s = scale_from_amax_rule(*p.amax, p.rule.fp8_max, p.rule.eps, p.rule.power_of_2);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *p.scale_out = s;
    *p.scale_inv_out = scale_inv_from_scale(s);
  }
  return s;
}

// scale = rule(*amax); block 0 stores scale and scale_inv; y = fp8(x * scale).
template <typename Tin, typename Tout, bool kStreaming>
__global__ void __launch_bounds__(Fp8Policy::kCastThreads) quantize_from_amax_kernel(CastParams p) {
  if (kernel_prologue_skip(p.noop_flag)) return;
  const float s = scale_from_finished_amax(p);
  cast_range<Tin, Tout, Fp8Policy::kCastUnroll, kStreaming>(p, s, static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x,
                                                 static_cast<int64_t>(gridDim.x) * blockDim.x, p.reverse);
}

// The one-launch kernels' and the runs cast's scale from the whole input's amax partial; block 0's
// thread 0 stores amax, the non-finite flag, scale and scale_inv.
__device__ __forceinline__ float store_current_scaling(const CastParams& p, const AmaxPartial& total) {
  const float amax = bits_float(total.bits);
  const float s = scale_from_amax_rule(amax, p.rule.fp8_max, p.rule.eps, p.rule.power_of_2);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *p.amax_out = amax;
    if (p.nonfinite_flag != nullptr) *p.nonfinite_flag = total.nonfinite != 0 ? 1 : 0;
    *p.scale_out = s;
    *p.scale_inv_out = scale_inv_from_scale(s);
  }
  return s;
}

// The cast after amax_runs_kernel, launched on its grid: every block reduces the amax pass's partials
// (p.partials: gridDim.x bits, then gridDim.x flags; max and or, exact, so every block gets the same
// amax), block 0 stores amax, the flag, scale and scale_inv, and block b casts the b-th of gridDim.x
// contiguous runs of the vectors (block_run), last to first, with the streaming hints. Each run is so
// cast by the SM that read it for the amax (blocks of two equal grids that fit the device at once land
// on the same SMs) and read from the L2 partition beside that SM.
template <typename Tin, typename Tout>
__global__ void __launch_bounds__(Fp8Policy::kQcsRunThreads) quantize_from_amax_runs_kernel(CastParams p) {
  if (kernel_prologue_skip(p.noop_flag)) return;
  const float s = store_current_scaling(p, reduce_block_partials(p.partials, static_cast<int>(gridDim.x)));
  const BlockRun run = block_run(p.split.nvec);
  cast_vectors<Tin, Tout, Fp8Policy::kCastUnroll, true>(p, s, run.first, run.count, threadIdx.x, blockDim.x, true);
  cast_scalars<Tin, Tout>(p, s, static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x,
                          static_cast<int64_t>(gridDim.x) * blockDim.x);
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
  add_scalars(acc, p.x, p.split, start, stride);

  const AmaxPartial total = cluster_reduce_amax(block_reduce_amax(acc.result()));
  cluster_done_reading();
  const float s = store_current_scaling(p, total);
#pragma unroll
  for (int k = 0; k < Fp8Policy::kQcsVecPerThread; ++k) {
    const int64_t i = start + k * stride;
    if (i < p.split.nvec) cast_vector<Tin, Tout>(v[k], s, yb, i);
  }
  cast_scalars<Tin, Tout>(p, s, start, stride);
  cluster_wait_before_exit();
}

// ---- resident current scaling ---------------------------------------------------------------------
// One cooperative grid, every block resident (the host launches one block per SM, only when the whole
// of x fits: nvec <= gridDim.x * blockDim.x * p.vecs_per_thread, p.vecs_per_thread <=
// kQcsResidentVecs). Block b holds the contiguous vectors [b * per, (b + 1) * per), per =
// p.vecs_per_thread * blockDim.x; its thread t holds vector b * per + k * blockDim.x + t in register
// v[k], all loads issued before any is used. Each block's amax partial goes to p.partials[b] and
// [gridDim.x + b]; after the grid barrier every block reduces all partials (max and or: exact, so every
// block gets the same amax), derives the scale and casts what it holds; block 0 stores amax, the flag,
// scale and scale_inv.
template <typename Tin, typename Tout>
__global__ void __launch_bounds__(Fp8Policy::kQcsResidentThreads, 1)
    quantize_current_scaling_resident_kernel(CastParams p) {
  if (kernel_prologue_skip(p.noop_flag)) return;
  constexpr int kVecs = Fp8Policy::kQcsResidentVecs;
  const int threads = static_cast<int>(blockDim.x);
  const int t = static_cast<int>(threadIdx.x);
  const int64_t nvec = p.split.nvec;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * p.vecs_per_thread * threads;
  const auto index = [&](int k) { return first + static_cast<int64_t>(k) * threads + t; };
  const auto held = [&](int k) { return k < p.vecs_per_thread && index(k) < nvec; };
  const void* xb = static_cast<const char*>(p.x) + p.split.head * static_cast<int64_t>(sizeof(Tin));
  void* yb = static_cast<char*>(p.y) + p.split.head * static_cast<int64_t>(sizeof(Tout));

  Vec16<Tin> v[kVecs];
#pragma unroll
  for (int k = 0; k < kVecs; ++k) {
    v[k].raw = make_uint4(0u, 0u, 0u, 0u);  // +0 does not change the amax
    if (held(k)) v[k] = load_vec<Tin, LoadHint::kReadOnlyNoL1>(xb, index(k));
  }
  MagAcc<Tin> acc;
#pragma unroll
  for (int k = 0; k < kVecs; ++k) acc.add_vec(v[k]);
  const int64_t gstart = static_cast<int64_t>(blockIdx.x) * threads + t;
  const int64_t gstride = static_cast<int64_t>(gridDim.x) * threads;
  add_scalars(acc, p.x, p.split, gstart, gstride);
  store_block_partial(p.partials, block_reduce_amax(acc.result()));
  cg::this_grid().sync();

  const float s = store_current_scaling(p, reduce_block_partials(p.partials, static_cast<int>(gridDim.x)));
#pragma unroll
  for (int k = 0; k < kVecs; ++k)
    if (held(k)) cast_vector<Tin, Tout>(v[k], s, yb, index(k));
  cast_scalars<Tin, Tout>(p, s, gstart, gstride);
}

}  // namespace cuda
}  // namespace embscale
