// RowCache, API layer (tbe_cache.h): names and parsers, create() (the placements, the pools of the cache's
// TableBatchedEmbedding, the state layout, the per-table facts in device memory) and every op's host-side
// checks before the CUDA backend (tbe/cuda/cache/). The CPU backend keeps every table in host memory and
// has no cache: create() refuses it.
#include <algorithm>
#include <climits>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/known_pointers.h"
#include "core/spelling.h"
#include "core/workspace.h"
#include "embscale/memory.h"
#include "embscale/tbe_cache.h"
#include "tbe/optimizer_table.h"
#include "tbe/tbe_cache_backend.h"

namespace embscale {

const char* table_placement_name(TablePlacement p) {
  switch (p) {
    case TablePlacement::kDevice: return "device";
    case TablePlacement::kHost: return "host";
    case TablePlacement::kCached: return "cached";
  }
  return "unknown";
}

namespace {
// Each name, then FBGEMM's EmbeddingLocation names for the same placements.
constexpr Spelling<TablePlacement> kPlacementSpellings[] = {
    {"device", TablePlacement::kDevice}, {"host", TablePlacement::kHost}, {"cached", TablePlacement::kCached},
    {"DEVICE", TablePlacement::kDevice}, {"MANAGED", TablePlacement::kHost},
    {"MANAGED_CACHING", TablePlacement::kCached},
};
constexpr Spelling<CacheAlgorithm> kCacheAlgorithmSpellings[] = {
    {"lru", CacheAlgorithm::kLru}, {"lfu", CacheAlgorithm::kLfu}, {"LRU", CacheAlgorithm::kLru},
    {"LFU", CacheAlgorithm::kLfu}};
}  // namespace

bool parse_table_placement(const std::string& name, TablePlacement* out) {
  return parse_spelling(kPlacementSpellings, name, out);
}

const char* cache_algorithm_name(CacheAlgorithm a) {
  switch (a) {
    case CacheAlgorithm::kLru: return "lru";
    case CacheAlgorithm::kLfu: return "lfu";
  }
  return "unknown";
}

bool parse_cache_algorithm(const std::string& name, CacheAlgorithm* out) {
  return parse_spelling(kCacheAlgorithmSpellings, name, out);
}

namespace {

Status check_config(const RowCacheConfig& cfg) {
  const size_t T = cfg.tables.tables.size();
  if (cfg.placement.size() != T)
    return invalid_argument("cfg.placement: " + std::to_string(cfg.placement.size()) + " entries; expected one per table (" +
                            std::to_string(T) + ")");
  if (cfg.cache_rows.size() != T)
    return invalid_argument("cfg.cache_rows: " + std::to_string(cfg.cache_rows.size()) +
                            " entries; expected one per table (" + std::to_string(T) + ")");
  for (size_t t = 0; t < T; ++t) {
    const std::string at = "[" + std::to_string(t) + "]";
    const TablePlacement p = cfg.placement[t];
    if (p != TablePlacement::kDevice && p != TablePlacement::kHost && p != TablePlacement::kCached)
      return invalid_argument("cfg.placement" + at + ": unknown value " + std::to_string(static_cast<int>(p)) +
                              "; expected device, host or cached");
    const int64_t rows = cfg.cache_rows[t];
    if (p == TablePlacement::kCached && rows < 1)
      return invalid_argument("cfg.cache_rows" + at + ": " + std::to_string(rows) + "; a cached table's cache needs >= 1 row");
    if (p == TablePlacement::kCached && rows > (int64_t{1} << 40))
      return invalid_argument("cfg.cache_rows" + at + ": " + std::to_string(rows) + " is more than 2^40 rows");
    if (p != TablePlacement::kCached && rows != 0)
      return invalid_argument("cfg.cache_rows" + at + ": " + std::to_string(rows) + " for a " + table_placement_name(p) +
                              " table, which has no cache; expected 0");
  }
  if (cfg.algorithm != CacheAlgorithm::kLru && cfg.algorithm != CacheAlgorithm::kLfu)
    return invalid_argument("cfg.algorithm: unknown value " + std::to_string(static_cast<int>(cfg.algorithm)) +
                            "; expected lru or lfu");
  const opt::OptimizerSpec* spec = opt::optimizer_spec(cfg.optimizer);
  if (spec == nullptr)
    return invalid_argument("cfg.optimizer: unknown value " + std::to_string(static_cast<int>(cfg.optimizer)));
  if (cfg.optimizer == OptimizerType::kNone)
    return invalid_argument("cfg.optimizer: none (the dense-gradient mode) names rows by their place in the cache; "
                            "a RowCache trains with an optimizer fused into the backward");
  if (cfg.max_lookups < 1 || cfg.max_lookups > INT32_MAX)
    return invalid_argument("cfg.max_lookups: " + std::to_string(cfg.max_lookups) + "; expected 1 .. 2^31 - 1");
  return Status::Ok();
}

// The fixed layout of the persistent state (tbe_cache.h): statistics first.
struct StateLayout {
  WorkspaceLayout ws{WorkspaceLayout::Base::kAsGiven};
  WorkspaceSlice stats, tags, stamps, dirty, lfu, rounding_bases;
  WorkspaceSlice rowwise_state[2];  // the optimizer's row-wise state buffers (momentum1, momentum2)
};

StateLayout state_layout(int64_t total_sets, int64_t host_rows, bool lfu, int64_t cache_rows, OptimizerType optimizer) {
  StateLayout L;
  const size_t slots = static_cast<size_t>(total_sets) * RowCache::kCacheWays;
  L.stats = L.ws.add(sizeof(int64_t) * kNumStats);
  L.tags = L.ws.add(sizeof(int64_t) * slots);
  L.stamps = L.ws.add(sizeof(int64_t) * slots);
  L.dirty = L.ws.add(slots);
  L.lfu = L.ws.add(lfu ? sizeof(int32_t) * static_cast<size_t>(host_rows) : 0);
  L.rounding_bases = L.ws.add(sizeof(int64_t) * static_cast<size_t>(cache_rows));
  const opt::OptimizerSpec& spec = *opt::optimizer_spec(optimizer);
  const opt::StateLayout layouts[2] = {spec.momentum1.layout, spec.momentum2.layout};
  for (int k = 0; k < 2; ++k)
    L.rowwise_state[k] =
        L.ws.add(layouts[k] == opt::StateLayout::kRowwise ? sizeof(float) * static_cast<size_t>(host_rows) : 0);
  return L;
}

// A state buffer in the ops' terms (the layout above over the caller's bytes).
cache_backend::State carve_state(const RowCache& c, void* state) {
  const StateLayout L =
      state_layout(c.total_sets(), c.host_tbe().total_rows(), c.config().algorithm == CacheAlgorithm::kLfu,
                   c.cache_tbe().total_rows(), c.config().optimizer);
  cache_backend::State s;
  s.stats = L.ws.at<int64_t>(state, L.stats);
  s.tags = L.ws.at<int64_t>(state, L.tags);
  s.stamps = L.ws.at<int64_t>(state, L.stamps);
  s.dirty = L.ws.at<uint8_t>(state, L.dirty);
  s.lfu = c.config().algorithm == CacheAlgorithm::kLfu ? L.ws.at<int32_t>(state, L.lfu) : nullptr;
  s.rounding_bases = L.ws.at<int64_t>(state, L.rounding_bases);
  for (int k = 0; k < 2; ++k)
    s.rowwise_state[k] = L.rowwise_state[k].bytes > 0 ? L.ws.at<float>(state, L.rowwise_state[k]) : nullptr;
  return s;
}

// One buffer of the host store or of the cache: of the weights' dtype, or fp32 state in the layout the
// optimizer gives (row-wise: rows, element-wise: weights), present exactly when the optimizer keeps it.
Status check_buffer(const Context& ctx, detail::KnownPointers* known, const char* name, const TensorView& v,
                    DType dtype, int64_t numel, bool present, bool host) {
  if (!present) {
    if (v.data != nullptr) return invalid_argument(std::string(name) + ": given, but the optimizer keeps no such state");
    return Status::Ok();
  }
  if (v.data == nullptr && numel > 0) return invalid_argument(std::string(name) + ": absent, but the optimizer keeps it");
  EMBSCALE_RETURN_IF_ERROR(check::shape(name, v, 1));
  EMBSCALE_RETURN_IF_ERROR(check::data(name, v));
  if (v.dtype != dtype)
    return invalid_argument(std::string(name) + ": dtype " + dtype_name(v.dtype) + "; expected " + dtype_name(dtype));
  if (v.numel() != numel)
    return invalid_argument(std::string(name) + ": " + std::to_string(v.numel()) + " elements; expected " +
                            std::to_string(numel));
  return host ? check::host_store_memory(ctx, name, v.data, known) : check::memory(ctx, name, v.data, known);
}

}  // namespace

RowCache::~RowCache() { backend_free(backend_, meta_storage_); }

Status RowCache::create(const Context& ctx, const RowCacheConfig& cfg, std::unique_ptr<RowCache>* out) {
  if (out == nullptr) return invalid_argument("out: must not be null");
  out->reset();
  EMBSCALE_RETURN_IF_ERROR(check::context(ctx));
  if (ctx.backend != Backend::kCuda)
    return unsupported("ctx.backend: the CPU backend keeps every table in host memory and needs no row cache; a "
                       "RowCache is a CUDA object");
  EMBSCALE_RETURN_IF_ERROR(check_config(cfg));
  std::unique_ptr<RowCache> c(new RowCache());
  c->cfg_ = cfg;
  c->backend_ = ctx.backend;
  c->known_pointers_.reset(new detail::KnownPointers());
  Context host_ctx = Context::cpu(1);
  EMBSCALE_RETURN_IF_ERROR(TableBatchedEmbedding::create(host_ctx, cfg.tables, &c->host_tbe_));
  const TableBatchedEmbedding& host = *c->host_tbe_;
  const int T = host.num_tables();

  // The cache's tables: each device table as it is, one pool per dimension of the other tables (their
  // cache slots in table order, then the staging rows of two batches).
  TbeConfig cache_cfg;
  cache_cfg.weights_dtype = cfg.tables.weights_dtype;
  std::vector<int> cache_table(T, -1);
  std::map<int, int> pool_of_dim;  // D -> its pool's cache table
  c->slots_.assign(T, 0);
  c->meta_.assign(T, TableMeta{});
  const int64_t staging = 2 * cfg.max_lookups;
  for (int t = 0; t < T; ++t) {
    const TableSpec& s = cfg.tables.tables[t];
    TableMeta& m = c->meta_[t];
    m.row_offset = host.row_offset(t);
    m.num_rows = s.num_rows;
    m.weight_offset = host.weight_offset(t);
    m.dim = s.dim;
    m.placement = static_cast<int32_t>(cfg.placement[t]);
    if (cfg.placement[t] == TablePlacement::kDevice) {
      cache_table[t] = static_cast<int>(cache_cfg.tables.size());
      cache_cfg.tables.push_back(s);
      continue;
    }
    auto it = pool_of_dim.find(s.dim);
    if (it == pool_of_dim.end()) {
      it = pool_of_dim.emplace(s.dim, static_cast<int>(cache_cfg.tables.size())).first;
      cache_cfg.tables.push_back(TableSpec{0, s.dim});
    }
    cache_table[t] = it->second;
    TableSpec& pool = cache_cfg.tables[it->second];
    if (cfg.placement[t] == TablePlacement::kCached) {
      const int64_t sets = (cfg.cache_rows[t] + kCacheWays - 1) / kCacheWays;
      c->slots_[t] = sets * kCacheWays;
      m.num_sets = sets;
      m.set_base = c->total_sets_;
      m.slot_base = pool.num_rows;
      c->total_sets_ += sets;
      pool.num_rows += c->slots_[t];
    }
  }
  for (auto& [dim, table] : pool_of_dim) cache_cfg.tables[table].num_rows += staging;
  for (int t = 0; t < T; ++t)
    if (cfg.placement[t] != TablePlacement::kDevice) c->meta_[t].staging_base = cache_cfg.tables[cache_table[t]].num_rows - staging;
  const int F = host.num_features();
  for (int f = 0; f < F; ++f) cache_cfg.feature_table_map.push_back(cache_table[host.feature_table(f)]);
  EMBSCALE_RETURN_IF_ERROR(TableBatchedEmbedding::create(ctx, cache_cfg, &c->cache_tbe_));
  for (int t = 0; t < T; ++t) {
    c->meta_[t].cache_weight_offset = c->cache_tbe_->weight_offset(cache_table[t]);
    c->meta_[t].cache_row_offset = c->cache_tbe_->row_offset(cache_table[t]);
  }

  const StateLayout L = state_layout(c->total_sets_, host.total_rows(), cfg.algorithm == CacheAlgorithm::kLfu,
                                     c->cache_tbe_->total_rows(), cfg.optimizer);
  c->state_bytes_ = L.ws.size();
  c->rounding_bases_offset_ = L.rounding_bases.offset;

  // The per-table facts and the feature -> table map, in device memory.
  const size_t meta_bytes = sizeof(TableMeta) * T, map_bytes = sizeof(int32_t) * F;
  std::vector<char> host_meta(meta_bytes + map_bytes);
  std::memcpy(host_meta.data(), c->meta_.data(), meta_bytes);
  for (int f = 0; f < F; ++f) {
    const int32_t t = host.feature_table(f);
    std::memcpy(host_meta.data() + meta_bytes + sizeof(int32_t) * f, &t, sizeof(t));
  }
  EMBSCALE_RETURN_IF_ERROR(backend_malloc(ctx.backend, host_meta.size(), &c->meta_storage_));
  EMBSCALE_RETURN_IF_ERROR(copy_to_backend(ctx, c->meta_storage_, host_meta.data(), host_meta.size()));
  EMBSCALE_RETURN_IF_ERROR(synchronize(ctx));
  *out = std::move(c);
  return Status::Ok();
}

#if EMBSCALE_WITH_CUDA
#define EMBSCALE_CACHE_BACKEND(call) return cache_backend::call
size_t RowCache::plan_bytes() const { return cache_backend::plan_bytes(cfg_.max_lookups); }
#else
// A RowCache is never created in a build without CUDA (create() refuses the CPU backend).
#define EMBSCALE_CACHE_BACKEND(call) return unsupported("ctx: this build of embscale has no CUDA backend")
size_t RowCache::plan_bytes() const { return 0; }
#endif

namespace {

// Everything an op is given, checked: the buffers against both layouts and the state's size.
Status check_buffers(const RowCache& c, const Context& ctx, const RowCacheBuffers& b) {
  EMBSCALE_RETURN_IF_ERROR(check::context(ctx));
  if (ctx.backend != Backend::kCuda) return invalid_argument("ctx.backend: a RowCache runs on CUDA");
  const opt::OptimizerSpec& spec = *opt::optimizer_spec(c.config().optimizer);
  const TableBatchedEmbedding &host = c.host_tbe(), &cache = c.cache_tbe();
  const DType w = c.config().tables.weights_dtype;
  const auto numel = [](const TableBatchedEmbedding& t, opt::StateLayout l) {
    return l == opt::StateLayout::kRowwise ? t.total_rows() : t.num_weights();
  };
  const opt::StateLayout l1 = spec.momentum1.layout, l2 = spec.momentum2.layout;
  const bool m1 = l1 != opt::StateLayout::kAbsent, m2 = l2 != opt::StateLayout::kAbsent;
  detail::KnownPointers* known = c.known_pointers();
  EMBSCALE_RETURN_IF_ERROR(check_buffer(ctx, known, "host_weights", b.host_weights, w, host.num_weights(), true, true));
  EMBSCALE_RETURN_IF_ERROR(
      check_buffer(ctx, known, "host_momentum1", b.host_momentum1, DType::kF32, numel(host, l1), m1, true));
  EMBSCALE_RETURN_IF_ERROR(
      check_buffer(ctx, known, "host_momentum2", b.host_momentum2, DType::kF32, numel(host, l2), m2, true));
  EMBSCALE_RETURN_IF_ERROR(
      check_buffer(ctx, known, "cache_weights", b.cache_weights, w, cache.num_weights(), true, false));
  EMBSCALE_RETURN_IF_ERROR(
      check_buffer(ctx, known, "cache_momentum1", b.cache_momentum1, DType::kF32, numel(cache, l1), m1, false));
  EMBSCALE_RETURN_IF_ERROR(
      check_buffer(ctx, known, "cache_momentum2", b.cache_momentum2, DType::kF32, numel(cache, l2), m2, false));
  if (b.state == nullptr) return invalid_argument("state: null; state_bytes() = " + std::to_string(c.state_bytes()));
  if (b.state_bytes < c.state_bytes())
    return invalid_argument("state_bytes: " + std::to_string(b.state_bytes) + "; state_bytes() asks for " +
                            std::to_string(c.state_bytes()));
  if (reinterpret_cast<uintptr_t>(b.state) % WorkspaceLayout::kAlign != 0)
    return invalid_argument("state: not aligned to " + std::to_string(WorkspaceLayout::kAlign) + " bytes");
  EMBSCALE_RETURN_IF_ERROR(check::memory(ctx, "state", b.state, known));
  using check::region;
  const check::Region all[] = {region("host_weights", b.host_weights),   region("host_momentum1", b.host_momentum1),
                               region("host_momentum2", b.host_momentum2), region("cache_weights", b.cache_weights),
                               region("cache_momentum1", b.cache_momentum1), region("cache_momentum2", b.cache_momentum2),
                               check::Region{"state", b.state, c.state_bytes()}};
  return check::disjoint(all, 7, nullptr, 0);
}

Status check_plan(const RowCache& c, const Context& ctx, const void* plan, size_t plan_bytes) {
  if (plan == nullptr) return invalid_argument("plan: null; plan_bytes() = " + std::to_string(c.plan_bytes()));
  if (plan_bytes < c.plan_bytes())
    return invalid_argument("plan_bytes: " + std::to_string(plan_bytes) + "; plan_bytes() asks for " +
                            std::to_string(c.plan_bytes()));
  if (reinterpret_cast<uintptr_t>(plan) % WorkspaceLayout::kAlign != 0)
    return invalid_argument("plan: not aligned to " + std::to_string(WorkspaceLayout::kAlign) + " bytes");
  return check::memory(ctx, "plan", plan, c.known_pointers());
}

cache_backend::Call make_call(const RowCache& c, const Context& ctx, const RowCacheBuffers& b) {
  cache_backend::Call call;
  call.stream = ctx.stream;
  call.cache = &c;
  call.tables = static_cast<const RowCache::TableMeta*>(c.meta_storage());
  call.feature_table = reinterpret_cast<const int32_t*>(static_cast<const char*>(c.meta_storage()) +
                                                        sizeof(RowCache::TableMeta) * c.host_tbe().num_tables());
  call.state = carve_state(c, b.state);
  call.buffers = b;
  return call;
}

}  // namespace

Status RowCache::load(const Context& ctx, const RowCacheBuffers& b) const {
  EMBSCALE_RETURN_IF_ERROR(check_buffers(*this, ctx, b));
  EMBSCALE_CACHE_BACKEND(load(make_call(*this, ctx, b)));
}

Status RowCache::prefetch(const Context& ctx, const RowCacheBuffers& b, const RowCachePrefetchArgs& a) const {
  EMBSCALE_RETURN_IF_ERROR(check_buffers(*this, ctx, b));
  EMBSCALE_RETURN_IF_ERROR(check_plan(*this, ctx, a.plan, a.plan_bytes));
  // The lookups as the forward takes them (the host TBE's view: features, batch size, dtypes).
  EMBSCALE_RETURN_IF_ERROR(check::shape("indices", a.indices, 1));
  EMBSCALE_RETURN_IF_ERROR(check::data("indices", a.indices));
  EMBSCALE_RETURN_IF_ERROR(check::shape("offsets", a.offsets, 1));
  EMBSCALE_RETURN_IF_ERROR(check::data("offsets", a.offsets));
  if (a.indices.ndim != 1 || a.offsets.ndim != 1)
    return invalid_argument("indices, offsets: expected 1-D tensors");
  if (a.indices.dtype != DType::kI32 && a.indices.dtype != DType::kI64)
    return invalid_argument(std::string("indices: dtype ") + dtype_name(a.indices.dtype) + "; expected int32 or int64");
  if (a.offsets.dtype != a.indices.dtype)
    return invalid_argument(std::string("offsets: dtype ") + dtype_name(a.offsets.dtype) + " differs from the indices' " +
                            dtype_name(a.indices.dtype));
  const int64_t N = a.indices.numel();
  if (N > cfg_.max_lookups)
    return invalid_argument("indices: " + std::to_string(N) + " lookups; the cache stages at most cfg.max_lookups = " +
                            std::to_string(cfg_.max_lookups));
  const int64_t F = host_tbe_->num_features();
  if (a.batch_size < 0 || a.offsets.numel() != F * a.batch_size + 1)
    return invalid_argument("offsets: " + std::to_string(a.offsets.numel()) + " entries with batch_size " +
                            std::to_string(a.batch_size) + "; expected T*B+1 with T = " + std::to_string(F) +
                            " features");
  if (a.step < 1) return invalid_argument("step: " + std::to_string(a.step) + "; expected >= 1");
  if (a.lock_from < 0 || a.lock_from > a.step)
    return invalid_argument("lock_from: " + std::to_string(a.lock_from) + "; expected 0 .. step (" +
                            std::to_string(a.step) + ")");
  EMBSCALE_RETURN_IF_ERROR(check::shape("remapped", a.remapped, 1));
  EMBSCALE_RETURN_IF_ERROR(check::data("remapped", a.remapped));
  if (a.remapped.dtype != a.indices.dtype || a.remapped.numel() != N)
    return invalid_argument(std::string("remapped: ") + dtype_name(a.remapped.dtype) + " [" +
                            std::to_string(a.remapped.numel()) + "]; expected the indices' dtype and length [" +
                            std::to_string(N) + "]");
  if (a.indices.dtype == DType::kI32 && cache_tbe_->total_rows() > INT32_MAX)
    return invalid_argument("indices: int32, but the cache's tables have more rows than int32 indexes; pass int64");
  for (const auto& [name, p] : {std::pair<const char*, const void*>{"indices", a.indices.data},
                                {"offsets", a.offsets.data}, {"remapped", a.remapped.data}})
    EMBSCALE_RETURN_IF_ERROR(check::memory(ctx, name, p, known_pointers_.get()));
  using check::region;
  const check::Region written[] = {region("remapped", a.remapped), check::Region{"plan", a.plan, plan_bytes()}};
  const check::Region read[] = {region("indices", a.indices), region("offsets", a.offsets),
                                check::Region{"state", b.state, state_bytes_}, region("cache_weights", b.cache_weights),
                                region("host_weights", b.host_weights)};
  EMBSCALE_RETURN_IF_ERROR(check::disjoint(written, 2, read, 5));
  EMBSCALE_CACHE_BACKEND(prefetch(make_call(*this, ctx, b), a));
}

Status RowCache::fetch(const Context& ctx, const RowCacheBuffers& b, const void* plan, size_t plan_bytes) const {
  EMBSCALE_RETURN_IF_ERROR(check_buffers(*this, ctx, b));
  EMBSCALE_RETURN_IF_ERROR(check_plan(*this, ctx, plan, plan_bytes));
  EMBSCALE_CACHE_BACKEND(fetch(make_call(*this, ctx, b), plan));
}

Status RowCache::write_back(const Context& ctx, const RowCacheBuffers& b, const void* plan, size_t plan_bytes) const {
  EMBSCALE_RETURN_IF_ERROR(check_buffers(*this, ctx, b));
  EMBSCALE_RETURN_IF_ERROR(check_plan(*this, ctx, plan, plan_bytes));
  EMBSCALE_CACHE_BACKEND(write_back(make_call(*this, ctx, b), plan));
}

Status RowCache::flush(const Context& ctx, const RowCacheBuffers& b) const {
  EMBSCALE_RETURN_IF_ERROR(check_buffers(*this, ctx, b));
  EMBSCALE_CACHE_BACKEND(flush(make_call(*this, ctx, b)));
}

}  // namespace embscale
