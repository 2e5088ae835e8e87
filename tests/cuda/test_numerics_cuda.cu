// The device's fp32 -> fp16 rounding against its software form over every fp32 bit pattern: CUDA kernels
// round with the hardware cvt (core/numerics.h), the CPU backend and the references in software, and
// the two must give the same bits for all 2^32 inputs (NaN included).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>

#include "core/numerics.h"

namespace embscale {
namespace {

struct Mismatches {
  unsigned long long count;
  unsigned int first;  // smallest mismatching input bits (atomicMin), 0xffffffff when none
};

__global__ void compare_all_kernel(Mismatches* fp16) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (uint64_t{1} << 32); i += stride) {
    const uint32_t u = static_cast<uint32_t>(i);
    const float f = __uint_as_float(u);
    if (float_to_fp16(f) != float_to_fp16_soft(f)) {
      atomicAdd(&fp16->count, 1ull);
      atomicMin(&fp16->first, u);
    }
  }
}

TEST(NumericsCuda, Fp16RoundingMatchesSoftwareForEveryFloat) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) GTEST_SKIP() << "no CUDA device";
  Mismatches* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, sizeof(Mismatches)), cudaSuccess);
  const Mismatches none = {0, 0xffffffffu};
  ASSERT_EQ(cudaMemcpy(d, &none, sizeof(none), cudaMemcpyHostToDevice), cudaSuccess);
  compare_all_kernel<<<1024, 256>>>(d);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  Mismatches got;
  ASSERT_EQ(cudaMemcpy(&got, d, sizeof(got), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d);
  EXPECT_EQ(got.count, 0u) << "fp16: first mismatching input bits 0x" << std::hex << got.first;
}

}  // namespace
}  // namespace embscale
