// Tables beyond the GPU's memory: a RowCache keeps tables in host memory (pinned and mapped, so the GPU
// reads and writes it over the host link) and the rows a batch uses in device memory.
//
// Placement per table (FBGEMM's EmbeddingLocation in brackets):
//   kDevice  the table lives in device memory (DEVICE);
//   kHost    the table lives in host memory; each batch's rows are staged into device memory and
//            written back after the backward (MANAGED: FBGEMM reads such rows over the link in place);
//   kCached  the table lives in host memory, with a set-associative cache of its rows in device memory
//            (MANAGED_CACHING): kCacheWays-way sets, LRU or LFU replacement, dirty rows written back
//            when evicted or flushed.
// A row's optimizer state travels with it: element-wise state with the row over the link; row-wise state
// (a float a row) between the cache and a device copy of every row's (in `state`), which load() fills
// from the host store and flush() writes back to it.
//
// How it runs. The cache's device memory is a TableBatchedEmbedding of its own, cache_tbe(): one
// table per device table (its rows as they are) and one "pool" per dimension D of the host and cached
// tables, holding those tables' cache slots and then 2 x max_lookups staging rows (batch s stages into
// half s % 2, so at most two batches may be in flight: one running, one prefetched). prefetch() maps each
// lookup of a batch to its row in cache_tbe() (remapped indices) and chooses the rows to evict;
// fetch() copies the missing rows in, writing each dirty victim back as its slot's new row comes in (both
// directions of the host link at once); the caller then runs cache_tbe()'s
// forward and backward with the remapped indices and the unchanged offsets (and rounding_bases(), so
// stochastic rounding hashes each weight by its place in the tables, not in the cache); write_back()
// returns the staged rows after the backward. Within a batch the remapping is one-to-one, and the
// backward sums each row's gradient in lookup order whatever the row's number, so training through a
// RowCache gives bit for bit the tables of training with every table in device memory.
//
// Pipelining: rows a batch uses are locked (their stamp is its step). prefetch(step s, lock_from l)
// never evicts a row stamped l or later, so a batch still running keeps its rows while the next one is
// prepared on another stream. prefetch() reads and writes only cache bookkeeping (no row), so it may run
// beside that batch's forward and backward; fetch() reads the host store, which the running batch's
// write_back() updates, and writes the victims, which no batch at or after lock_from uses: order fetch()
// after write_back(). Every prefetch() is followed by its fetch() before the next prefetch() or flush()
// (a planned batch that is then dropped is fetched all the same): the slots it claimed hold their new
// rows, and their victims are home, only then.
//
// Memory: the host store (RowCacheBuffers::host_*) has the layout of a TableBatchedEmbedding of
// cfg.tables (device tables' rows in it are written by flush() and read by load() only). The cache's
// device buffers have cache_tbe()'s layout; `state` (state_bytes()) holds the bookkeeping: statistics
// (first kNumStats int64), tags, stamps, dirty flags, LFU counts, rounding bases, the row-wise state of
// every host-store row (4 bytes a row for each row-wise state buffer of the optimizer). Each batch in flight
// has a plan buffer (plan_bytes()) that prefetch() fills and fetch() / write_back() read. Nothing
// here allocates except create().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "embscale/context.h"
#include "embscale/status.h"
#include "embscale/tbe.h"
#include "embscale/tensor.h"

