// Cached device facts (device.cuh).
#include "core/cuda/device.cuh"

namespace embscale {
namespace cuda {

namespace {

constexpr int kMaxDevices = 64;

// Caches one integer attribute per device; 0 means "not asked yet" (the attributes used are >= 1).
int cached_attribute(std::atomic<int>* cache, cudaDeviceAttr attr) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) {
    cudaGetLastError();
    return 1;
  }
  int v = cache[dev].load(std::memory_order_relaxed);
  if (v > 0) return v;
  if (cudaDeviceGetAttribute(&v, attr, dev) != cudaSuccess || v < 1) {
    cudaGetLastError();
    v = 1;
  }
  cache[dev].store(v, std::memory_order_relaxed);
  return v;
}

}  // namespace

int sm_count() {
  static std::atomic<int> cache[kMaxDevices];
  return cached_attribute(cache, cudaDevAttrMultiProcessorCount);
}

int cc_major() {
  static std::atomic<int> cache[kMaxDevices];
  return cached_attribute(cache, cudaDevAttrComputeCapabilityMajor);
}

int max_threads_per_sm() {
  static std::atomic<int> cache[kMaxDevices];
  return cached_attribute(cache, cudaDevAttrMaxThreadsPerMultiProcessor);
}

bool pdl_enabled() { return cc_major() >= 9; }

int blocks_per_sm(const void* fn, int threads) {
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, threads, 0) != cudaSuccess || n < 1) {
    (void)cudaGetLastError();
    return 1;
  }
  return n;
}

}  // namespace cuda
}  // namespace embscale
