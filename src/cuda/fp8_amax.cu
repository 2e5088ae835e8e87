// amax on CUDA: path choice (cluster / atomic / two-stage, see fp8_amax.cuh), workspace size and the
// one dtype dispatch of the amax kernels (fp32, fp16, bf16).
#include <algorithm>

#include "api/fp8_backend.h"
#include "cuda/fp8_amax.cuh"
#include "cuda/fp8_launch.cuh"

namespace embscale {
namespace cuda {

AmaxPath choose_amax_path(AmaxAlgo algo, int64_t bytes, bool cluster_available) {
  if (algo == AmaxAlgo::kAtomic) return AmaxPath::kAtomic;
  if (algo == AmaxAlgo::kTwoStage) return AmaxPath::kTwoStage;
  return (cluster_available && bytes <= kAmaxClusterMaxBytes) ? AmaxPath::kCluster : AmaxPath::kAtomic;
}

size_t amax_grid_workspace_bytes(AmaxPath path) {
  switch (path) {
    case AmaxPath::kCluster:
      return 0;
    case AmaxPath::kAtomic:
      return kWsHeaderBytes;
    case AmaxPath::kTwoStage: {
      const size_t slots = static_cast<size_t>(sm_count()) * kAmaxGridBlocksPerSm * 4;
      return kWsHeaderBytes + (slots + 255) / 256 * 256;
    }
  }
  return 0;
}

int amax_grid_blocks(int64_t work_vectors) {
  const int64_t per_block = static_cast<int64_t>(kAmaxGridThreads) * kAmaxUnroll;
  const int64_t cap = static_cast<int64_t>(sm_count()) * kAmaxGridBlocksPerSm;
  return static_cast<int>(std::max<int64_t>(1, std::min(cap, ceil_div(std::max<int64_t>(work_vectors, 1), per_block))));
}

namespace {

template <typename T>
AmaxPath amax_path_for(int64_t n, AmaxAlgo algo) {
  const bool cluster = cluster_size_for(amax_cluster_kernel<T>, kClusterThreads) > 0;
  return choose_amax_path(algo, n * static_cast<int64_t>(sizeof(T)), cluster);
}

template <typename T>
Status launch_amax_typed(cudaStream_t stream, const TensorView& x, float* amax, int32_t* nonfinite_flag,
                         const float* noop_flag, AmaxAlgo algo, void* ws) {
  const int64_t n = x.numel();
  AmaxParams p;
  p.x = x.data;
  p.split = make_split(x.data, sizeof(T), n, nullptr, 0);
  p.noop_flag = noop_flag;
  p.out = AmaxOutputs{amax, nonfinite_flag, ws, 0u};
  const int64_t work = p.split.nvec + ceil_div(p.split.num_scalar(), 4);
  const AmaxPath path = amax_path_for<T>(n, algo);
  if (path != AmaxPath::kCluster) {
    EMBSCALE_RETURN_IF_ERROR(check_amax_workspace(ws, "amax"));
    p.out.token = next_launch_token();
  }
  switch (path) {
    case AmaxPath::kCluster: {
      const int c = cluster_size_for(amax_cluster_kernel<T>, kClusterThreads);
      return launch_kernel("amax_cluster_kernel", amax_cluster_kernel<T>, dim3(c), dim3(kClusterThreads), c,
                           stream, p);
    }
    case AmaxPath::kAtomic:
      return launch_kernel("amax_atomic_kernel", amax_atomic_kernel<T>, dim3(amax_grid_blocks(work)),
                           dim3(kAmaxGridThreads), 0, stream, p);
    case AmaxPath::kTwoStage:
      return launch_kernel("amax_two_stage_kernel", amax_two_stage_kernel<T>, dim3(amax_grid_blocks(work)),
                           dim3(kAmaxGridThreads), 0, stream, p);
  }
  return Status::Ok();
}

}  // namespace

size_t launch_amax_workspace_bytes(const TensorView& x, AmaxAlgo algo) {
  switch (x.dtype) {
    case DType::kF32:
      return amax_grid_workspace_bytes(amax_path_for<float>(x.numel(), algo));
    case DType::kF16:
      return amax_grid_workspace_bytes(amax_path_for<fp16_t>(x.numel(), algo));
    case DType::kBF16:
      return amax_grid_workspace_bytes(amax_path_for<bf16_t>(x.numel(), algo));
    default:
      return 0;
  }
}

Status launch_amax(cudaStream_t stream, const TensorView& x, float* amax, int32_t* nonfinite_flag,
                   const float* noop_flag, AmaxAlgo algo, void* ws) {
  switch (x.dtype) {
    case DType::kF32:
      return launch_amax_typed<float>(stream, x, amax, nonfinite_flag, noop_flag, algo, ws);
    case DType::kF16:
      return launch_amax_typed<fp16_t>(stream, x, amax, nonfinite_flag, noop_flag, algo, ws);
    case DType::kBF16:
      return launch_amax_typed<bf16_t>(stream, x, amax, nonfinite_flag, noop_flag, algo, ws);
    default:
      return unsupported(std::string("x: dtype ") + dtype_name(x.dtype) + " is not supported by amax on CUDA");
  }
}

// ---- backend entry points (api/fp8_backend.h) ---------------------------------------------------
Status amax_workspace_size(const TensorView& x, const AmaxOptions& opts, size_t* bytes) {
  *bytes = launch_amax_workspace_bytes(x, opts.algo);
  return Status::Ok();
}

Status amax(const Context& ctx, const TensorView& x, float* amax_out, const AmaxOptions& opts, void* ws,
            size_t ws_bytes) {
  (void)ws_bytes;
  return launch_amax(static_cast<cudaStream_t>(ctx.stream), x, amax_out, opts.nonfinite_flag, opts.noop_flag,
                     opts.algo, ws);
}

}  // namespace cuda
}  // namespace embscale