namespace embscale {

enum class TablePlacement { kDevice = 0, kHost, kCached };
constexpr int kNumTablePlacements = static_cast<int>(TablePlacement::kCached) + 1;  // values 0 .. count - 1
const char* table_placement_name(TablePlacement p);  // "device", "host", "cached"
// Also FBGEMM's EmbeddingLocation names: DEVICE, MANAGED (host), MANAGED_CACHING (cached).
bool parse_table_placement(const std::string& name, TablePlacement* out);

enum class CacheAlgorithm { kLru = 0, kLfu };
constexpr int kNumCacheAlgorithms = static_cast<int>(CacheAlgorithm::kLfu) + 1;
const char* cache_algorithm_name(CacheAlgorithm a);  // "lru", "lfu"
bool parse_cache_algorithm(const std::string& name, CacheAlgorithm* out);  // also LRU, LFU

// The statistics prefetch(), write_back() and flush() add to (int64 counters at the start of `state`,
// device memory: read them whenever the stream allows, no synchronisation is needed to keep them).
enum RowCacheStat : int {
  kStatLookups = 0,     // unique rows of cached tables looked up (one per row per batch)
  kStatHits,            // of those, found in the cache
  kStatMisses,          // of those, not found (fetched into the cache, or staged: kStatConflicts)
  kStatConflicts,       // misses staged because every way of the row's set held a row in use
  kStatEvictions,       // cached rows replaced by another row
  kStatRowsFetched,     // rows copied from the host store (cached and host tables)
  kStatRowsWrittenBack, // rows copied to the host store (dirty evictions, staged rows, flush)
  kStatBytesMoved,      // bytes over the host link, both ways (rows with their element-wise state)
  kNumStats
};

struct RowCacheConfig {
  TbeConfig tables;                       // the tables, as a TableBatchedEmbedding of them would hold
  std::vector<TablePlacement> placement;  // [num_tables]
  std::vector<int64_t> cache_rows;        // [num_tables] kCached: rows its cache holds (>= 1, rounded up to
                                          // whole sets of kCacheWays); 0 for the other placements
  CacheAlgorithm algorithm = CacheAlgorithm::kLru;
  OptimizerType optimizer = OptimizerType::kSgd;  // whose state rows travel with the weights
  int64_t max_lookups = 0;  // lookups (N) of the largest batch: each pool stages twice as many rows
};

// The buffers every op reads or writes. Host store: host memory the device can address: memory.h's
// host_store_malloc (managed memory kept on the host, which moves scattered rows at the link's rate), or
// pinned and mapped memory (torch's pin_memory, cudaHostAlloc, cudaHostRegister: scattered rows move slower). Cache: device memory in cache_tbe()'s layout. State:
// device memory of state_bytes().
struct RowCacheBuffers {
  TensorView host_weights;     // [tables' num_weights] of cfg.tables.weights_dtype
  TensorView host_momentum1;   // as the optimizer keeps it for cfg.tables (absent when it keeps none)
  TensorView host_momentum2;
  TensorView cache_weights;    // [cache_tbe().num_weights()]
  TensorView cache_momentum1;  // cache_tbe()'s layout
  TensorView cache_momentum2;
  void* state = nullptr;
  size_t state_bytes = 0;
};

struct RowCachePrefetchArgs {
  TensorView indices;    // [N] int32 or int64, N <= max_lookups (table-major, as TbeForwardArgs)
  TensorView offsets;    // [T*B+1], the indices' dtype
  int64_t batch_size = 0;
  int64_t step = 1;       // this batch's number (>= 1): consecutive for batches in flight (a prefetched
                          // batch that is dropped gives its number to the next)
  int64_t lock_from = 1;  // rows used by batches numbered lock_from or later are not evicted (<= step)
  bool training = true;   // the batch will be trained: its rows become dirty (written back)
  // Out: [N] of the indices' dtype, each lookup's row in cache_tbe()'s table for its feature. An index
  // outside its table gets an index outside that cache table (the forward's bounds check reports it).
  TensorView remapped;
  void* plan = nullptr;   // plan_bytes() of device memory, kept until this batch's write_back()
  size_t plan_bytes = 0;
};

class RowCache {
 public:
  static constexpr int kCacheWays = 32;

  static Status create(const Context& ctx, const RowCacheConfig& cfg, std::unique_ptr<RowCache>* out);
  ~RowCache();
  RowCache(const RowCache&) = delete;
  RowCache& operator=(const RowCache&) = delete;

