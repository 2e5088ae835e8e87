// Cached device facts (device.cuh).
#include "core/cuda/device.cuh"

namespace embscale {
namespace cuda {

namespace {

constexpr int kMaxDevices = 64;

// Caches one positive integer per device, query(dev, &v); 0 means "not asked yet", and a failed query
// or a value below 1 gives 1.
template <class Query>
int cached_per_device(std::atomic<int>* cache, Query query) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= kMaxDevices) {
    cudaGetLastError();
    return 1;
  }
  int v = cache[dev].load(std::memory_order_relaxed);
  if (v > 0) return v;
  if (query(dev, &v) != cudaSuccess || v < 1) {
    cudaGetLastError();
    v = 1;
  }
  cache[dev].store(v, std::memory_order_relaxed);
  return v;
}

int cached_attribute(std::atomic<int>* cache, cudaDeviceAttr attr) {
  return cached_per_device(cache, [attr](int dev, int* v) { return cudaDeviceGetAttribute(v, attr, dev); });
}

// Never launched: its attributes say which of the library's compiled architectures the driver loaded
// for the current device (every CUDA file of the build has the same architecture list).
__global__ void code_arch_probe_kernel() {}

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

int code_arch() {
  static std::atomic<int> cache[kMaxDevices];
  return cached_per_device(cache, [](int, int* v) {
    cudaFuncAttributes a = {};
    const cudaError_t err = cudaFuncGetAttributes(&a, code_arch_probe_kernel);
    *v = a.ptxVersion;
    return err;
  });
}

// Asked on every launch (pdl_enabled()): one cached value per device, 2 yes, 1 no. AMD GPUs have
// neither clusters nor programmatic dependent launch (and their "compute capability" is the gfx major).
bool sm90_features() {
#if defined(__HIP_PLATFORM_AMD__)
  return false;
#endif
  static std::atomic<int> cache[kMaxDevices];
  return cached_per_device(cache, [](int, int* v) {
           *v = cc_major() >= 9 && code_arch() >= 90 ? 2 : 1;
           return cudaSuccess;
         }) == 2;
}

bool pdl_enabled() { return sm90_features(); }

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
