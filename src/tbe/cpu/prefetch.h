// Software prefetch of embedding rows for the CPU TBE kernels: every row is a random gather, so rows a
// few steps ahead are requested while the current one is summed, overlapping their memory latency.
#pragma once

#include <algorithm>
#include <cstdint>

namespace embscale {
namespace cpu {

// At most this many cache lines of a row are prefetched; the hardware streamer follows the rest.
constexpr int64_t kPrefetchMaxLines = 32;

// Prefetched into L2 (prefetcht2, locality 1) rather than L1: on the 2-core development machine a bare
// gather of random 512-byte rows ran ~18% faster that way (the L1 fill buffers stay free for the loads
// being summed), and the TBE forward 5-25% faster in alternating runs.
inline void prefetch_bytes(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  const int64_t lines = std::min<int64_t>((bytes + 63) / 64, kPrefetchMaxLines);
  for (int64_t i = 0; i < lines; ++i) __builtin_prefetch(c + 64 * i, 0, 1);
}

template <typename T>
inline void prefetch_row(const T* row, int64_t elements) {
  prefetch_bytes(row, elements * static_cast<int64_t>(sizeof(T)));
}

}  // namespace cpu
}  // namespace embscale
