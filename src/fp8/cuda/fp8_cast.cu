// Casts on CUDA: compute_scale, quantize, dequantize and quantize_current_scaling (one cluster launch for
// small inputs, one resident grid for mid-size ones, amax + cast on one grid of runs up to 32 MiB, amax +
// quantize_from_amax otherwise; see fp8_cast.cuh). The runtime dtype -> template
// dispatch of each op is here, over the closed set {fp32, fp16, bf16} x {e4m3, e5m2}.
#include <algorithm>
#include <string>

#include "fp8/fp8_backend.h"
#include "fp8/cuda/fp8_cast.cuh"
#include "fp8/cuda/fp8_launch.cuh"

namespace embscale {
namespace cuda {

namespace {

float fp8_max_for(DType f8dt) { return f8dt == DType::kF8E5M2 ? kFp8E5M2Max : kFp8E4M3Max; }

// Blocks of a cast grid over s (kCastThreads threads, unroll vectors each): capped at kCastBlocksPerSm
// resident blocks an SM (the threads then loop over the input), or one block per chunk of the input.
int cast_grid_blocks(const RangeSplit& s, int unroll, bool capped = true) {
  const int64_t work = s.nvec + ceil_div(s.num_scalar(), 4);
  const int64_t cap = capped ? static_cast<int64_t>(sm_count()) * Fp8Policy::kCastBlocksPerSm : int64_t{INT32_MAX};
  const int64_t want =
      ceil_div(std::max<int64_t>(work, 1), static_cast<int64_t>(Fp8Policy::kCastThreads) * unroll);
  return static_cast<int>(std::max<int64_t>(1, std::min(cap, want)));
}

// Cluster size for the one-launch current-scaling path of Tin -> Tout, or 0 when it does not apply
// (explicit amax algorithm, too large, or no cluster support). The workspace does not depend on it: the
// fallback under kAuto is the atomic amax path, which needs none either.
template <typename Tin, typename Tout>
int qcs_cluster_size(int64_t n, AmaxAlgo algo) {
  if (algo != AmaxAlgo::kAuto) return 0;
  if (n * static_cast<int64_t>(sizeof(Tin)) > Fp8Policy::kQcsClusterMaxBytes) return 0;
  const int c = cluster_size_for<quantize_current_scaling_cluster_kernel<Tin, Tout>>(Fp8Policy::kClusterThreads);
  if (c == 0) return 0;
  const int64_t capacity =
      static_cast<int64_t>(Fp8Policy::kQcsVecPerThread) * c * Fp8Policy::kClusterThreads * Vec16<Tin>::kN;
  return n <= capacity ? c : 0;
}

// Whether the resident kernel of Tin -> Tout can run one block of kQcsResidentThreads threads on every
// SM of the current device as a cooperative grid (cached per device and kernel).
template <typename Tin, typename Tout>
bool resident_available() {
  constexpr auto kKernel = quantize_current_scaling_resident_kernel<Tin, Tout>;
  return per_kernel_cached<kKernel>([]() -> int {
    int dev = 0, coop = 0, blocks = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kKernel, Fp8Policy::kQcsResidentThreads, 0) != cudaSuccess) {
      cudaGetLastError();
      return -1;
    }
    return coop != 0 && blocks >= 1 ? 1 : -1;
  }) > 0;
}

// The resident path's shape for x split as `split`: one block per SM and vecs_per_thread vectors a
// thread; blocks == 0 when the path does not apply (explicit amax algorithm, outside
// [kQcsResidentMinBytes, kQcsResidentMaxBytes], no vectors, more than the device holds, or unavailable).
struct ResidentShape {
  int blocks = 0;
  int vecs_per_thread = 0;
};
// x's size (bytes) and the amax algorithm are in the resident path's range.
bool qcs_resident_range(int64_t bytes, AmaxAlgo algo) {
  return algo == AmaxAlgo::kAuto && bytes >= Fp8Policy::kQcsResidentMinBytes && bytes <= Fp8Policy::kQcsResidentMaxBytes;
}
template <typename Tin, typename Tout>
ResidentShape qcs_resident_shape(const RangeSplit& split, AmaxAlgo algo) {
  if (!qcs_resident_range(split.n * static_cast<int64_t>(sizeof(Tin)), algo) || split.nvec == 0 ||
      !resident_available<Tin, Tout>())
    return {};
  const int blocks = sm_count();
  const int64_t k = ceil_div(split.nvec, static_cast<int64_t>(blocks) * Fp8Policy::kQcsResidentThreads);
  if (k > Fp8Policy::kQcsResidentVecs) return {};
  return {blocks, static_cast<int>(k)};
}

// x's size (bytes) and the amax algorithm are in the runs pair's range (where no path above it runs).
bool qcs_runs_range(int64_t bytes, AmaxAlgo algo) {
  return algo == AmaxAlgo::kAuto && bytes > 0 && bytes <= Fp8Policy::kQcsRunsMaxBytes;
}

// Workspace of the resident path and the runs pair: two 32-bit partials for each block of the runs grid
// (kQcsRunBlocksPerSm an SM; the resident grid's one block an SM uses the first half), whenever x's size
// lies in the runs pair's range, which holds the resident range and the cluster range (a refused cluster
// launch falls back to the runs pair). The size query sees neither y nor the pointers' alignment.
size_t qcs_workspace_bytes(const TensorView& x, AmaxAlgo algo) {
  if (!qcs_runs_range(x.numel() * static_cast<int64_t>(dtype_size(x.dtype)), algo)) return 0;
  return 2 * sizeof(uint32_t) * static_cast<size_t>(sm_count()) * Fp8Policy::kQcsRunBlocksPerSm;
}

// The workspace a path that keeps partials there was given: non-null and 4-byte aligned.
Status check_partials_workspace(const void* ws) {
  if (ws == nullptr || reinterpret_cast<uintptr_t>(ws) % 4 != 0)
    return invalid_argument("quantize_current_scaling: workspace must be non-null and 4-byte aligned "
                            "(quantize_current_scaling_workspace_size() is nonzero for this x)");
  return Status::Ok();
}

}  // namespace

