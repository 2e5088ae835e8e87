// CUDA row cache (tbe_cache.h): the kernels behind prefetch, fetch, write_back, flush and load.
//
// prefetch, enqueued on the caller's stream in order, no host synchronisation:
//   linearize  each lookup's key: its table's first row in the host store + the index (an index outside
//              its table, or a lookup outside every bag, gets the sentinel total_rows);
//   sort       CUB radix sort of (key, lookup) pairs on the key's significant bits (stable);
//   encode     CUB run-length encode (unique keys, run lengths) and an exclusive scan (run starts);
//   probe      a warp per unique key: device tables map to themselves; a cached table's set is read by
//              the warp (one way a lane) and a hit stamps the slot with the step (locking it); misses
//              are flagged, then compacted in key order (CUB select);
//   insert     a warp per miss: the set's unlocked way of lowest priority (LRU: oldest stamp; LFU: fewest
//              uses, then oldest) is claimed by a compare-and-swap of its stamp (misses of one set race;
//              a loser takes the next way), its tag replaced and its dirty row (the victim) noted for
//              fetch; when every way is locked, or the table is host-resident, the row is staged instead
//              (half step % 2 of its pool's staging rows, at the miss's index: no counter);
//   remap      done by probe and insert: every lookup of a unique key gets its row in the cache table.
// The plan then holds the misses (key, cache row, victim) that fetch exchanges (the victim out, the row
// in: both directions of the host link at once) and write_back returns (staged rows only). Which way a miss takes depends on the race, the values trained never do: each unique key
// is one row for the batch, and the backward sums its gradient in lookup order whatever its number.
//
// Rows move between the host store (host memory the device maps) and the cache by a warp per row, 16
// bytes a lane where every end and the length allow, with the row's element-wise optimizer state; a lane
// loads what comes in before it stores what goes out, so a row's reads over the link are in flight
// together. Row-wise state (a float a row) stays in device memory (State::rowwise_state, filled by load()
// and written to the host store by flush()), so a row crossing the link is one host access, not two.
#include <cuda_runtime.h>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda/arch_traits.cuh"
#include "core/cuda/check.cuh"
#include "core/cuda/device.cuh"
#include "core/cuda/lanes.cuh"
#include "core/workspace.h"
#include "tbe/optimizer_table.h"
#include "tbe/rounding.h"
#include "tbe/tbe_cache_backend.h"

namespace embscale {
namespace cache_backend {
namespace {

using cuda::ArchTraits;
using cuda::cuda_status;
constexpr int kWays = RowCache::kCacheWays;
// A set is read by a unit of kWays lanes, one lane a way: the whole warp on NVIDIA and RDNA, half a
// wavefront on CDNA (the units of one wavefront walk their own sets; every shuffle stays in its unit).
static_assert(ArchTraits::kWarpSize % kWays == 0, "a unit of kWays lanes divides the warp");
using cuda::Warp;
using SetLanes = LaneShape<kWays>;
constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / kWays;

// Plan counters (uint32, at the plan's start) and header fields.
enum PlanCounter : int { kNumRuns = 0, kNumMisses = 1, kNumPlanCounters = 16 };
struct PlanHeader {
  uint32_t counters[kNumPlanCounters];
  int64_t step;
  int32_t training;
};

struct PlanLayout {
  WorkspaceLayout ws{WorkspaceLayout::Base::kAsGiven};
  WorkspaceSlice header, fetch_keys, fetch_rows, evict_keys, keys_in, keys_sorted, vals_in, vals_sorted, unique_keys, run_counts,
      run_starts, miss_flags, miss_list, cub_temp;
};

PlanLayout plan_layout(int64_t max_lookups) {
  const size_t M = static_cast<size_t>(max_lookups);
  const int n = static_cast<int>(max_lookups);
  size_t sort = 0, rle = 0, scan = 0, select = 0;
  cub::DeviceRadixSort::SortPairs(nullptr, sort, static_cast<const uint64_t*>(nullptr), static_cast<uint64_t*>(nullptr),
                                  static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr), n);
  cub::DeviceRunLengthEncode::Encode(nullptr, rle, static_cast<const uint64_t*>(nullptr), static_cast<uint64_t*>(nullptr),
                                     static_cast<uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr), n);
  cub::DeviceScan::ExclusiveSum(nullptr, scan, static_cast<const uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr), n);
  cub::DeviceSelect::Flagged(nullptr, select, thrust::counting_iterator<uint32_t>(0),
                             static_cast<const uint8_t*>(nullptr), static_cast<uint32_t*>(nullptr),
                             static_cast<uint32_t*>(nullptr), n);
  PlanLayout L;
  L.header = L.ws.add(sizeof(PlanHeader));
  L.fetch_keys = L.ws.add(M * 8);
  L.fetch_rows = L.ws.add(M * 8);
  L.evict_keys = L.ws.add(M * 8);
  L.keys_in = L.ws.add(M * 8);
  L.keys_sorted = L.ws.add(M * 8);
  L.vals_in = L.ws.add(M * 4);
  L.vals_sorted = L.ws.add(M * 4);
  L.unique_keys = L.ws.add(M * 8);
  L.run_counts = L.ws.add(M * 4);
  L.run_starts = L.ws.add(M * 4);
  L.miss_flags = L.ws.add(M);
  L.miss_list = L.ws.add(M * 4);
  L.cub_temp = L.ws.add(std::max(std::max(sort, rle), std::max(scan, select)));
  return L;
}

