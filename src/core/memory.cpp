// Backend-neutral memory helpers (memory.h) and backend availability. CUDA calls live in
// src/core/cuda/runtime_cuda.cu behind the small interface in core/cuda_runtime.h.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "core/cuda_runtime.h"
#include "embscale/memory.h"

namespace embscale {

namespace {
constexpr size_t kHugePageBytes = size_t{2} << 20;
}  // namespace

bool backend_compiled(Backend b) { return b == Backend::kCpu || EMBSCALE_WITH_CUDA; }

bool backend_available(Backend b) {
  if (b == Backend::kCpu) return true;
#if EMBSCALE_WITH_CUDA
  return cuda::device_present();
#else
  return false;
#endif
}

#if !EMBSCALE_WITH_CUDA
static Status no_cuda() { return unsupported("backend: this build of embscale has no CUDA backend"); }
#endif

Status backend_malloc(Backend b, size_t bytes, void** ptr) {
  if (ptr == nullptr) return invalid_argument("ptr: must not be null");
  *ptr = nullptr;
  if (bytes == 0) return Status::Ok();
  if (b == Backend::kCpu) {
    // 64-byte aligned so vector loads never straddle a cache line at the start. From 2 MiB up, 2 MiB-aligned
    // and advised for transparent huge pages before anything touches it: random row reads of large tables
    // then miss the TLB far less often (docs/tbe_cpu.md, "Huge pages").
    const size_t align = bytes >= kHugePageBytes ? kHugePageBytes : 64;
    if (bytes > SIZE_MAX - align) return invalid_argument("bytes: " + std::to_string(bytes) + " is more than any host allocation");
    const size_t size = (bytes + align - 1) / align * align;
    *ptr = std::aligned_alloc(align, size);
    if (*ptr == nullptr) return Status(StatusCode::kBackendError, "host allocation of " + std::to_string(bytes) + " bytes failed");
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (align == kHugePageBytes) madvise(*ptr, size, MADV_HUGEPAGE);  // advice only: failure changes nothing
#endif
    return Status::Ok();
  }
#if EMBSCALE_WITH_CUDA
  return cuda::device_malloc(bytes, ptr);
#else
  return no_cuda();
#endif
}

void backend_free(Backend b, void* ptr) {
  if (ptr == nullptr) return;
  if (b == Backend::kCpu) {
    std::free(ptr);
    return;
  }
#if EMBSCALE_WITH_CUDA
  cuda::device_free(ptr);
#endif
}

Status host_store_malloc(size_t bytes, void** ptr) {
  if (ptr == nullptr) return invalid_argument("ptr: must not be null");
  *ptr = nullptr;
  if (bytes == 0) return Status::Ok();
#if EMBSCALE_WITH_CUDA
  if (!cuda::device_present()) return unsupported("host_store_malloc: no CUDA device is present");
  return cuda::host_store_malloc(bytes, ptr);
#else
  return no_cuda();
#endif
}

void host_store_free(void* ptr) {
#if EMBSCALE_WITH_CUDA
  if (ptr != nullptr) cuda::host_store_free(ptr);
#else
  (void)ptr;
#endif
}

Status copy_to_backend(const Context& ctx, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return Status::Ok();
  if (dst == nullptr || src == nullptr) return invalid_argument("copy_to_backend: null pointer");
  if (ctx.backend == Backend::kCpu) {
    std::memcpy(dst, src, bytes);
    return Status::Ok();
  }
#if EMBSCALE_WITH_CUDA
  return cuda::memcpy_sync(dst, src, bytes, ctx.stream);
#else
  return no_cuda();
#endif
}

Status copy_to_host(const Context& ctx, void* dst, const void* src, size_t bytes) {
  return copy_to_backend(ctx, dst, src, bytes);  // cudaMemcpyDefault infers the direction
}

Status copy_within_backend(const Context& ctx, void* dst, const void* src, size_t bytes) {
  return copy_to_backend(ctx, dst, src, bytes);
}

Status fill_bytes(const Context& ctx, void* dst, int value, size_t bytes) {
  if (bytes == 0) return Status::Ok();
  if (dst == nullptr) return invalid_argument("fill_bytes: null pointer");
  if (ctx.backend == Backend::kCpu) {
    std::memset(dst, value, bytes);
    return Status::Ok();
  }
#if EMBSCALE_WITH_CUDA
  return cuda::memset_async(dst, value, bytes, ctx.stream);
#else
  return no_cuda();
#endif
}

Status synchronize(const Context& ctx) {
  if (ctx.backend == Backend::kCpu) return Status::Ok();
#if EMBSCALE_WITH_CUDA
  return cuda::stream_synchronize(ctx.stream);
#else
  return no_cuda();
#endif
}

std::string device_name(Backend b) {
  if (b == Backend::kCuda) {
#if EMBSCALE_WITH_CUDA
    return cuda::device_name();
#else
    return "none";
#endif
  }
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto pos = line.find(':');
      if (pos != std::string::npos) return line.substr(pos + 2);
    }
  }
  return "cpu";
}

}  // namespace embscale