  const RowCacheConfig& config() const { return cfg_; }
  // The tables the forward and backward run on (created with the cache, on its backend).
  const TableBatchedEmbedding& cache_tbe() const { return *cache_tbe_; }
  // The layout of the host store (a TableBatchedEmbedding of cfg.tables, for its offsets).
  const TableBatchedEmbedding& host_tbe() const { return *host_tbe_; }
  // Rows of each table's cache (cache_rows rounded up to whole sets; 0 for device and host tables).
  int64_t cache_slots(int table) const { return slots_[table]; }
  size_t state_bytes() const { return state_bytes_; }
  // Byte offset in `state` of the rounding bases: [cache_tbe().total_rows()] int64, the element index
  // stochastic rounding hashes for each cache row's first weight (TbeBackwardArgs::rounding_bases).
  size_t rounding_bases_offset() const { return rounding_bases_offset_; }
  // Bytes of one batch's plan (the same for every batch: sized for max_lookups).
  size_t plan_bytes() const;

  // Empties the cache (nothing written back), zeroes the statistics and copies the device tables' rows
  // and their state from the host store: after creation, and after the caller changed the host store.
  Status load(const Context& ctx, const RowCacheBuffers& b) const;
  // Plans a batch: remapped indices, the rows to fetch, the victims their slots evict.
  Status prefetch(const Context& ctx, const RowCacheBuffers& b, const RowCachePrefetchArgs& args) const;
  // Copies the planned batch's missing rows (and their state) from the host store into the cache, each
  // dirty victim to the host store first.
  Status fetch(const Context& ctx, const RowCacheBuffers& b, const void* plan, size_t plan_bytes) const;
  // After a training batch's backward: its staged rows (host tables, conflicts) back to the host store.
  Status write_back(const Context& ctx, const RowCacheBuffers& b, const void* plan, size_t plan_bytes) const;
  // Every dirty cached row, and every device table, written to the host store (which then holds every
  // table's current values); the cache keeps its rows.
  Status flush(const Context& ctx, const RowCacheBuffers& b) const;

  // The per-table facts the backend kernels read (device memory owned by this object).
  struct TableMeta {
    int64_t row_offset;          // first row in the host store's row numbering (host_tbe().row_offset)
    int64_t num_rows;            // E_t
    int64_t weight_offset;       // host_tbe().weight_offset(t)
    int64_t cache_weight_offset; // cache_tbe().weight_offset of its cache table
    int64_t cache_row_offset;    // cache_tbe().row_offset of its cache table
    int64_t slot_base;           // kCached: its first slot in the cache table (a pool)
    int64_t set_base;            // kCached: its first set in the state's tags and stamps
    int64_t num_sets;            // kCached: sets (0 otherwise)
    int64_t staging_base;        // kHost, kCached: the pool's first staging row
    int32_t dim;
    int32_t placement;           // TablePlacement
  };

  // For the backend: the sets of all cached tables, and the device copy of the TableMetas followed by the
  // feature -> table map ([num_features] int32).
  int64_t total_sets() const { return total_sets_; }
  const TableMeta& table_meta(int table) const { return meta_[table]; }
  const void* meta_storage() const { return meta_storage_; }
  // The buffers this object's calls have found in memory the backend can use (as TableBatchedEmbedding's).
  detail::KnownPointers* known_pointers() const { return known_pointers_.get(); }

 private:
  RowCache() = default;
  RowCacheConfig cfg_;
  Backend backend_ = Backend::kCpu;
  std::unique_ptr<TableBatchedEmbedding> cache_tbe_, host_tbe_;
  std::vector<int64_t> slots_;
  std::vector<TableMeta> meta_;
  int64_t total_sets_ = 0;
  size_t state_bytes_ = 0, rounding_bases_offset_ = 0;
  void* meta_storage_ = nullptr;  // [num_tables] TableMeta, then [num_features] int32 feature -> table
  std::unique_ptr<detail::KnownPointers> known_pointers_;
};

}  // namespace embscale