struct Plan {
  PlanHeader* header;
  int64_t* fetch_keys;  // [M] host-store key of each miss
  int64_t* fetch_rows;  // [M] its row in the cache's tables (cache_tbe row numbering)
  int64_t* evict_keys;  // [M] host-store key of the dirty row it replaces there, or -1
  uint64_t *keys_in, *keys_sorted, *unique_keys;
  uint32_t *vals_in, *vals_sorted, *run_counts, *run_starts, *miss_list;
  uint8_t* miss_flags;
  void* cub_temp;
  size_t cub_bytes;
};

Plan carve(const PlanLayout& L, void* p) {
  Plan r;
  r.header = L.ws.at<PlanHeader>(p, L.header);
  r.fetch_keys = L.ws.at<int64_t>(p, L.fetch_keys);
  r.fetch_rows = L.ws.at<int64_t>(p, L.fetch_rows);
  r.evict_keys = L.ws.at<int64_t>(p, L.evict_keys);
  r.keys_in = L.ws.at<uint64_t>(p, L.keys_in);
  r.keys_sorted = L.ws.at<uint64_t>(p, L.keys_sorted);
  r.unique_keys = L.ws.at<uint64_t>(p, L.unique_keys);
  r.vals_in = L.ws.at<uint32_t>(p, L.vals_in);
  r.vals_sorted = L.ws.at<uint32_t>(p, L.vals_sorted);
  r.run_counts = L.ws.at<uint32_t>(p, L.run_counts);
  r.run_starts = L.ws.at<uint32_t>(p, L.run_starts);
  r.miss_list = L.ws.at<uint32_t>(p, L.miss_list);
  r.miss_flags = L.ws.at<uint8_t>(p, L.miss_flags);
  r.cub_temp = L.ws.at<void>(p, L.cub_temp);
  r.cub_bytes = L.cub_temp.bytes;
  return r;
}

// What every kernel reads: the tables, the state, where rows live.
struct Params {
  const RowCache::TableMeta* tables;
  const int32_t* feature_table;
  int num_tables;
  int64_t total_rows;  // host store rows: the sentinel key
  int64_t max_lookups;
  State st;
  char* host_w;
  float* host_m1;
  float* host_m2;
  char* cache_w;
  float* cache_m1;
  float* cache_m2;
  int w_bytes;        // bytes per weight
  int m1_layout;      // opt::StateLayout
  int m2_layout;
};

Params make_params(const Call& c) {
  const RowCache& rc = *c.cache;
  const opt::OptimizerSpec& spec = *opt::optimizer_spec(rc.config().optimizer);
  Params p;
  p.tables = c.tables;
  p.feature_table = c.feature_table;
  p.num_tables = rc.host_tbe().num_tables();
  p.total_rows = rc.host_tbe().total_rows();
  p.max_lookups = rc.config().max_lookups;
  p.st = c.state;
  p.host_w = static_cast<char*>(c.buffers.host_weights.data);
  p.host_m1 = static_cast<float*>(c.buffers.host_momentum1.data);
  p.host_m2 = static_cast<float*>(c.buffers.host_momentum2.data);
  p.cache_w = static_cast<char*>(c.buffers.cache_weights.data);
  p.cache_m1 = static_cast<float*>(c.buffers.cache_momentum1.data);
  p.cache_m2 = static_cast<float*>(c.buffers.cache_momentum2.data);
  p.w_bytes = static_cast<int>(dtype_size(rc.config().tables.weights_dtype));
  p.m1_layout = static_cast<int>(spec.momentum1.layout);
  p.m2_layout = static_cast<int>(spec.momentum2.layout);
  return p;
}

// The lane within its unit of kWays lanes ("warp" below: that unit), the unit's index and the units of the grid.
__device__ __forceinline__ int lane_id() { return static_cast<int>(threadIdx.x) & (kWays - 1); }
__device__ __forceinline__ int64_t warp_id() {
  return (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWays;
}
__device__ __forceinline__ int64_t num_warps() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x / kWays;
}

