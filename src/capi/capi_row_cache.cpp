// The C API's row cache entry points (embscale/embscale_c.h): tables in host memory behind a cache of rows
// in device memory (embscale/tbe_cache.h), and the host store's memory (embscale/memory.h).
#include "capi/capi_internal.h"

using namespace embscale::capi;  // NOLINT: the entry points below are written in its helpers' names
using embscale::Status;
using embscale::StatusCode;

/* ---- row cache ---------------------------------------------------------------------------------- */

namespace {

Status row_cache_handle(const embscale_row_cache* c) {
  if (c == nullptr || !c->impl) return embscale::invalid_argument("cache: must not be null");
  return Status::Ok();
}

Status to_cache_buffers(const embscale_row_cache_buffers* b, embscale::RowCacheBuffers* out) {
  if (b == nullptr) return embscale::invalid_argument("buffers: must not be null");
  EMBSCALE_RETURN_IF_ERROR(to_tensor("host_weights", &b->host_weights, &out->host_weights));
  EMBSCALE_RETURN_IF_ERROR(to_optional_tensor("host_momentum1", &b->host_momentum1, &out->host_momentum1));
  EMBSCALE_RETURN_IF_ERROR(to_optional_tensor("host_momentum2", &b->host_momentum2, &out->host_momentum2));
  EMBSCALE_RETURN_IF_ERROR(to_tensor("cache_weights", &b->cache_weights, &out->cache_weights));
  EMBSCALE_RETURN_IF_ERROR(to_optional_tensor("cache_momentum1", &b->cache_momentum1, &out->cache_momentum1));
  EMBSCALE_RETURN_IF_ERROR(to_optional_tensor("cache_momentum2", &b->cache_momentum2, &out->cache_momentum2));
  out->state = b->state;
  out->state_bytes = b->state_bytes;
  return Status::Ok();
}

// Runs `op(cache, context, buffers)` after converting the common arguments.
template <typename F>
int with_cache(const embscale_row_cache* cache, const embscale_context* ctx, const embscale_row_cache_buffers* b,
               F&& op) {
  return guarded([&]() -> Status {
    EMBSCALE_RETURN_IF_ERROR(row_cache_handle(cache));
    embscale::Context c;
    embscale::RowCacheBuffers bufs;
    EMBSCALE_RETURN_IF_ERROR(to_context(ctx, &c));
    EMBSCALE_RETURN_IF_ERROR(to_cache_buffers(b, &bufs));
    return op(*cache->impl, c, bufs);
  });
}

}  // namespace

int embscale_row_cache_create(const embscale_context* ctx, int32_t num_tables, const int64_t* num_rows,
                              const int32_t* dims, int32_t num_features, const int32_t* feature_table_map,
                              int32_t weights_dtype, const int32_t* placement, const int64_t* cache_rows,
                              int32_t algorithm, int32_t optimizer, int64_t max_lookups, embscale_row_cache** out) {
  return guarded([&]() -> Status {
    if (out == nullptr) return embscale::invalid_argument("out: must not be null");
    *out = nullptr;
    embscale_tbe* tables = nullptr;
    embscale::Context c;
    EMBSCALE_RETURN_IF_ERROR(to_context(ctx, &c));
    if (num_tables < 1) return embscale::invalid_argument("num_tables: " + std::to_string(num_tables) + "; expected >= 1");
    if (placement == nullptr || cache_rows == nullptr)
      return embscale::invalid_argument("placement, cache_rows: must not be null");
    std::vector<embscale::TablePlacement> placements(static_cast<size_t>(num_tables));
    for (int32_t t = 0; t < num_tables; ++t)
      EMBSCALE_RETURN_IF_ERROR(to_enum("placement[" + std::to_string(t) + "]", placement[t], &placements[t]));
    embscale::CacheAlgorithm algo;
    embscale::OptimizerType type;
    EMBSCALE_RETURN_IF_ERROR(to_enum("algorithm", algorithm, &algo));
    EMBSCALE_RETURN_IF_ERROR(to_enum("optimizer", optimizer, &type));
    // The tables as embscale_tbe_create takes them (its checks, then its config).
    const int st = embscale_tbe_create(ctx, num_tables, num_rows, dims, num_features, feature_table_map, weights_dtype,
                                       &tables);
    if (st != 0) return Status(static_cast<StatusCode>(st), embscale_last_error());
    std::unique_ptr<embscale_tbe> owned_tables(tables);
    embscale::RowCacheConfig cfg;
    cfg.tables = tables->impl->config();
    cfg.placement = placements;
    cfg.cache_rows.assign(cache_rows, cache_rows + num_tables);
    cfg.algorithm = algo;
    cfg.optimizer = type;
    cfg.max_lookups = max_lookups;
    auto handle = std::make_unique<embscale_row_cache>();
    EMBSCALE_RETURN_IF_ERROR(embscale::RowCache::create(c, cfg, &handle->impl));
    handle->tables.impl = &handle->impl->cache_tbe();
    *out = handle.release();
    return Status::Ok();
  });
}

