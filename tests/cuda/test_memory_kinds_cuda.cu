// The CUDA backend's device-memory check (core/check.h `check::memory`) on every kind of pointer a
// caller may pass: device memory (also an address inside an allocation), pinned, mapped-registered and
// managed host memory are accepted and an op on them gives the right answer; plain host memory (heap,
// stack), freed device memory and, with two devices, another device's memory are refused, naming the
// argument, and nothing is written.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "embscale/fp8.h"

namespace embscale {
namespace {

bool have_device() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return n > 0;
}

constexpr int64_t kN = 4099;  // odd: the vector body and a scalar tail

std::vector<float> random_input(unsigned seed, float* want) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  std::vector<float> h(kN);
  *want = 0.0f;
  for (float& v : h) {
    v = dist(rng);
    *want = std::max(*want, std::fabs(v));
  }
  return h;
}

// amax of x into a device float, read back. The output is allocated by the caller, before any
// allocation the test frees, so it cannot land on a freed address.
Status run_amax(const void* x, float* d_amax, float* out) {
  const Context ctx = Context::cuda();
  *out = -1.0f;
  const Status st = amax(ctx, TensorView::vec(const_cast<void*>(x), DType::kF32, kN), d_amax, AmaxOptions{}, nullptr, 0);
  if (st.ok()) cudaMemcpy(out, d_amax, sizeof(float), cudaMemcpyDeviceToHost);
  return st;
}

void expect_refused(const Status& st, const std::string& start) {
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.to_string();
  EXPECT_EQ(st.message().rfind(start, 0), 0u) << st.message();
}

TEST(CudaMemoryKinds, AcceptsDevicePinnedRegisteredAndManagedMemory) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  const unsigned seed = 20261203;
  std::printf("seed %u\n", seed);
  float want = 0.0f;
  const std::vector<float> h = random_input(seed, &want);
  const size_t bytes = h.size() * sizeof(float);
  float got = 0.0f;
  float* d_amax = nullptr;
  ASSERT_EQ(cudaMalloc(&d_amax, sizeof(float)), cudaSuccess);

  float* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, bytes + 256), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dev + 16, h.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_TRUE(run_amax(dev + 16, d_amax, &got).ok()) << "an address inside a device allocation";
  EXPECT_EQ(got, want);
  cudaFree(dev);

  // x in memory the device can read, allocated its own way: accepted, and the amax is the same.
  const auto expect_accepted = [&](const char* kind, const float* x) {
    const Status st = run_amax(x, d_amax, &got);
    EXPECT_TRUE(st.ok()) << kind << ": " << st.to_string();
    EXPECT_EQ(got, want) << kind;
  };
  float* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, bytes), cudaSuccess);
  std::copy(h.begin(), h.end(), pinned);
  expect_accepted("pinned", pinned);
  cudaFreeHost(pinned);

  std::vector<float> registered(h);
  ASSERT_EQ(cudaHostRegister(registered.data(), bytes, cudaHostRegisterMapped), cudaSuccess);
  expect_accepted("registered", registered.data());
  cudaHostUnregister(registered.data());

  float* managed = nullptr;
  ASSERT_EQ(cudaMallocManaged(&managed, bytes), cudaSuccess);
  std::copy(h.begin(), h.end(), managed);
  expect_accepted("managed", managed);
  cudaFree(managed);
  cudaFree(d_amax);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the checks must leave no CUDA error behind";
}

TEST(CudaMemoryKinds, RefusesHostFreedAndOtherDeviceMemory) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device";
  float want = 0.0f;
  const std::vector<float> heap = random_input(7, &want);
  float got = 0.0f;
  float* d_amax = nullptr;
  ASSERT_EQ(cudaMalloc(&d_amax, sizeof(float)), cudaSuccess);
  expect_refused(run_amax(heap.data(), d_amax, &got), "x: host memory");
  float stack[kN] = {};
  expect_refused(run_amax(stack, d_amax, &got), "x: host memory");

  float* freed = nullptr;
  ASSERT_EQ(cudaMalloc(&freed, kN * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaFree(freed), cudaSuccess);
  expect_refused(run_amax(freed, d_amax, &got), "x: host memory");

  // The output too: a refused call writes nothing.
  float* dx = nullptr;
  ASSERT_EQ(cudaMalloc(&dx, kN * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(dx, heap.data(), kN * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  float h_amax = -2.0f;
  expect_refused(amax(Context::cuda(), TensorView::vec(dx, DType::kF32, kN), &h_amax, AmaxOptions{}, nullptr, 0),
                 "amax: host memory");
  EXPECT_EQ(h_amax, -2.0f);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "the checks must leave no CUDA error behind";

  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  if (devices >= 2) {
    float* other = nullptr;
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&other, kN * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    expect_refused(run_amax(other, d_amax, &got), "x: memory of CUDA device 1, but the op runs on the current device 0");
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    cudaFree(other);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  }
  cudaFree(dx);
  cudaFree(d_amax);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "the context must still work after the refusals";
}

}  // namespace
}  // namespace embscale