// The table whose host rows hold `key` (tables' row offsets ascend).
__device__ __forceinline__ int table_of(const Params& p, int64_t key) {
  int lo = 0, hi = p.num_tables - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.tables[mid].row_offset <= key) lo = mid; else hi = mid - 1;
  }
  return lo;
}

__device__ __forceinline__ int64_t set_of(const RowCache::TableMeta& m, int64_t row) {
  return static_cast<int64_t>(mix64(static_cast<uint64_t>(row)) % static_cast<uint64_t>(m.num_sets));
}

// A warp moves `bytes` bytes (a multiple of 2) of one row segment: `out` (when not null) := `cache`,
// then `cache` := `in` (when not null). Each lane loads its unit of `in` and of `cache` before it stores
// either, in units of 16 bytes where every end and the length allow.
template <typename U>
__device__ __forceinline__ void exchange_units(char* cache, const char* in, char* out, int64_t bytes) {
  U* c = reinterpret_cast<U*>(cache);
  const U* i_ = reinterpret_cast<const U*>(in);
  U* o = reinterpret_cast<U*>(out);
  for (int64_t k = lane_id(); k < bytes / static_cast<int64_t>(sizeof(U)); k += kWays) {
    U v_in{};
    if (in != nullptr) v_in = i_[k];
    if (out != nullptr) o[k] = c[k];
    if (in != nullptr) c[k] = v_in;
  }
}

__device__ __forceinline__ void warp_exchange(void* cache, const void* in, void* out, int64_t bytes) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(cache) | reinterpret_cast<uintptr_t>(in) |
                      reinterpret_cast<uintptr_t>(out) | static_cast<uintptr_t>(bytes);
  char* c = static_cast<char*>(cache);
  const char* i = static_cast<const char*>(in);
  char* o = static_cast<char*>(out);
  if ((a & 15) == 0) exchange_units<uint4>(c, i, o, bytes);
  else if ((a & 3) == 0) exchange_units<uint32_t>(c, i, o, bytes);
  else exchange_units<uint16_t>(c, i, o, bytes);
}

// Moves the rows of cache row c (cache_tbe numbering) with their optimizer state: table t's row out_r
// (when >= 0) to the host store from c, then its row in_r (when >= 0) from the host store into c; row-wise
// state between the cache and its device copy (State::rowwise_state). Returns the bytes moved over the
// link.
__device__ int64_t exchange_row(const Params& p, const RowCache::TableMeta& m, int64_t out_r, int64_t in_r,
                                int64_t c) {
  const int64_t D = m.dim;
  const int64_t cache_elem = m.cache_weight_offset + (c - m.cache_row_offset) * D;
  const int64_t rows = (in_r >= 0 ? 1 : 0) + (out_r >= 0 ? 1 : 0);
  const int layouts[2] = {p.m1_layout, p.m2_layout};
  float* const host_state[2] = {p.host_m1, p.host_m2};
  float* const cache_state[2] = {p.cache_m1, p.cache_m2};
  float* const rowwise_home[2] = {p.st.rowwise_state[0], p.st.rowwise_state[1]};
  constexpr int kRowwise = static_cast<int>(opt::StateLayout::kRowwise);
  constexpr int kElementwise = static_cast<int>(opt::StateLayout::kElementwise);
  float rowwise_in[2] = {0.0f, 0.0f}, rowwise_out[2] = {0.0f, 0.0f};
  const bool lead = lane_id() == 0;
  for (int k = 0; k < 2; ++k) {
    if (layouts[k] != kRowwise || !lead) continue;
    if (in_r >= 0) rowwise_in[k] = rowwise_home[k][m.row_offset + in_r];
    if (out_r >= 0) rowwise_out[k] = cache_state[k][c];
  }
  const auto host_row = [&](char* base, int64_t elem_bytes, int64_t r) {
    return r < 0 ? nullptr : base + (m.weight_offset + r * D) * elem_bytes;
  };
  const int64_t wb = D * p.w_bytes;
  warp_exchange(p.cache_w + cache_elem * p.w_bytes, host_row(p.host_w, p.w_bytes, in_r),
                host_row(p.host_w, p.w_bytes, out_r), wb);
  int64_t moved = rows * wb;
  for (int k = 0; k < 2; ++k) {
    if (layouts[k] == kRowwise) {
      if (lead && out_r >= 0) rowwise_home[k][m.row_offset + out_r] = rowwise_out[k];
      if (lead && in_r >= 0) cache_state[k][c] = rowwise_in[k];
    } else if (layouts[k] == kElementwise) {
      char* hs = reinterpret_cast<char*>(host_state[k]);
      warp_exchange(cache_state[k] + cache_elem, host_row(hs, 4, in_r), host_row(hs, 4, out_r), D * 4);
      moved += rows * D * 4;
    }
  }
  return moved;
}

