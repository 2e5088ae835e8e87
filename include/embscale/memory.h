// Backend-neutral memory helpers for callers: the CLI, the tests, benchmarks and bindings use them to
// allocate, fill and read back buffers without CUDA headers. Ops themselves never call these.
#pragma once

#include <cstddef>
#include <string>
#include <utility>

#include "embscale/context.h"
#include "embscale/status.h"

namespace embscale {

Status backend_malloc(Backend b, size_t bytes, void** ptr);  // bytes == 0 gives nullptr
void backend_free(Backend b, void* ptr);
// Host memory for a row cache's host store (tbe_cache.h) on the current CUDA device, which kernels read and
// write in place at the host link's rate however scattered the rows: managed memory kept on the host and
// mapped for the device, as FBGEMM's UVM tables (the device maps it in large pages; rows of pinned memory
// at random places move at under half the rate, docs/tbe_cache.md), or pinned, mapped memory where the
// device cannot access managed memory concurrently. The CPU reads and writes it as ordinary memory.
// CUDA only; bytes == 0 gives nullptr. Freed by host_store_free.
Status host_store_malloc(size_t bytes, void** ptr);
void host_store_free(void* ptr);
// Copies between host memory and the backend's memory (for kCpu both are host memory).
Status copy_to_backend(const Context& ctx, void* dst, const void* host_src, size_t bytes);
Status copy_to_host(const Context& ctx, void* host_dst, const void* src, size_t bytes);
Status copy_within_backend(const Context& ctx, void* dst, const void* src, size_t bytes);
Status fill_bytes(const Context& ctx, void* dst, int value, size_t bytes);
// Waits for all work enqueued on ctx (a no-op for the CPU).
Status synchronize(const Context& ctx);
// "NVIDIA H200", or the CPU model for the CPU backend.
std::string device_name(Backend b);

// Owning buffer in a backend's memory (RAII over backend_malloc/backend_free).
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend b, size_t bytes) : backend_(b), bytes_(bytes) {
    if (!backend_malloc(b, bytes, &ptr_).ok()) {
      ptr_ = nullptr;
      bytes_ = 0;
      failed_ = true;
    }
  }
  ~Buffer() { backend_free(backend_, ptr_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      backend_free(backend_, ptr_);
      backend_ = o.backend_;
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      failed_ = o.failed_;
      o.ptr_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  void* data() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }
  // False when the allocation failed (out of memory).
  bool valid() const { return !failed_; }

 private:
  Backend backend_ = Backend::kCpu;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  bool failed_ = false;
};

}  // namespace embscale
