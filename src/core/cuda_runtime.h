// The few CUDA runtime services the host-side code needs, behind plain C++ signatures so .cpp files
// never include CUDA headers. Implemented in src/core/cuda/runtime_cuda.cu; only linked with CUDA.
#pragma once

#include <cstddef>
#include <string>

#include "embscale/status.h"

namespace embscale {
namespace cuda {

bool device_present();
std::string device_name();
Status device_malloc(size_t bytes, void** ptr);
void device_free(void* ptr);
Status memcpy_sync(void* dst, const void* src, size_t bytes, void* stream);  // cudaMemcpyDefault
Status memset_async(void* dst, int value, size_t bytes, void* stream);
Status stream_synchronize(void* stream);
Status current_device(int* device);  // cudaGetDevice
// Refuses a pointer the current device cannot use as device memory: host memory that is not mapped
// for the device, or memory of another device (named in the message). Pinned, mapped and managed
// memory pass.
Status check_device_memory(const char* name, const void* ptr);
// Refuses a pointer that is not host memory the current device writes at the same address (pinned and
// mapped, as cudaHostAlloc's under unified addressing): what a host polls while the device stores to it.
Status check_mapped_host_memory(const char* name, const void* ptr);
// Host memory that the current device reads and writes in place (memory.h's host_store_malloc).
Status host_store_malloc(size_t bytes, void** ptr);
void host_store_free(void* ptr);
// Refuses a pointer that is not host memory the current device reads and writes at the same address:
// managed memory, or pinned memory mapped at the same address (a row cache's host store, tbe_cache.h).
Status check_host_store_memory(const char* name, const void* ptr);
// Turns the last launch error (if any) into a Status naming `what`.
Status check_last_launch(const char* what);

}  // namespace cuda
}  // namespace embscale
