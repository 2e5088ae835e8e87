// amax on CUDA: path choice (cluster / atomic / two-stage, see fp8_amax.cuh), workspace size, the small
// init and final-reduce kernels of the grid paths, and the one dtype dispatch of the amax kernels (fp32,
// fp16, bf16).
#include <algorithm>
#include <string>

#include "fp8/fp8_backend.h"
#include "fp8/cuda/fp8_amax.cuh"
#include "core/workspace.h"
#include "fp8/cuda/fp8_launch.cuh"

namespace embscale {
namespace cuda {

// One thread: the atomic path's initial values.
__global__ void amax_init_kernel(AmaxOutputs o, const float* noop_flag) {
  if (kernel_prologue_skip(noop_flag)) return;
  if (threadIdx.x == 0) {
    *o.amax = 0.0f;
    if (o.nonfinite_flag != nullptr) *o.nonfinite_flag = 0;
  }
}

// One block: reduces nslots slots of the two-stage path and writes amax and flag.
__global__ void __launch_bounds__(Fp8Policy::kAmaxReduceThreads)
    amax_reduce_slots_kernel(AmaxOutputs o, int nslots, const float* noop_flag) {
  if (kernel_prologue_skip(noop_flag)) return;
  // Fixed traversal (thread t takes slots t, t + blockDim, ...), then the block reduction. The slots
  // were written by the previous grid: read them through L2.
  AmaxPartial p{0u, 0u};
  for (int b = threadIdx.x; b < nslots; b += blockDim.x) {
    const uint32_t v = __ldcg(&o.slots[b]);
    p.bits = max(p.bits, v & 0x7fffffffu);
    p.nonfinite |= v >> 31;
  }
  const AmaxPartial total = block_reduce_amax(p);
  if (threadIdx.x == 0) {
    *o.amax = bits_float(total.bits);
    if (o.nonfinite_flag != nullptr) *o.nonfinite_flag = total.nonfinite != 0 ? 1 : 0;
  }
}

AmaxPath choose_amax_path(AmaxAlgo algo, int64_t bytes, bool cluster_available) {
  if (algo == AmaxAlgo::kAtomic) return AmaxPath::kAtomic;
  if (algo == AmaxAlgo::kTwoStage) return AmaxPath::kTwoStage;
  if (cluster_available && bytes <= Fp8Policy::kAmaxClusterMaxBytes) return AmaxPath::kCluster;
  return Fp8Policy::kAmaxAutoTwoStage ? AmaxPath::kTwoStage : AmaxPath::kAtomic;
}

namespace {
// Upper bound of any grid amax kernel's resident wave: SMs x (threads per SM / threads per block).
int64_t max_amax_grid() {
  return static_cast<int64_t>(sm_count()) * std::max(1, max_threads_per_sm() / Fp8Policy::kAmaxGridThreads);
}
}  // namespace

size_t amax_grid_workspace_bytes(AmaxPath path) {
  WorkspaceLayout layout(WorkspaceLayout::Base::kAsGiven);
  if (path == AmaxPath::kTwoStage) layout.add(static_cast<size_t>(max_amax_grid()) * sizeof(uint32_t));  // the slots
  return layout.size();
}

int amax_grid_blocks(int64_t work_vectors, int wave) {
  const int64_t cap = std::min<int64_t>(wave, max_amax_grid());
  const bool mid = work_vectors * 16 <= Fp8Policy::kAmaxMidMaxBytes;
  const int vpt = mid ? Fp8Policy::kAmaxMidVectorsPerThread : Fp8Policy::kAmaxGridVectorsPerThread;
  const int64_t want =
      ceil_div(std::max<int64_t>(work_vectors, 1), static_cast<int64_t>(Fp8Policy::kAmaxGridThreads) * vpt);
  return static_cast<int>(std::max<int64_t>(1, std::min(cap, want)));
}

Status launch_amax_init(cudaStream_t stream, float* amax, int32_t* nonfinite_flag, const float* noop_flag,
                        int64_t input_bytes) {
  if (noop_flag == nullptr && input_bytes <= Fp8Policy::kAmaxMidMaxBytes) {
    // Plain zero stores in stream order (0.0f and 0 are all-zero bytes); the next kernel's programmatic
    // dependency does not apply across a memset, so it starts after it as after any stream operation.
    cudaError_t err = cudaMemsetAsync(amax, 0, sizeof(float), stream);
    if (err == cudaSuccess && nonfinite_flag != nullptr) {
      err = cudaMemsetAsync(nonfinite_flag, 0, sizeof(int32_t), stream);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      return cuda_status(err, "amax init (memset)");
    }
    return Status::Ok();
  }
  return launch_kernel("amax_init_kernel", amax_init_kernel, dim3(1), dim3(Arch::kWarpSize), 0, stream,
                       AmaxOutputs{amax, nonfinite_flag, nullptr}, noop_flag);
}

Status launch_amax_reduce_slots(cudaStream_t stream, const uint32_t* slots, int nslots, float* amax,
                                int32_t* nonfinite_flag, const float* noop_flag) {
  return launch_kernel("amax_reduce_slots_kernel", amax_reduce_slots_kernel, dim3(1),
                       dim3(Fp8Policy::kAmaxReduceThreads), 0, stream,
                       AmaxOutputs{amax, nonfinite_flag, const_cast<uint32_t*>(slots)}, nslots, noop_flag);
}

namespace {

template <typename T>
AmaxPath amax_path_for(int64_t n, AmaxAlgo algo) {
  const bool cluster = cluster_size_for<amax_cluster_kernel<T>>(Fp8Policy::kClusterThreads) > 0;
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
  p.out = AmaxOutputs{amax, nonfinite_flag, static_cast<uint32_t*>(ws)};
  AmaxPath path = amax_path_for<T>(n, algo);
  if (path == AmaxPath::kCluster) {
    const int c = cluster_size_for<amax_cluster_kernel<T>>(Fp8Policy::kClusterThreads);
    const Status st = launch_kernel("amax_cluster_kernel", amax_cluster_kernel<T>, dim3(c),
                                    dim3(Fp8Policy::kClusterThreads), c, stream, p);
    if (st.ok()) return st;
    // The cluster launch was refused (its error is cleared): kAuto falls back to the atomic path, which
    // needs no workspace either.
    path = AmaxPath::kAtomic;
  }
  const int64_t work = p.split.nvec + ceil_div(p.split.num_scalar(), 4);
  if (path == AmaxPath::kAtomic) {
    EMBSCALE_RETURN_IF_ERROR(launch_amax_init(stream, amax, nonfinite_flag, noop_flag, work * 16));
    if (n == 0) return Status::Ok();
    const int grid =
        amax_grid_blocks(work, resident_wave_blocks<amax_atomic_kernel<T>>(Fp8Policy::kAmaxGridThreads));
    return launch_kernel("amax_atomic_kernel", amax_atomic_kernel<T>, dim3(grid), dim3(Fp8Policy::kAmaxGridThreads),
                         0, stream, p);
  }
  EMBSCALE_RETURN_IF_ERROR(check_amax_slots(ws, "amax"));
  const int grid =
      amax_grid_blocks(work, resident_wave_blocks<amax_two_stage_kernel<T>>(Fp8Policy::kAmaxGridThreads));
  EMBSCALE_RETURN_IF_ERROR(launch_kernel("amax_two_stage_kernel", amax_two_stage_kernel<T>, dim3(grid),
                                         dim3(Fp8Policy::kAmaxGridThreads), 0, stream, p));
  return launch_amax_reduce_slots(stream, p.out.slots, grid, amax, nonfinite_flag, noop_flag);
}

}  // namespace

size_t launch_amax_workspace_bytes(const TensorView& x, AmaxAlgo algo) {
  size_t bytes = 0;
  (void)dispatch_float(x.dtype, "x", [&](auto t) -> Status {
    bytes = amax_grid_workspace_bytes(amax_path_for<typename decltype(t)::type>(x.numel(), algo));
    return Status::Ok();
  });
  return bytes;
}

Status launch_amax(cudaStream_t stream, const TensorView& x, float* amax, int32_t* nonfinite_flag,
                   const float* noop_flag, AmaxAlgo algo, void* ws) {
  return dispatch_float(x.dtype, "x", [&](auto t) -> Status {
    return launch_amax_typed<typename decltype(t)::type>(stream, x, amax, nonfinite_flag, noop_flag, algo, ws);
  });
}

// ---- backend entry points (fp8/fp8_backend.h) ---------------------------------------------------
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