// Per-warp statistics, added to the state's counters once per warp at the end of a kernel.
struct WarpStats {
  int64_t v[kNumStats] = {};
  __device__ void flush(int64_t* stats) const {
    if (lane_id() != 0) return;
    for (int i = 0; i < kNumStats; ++i)
      if (v[i] != 0) atomicAdd(reinterpret_cast<unsigned long long*>(stats + i), static_cast<unsigned long long>(v[i]));
  }
};

// ---- prefetch ------------------------------------------------------------------------------------

__global__ void cache_plan_header_kernel(PlanHeader* h, int64_t step, int training) {
  for (int i = 0; i < kNumPlanCounters; ++i) h->counters[i] = 0;
  h->step = step;
  h->training = training;
}

template <typename I>
__global__ void cache_linearize_kernel(Params p, const I* __restrict__ indices, const I* __restrict__ offsets,
                                       int64_t n, int64_t batch_size, int num_features, Plan plan) {
  const int64_t items = static_cast<int64_t>(num_features) * batch_size;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t key = static_cast<uint64_t>(p.total_rows);
    // The bag holding lookup i: the last offset <= i (offsets that are not monotone give some bag; the
    // forward reports them, and any key here is one of a real table's rows).
    if (items > 0 && static_cast<int64_t>(offsets[0]) <= i && i < static_cast<int64_t>(offsets[items])) {
      int64_t lo = 0, hi = items - 1;
      while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (static_cast<int64_t>(offsets[mid]) <= i) lo = mid; else hi = mid - 1;
      }
      const int f = static_cast<int>(lo / batch_size);
      const RowCache::TableMeta& m = p.tables[p.feature_table[f]];
      const int64_t idx = static_cast<int64_t>(indices[i]);
      if (idx >= 0 && idx < m.num_rows) key = static_cast<uint64_t>(m.row_offset + idx);
    }
    plan.keys_in[i] = key;
    plan.vals_in[i] = static_cast<uint32_t>(i);
  }
}

// Every lookup of unique key u gets `row` (a row of its cache table, or -1).
template <typename I>
__device__ __forceinline__ void remap_run(const Plan& plan, I* remapped, int64_t u, int64_t row) {
  const uint32_t start = plan.run_starts[u], len = plan.run_counts[u];
  for (uint32_t j = lane_id(); j < len; j += kWays) remapped[plan.vals_sorted[start + j]] = static_cast<I>(row);
}

template <typename I>
__global__ void cache_probe_kernel(Params p, Plan plan, I* remapped, int64_t step, int training) {
  const uint32_t runs = plan.header->counters[kNumRuns];
  const int lane = lane_id();
  WarpStats ws;
  for (int64_t u = warp_id(); u < runs; u += num_warps()) {
    const int64_t key = static_cast<int64_t>(plan.unique_keys[u]);
    if (key >= p.total_rows) {  // indices outside their tables
      remap_run(plan, remapped, u, -1);
      if (lane == 0) plan.miss_flags[u] = 0;
      continue;
    }
    const RowCache::TableMeta& m = p.tables[table_of(p, key)];
    const int64_t r = key - m.row_offset;
    bool miss = m.placement == static_cast<int32_t>(TablePlacement::kHost);
    int64_t local = r;  // device tables: the row itself
    if (m.placement == static_cast<int32_t>(TablePlacement::kCached)) {
      const int64_t set = set_of(m, r);
      const int64_t slot = (m.set_base + set) * kWays + lane;
      const SetLanes::Mask hit = Warp::group_ballot<kWays>(p.st.tags[slot] == r);
      miss = hit == 0;
      if (!miss) {
        const int way = SetLanes::ffs(hit) - 1;
        if (lane == way) {
          p.st.stamps[slot] = step;
          if (training) p.st.dirty[slot] = 1;
        }
        local = m.slot_base + set * kWays + way;
      }
      if (lane == 0) {
        ws.v[kStatLookups] += 1;
        ws.v[kStatHits] += miss ? 0 : 1;
        if (p.st.lfu != nullptr && p.st.lfu[key] < INT32_MAX) p.st.lfu[key] += 1;
      }
    }
    if (lane == 0) plan.miss_flags[u] = miss ? 1 : 0;
    if (!miss) remap_run(plan, remapped, u, local);
  }
  ws.flush(p.st.stats);
}