// ---- backend entry points (fp8/fp8_backend.h) ---------------------------------------------------
Status compute_scale(const Context& ctx, const float* amax, float fp8_max_value, const ScaleOptions& opts,
                     float* scale, float* scale_inv, const float* noop_flag) {
  const ScaleRule rule{fp8_max_value, opts.eps, opts.power_of_2};
  return launch_kernel("compute_scale_kernel", compute_scale_kernel, dim3(1), dim3(Arch::kWarpSize), 0,
                       static_cast<cudaStream_t>(ctx.stream), amax, rule, scale, scale_inv, noop_flag);
}

Status quantize(const Context& ctx, const TensorView& x, const float* scale, const TensorView& y,
                const float* noop_flag) {
  const int64_t n = x.numel();
  if (n == 0) return Status::Ok();
  return dispatch_float_fp8(x.dtype, "x", y.dtype, "y", [&](auto tin, auto tout) -> Status {
    using Tin = typename decltype(tin)::type;
    using Tout = typename decltype(tout)::type;
    CastParams p{};
    p.x = x.data;
    p.y = y.data;
    p.split = make_split(x.data, sizeof(Tin), n, y.data, sizeof(Tout));
    p.scale = scale;
    p.noop_flag = noop_flag;
    return launch_kernel("quantize_scaled_kernel", quantize_scaled_kernel<Tin, Tout>,
                         dim3(cast_grid_blocks(p.split, Fp8Policy::kCastUnroll, Fp8Policy::kQuantizeGridCapped)),
                         dim3(Fp8Policy::kCastThreads), 0, static_cast<cudaStream_t>(ctx.stream), p);
  });
}

Status dequantize(const Context& ctx, const TensorView& y, const float* scale_inv, const TensorView& x,
                  const float* noop_flag) {
  const int64_t n = y.numel();
  if (n == 0) return Status::Ok();
  return dispatch_float_fp8(x.dtype, "x", y.dtype, "y", [&](auto tout, auto tin) -> Status {
    using Tin = typename decltype(tin)::type;    // fp8
    using Tout = typename decltype(tout)::type;  // fp32/fp16/bf16
    CastParams p{};
    p.x = y.data;
    p.y = x.data;
    p.split = make_split(y.data, sizeof(Tin), n, x.data, sizeof(Tout));
    p.scale = scale_inv;
    p.noop_flag = noop_flag;
    return launch_kernel("dequantize_kernel", dequantize_kernel<Tin, Tout>,
                         dim3(cast_grid_blocks(p.split, Fp8Policy::kDequantUnroll)), dim3(Fp8Policy::kCastThreads), 0,
                         static_cast<cudaStream_t>(ctx.stream), p);
  });
}

Status quantize_current_scaling_workspace_size(const TensorView& x, const CurrentScalingOptions& opts,
                                               size_t* bytes) {
  *bytes = std::max(launch_amax_workspace_bytes(x, opts.amax.algo), qcs_workspace_bytes(x, opts.amax.algo));
  return Status::Ok();
}

