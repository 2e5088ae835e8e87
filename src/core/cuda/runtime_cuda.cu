// CUDA runtime services for host-side code (core/cuda_runtime.h).
#include <cuda_runtime.h>

#include <string>

#include "core/cuda_runtime.h"
#include "core/cuda/check.cuh"

namespace embscale {
namespace cuda {

bool device_present() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return false;
  }
  return n > 0;
}

std::string device_name() {
  int dev = 0;
  cudaDeviceProp prop;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&prop, dev) != cudaSuccess) {
    cudaGetLastError();
    return "none";
  }
  return prop.name;
}

Status device_malloc(size_t bytes, void** ptr) {
  return cuda_status(cudaMalloc(ptr, bytes), "cudaMalloc");
}

void device_free(void* ptr) { cudaFree(ptr); }

Status memcpy_sync(void* dst, const void* src, size_t bytes, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  EMBSCALE_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s), "cudaMemcpyAsync"));
  return cuda_status(cudaStreamSynchronize(s), "cudaStreamSynchronize");
}

Status memset_async(void* dst, int value, size_t bytes, void* stream) {
  return cuda_status(cudaMemsetAsync(dst, value, bytes, static_cast<cudaStream_t>(stream)), "cudaMemsetAsync");
}

Status stream_synchronize(void* stream) {
  return cuda_status(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}

Status current_device(int* device) { return cuda_status(cudaGetDevice(device), "cudaGetDevice"); }

Status check_device_memory(const char* name, const void* ptr) {
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();  // not a pointer the runtime knows: clear the error it leaves behind
    attr.type = cudaMemoryTypeUnregistered;
  }
  if (attr.type == cudaMemoryTypeManaged) return Status::Ok();
  if (attr.type == cudaMemoryTypeUnregistered || (attr.type == cudaMemoryTypeHost && attr.devicePointer == nullptr))
    return invalid_argument(std::string(name) + ": host memory (or an address no CUDA allocation holds, such as "
                            "freed memory); the CUDA backend needs device memory (or pinned, mapped or managed memory)");
  int dev = 0;
  EMBSCALE_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&dev), "cudaGetDevice"));
  if (attr.type == cudaMemoryTypeDevice && attr.device != dev)
    return invalid_argument(std::string(name) + ": memory of CUDA device " + std::to_string(attr.device) +
                            ", but the op runs on the current device " + std::to_string(dev));
  return Status::Ok();
}

Status check_mapped_host_memory(const char* name, const void* ptr) {
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();
    attr.type = cudaMemoryTypeUnregistered;
  }
  if (attr.type != cudaMemoryTypeHost || attr.devicePointer != ptr)
    return invalid_argument(std::string(name) + ": expected pinned host memory mapped for the device at the same "
                            "address (cudaHostAlloc, torch's pin_memory), which the device writes and the host reads");
  return Status::Ok();
}

Status check_host_store_memory(const char* name, const void* ptr) {
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();
    attr.type = cudaMemoryTypeUnregistered;
  }
  if (attr.type == cudaMemoryTypeManaged || (attr.type == cudaMemoryTypeHost && attr.devicePointer == ptr))
    return Status::Ok();
  return invalid_argument(std::string(name) + ": expected host memory the device maps at the same address: "
                          "host_store_malloc's (managed memory kept on the host), or pinned, mapped memory "
                          "(cudaHostAlloc, cudaHostRegister, torch's pin_memory)");
}

Status host_store_malloc(size_t bytes, void** ptr) {
  int dev = 0, concurrent = 0;
  EMBSCALE_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&dev), "cudaGetDevice"));
  EMBSCALE_RETURN_IF_ERROR(cuda_status(
      cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, dev), "cudaDeviceGetAttribute"));
  if (concurrent) {
    // Managed memory kept on the host and mapped for the device: its pages are never migrated.
    EMBSCALE_RETURN_IF_ERROR(cuda_status(cudaMallocManaged(ptr, bytes, cudaMemAttachGlobal), "cudaMallocManaged"));
    cudaMemLocation host{};
    host.type = cudaMemLocationTypeHost;
    cudaMemLocation device{};
    device.type = cudaMemLocationTypeDevice;
    device.id = dev;
    cudaError_t e = cudaMemAdvise(*ptr, bytes, cudaMemAdviseSetPreferredLocation, host);
    if (e == cudaSuccess) e = cudaMemAdvise(*ptr, bytes, cudaMemAdviseSetAccessedBy, device);
    if (e != cudaSuccess) {
      cudaFree(*ptr);
      *ptr = nullptr;
    }
    return cuda_status(e, "cudaMemAdvise (host store: preferred location host, accessed by the device)");
  }
  return cuda_status(cudaHostAlloc(ptr, bytes, cudaHostAllocMapped | cudaHostAllocPortable), "cudaHostAlloc");
}

void host_store_free(void* ptr) {
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();
    return;  // not an allocation of host_store_malloc
  }
  if (attr.type == cudaMemoryTypeManaged) cudaFree(ptr);
  else if (attr.type == cudaMemoryTypeHost) cudaFreeHost(ptr);
}

Status check_last_launch(const char* what) { return cuda_status(cudaGetLastError(), what); }

}  // namespace cuda
}  // namespace embscale