// Warp-wide minimum of (priority, lane): the lane holding the smallest priority (ties: lowest lane).
__device__ __forceinline__ int argmin_lane(uint64_t prio) {
  int best = lane_id();
  for (int d = kWays / 2; d > 0; d /= 2) {
    const uint64_t op = Warp::shfl_xor(prio, d, kWays);
    const int ol = Warp::shfl_xor(best, d, kWays);
    if (op < prio || (op == prio && ol < best)) {
      prio = op;
      best = ol;
    }
  }
  return prio == UINT64_MAX ? -1 : best;
}

template <typename I>
__global__ void cache_insert_kernel(Params p, Plan plan, I* remapped, int64_t step, int64_t lock_from, int training,
                                    int lfu) {
  const uint32_t misses = plan.header->counters[kNumMisses];
  const int lane = lane_id();
  const int64_t half = (step % 2) * p.max_lookups;
  WarpStats ws;
  for (int64_t i = warp_id(); i < misses; i += num_warps()) {
    const uint32_t u = plan.miss_list[i];
    const int64_t key = static_cast<int64_t>(plan.unique_keys[u]);
    const RowCache::TableMeta& m = p.tables[table_of(p, key)];
    const int64_t r = key - m.row_offset;
    int64_t local = -1, evicted = -1;
    if (m.placement == static_cast<int32_t>(TablePlacement::kCached)) {
      const int64_t set = set_of(m, r);
      const int64_t slot = (m.set_base + set) * kWays + lane;
      // Claim the unlocked way of lowest priority; a lost race (another miss of this set took it) is
      // seen as a changed stamp, and the next try excludes that way (its stamp is now this step's).
      for (int attempt = 0; attempt < 2 * kWays && local < 0; ++attempt) {
        const int64_t stamp = *reinterpret_cast<volatile const int64_t*>(p.st.stamps + slot);
        const int64_t tag = p.st.tags[slot];
        uint64_t prio = UINT64_MAX;
        if (stamp < lock_from) {
          const uint64_t age = static_cast<uint64_t>(stamp + 1);  // never used: 0
          if (!lfu) {
            prio = age;
          } else {
            const uint64_t uses = tag < 0 ? 0 : static_cast<uint64_t>(p.st.lfu[m.row_offset + tag]) + 1;
            prio = (uses << 32) | (age < 0xffffffffull ? age : 0xfffffffeull);
          }
        }
        const int way = argmin_lane(prio);
        if (way < 0) break;  // every way holds a row in use: stage
        int won = 0;
        if (lane == way)
          won = atomicCAS(reinterpret_cast<unsigned long long*>(p.st.stamps + slot), static_cast<unsigned long long>(stamp),
                          static_cast<unsigned long long>(step)) == static_cast<unsigned long long>(stamp);
        if (Warp::shfl(won, way, kWays)) {
          const int64_t victim = (m.set_base + set) * kWays + way;
          local = m.slot_base + set * kWays + way;
          if (lane == 0) {
            const int64_t old = p.st.tags[victim];
            if (old >= 0) ws.v[kStatEvictions] += 1;
            if (old >= 0 && p.st.dirty[victim]) evicted = m.row_offset + old;  // fetch writes it back
            p.st.tags[victim] = r;
            p.st.dirty[victim] = training ? 1 : 0;
          }
        }
      }
      if (lane == 0) {
        ws.v[kStatMisses] += 1;
        ws.v[kStatConflicts] += local < 0 ? 1 : 0;
      }
    }
    if (local < 0) local = m.staging_base + half + i;  // staged: a row of this batch's half
    if (lane == 0) {
      plan.fetch_keys[i] = key;
      plan.fetch_rows[i] = m.cache_row_offset + local;
      plan.evict_keys[i] = evicted;
    }
    remap_run(plan, remapped, u, local);
  }
  ws.flush(p.st.stats);
}

// ---- moving rows ------------------------------------------------------------------------------------

__global__ void cache_fetch_kernel(Params p, Plan plan) {
  const uint32_t misses = plan.header->counters[kNumMisses];
  WarpStats ws;
  for (int64_t i = warp_id(); i < misses; i += num_warps()) {
    const int64_t key = plan.fetch_keys[i], row = plan.fetch_rows[i], evicted = plan.evict_keys[i];
    const RowCache::TableMeta& m = p.tables[table_of(p, key)];
    const int64_t r = key - m.row_offset;
    // The victim (a row of the same table: its set is the table's) leaves as the row comes in.
    const int64_t bytes = exchange_row(p, m, evicted < 0 ? -1 : evicted - m.row_offset, r, row);
    if (lane_id() == 0) {
      p.st.rounding_bases[row] = m.weight_offset + r * m.dim;
      ws.v[kStatRowsFetched] += 1;
      ws.v[kStatRowsWrittenBack] += evicted < 0 ? 0 : 1;
      ws.v[kStatBytesMoved] += bytes;
    }
  }
  ws.flush(p.st.stats);
}

