// The amax peers of the fp8 benchmark (peers_fp8.h), written from their published designs.
//
// Both TE-style designs share one first-stage kernel: 512 threads, grid-stride over 16-byte vectors
// (4 fp32 or 8 fp16/bf16 per load) with the grid capped at 65535 blocks, a warp-shuffle + shared-memory
// block reduction, and then either one atomic max per block (te_atomic, after a memset of the output)
// or one block maximum per block into a workspace that a single 256-thread block reduces (te_two_stage).
// An input not aligned to 16 bytes takes the same kernel with one element per load, as TE does.
// max is exact and order-independent, so every peer returns the same bits as embscale.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cub/device/device_reduce.cuh>

#include <climits>
#include <cstdint>
#include <string>

#include "core/cuda/check.cuh"
#include "core/dispatch.h"
#include "peers_fp8.h"

namespace embscale {
namespace tools {
namespace peers {
namespace {

constexpr int kTeThreads = 512;
constexpr int64_t kTeMaxBlocks = 65535;
constexpr int kFinalThreads = 256;
constexpr int kVectorBytes = 16;

__device__ __forceinline__ float abs_f(float v) { return fabsf(v); }
__device__ __forceinline__ float abs_f(__half v) { return fabsf(__half2float(v)); }
__device__ __forceinline__ float abs_f(__nv_bfloat16 v) { return fabsf(__bfloat162float(v)); }

template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

// Max over the block; the result is valid in thread 0. fmaxf drops NaN, so NaN elements vanish here.
template <int kThreads>
__device__ __forceinline__ float block_max(float m) {
  constexpr int kWarps = kThreads / 32;
  __shared__ float warp_max[kWarps];
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_max[warp] = m;
  __syncthreads();
  if (warp == 0) {
    m = lane < kWarps ? warp_max[lane] : 0.0f;
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  }
  return m;
}

// Stage one of both TE designs. kAtomic: one atomicMax per block into out[0] (zeroed beforehand);
// else out[blockIdx.x] = the block's maximum. The block maximum is >= +0, so comparing the fp32 bits
// as signed integers orders it correctly.
template <typename T, int kVec, bool kAtomic>
__global__ void __launch_bounds__(kTeThreads) te_amax_stage1_kernel(const T* __restrict__ x, int64_t n,
                                                                     float* __restrict__ out) {
  const int64_t num_vec = n / kVec;
  const auto* xv = reinterpret_cast<const Pack<T, kVec>*>(x);
  float m = 0.0f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kTeThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kTeThreads + threadIdx.x; i < num_vec; i += stride) {
    const Pack<T, kVec> p = xv[i];
#pragma unroll
    for (int k = 0; k < kVec; ++k) m = fmaxf(m, abs_f(p.v[k]));
  }
  // The n % kVec elements after the last full vector.
  if (blockIdx.x == 0 && threadIdx.x < n - num_vec * kVec) m = fmaxf(m, abs_f(x[num_vec * kVec + threadIdx.x]));
  m = block_max<kTeThreads>(m);
  if (threadIdx.x == 0) {
    if (kAtomic)
      atomicMax(reinterpret_cast<int*>(out), __float_as_int(m));
    else
      out[blockIdx.x] = m;
  }
}

// Stage two of te_two_stage: one block folds the block maxima into the output.
__global__ void __launch_bounds__(kFinalThreads) te_amax_final_kernel(const float* __restrict__ block_max_in,
                                                                      int num_blocks, float* __restrict__ amax) {
  float m = 0.0f;
  for (int i = threadIdx.x; i < num_blocks; i += kFinalThreads) m = fmaxf(m, block_max_in[i]);
  m = block_max<kFinalThreads>(m);
  if (threadIdx.x == 0) *amax = m;
}

template <typename T>
int elements_per_load(const void* x) {
  return reinterpret_cast<uintptr_t>(x) % kVectorBytes == 0 ? kVectorBytes / static_cast<int>(sizeof(T)) : 1;
}

// One thread per load unit, as many blocks as that needs, at most 65535 (the grid then strides).
inline int te_num_blocks(int64_t n, int vec) {
  const int64_t units = n / vec;
  const int64_t blocks = (units + kTeThreads - 1) / kTeThreads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > kTeMaxBlocks ? kTeMaxBlocks : blocks));
}

template <typename T, bool kAtomic>
Status launch_te_stage1(const T* x, int64_t n, float* out, int blocks, cudaStream_t s) {
  constexpr int kVec = kVectorBytes / sizeof(T);
  if (reinterpret_cast<uintptr_t>(x) % kVectorBytes == 0)
    te_amax_stage1_kernel<T, kVec, kAtomic><<<blocks, kTeThreads, 0, s>>>(x, n, out);
  else
    te_amax_stage1_kernel<T, 1, kAtomic><<<blocks, kTeThreads, 0, s>>>(x, n, out);
  return cuda::cuda_status(cudaGetLastError(), "te_amax_stage1_kernel");
}

template <typename T>
Status te_atomic(const T* x, int64_t n, float* amax, cudaStream_t s) {
  EMBSCALE_RETURN_IF_ERROR(cuda::cuda_status(cudaMemsetAsync(amax, 0, sizeof(float), s), "cudaMemsetAsync"));
  return launch_te_stage1<T, true>(x, n, amax, te_num_blocks(n, elements_per_load<T>(x)), s);
}

template <typename T>
Status te_two_stage(const T* x, int64_t n, float* amax, float* ws, cudaStream_t s) {
  const int blocks = te_num_blocks(n, elements_per_load<T>(x));
  EMBSCALE_RETURN_IF_ERROR((launch_te_stage1<T, false>(x, n, ws, blocks, s)));
  te_amax_final_kernel<<<1, kFinalThreads, 0, s>>>(ws, blocks, amax);
  return cuda::cuda_status(cudaGetLastError(), "te_amax_final_kernel");
}

struct AbsToFloat {
  __device__ float operator()(float v) const { return fabsf(v); }
  __device__ float operator()(__half v) const { return fabsf(__half2float(v)); }
  __device__ float operator()(__nv_bfloat16 v) const { return fabsf(__bfloat162float(v)); }
};
struct MaxF {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// CUB with 32-bit item counts (the common call); its temp storage is sized by the same call with a
// null pointer.
template <typename T>
Status cub_amax(const T* x, int64_t n, float* amax, void* ws, size_t* ws_bytes, cudaStream_t s) {
  if (n > INT_MAX) return unsupported("cub peer: n = " + std::to_string(n) + " exceeds 2^31-1 items");
  return cuda::cuda_status(cub::DeviceReduce::TransformReduce(ws, *ws_bytes, x, amax, static_cast<int>(n), MaxF{},
                                                              AbsToFloat{}, 0.0f, s),
                           "cub::DeviceReduce::TransformReduce");
}

// CUDA's own type for a storage type of core/dispatch.h (the peers compute on __half and
// __nv_bfloat16, as TE does).
template <typename T>
struct CudaElem {
  using type = T;
};
template <>
struct CudaElem<fp16_t> {
  using type = __half;
};
template <>
struct CudaElem<bf16_t> {
  using type = __nv_bfloat16;
};

}  // namespace

const char* amax_peer_name(AmaxPeer p) {
  switch (p) {
    case AmaxPeer::kTeAtomic: return "te_atomic";
    case AmaxPeer::kTeTwoStage: return "te_two_stage";
    case AmaxPeer::kCub: return "cub";
  }
  return "unknown";
}

std::vector<AmaxPeer> all_amax_peers() { return {AmaxPeer::kTeAtomic, AmaxPeer::kTeTwoStage, AmaxPeer::kCub}; }

Status amax_peer_workspace_size(AmaxPeer p, DType dtype, int64_t n, size_t* bytes) {
  if (bytes == nullptr) return invalid_argument("bytes: must not be null");
  if (n < 0) return invalid_argument("n: must be >= 0, got " + std::to_string(n));
  *bytes = 0;
  return dispatch_float(dtype, "x", [&](auto tx) -> Status {
    using T = typename CudaElem<typename decltype(tx)::type>::type;
    switch (p) {
      case AmaxPeer::kTeAtomic: return Status::Ok();
      case AmaxPeer::kTeTwoStage:
        // The grid depends on the pointer's alignment (one element per load when unaligned, hence
        // more blocks); size for that larger grid so any pointer fits.
        *bytes = sizeof(float) * static_cast<size_t>(te_num_blocks(n, 1));
        return Status::Ok();
      case AmaxPeer::kCub: return cub_amax<T>(nullptr, n, nullptr, nullptr, bytes, nullptr);
    }
    return invalid_argument("peer: unknown amax peer");
  });
}

Status amax_peer(AmaxPeer p, const void* x, DType dtype, int64_t n, float* amax, void* workspace,
                 size_t workspace_bytes, void* stream) {
  if (amax == nullptr) return invalid_argument("amax: must not be null");
  if (n < 0) return invalid_argument("n: must be >= 0, got " + std::to_string(n));
  if (x == nullptr && n > 0) return invalid_argument("x: must not be null");
  // te_two_stage's need is checked here; CUB checks its own temp storage size and reports a short one.
  if (p == AmaxPeer::kTeTwoStage) {
    const size_t need = sizeof(float) * static_cast<size_t>(te_num_blocks(n, 1));
    if (workspace_bytes < need || workspace == nullptr)
      return Status(StatusCode::kWorkspaceTooSmall, "workspace: " + std::to_string(workspace_bytes) +
                                                        " bytes given, " + std::to_string(need) + " needed");
  }
  auto s = static_cast<cudaStream_t>(stream);
  return dispatch_float(dtype, "x", [&](auto tx) -> Status {
    using T = typename CudaElem<typename decltype(tx)::type>::type;
    const T* xt = static_cast<const T*>(x);
    switch (p) {
      case AmaxPeer::kTeAtomic: return te_atomic<T>(xt, n, amax, s);
      case AmaxPeer::kTeTwoStage: return te_two_stage<T>(xt, n, amax, static_cast<float*>(workspace), s);
      case AmaxPeer::kCub: {
        size_t bytes = workspace_bytes;
        return cub_amax<T>(xt, n, amax, workspace, &bytes, s);
      }
    }
    return invalid_argument("peer: unknown amax peer");
  });
}

}  // namespace peers
}  // namespace tools
}  // namespace embscale
