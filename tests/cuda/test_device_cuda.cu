// The run-time architecture facts (core/cuda/device.cuh) against what a kernel of this build reports from
// the device. Cluster launch and programmatic dependent launch are chosen from code_arch(): it must name
// the architecture the loaded code was compiled for (__CUDA_ARCH__), which is not the device's own when
// the driver compiled an older PTX for it (a build with -DCMAKE_CUDA_ARCHITECTURES=80 run on an H200).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "core/cuda/device.cuh"
#include "core/cuda/pdl.cuh"

namespace embscale {
namespace {

__global__ void report_arch_kernel(int* arch) {
#ifdef __CUDA_ARCH__
  *arch = __CUDA_ARCH__;
#endif
}

TEST(DeviceCuda, CodeArchIsTheArchitectureOfTheRunningCode) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) GTEST_SKIP() << "no CUDA device";
  int* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMemset(d, 0, sizeof(int)), cudaSuccess);
  report_arch_kernel<<<1, 1>>>(d);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  int arch = 0;
  ASSERT_EQ(cudaMemcpy(&arch, d, sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d);
  EXPECT_EQ(cuda::code_arch() * 10, arch);
  const bool sm90 = cuda::cc_major() >= 9 && arch >= 900;
  EXPECT_EQ(cuda::sm90_features(), sm90) << "device " << cuda::cc_major() << ".x, code " << arch;
  EXPECT_EQ(cuda::pdl_enabled(), sm90);
}

}  // namespace
}  // namespace embscale
