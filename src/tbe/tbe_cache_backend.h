// What the CUDA backend implements for tbe_cache.h. tbe/tbe_cache.cpp checks every host-side argument
// (buffers against the host and cache layouts, the state and plan sizes, the lookups' shapes) first.
#pragma once

#include <cstddef>
#include <cstdint>

#include "embscale/tbe_cache.h"

namespace embscale {
namespace cache_backend {

// The persistent state carved from the caller's buffer (tbe_cache.cpp's layout).
struct State {
  int64_t* stats = nullptr;           // [kNumStats]
  int64_t* tags = nullptr;            // [sets * kCacheWays] the table row in each slot, -1: empty
  int64_t* stamps = nullptr;          // [sets * kCacheWays] the step that last used it, -1: never
  uint8_t* dirty = nullptr;           // [sets * kCacheWays] differs from the host store
  int32_t* lfu = nullptr;             // [host total_rows] uses per row (LFU only)
  int64_t* rounding_bases = nullptr;  // [cache total_rows] (TbeBackwardArgs::rounding_bases)
  // [host total_rows] each row-wise state buffer of the optimizer (momentum1, momentum2; null where the
  // buffer is absent or element-wise): the state of every host and cached row, kept in device memory, so
  // a row moving over the link carries only its weights (and element-wise state). load() fills it from
  // the host store, flush() writes it back there.
  float* rowwise_state[2] = {nullptr, nullptr};
};

struct Call {
  void* stream = nullptr;
  const RowCache* cache = nullptr;
  const RowCache::TableMeta* tables = nullptr;  // device memory [num_tables]
  const int32_t* feature_table = nullptr;       // device memory [num_features]
  State state;
  RowCacheBuffers buffers;
};

size_t plan_bytes(int64_t max_lookups);
#if EMBSCALE_WITH_CUDA
Status load(const Call& call);
Status prefetch(const Call& call, const RowCachePrefetchArgs& args);
Status fetch(const Call& call, const void* plan);
Status write_back(const Call& call, const void* plan);
Status flush(const Call& call);
#endif

}  // namespace cache_backend
}  // namespace embscale
