// Host-side argument checks every op shares (FP8 in fp8/fp8.cpp, TBE in tbe/tbe_validate.h): the
// context, a tensor's shape (ndim, extents, element and byte counts that fit in int64) and its data
// pointer (present unless empty, aligned to the element size), the memory space of a pointer, and that
// what an op writes overlaps nothing else it is given. Messages name the argument.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/cuda_runtime.h"
#include "core/known_pointers.h"
#include "embscale/context.h"
#include "embscale/status.h"
#include "embscale/tensor.h"

namespace embscale {
namespace check {

// The most OpenMP threads a CPU call may ask for: far above any machine's core count, low enough that
// the OpenMP runtime can always create them (it aborts the process, or crashes, when it cannot).
constexpr int kMaxCpuThreads = 1024;

inline std::string shape_str(const TensorView& t) {
  std::string s = "[";
  for (int i = 0; i < t.ndim && i < kMaxDims; ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
  return s + "]";
}

inline Status context(const Context& ctx) {
  if (ctx.backend != Backend::kCpu && ctx.backend != Backend::kCuda)
    return invalid_argument("ctx.backend: unknown backend value " + std::to_string(static_cast<int>(ctx.backend)));
  if (ctx.backend == Backend::kCpu && (ctx.num_threads < 0 || ctx.num_threads > kMaxCpuThreads))
    return invalid_argument("ctx.num_threads: " + std::to_string(ctx.num_threads) + " is outside [0, " +
                            std::to_string(kMaxCpuThreads) + "] (0 = all hardware threads)");
#if !EMBSCALE_WITH_CUDA
  if (ctx.backend == Backend::kCuda) return unsupported("ctx.backend: this build of embscale has no CUDA backend");
#endif
  return Status::Ok();
}

// ndim in [min_ndim, kMaxDims], no negative extent, and numel() * element size representable, so
// numel() and size_bytes() are meaningful afterwards.
inline Status shape(const char* name, const TensorView& t, int min_ndim) {
  if (t.ndim < min_ndim || t.ndim > kMaxDims)
    return invalid_argument(std::string(name) + ": ndim " + std::to_string(t.ndim) + " is outside [" +
                            std::to_string(min_ndim) + ", " + std::to_string(kMaxDims) + "]");
  int64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) {
    if (t.shape[i] < 0) return invalid_argument(std::string(name) + ": shape " + shape_str(t) + " has a negative extent");
    if (__builtin_mul_overflow(n, t.shape[i], &n))
      return invalid_argument(std::string(name) + ": shape " + shape_str(t) + " has too many elements");
  }
  if (__builtin_mul_overflow(n, static_cast<int64_t>(dtype_size(t.dtype)), &n))
    return invalid_argument(std::string(name) + ": shape " + shape_str(t) + " has too many bytes");
  return Status::Ok();
}

// Data pointer: required unless the tensor is empty; aligned to the element size. Call after shape().
inline Status data(const char* name, const TensorView& t) {
  if (t.numel() == 0) return Status::Ok();
  if (t.data == nullptr)
    return invalid_argument(std::string(name) + ": data is null for a tensor of shape " + shape_str(t));
  const size_t esize = dtype_size(t.dtype);
  if (reinterpret_cast<uintptr_t>(t.data) % esize != 0)
    return invalid_argument(std::string(name) + ": data pointer is not aligned to its " + std::to_string(esize) +
                            "-byte elements (" + dtype_name(t.dtype) + ")");
  return Status::Ok();
}

#if EMBSCALE_WITH_CUDA
// `accept`, the runtime's verdict on p, unless `known` (when given) holds p as accepted by the same check
// under the current device; p is remembered once accepted. A refusal is never remembered.
template <typename Accept>
Status remembered(detail::KnownPointers* known, detail::KnownPointers::Kind kind, const void* p, Accept accept) {
  if (known == nullptr) return accept();
  int dev = 0;
  EMBSCALE_RETURN_IF_ERROR(cuda::current_device(&dev));
  if (known->contains(p, dev, kind)) return Status::Ok();
  EMBSCALE_RETURN_IF_ERROR(accept());
  known->add(p, dev, kind);
  return Status::Ok();
}
#endif

// Memory the context's backend can use: on CUDA, device memory of the current device (or pinned,
// mapped or managed memory), so a host pointer or another GPU's buffer is refused before a kernel
// faults on it. Null pointers pass (presence is checked where it is required). A handle passes its
// `known` pointers (core/known_pointers.h) so each of its buffers is asked about once.
inline Status memory(const Context& ctx, const char* name, const void* p, detail::KnownPointers* known = nullptr) {
#if EMBSCALE_WITH_CUDA
  if (ctx.backend == Backend::kCuda && p != nullptr)
    return remembered(known, detail::KnownPointers::Kind::kDevice, p,
                      [&] { return cuda::check_device_memory(name, p); });
#else
  (void)ctx, (void)name, (void)p, (void)known;
#endif
  return Status::Ok();
}

// Host memory the backend's device stores to and the host reads (a count polled without an event): on
// CUDA pinned memory mapped at the same address; on the CPU any memory. Null pointers pass.
inline Status mapped_host_memory(const Context& ctx, const char* name, const void* p,
                                 detail::KnownPointers* known = nullptr) {
#if EMBSCALE_WITH_CUDA
  if (ctx.backend == Backend::kCuda && p != nullptr)
    return remembered(known, detail::KnownPointers::Kind::kMappedHost, p,
                      [&] { return cuda::check_mapped_host_memory(name, p); });
#else
  (void)ctx, (void)name, (void)p, (void)known;
#endif
  return Status::Ok();
}

// A row cache's host store (tbe_cache.h): on CUDA managed memory or pinned memory mapped at the same
// address; on the CPU any memory. Null pointers pass.
inline Status host_store_memory(const Context& ctx, const char* name, const void* p,
                                detail::KnownPointers* known = nullptr) {
#if EMBSCALE_WITH_CUDA
  if (ctx.backend == Backend::kCuda && p != nullptr)
    return remembered(known, detail::KnownPointers::Kind::kHostStore, p,
                      [&] { return cuda::check_host_store_memory(name, p); });
#else
  (void)ctx, (void)name, (void)p, (void)known;
#endif
  return Status::Ok();
}

// The bytes an op reads or writes through one argument, named for the error (null or no bytes: none).
struct Region {
  const char* name;
  const void* p;
  size_t bytes;
};
inline Region region(const char* name, const TensorView& t) {
  return Region{name, t.data, t.numel() > 0 ? static_cast<size_t>(t.size_bytes()) : 0};
}
template <typename T>
inline Region scalar(const char* name, const T* p) {  // one value (an amax, a scale, a flag, a count)
  return Region{name, p, sizeof(T)};
}

// Whether two regions share a byte.
inline bool overlap(const Region& a, const Region& b) {
  if (a.p == nullptr || b.p == nullptr || a.bytes == 0 || b.bytes == 0) return false;
  const auto a0 = reinterpret_cast<uintptr_t>(a.p), b0 = reinterpret_cast<uintptr_t>(b.p);
  return a0 < b0 + b.bytes && b0 < a0 + a.bytes;
}

// What an op writes must share no byte with anything else it is given: each written region against the
// written ones after it and every read one. The first overlap found is refused, naming both arguments
// (a write into an input, or two outputs into one buffer, would silently corrupt either).
inline Status disjoint(const Region* written, size_t num_written, const Region* read, size_t num_read) {
  for (size_t i = 0; i < num_written; ++i) {
    const Region* other = nullptr;
    for (size_t j = i + 1; j < num_written && other == nullptr; ++j)
      if (overlap(written[i], written[j])) other = &written[j];
    for (size_t j = 0; j < num_read && other == nullptr; ++j)
      if (overlap(written[i], read[j])) other = &read[j];
    if (other != nullptr)
      return invalid_argument(std::string(written[i].name) + ": overlaps " + other->name +
                              "; a buffer the op writes must not share memory with another argument");
  }
  return Status::Ok();
}
inline Status disjoint(std::initializer_list<Region> written, std::initializer_list<Region> read) {
  return disjoint(written.begin(), written.size(), read.begin(), read.size());
}

}  // namespace check
}  // namespace embscale
