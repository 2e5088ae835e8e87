// Bare gather of looked-up rows (gather_ceiling.h), a dev/ measurement: never part of the library or the CLI.
#include "gather_ceiling.h"

#include <cuda_runtime.h>

#include <string>

#include "core/cuda/check.cuh"
#include "core/cuda/device.cuh"
#include "embscale/memory.h"

namespace embscale {
namespace dev {
namespace {

constexpr int kThreads = 256;
constexpr int kInFlight = 8;  // rows per lane in flight

template <int kUnit>
struct Unit;
template <>
struct Unit<16> {
  using T = float4;
  static __device__ float sum(float4 v) { return v.x + v.y + v.z + v.w; }
};
template <>
struct Unit<4> {
  using T = float;
  static __device__ float sum(float v) { return v; }
};

// Lane group of `lanes` lanes (a power of two) per row; in pass p lane r loads the kUnit bytes of unit
// r + p * lanes when the row has that many units (row_units[i], or `units` for every row when null).
// Each group walks rows g, g + groups, ... kInFlight at a time: the offsets, then the row loads of all
// kPasses passes (kPasses = 0: `passes` passes, one at a time), then the sum. The sum is kept alive by a
// store that never happens (its condition depends on every load).
template <int kUnit, int kPasses>
__global__ void __launch_bounds__(kThreads) gather_rows_kernel(const char* __restrict__ base,
                                                               const int64_t* __restrict__ off,
                                                               const int32_t* __restrict__ row_units, int64_t n,
                                                               int lanes, int units, int passes, float* sink) {
  using V = typename Unit<kUnit>::T;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int rank = static_cast<int>(threadIdx.x) & (lanes - 1);
  const int64_t groups = static_cast<int64_t>(gridDim.x) * blockDim.x / lanes;
  float acc = 0.0f;
  for (int64_t g = tid / lanes; g < n; g += groups * kInFlight) {
    int64_t o[kInFlight];
    int un[kInFlight];
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) {
      const int64_t i = g + j * groups;
      o[j] = i < n ? __ldg(off + i) : -1;
      un[j] = row_units == nullptr ? units : (i < n ? __ldg(row_units + i) : 0);
    }
    const auto load = [&](int j, int u) {
      return o[j] >= 0 && u < un[j] ? __ldg(reinterpret_cast<const V*>(base + o[j] + u * kUnit)) : V{};
    };
    if constexpr (kPasses > 0) {
      V v[kInFlight][kPasses];
#pragma unroll
      for (int j = 0; j < kInFlight; ++j)
#pragma unroll
        for (int p = 0; p < kPasses; ++p) v[j][p] = load(j, rank + p * lanes);
#pragma unroll
      for (int j = 0; j < kInFlight; ++j)
#pragma unroll
        for (int p = 0; p < kPasses; ++p) acc += Unit<kUnit>::sum(v[j][p]);
    } else {
      for (int p = 0; p < passes; ++p) {
        V v[kInFlight];
#pragma unroll
        for (int j = 0; j < kInFlight; ++j) v[j] = load(j, rank + p * lanes);
#pragma unroll
        for (int j = 0; j < kInFlight; ++j) acc += Unit<kUnit>::sum(v[j]);
      }
    }
  }
  if (acc == -1.2345e-30f) sink[0] = acc;
}

}  // namespace

Status gather_ceiling(const Context& ctx, const void* weights, const std::vector<int64_t>& byte_offsets,
                      const std::vector<int32_t>& row_bytes, const tools::TimingConfig& cfg, tools::Timing* t) {
  using cuda::cuda_status;
  if (row_bytes.empty() || (row_bytes.size() != 1 && row_bytes.size() != byte_offsets.size()))
    return invalid_argument("gather ceiling: row_bytes must hold one size or one per row");
  int max_bytes = 0;
  bool all16 = true;
  for (const int32_t b : row_bytes) {
    if (b <= 0 || b % 4 != 0)
      return invalid_argument("gather ceiling: row bytes " + std::to_string(b) + "; expected a positive multiple of 4");
    all16 = all16 && b % 16 == 0;
    max_bytes = b > max_bytes ? b : max_bytes;
  }
  const int unit = all16 ? 16 : 4;
  const int max_units = max_bytes / unit;
  int lanes = 1;
  while (lanes < max_units && lanes < 32) lanes *= 2;
  const int passes = (max_units + lanes - 1) / lanes;
  std::vector<int32_t> units;
  if (row_bytes.size() > 1)
    for (const int32_t b : row_bytes) units.push_back(b / unit);

  Buffer off(Backend::kCuda, byte_offsets.size() * sizeof(int64_t));
  Buffer unit_buf(Backend::kCuda, units.size() * sizeof(int32_t));
  Buffer sink(Backend::kCuda, sizeof(float));
  if (!off.valid() || !unit_buf.valid() || !sink.valid())
    return Status(StatusCode::kBackendError, "gather ceiling: allocation failed");
  auto s = static_cast<cudaStream_t>(ctx.stream);
  EMBSCALE_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(off.data(), byte_offsets.data(), off.bytes(),
                                                       cudaMemcpyHostToDevice, s),
                                       "cudaMemcpyAsync (gather offsets)"));
  if (!units.empty())
    EMBSCALE_RETURN_IF_ERROR(cuda_status(
        cudaMemcpyAsync(unit_buf.data(), units.data(), unit_buf.bytes(), cudaMemcpyHostToDevice, s),
        "cudaMemcpyAsync (gather row sizes)"));
  // Rows of up to two passes have both passes' loads in flight at once; wider rows go pass by pass.
  const auto kernel = unit == 16 ? (passes == 1 ? gather_rows_kernel<16, 1>
                                                : passes == 2 ? gather_rows_kernel<16, 2> : gather_rows_kernel<16, 0>)
                                 : (passes == 1 ? gather_rows_kernel<4, 1> : gather_rows_kernel<4, 0>);
  const int blocks = cuda::sm_count() * cuda::blocks_per_sm(reinterpret_cast<const void*>(kernel), kThreads);
  const auto n = static_cast<int64_t>(byte_offsets.size());
  const int32_t* row_units = units.empty() ? nullptr : unit_buf.as<int32_t>();
  return tools::time_op(ctx, cfg,
                        [&](int) {
                          kernel<<<blocks, kThreads, 0, s>>>(static_cast<const char*>(weights), off.as<int64_t>(),
                                                             row_units, n, lanes, max_units, passes, sink.as<float>());
                          return cuda_status(cudaGetLastError(), "gather_rows_kernel");
                        },
                        t);
}

}  // namespace dev
}  // namespace embscale