__global__ void cache_write_back_kernel(Params p, Plan plan) {
  if (!plan.header->training) return;
  const uint32_t misses = plan.header->counters[kNumMisses];
  WarpStats ws;
  for (int64_t i = warp_id(); i < misses; i += num_warps()) {
    const int64_t key = plan.fetch_keys[i], row = plan.fetch_rows[i];
    const RowCache::TableMeta& m = p.tables[table_of(p, key)];
    if (row - m.cache_row_offset < m.staging_base) continue;  // a cached row: written back when evicted
    const int64_t bytes = exchange_row(p, m, key - m.row_offset, -1, row);
    if (lane_id() == 0) {
      ws.v[kStatRowsWrittenBack] += 1;
      ws.v[kStatBytesMoved] += bytes;
    }
  }
  ws.flush(p.st.stats);
}

// Every dirty slot of every cached table written back (a warp per slot).
__global__ void cache_flush_kernel(Params p, int64_t total_slots) {
  WarpStats ws;
  for (int64_t s = warp_id(); s < total_slots; s += num_warps()) {
    const int64_t tag = p.st.tags[s];
    if (tag < 0 || !p.st.dirty[s]) continue;
    // The cached table whose sets hold slot s (set bases ascend over the cached tables).
    const int64_t set = s / kWays;
    int t = 0;
    for (int k = 0; k < p.num_tables; ++k)
      if (p.tables[k].num_sets > 0 && p.tables[k].set_base <= set) t = k;
    const RowCache::TableMeta& m = p.tables[t];
    const int64_t local = m.slot_base + (set - m.set_base) * kWays + s % kWays;
    const int64_t bytes = exchange_row(p, m, tag, -1, m.cache_row_offset + local);
    Warp::sync();
    if (lane_id() == 0) {
      p.st.dirty[s] = 0;
      ws.v[kStatRowsWrittenBack] += 1;
      ws.v[kStatBytesMoved] += bytes;
    }
  }
  ws.flush(p.st.stats);
}

// Device tables' rounding bases: each row's own place in the host store's layout.
__global__ void cache_device_bases_kernel(Params p) {
  for (int t = 0; t < p.num_tables; ++t) {
    const RowCache::TableMeta& m = p.tables[t];
    if (m.placement != static_cast<int32_t>(TablePlacement::kDevice)) continue;
    for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; r < m.num_rows;
         r += static_cast<int64_t>(gridDim.x) * blockDim.x)
      p.st.rounding_bases[m.cache_row_offset + r] = m.weight_offset + r * m.dim;
  }
}

unsigned warp_grid(int64_t items) {
  const int64_t per_wave = static_cast<int64_t>(cuda::sm_count()) * 4;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(per_wave, (items + kWarpsPerBlock - 1) / kWarpsPerBlock)));
}

// Copies each device table's rows and their state between the host store and the cache (contiguous
// ranges in both layouts).
Status copy_device_tables(const Call& c, bool to_cache) {
  const RowCache& rc = *c.cache;
  const opt::OptimizerSpec& spec = *opt::optimizer_spec(rc.config().optimizer);
  auto s = static_cast<cudaStream_t>(c.stream);
  const size_t wb = dtype_size(rc.config().tables.weights_dtype);
  const auto copy = [&](void* host, void* cache, size_t bytes) {
    return cuda_status(to_cache ? cudaMemcpyAsync(cache, host, bytes, cudaMemcpyHostToDevice, s)
                                : cudaMemcpyAsync(host, cache, bytes, cudaMemcpyDeviceToHost, s),
                       "cudaMemcpyAsync (device table)");
  };
  for (int t = 0; t < rc.host_tbe().num_tables(); ++t) {
    if (rc.config().placement[t] != TablePlacement::kDevice) continue;
    const RowCache::TableMeta& m = rc.table_meta(t);
    const size_t rows = static_cast<size_t>(m.num_rows), elems = rows * static_cast<size_t>(m.dim);
    EMBSCALE_RETURN_IF_ERROR(copy(static_cast<char*>(c.buffers.host_weights.data) + m.weight_offset * wb,
                                  static_cast<char*>(c.buffers.cache_weights.data) + m.cache_weight_offset * wb,
                                  elems * wb));
    const struct { opt::StateLayout layout; const TensorView* host; const TensorView* cache; } states[] = {
        {spec.momentum1.layout, &c.buffers.host_momentum1, &c.buffers.cache_momentum1},
        {spec.momentum2.layout, &c.buffers.host_momentum2, &c.buffers.cache_momentum2}};
    for (const auto& st : states) {
      if (st.layout == opt::StateLayout::kAbsent) continue;
      const bool rowwise = st.layout == opt::StateLayout::kRowwise;
      float* h = static_cast<float*>(st.host->data) + (rowwise ? m.row_offset : m.weight_offset);
      float* k = static_cast<float*>(st.cache->data) + (rowwise ? m.cache_row_offset : m.cache_weight_offset);
      EMBSCALE_RETURN_IF_ERROR(copy(h, k, (rowwise ? rows : elems) * sizeof(float)));
    }
  }
  return Status::Ok();
}