Status quantize_current_scaling(const Context& ctx, const TensorView& x, const TensorView& y, float* amax_out,
                                float* scale, float* scale_inv, const CurrentScalingOptions& opts, void* ws,
                                size_t ws_bytes) {
  (void)ws_bytes;
  const int64_t n = x.numel();
  const auto stream = static_cast<cudaStream_t>(ctx.stream);
  return dispatch_float_fp8(x.dtype, "x", y.dtype, "y", [&](auto tin, auto tout) -> Status {
    using Tin = typename decltype(tin)::type;
    using Tout = typename decltype(tout)::type;
    CastParams p{};
    p.x = x.data;
    p.y = y.data;
    p.split = make_split(x.data, sizeof(Tin), n, y.data, sizeof(Tout));
    p.amax = amax_out;
    p.amax_out = amax_out;
    p.nonfinite_flag = opts.amax.nonfinite_flag;
    p.scale_out = scale;
    p.scale_inv_out = scale_inv;
    p.rule = ScaleRule{fp8_max_for(y.dtype), opts.scale.eps, opts.scale.power_of_2};
    p.noop_flag = opts.amax.noop_flag;
    p.reverse = Fp8Policy::kQcsReverse;
    const int c = qcs_cluster_size<Tin, Tout>(n, opts.amax.algo);
    if (c > 0) {
      const Status st = launch_kernel("quantize_current_scaling_cluster_kernel",
                                      quantize_current_scaling_cluster_kernel<Tin, Tout>, dim3(c),
                                      dim3(Fp8Policy::kClusterThreads), c, stream, p);
      if (st.ok()) return st;
      // The cluster launch was refused (its error is cleared): fall back to amax + cast below.
    }
    const ResidentShape r = qcs_resident_shape<Tin, Tout>(p.split, opts.amax.algo);
    if (r.blocks > 0) {
      EMBSCALE_RETURN_IF_ERROR(check_partials_workspace(ws));
      p.vecs_per_thread = r.vecs_per_thread;
      p.partials = static_cast<uint32_t*>(ws);
      LaunchShape shape;
      shape.grid = dim3(r.blocks);
      shape.block = dim3(Fp8Policy::kQcsResidentThreads);
      shape.cooperative = true;
      const Status st = launch_kernel_with("quantize_current_scaling_resident_kernel",
                                           quantize_current_scaling_resident_kernel<Tin, Tout>, shape, stream, p);
      if (st.ok()) return st;
      // The cooperative launch was refused (its error is cleared): fall back to amax + cast below.
    }
    const int64_t x_bytes = n * static_cast<int64_t>(sizeof(Tin));
    if (qcs_runs_range(x_bytes, opts.amax.algo)) {
      // One grid of contiguous runs for the amax and the cast (Fp8Policy::kQcsRunsMaxBytes), the blocks'
      // amax partials passed between them in the workspace.
      EMBSCALE_RETURN_IF_ERROR(check_partials_workspace(ws));
      const dim3 grid(sm_count() * Fp8Policy::kQcsRunBlocksPerSm), block(Fp8Policy::kQcsRunThreads);
      p.partials = static_cast<uint32_t*>(ws);
      AmaxParams a;
      a.x = x.data;
      a.split = make_split(x.data, sizeof(Tin), n, nullptr, 0);
      a.noop_flag = opts.amax.noop_flag;
      a.out = AmaxOutputs{amax_out, opts.amax.nonfinite_flag, p.partials};
      EMBSCALE_RETURN_IF_ERROR(launch_kernel("amax_runs_kernel", amax_runs_kernel<Tin>, grid, block, 0, stream, a));
      return launch_kernel("quantize_from_amax_runs_kernel", quantize_from_amax_runs_kernel<Tin, Tout>, grid, block,
                           0, stream, p);
    }
    // amax (any path; none needs a workspace under kAuto), then the cast, PDL-launched: it waits for the
    // amax kernels to finish before reading *amax.
    EMBSCALE_RETURN_IF_ERROR(
        launch_amax(stream, x, amax_out, opts.amax.nonfinite_flag, opts.amax.noop_flag, opts.amax.algo, ws));
    // With n == 0 the cast has nothing to do, but scale and scale_inv must still be written.
    // The cast's grid and cache hints by the size of x (Fp8Policy): evict-first stores while x fits L2,
    // no grid cap from kQcsUncappedMinBytes on.
    const dim3 grid(cast_grid_blocks(p.split, Fp8Policy::kCastUnroll, x_bytes < Fp8Policy::kQcsUncappedMinBytes));
    const auto kernel = x_bytes <= Fp8Policy::kQcsStreamingMaxBytes ? quantize_from_amax_kernel<Tin, Tout, true>
                                                                     : quantize_from_amax_kernel<Tin, Tout, false>;
    return launch_kernel("quantize_from_amax_kernel", kernel, grid, dim3(Fp8Policy::kCastThreads), 0, stream, p);
  });
}

}  // namespace cuda
}  // namespace embscale
