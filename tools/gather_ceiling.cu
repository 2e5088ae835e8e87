// Bare gather of looked-up rows (gather_ceiling.h).
#include "gather_ceiling.h"

#include <cuda_runtime.h>

#include <string>

#include "cuda/check.cuh"
#include "embscale/memory.h"

namespace embscale {
namespace tools {
namespace {

constexpr int kThreads = 256;
constexpr int kInFlight = 8;  // rows per lane in flight

// Lane group of `lanes` lanes (a power of two) per row; lane r loads 16 bytes at r * 16 when r < units.
// Each group walks rows g, g + groups, ... kInFlight at a time: the offsets, then the row loads, then the
// sum. The sum is kept alive by a store that never happens (its condition depends on every load).
__global__ void __launch_bounds__(kThreads) gather_rows_kernel(const char* __restrict__ base,
                                                               const int64_t* __restrict__ off, int64_t n,
                                                               int lanes, int units, float* sink) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int rank = static_cast<int>(threadIdx.x) & (lanes - 1);
  const int64_t groups = static_cast<int64_t>(gridDim.x) * blockDim.x / lanes;
  const int col = (rank < units ? rank : 0) * 16;
  float acc = 0.0f;
  for (int64_t g = tid / lanes; g < n; g += groups * kInFlight) {
    int64_t o[kInFlight];
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) {
      const int64_t i = g + j * groups;
      o[j] = i < n ? __ldg(off + i) : -1;
    }
    float4 v[kInFlight];
#pragma unroll
    for (int j = 0; j < kInFlight; ++j)
      v[j] = o[j] >= 0 ? __ldg(reinterpret_cast<const float4*>(base + o[j] + col)) : make_float4(0, 0, 0, 0);
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) acc += v[j].x + v[j].y + v[j].z + v[j].w;
  }
  if (acc == -1.2345e-30f) sink[0] = acc;
}

}  // namespace

Status gather_ceiling(const Context& ctx, const void* weights, const std::vector<int64_t>& byte_offsets,
                      int row_bytes, const TimingConfig& cfg, Timing* t) {
  using cuda::cuda_status;
  if (row_bytes <= 0 || row_bytes % 16 != 0 || row_bytes > 512)
    return invalid_argument("gather ceiling: row bytes " + std::to_string(row_bytes) +
                            "; expected a multiple of 16 up to 512");
  const int units = row_bytes / 16;
  int lanes = 1;
  while (lanes < units) lanes *= 2;
  Buffer off(Backend::kCuda, byte_offsets.size() * sizeof(int64_t));
  Buffer sink(Backend::kCuda, sizeof(float));
  if (!off.valid() || !sink.valid()) return Status(StatusCode::kBackendError, "gather ceiling: allocation failed");
  auto s = static_cast<cudaStream_t>(ctx.stream);
  EMBSCALE_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(off.data(), byte_offsets.data(), off.bytes(),
                                                       cudaMemcpyHostToDevice, s),
                                       "cudaMemcpyAsync (gather offsets)"));
  int dev = 0, sms = 0, per_sm = 0;
  EMBSCALE_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&dev), "cudaGetDevice"));
  EMBSCALE_RETURN_IF_ERROR(cuda_status(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "SM count"));
  EMBSCALE_RETURN_IF_ERROR(cuda_status(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gather_rows_kernel, kThreads, 0), "occupancy"));
  const int blocks = sms * (per_sm > 0 ? per_sm : 1);
  const auto n = static_cast<int64_t>(byte_offsets.size());
  return time_op(ctx, cfg,
                 [&](int) {
                   gather_rows_kernel<<<blocks, kThreads, 0, s>>>(static_cast<const char*>(weights),
                                                                  off.as<int64_t>(), n, lanes, units,
                                                                  sink.as<float>());
                   return cuda_status(cudaGetLastError(), "gather_rows_kernel");
                 },
                 t);
}

}  // namespace tools
}  // namespace embscale
