// The pointers a handle's memory checks have accepted (core/check.h), so that a buffer passed on every
// call is asked about once. Plain C++17: every build compiles it, the CUDA backend alone uses it.
#pragma once

#include <mutex>

namespace embscale {
namespace detail {

// A handle (TableBatchedEmbedding, QuantizedTableBatchedEmbedding, RowCache) keeps one: the CUDA
// backend's memory checks ask the runtime about a pointer (cudaPointerGetAttributes) only when it is not
// here, and remember it once it passes. An entry is the address, the check it passed and the CUDA device
// current at the check, so the same address is checked again under another current device. Refused
// pointers are never remembered: a host buffer or another GPU's is refused with the same error every time
// it is passed. An address whose buffer was freed, passed again, is the caller's error, as for any kernel
// argument: it passes while its entry lasts. A fixed ring of the latest kCapacity accepted pointers (room
// for a forward's and a backward's buffers together), the oldest overwritten first; safe to use from
// several threads.
class KnownPointers {
 public:
  static constexpr int kCapacity = 32;
  // What a pointer was checked to be: core/check.h's memory, mapped_host_memory, host_store_memory.
  enum class Kind { kDevice, kMappedHost, kHostStore };

  bool contains(const void* p, int device, Kind kind) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Entry& e : entries_)
      if (e.p == p && e.device == device && e.kind == kind) return true;
    return false;
  }

  void add(const void* p, int device, Kind kind) {
    std::lock_guard<std::mutex> lock(mu_);
    entries_[next_] = Entry{p, device, kind};
    next_ = (next_ + 1) % kCapacity;
  }

 private:
  struct Entry {
    const void* p = nullptr;  // null: an empty slot (null pointers are never checked)
    int device = -1;
    Kind kind = Kind::kDevice;
  };
  mutable std::mutex mu_;
  Entry entries_[kCapacity];
  int next_ = 0;  // the slot add() writes next: the oldest entry once the ring is full
};

}  // namespace detail
}  // namespace embscale