void embscale_row_cache_destroy(embscale_row_cache* cache) { delete cache; }

int embscale_host_store_malloc(uint64_t bytes, void** out) {
  return guarded([&]() -> Status {
    if (out == nullptr) return embscale::invalid_argument("out: must not be null");
    *out = nullptr;
    if (bytes > SIZE_MAX) return embscale::invalid_argument("bytes: " + std::to_string(bytes) + " is more than any allocation");
    return embscale::host_store_malloc(static_cast<size_t>(bytes), out);
  });
}

void embscale_host_store_free(void* ptr) { embscale::host_store_free(ptr); }

const embscale_tbe* embscale_row_cache_tbe(const embscale_row_cache* cache) {
  return cache != nullptr && cache->impl ? &cache->tables : nullptr;
}

int embscale_row_cache_info_get(const embscale_row_cache* cache, embscale_row_cache_info* out, int64_t* cache_slots) {
  return guarded([&]() -> Status {
    EMBSCALE_RETURN_IF_ERROR(row_cache_handle(cache));
    if (out == nullptr) return embscale::invalid_argument("out: must not be null");
    out->state_bytes = static_cast<int64_t>(cache->impl->state_bytes());
    out->rounding_bases_offset = static_cast<int64_t>(cache->impl->rounding_bases_offset());
    out->plan_bytes = static_cast<int64_t>(cache->impl->plan_bytes());
    if (cache_slots != nullptr)
      for (int t = 0; t < cache->impl->host_tbe().num_tables(); ++t) cache_slots[t] = cache->impl->cache_slots(t);
    return Status::Ok();
  });
}

int embscale_row_cache_load(const embscale_row_cache* cache, const embscale_context* ctx,
                            const embscale_row_cache_buffers* buffers) {
  return with_cache(cache, ctx, buffers, [](const embscale::RowCache& rc, const embscale::Context& c,
                                            const embscale::RowCacheBuffers& b) { return rc.load(c, b); });
}

int embscale_row_cache_prefetch(const embscale_row_cache* cache, const embscale_context* ctx,
                                const embscale_row_cache_buffers* buffers, const embscale_row_cache_prefetch_args* args) {
  return with_cache(cache, ctx, buffers, [&](const embscale::RowCache& rc, const embscale::Context& c,
                                             const embscale::RowCacheBuffers& b) -> Status {
    if (args == nullptr) return embscale::invalid_argument("args: must not be null");
    embscale::RowCachePrefetchArgs a;
    EMBSCALE_RETURN_IF_ERROR(to_tensor("indices", &args->indices, &a.indices));
    EMBSCALE_RETURN_IF_ERROR(to_tensor("offsets", &args->offsets, &a.offsets));
    EMBSCALE_RETURN_IF_ERROR(to_tensor("remapped", &args->remapped, &a.remapped));
    a.batch_size = args->batch_size;
    a.step = args->step;
    a.lock_from = args->lock_from;
    a.training = args->training != 0;
    a.plan = args->plan;
    a.plan_bytes = args->plan_bytes;
    return rc.prefetch(c, b, a);
  });
}

int embscale_row_cache_fetch(const embscale_row_cache* cache, const embscale_context* ctx,
                             const embscale_row_cache_buffers* buffers, const void* plan, size_t plan_bytes) {
  return with_cache(cache, ctx, buffers, [&](const embscale::RowCache& rc, const embscale::Context& c,
                                             const embscale::RowCacheBuffers& b) { return rc.fetch(c, b, plan, plan_bytes); });
}

int embscale_row_cache_write_back(const embscale_row_cache* cache, const embscale_context* ctx,
                                  const embscale_row_cache_buffers* buffers, const void* plan, size_t plan_bytes) {
  return with_cache(cache, ctx, buffers, [&](const embscale::RowCache& rc, const embscale::Context& c,
                                             const embscale::RowCacheBuffers& b) {
    return rc.write_back(c, b, plan, plan_bytes);
  });
}

int embscale_row_cache_flush(const embscale_row_cache* cache, const embscale_context* ctx,
                             const embscale_row_cache_buffers* buffers) {
  return with_cache(cache, ctx, buffers, [](const embscale::RowCache& rc, const embscale::Context& c,
                                            const embscale::RowCacheBuffers& b) { return rc.flush(c, b); });
}