// Copies the row-wise state of every row between the host store and its device copy (State::rowwise_state).
Status copy_rowwise_state(const Call& c, bool to_device) {
  const size_t bytes = sizeof(float) * static_cast<size_t>(c.cache->host_tbe().total_rows());
  void* const host[2] = {c.buffers.host_momentum1.data, c.buffers.host_momentum2.data};
  for (int k = 0; k < 2; ++k) {
    float* dev = c.state.rowwise_state[k];
    if (dev == nullptr || bytes == 0) continue;
    EMBSCALE_RETURN_IF_ERROR(cuda_status(
        to_device ? cudaMemcpyAsync(dev, host[k], bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(c.stream))
                  : cudaMemcpyAsync(host[k], dev, bytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(c.stream)),
        "cudaMemcpyAsync (row-wise state)"));
  }
  return Status::Ok();
}

template <class F>
Status dispatch_index(DType t, F&& f) {
  return t == DType::kI32 ? f(int32_t{}) : f(int64_t{});
}

}  // namespace

size_t plan_bytes(int64_t max_lookups) { return plan_layout(max_lookups).ws.size(); }

Status load(const Call& c) {
  const RowCache& rc = *c.cache;
  auto s = static_cast<cudaStream_t>(c.stream);
  const size_t slots = static_cast<size_t>(rc.total_sets()) * kWays;
  const State& st = c.state;
  EMBSCALE_RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(st.stats, 0, sizeof(int64_t) * kNumStats, s), "cudaMemsetAsync"));
  if (slots > 0) {
    EMBSCALE_RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(st.tags, 0xff, slots * 8, s), "cudaMemsetAsync (tags)"));
    EMBSCALE_RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(st.stamps, 0xff, slots * 8, s), "cudaMemsetAsync (stamps)"));
    EMBSCALE_RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(st.dirty, 0, slots, s), "cudaMemsetAsync (dirty)"));
  }
  if (st.lfu != nullptr)
    EMBSCALE_RETURN_IF_ERROR(cuda_status(
        cudaMemsetAsync(st.lfu, 0, sizeof(int32_t) * static_cast<size_t>(rc.host_tbe().total_rows()), s),
        "cudaMemsetAsync (lfu)"));
  // Rows not yet fetched hash as themselves (a value no real row's weights use is not needed: the
  // backward never updates a row the batch did not fetch).
  EMBSCALE_RETURN_IF_ERROR(cuda_status(
      cudaMemsetAsync(st.rounding_bases, 0, sizeof(int64_t) * static_cast<size_t>(rc.cache_tbe().total_rows()), s),
      "cudaMemsetAsync (rounding bases)"));
  const Params p = make_params(c);
  cache_device_bases_kernel<<<static_cast<unsigned>(cuda::sm_count() * 2), kThreads, 0, s>>>(p);
  EMBSCALE_CHECK_LAUNCH("cache_device_bases_kernel");
  EMBSCALE_RETURN_IF_ERROR(copy_rowwise_state(c, /*to_device=*/true));
  return copy_device_tables(c, /*to_cache=*/true);
}

Status prefetch(const Call& c, const RowCachePrefetchArgs& a) {
  const RowCache& rc = *c.cache;
  auto s = static_cast<cudaStream_t>(c.stream);
  const PlanLayout L = plan_layout(rc.config().max_lookups);
  const Plan plan = carve(L, a.plan);
  const Params p = make_params(c);
  const int64_t N = a.indices.numel();
  const int n = static_cast<int>(N);
  const int training = a.training ? 1 : 0;
  cache_plan_header_kernel<<<1, 1, 0, s>>>(plan.header, a.step, training);
  EMBSCALE_CHECK_LAUNCH("cache_plan_header_kernel");
  if (N == 0) return Status::Ok();
  const int end_bit = std::max(1, 64 - __builtin_clzll(static_cast<unsigned long long>(p.total_rows)));
  return dispatch_index(a.indices.dtype, [&](auto tag) -> Status {
    using I = decltype(tag);
    const unsigned lin_blocks = static_cast<unsigned>(std::min<int64_t>((N + kThreads - 1) / kThreads, 65535));
    cache_linearize_kernel<I><<<lin_blocks, kThreads, 0, s>>>(p, static_cast<const I*>(a.indices.data),
                                                             static_cast<const I*>(a.offsets.data), N, a.batch_size,
                                                             rc.host_tbe().num_features(), plan);
    EMBSCALE_CHECK_LAUNCH("cache_linearize_kernel");
    size_t bytes = plan.cub_bytes;
    EMBSCALE_RETURN_IF_ERROR(cuda_status(cub::DeviceRadixSort::SortPairs(plan.cub_temp, bytes, plan.keys_in, plan.keys_sorted,
                                                                         plan.vals_in, plan.vals_sorted, n, 0, end_bit, s),
                                         "cub::DeviceRadixSort::SortPairs (cache)"));
    EMBSCALE_RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(plan.run_counts, 0, static_cast<size_t>(N) * 4, s), "cudaMemsetAsync"));
    EMBSCALE_RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(plan.miss_flags, 0, static_cast<size_t>(N), s), "cudaMemsetAsync"));
    bytes = plan.cub_bytes;
    EMBSCALE_RETURN_IF_ERROR(cuda_status(
        cub::DeviceRunLengthEncode::Encode(plan.cub_temp, bytes, plan.keys_sorted, plan.unique_keys, plan.run_counts,
                                           plan.header->counters + kNumRuns, n, s),
        "cub::DeviceRunLengthEncode::Encode (cache)"));
    bytes = plan.cub_bytes;
    EMBSCALE_RETURN_IF_ERROR(cuda_status(
        cub::DeviceScan::ExclusiveSum(plan.cub_temp, bytes, plan.run_counts, plan.run_starts, n, s),
        "cub::DeviceScan::ExclusiveSum (cache)"));
    I* remapped = static_cast<I*>(a.remapped.data);
    const unsigned grid = warp_grid(N);
    cache_probe_kernel<I><<<grid, kThreads, 0, s>>>(p, plan, remapped, a.step, training);
    EMBSCALE_CHECK_LAUNCH("cache_probe_kernel");
    bytes = plan.cub_bytes;
    EMBSCALE_RETURN_IF_ERROR(cuda_status(
        cub::DeviceSelect::Flagged(plan.cub_temp, bytes, thrust::counting_iterator<uint32_t>(0), plan.miss_flags,
                                   plan.miss_list, plan.header->counters + kNumMisses, n, s),
        "cub::DeviceSelect::Flagged (cache misses)"));
    cache_insert_kernel<I><<<grid, kThreads, 0, s>>>(p, plan, remapped, a.step, a.lock_from, training,
                                                     rc.config().algorithm == CacheAlgorithm::kLfu ? 1 : 0);
    EMBSCALE_CHECK_LAUNCH("cache_insert_kernel");
    return Status::Ok();
  });
}

Status fetch(const Call& c, const void* plan_ptr) {
  const RowCache& rc = *c.cache;
  const Plan plan = carve(plan_layout(rc.config().max_lookups), const_cast<void*>(plan_ptr));
  cache_fetch_kernel<<<warp_grid(rc.config().max_lookups), kThreads, 0, static_cast<cudaStream_t>(c.stream)>>>(
      make_params(c), plan);
  EMBSCALE_CHECK_LAUNCH("cache_fetch_kernel");
  return Status::Ok();
}

Status write_back(const Call& c, const void* plan_ptr) {
  const RowCache& rc = *c.cache;
  const Plan plan = carve(plan_layout(rc.config().max_lookups), const_cast<void*>(plan_ptr));
  cache_write_back_kernel<<<warp_grid(rc.config().max_lookups), kThreads, 0, static_cast<cudaStream_t>(c.stream)>>>(
      make_params(c), plan);
  EMBSCALE_CHECK_LAUNCH("cache_write_back_kernel");
  return Status::Ok();
}

Status flush(const Call& c) {
  const RowCache& rc = *c.cache;
  const int64_t slots = rc.total_sets() * kWays;
  if (slots > 0) {
    cache_flush_kernel<<<warp_grid(slots), kThreads, 0, static_cast<cudaStream_t>(c.stream)>>>(make_params(c), slots);
    EMBSCALE_CHECK_LAUNCH("cache_flush_kernel");
  }
  // The row-wise state home, then the device tables' rows and state over their ranges of it.
  EMBSCALE_RETURN_IF_ERROR(copy_rowwise_state(c, /*to_device=*/false));
  return copy_device_tables(c, /*to_cache=*/false);
}

}  // namespace cache_backend
}  // namespace embscale
