// The C API's table-batched embedding entry points (embscale/embscale_c.h): the trainable TBE (create,
// layout, forward, backward) and the quantized one (create, layout, forward, row quantization), converted
// (capi_internal.h) and passed to embscale/tbe.h and embscale/tbe_quant.h.
#include "capi/capi_internal.h"

using namespace embscale::capi;  // NOLINT: the entry points below are written in its helpers' names
using embscale::Status;

extern "C" {

int embscale_tbe_create(const embscale_context* ctx, int32_t num_tables, const int64_t* num_rows,
                        const int32_t* dims, int32_t num_features, const int32_t* feature_table_map,
                        int32_t weights_dtype, embscale_tbe** out) {
  return guarded([&]() -> Status {
    if (out == nullptr) return embscale::invalid_argument("out: must not be null");
    *out = nullptr;
    embscale::Context c;
    EMBSCALE_RETURN_IF_ERROR(to_context(ctx, &c));
    if (num_tables < 1)
      return embscale::invalid_argument("num_tables: " + std::to_string(num_tables) + "; at least one table is required");
    if (num_rows == nullptr || dims == nullptr) return embscale::invalid_argument("num_rows, dims: must not be null");
    embscale::TbeConfig cfg;
    EMBSCALE_RETURN_IF_ERROR(to_enum("weights_dtype", weights_dtype, &cfg.weights_dtype));
    for (int32_t t = 0; t < num_tables; ++t) cfg.tables.push_back({num_rows[t], dims[t]});
    EMBSCALE_RETURN_IF_ERROR(to_feature_table_map(num_tables, num_features, feature_table_map, &cfg.feature_table_map));
    auto handle = std::make_unique<embscale_tbe>();
    EMBSCALE_RETURN_IF_ERROR(embscale::TableBatchedEmbedding::create(c, cfg, &handle->owned));
    handle->impl = handle->owned.get();
    *out = handle.release();
    return Status::Ok();
  });
}

void embscale_tbe_destroy(embscale_tbe* tbe) {
  if (tbe != nullptr && tbe->owned) delete tbe;  // a row cache's lent tables go with the cache
}

int embscale_tbe_layout_get(const embscale_tbe* tbe, embscale_tbe_layout* out) {
  return guarded([&]() -> Status {
    EMBSCALE_RETURN_IF_ERROR(tbe_handle(tbe));
    if (out == nullptr) return embscale::invalid_argument("out: must not be null");
    out->num_weights = tbe->impl->num_weights();
    out->total_rows = tbe->impl->total_rows();
    out->total_dim = tbe->impl->total_dim();
    out->max_dim = tbe->impl->max_dim();
    return Status::Ok();
  });
}

int embscale_tbe_table_offsets(const embscale_tbe* tbe, int64_t* weight_offsets, int64_t* row_offsets) {
  return guarded([&]() -> Status {
    EMBSCALE_RETURN_IF_ERROR(tbe_handle(tbe));
    for (int t = 0; t < tbe->impl->num_tables(); ++t) {
      if (weight_offsets != nullptr) weight_offsets[t] = tbe->impl->weight_offset(t);
      if (row_offsets != nullptr) row_offsets[t] = tbe->impl->row_offset(t);
    }
    return Status::Ok();
  });
}

int embscale_tbe_forward(const embscale_tbe* tbe, const embscale_context* ctx,
                         const embscale_tbe_forward_args* args) {
  return embscale_tbe_forward_host_count(tbe, ctx, args, nullptr);
}

int embscale_tbe_forward_host_count(const embscale_tbe* tbe, const embscale_context* ctx,
                                    const embscale_tbe_forward_args* args, int64_t* num_skipped_host) {
  return guarded([&]() -> Status {
    EMBSCALE_RETURN_IF_ERROR(tbe_handle(tbe));
    embscale::Context c;
    embscale::TbeForwardArgs a;
    EMBSCALE_RETURN_IF_ERROR(to_context(ctx, &c));
    EMBSCALE_RETURN_IF_ERROR(to_forward_args(args, &a));
    a.num_skipped_host = num_skipped_host;
    return tbe->impl->forward(c, a);
  });
}

int embscale_tbe_backward_workspace_size(const embscale_tbe* tbe, const embscale_context* ctx,
                                         const embscale_tbe_backward_args* args, size_t* bytes) {
  return guarded([&]() -> Status {
    EMBSCALE_RETURN_IF_ERROR(tbe_handle(tbe));
    embscale::Context c;
    embscale::TbeBackwardArgs a;
    EMBSCALE_RETURN_IF_ERROR(to_context(ctx, &c));
    EMBSCALE_RETURN_IF_ERROR(to_backward_args(args, &a));
    return tbe->impl->backward_workspace_size(c, a, bytes);
  });
}

int embscale_tbe_backward(const embscale_tbe* tbe, const embscale_context* ctx,
                          const embscale_tbe_backward_args* args, void* workspace, size_t workspace_bytes) {
  return guarded([&]() -> Status {
    EMBSCALE_RETURN_IF_ERROR(tbe_handle(tbe));
    embscale::Context c;
    embscale::TbeBackwardArgs a;
    EMBSCALE_RETURN_IF_ERROR(to_context(ctx, &c));
    EMBSCALE_RETURN_IF_ERROR(to_backward_args(args, &a));
    return tbe->impl->backward(c, a, workspace, workspace_bytes);
  });
}

}  // extern "C"

/* ---- quantized tables ---------------------------------------------------------------------------- */

namespace {
Status quant_handle(const embscale_quant_tbe* tbe) {
  if (tbe == nullptr || !tbe->impl) return embscale::invalid_argument("tbe: must not be null");
  return Status::Ok();
}

// The arguments every quantize_rows entry point converts.
Status to_rows_call(const embscale_context* ctx, int32_t type, const embscale_tensor* rows,
                    embscale::Context* c, embscale::QuantWeightType* t, embscale::TensorView* r) {
  EMBSCALE_RETURN_IF_ERROR(to_context(ctx, c));
  EMBSCALE_RETURN_IF_ERROR(to_enum("type", type, t));
  return to_tensor("rows", rows, r);
}
}  // namespace

extern "C" {

int embscale_quant_tbe_create(const embscale_context* ctx, int32_t num_tables, const int64_t* num_rows,
                              const int32_t* dims, const int32_t* types, int32_t num_features,
                              const int32_t* feature_table_map, int32_t row_alignment, int32_t table_alignment,
                              embscale_quant_tbe** out) {
  return guarded([&]() -> Status {
    if (out == nullptr) return embscale::invalid_argument("out: must not be null");
    *out = nullptr;
    embscale::Context c;
    EMBSCALE_RETURN_IF_ERROR(to_context(ctx, &c));
    if (num_tables < 1)
      return embscale::invalid_argument("num_tables: " + std::to_string(num_tables) + "; at least one table is required");
    if (num_rows == nullptr || dims == nullptr || types == nullptr)
      return embscale::invalid_argument("num_rows, dims, types: must not be null");
    embscale::QuantTbeConfig cfg;
    for (int32_t t = 0; t < num_tables; ++t) {
      embscale::QuantWeightType type;
      EMBSCALE_RETURN_IF_ERROR(to_enum("types[" + std::to_string(t) + "]", types[t], &type));
      cfg.tables.push_back({num_rows[t], dims[t], type});
    }
    EMBSCALE_RETURN_IF_ERROR(to_feature_table_map(num_tables, num_features, feature_table_map, &cfg.feature_table_map));
    cfg.row_alignment = row_alignment;
    cfg.table_alignment = table_alignment;
    auto handle = std::make_unique<embscale_quant_tbe>();
    EMBSCALE_RETURN_IF_ERROR(embscale::QuantizedTableBatchedEmbedding::create(c, cfg, &handle->impl));
    *out = handle.release();
    return Status::Ok();
  });
}

void embscale_quant_tbe_destroy(embscale_quant_tbe* tbe) { delete tbe; }

int embscale_quant_tbe_layout_get(const embscale_quant_tbe* tbe, embscale_quant_tbe_layout* out, int64_t* row_bytes,
                                  int64_t* table_offsets) {
  return guarded([&]() -> Status {
    EMBSCALE_RETURN_IF_ERROR(quant_handle(tbe));
    if (out == nullptr) return embscale::invalid_argument("out: must not be null");
    const embscale::QuantizedTableBatchedEmbedding& q = *tbe->impl;
    out->total_bytes = q.total_bytes();
    out->total_dim = q.total_dim();
    out->max_dim = q.max_dim();
    for (int t = 0; t < q.num_tables(); ++t) {
      if (row_bytes != nullptr) row_bytes[t] = q.row_bytes(t);
      if (table_offsets != nullptr) table_offsets[t] = q.table_offset(t);
    }
    return Status::Ok();
  });
}

int embscale_quant_tbe_forward(const embscale_quant_tbe* tbe, const embscale_context* ctx,
                               const embscale_quant_tbe_forward_args* args) {
  return guarded([&]() -> Status {
    EMBSCALE_RETURN_IF_ERROR(quant_handle(tbe));
    embscale::Context c;
    EMBSCALE_RETURN_IF_ERROR(to_context(ctx, &c));
    if (args == nullptr) return embscale::invalid_argument("args: must not be null");
    embscale::QuantTbeForwardArgs a;
    a.weights = args->weights;
    a.weights_bytes = args->weights_bytes;
    EMBSCALE_RETURN_IF_ERROR(to_tensor("indices", &args->indices, &a.indices));
    EMBSCALE_RETURN_IF_ERROR(to_tensor("offsets", &args->offsets, &a.offsets));
    EMBSCALE_RETURN_IF_ERROR(
        to_optional_tensor("per_sample_weights", &args->per_sample_weights, &a.per_sample_weights));
    a.batch_size = args->batch_size;
    EMBSCALE_RETURN_IF_ERROR(to_enum("pooling", args->pooling, &a.pooling));
    EMBSCALE_RETURN_IF_ERROR(to_enum("bounds_check", args->bounds_check, &a.bounds_check));
    EMBSCALE_RETURN_IF_ERROR(to_tensor("output", &args->output, &a.output));
    a.num_skipped = args->num_skipped;
    return tbe->impl->forward(c, a);
  });
}

int embscale_quantize_rows_workspace_size(const embscale_context* ctx, int32_t type, const embscale_tensor* rows,
                                          int32_t row_alignment, size_t* bytes) {
  return guarded([&]() -> Status {
    embscale::Context c;
    embscale::QuantWeightType t;
    embscale::TensorView r;
    EMBSCALE_RETURN_IF_ERROR(to_rows_call(ctx, type, rows, &c, &t, &r));
    return embscale::quantize_rows_workspace_size(c, t, r, row_alignment, bytes);
  });
}

int embscale_quantize_rows(const embscale_context* ctx, int32_t type, const embscale_tensor* rows,
                           int32_t row_alignment, void* out, int64_t out_bytes, void* workspace,
                           size_t workspace_bytes) {
  return guarded([&]() -> Status {
    embscale::Context c;
    embscale::QuantWeightType t;
    embscale::TensorView r;
    EMBSCALE_RETURN_IF_ERROR(to_rows_call(ctx, type, rows, &c, &t, &r));
    return embscale::quantize_rows(c, t, r, row_alignment, out, out_bytes, workspace, workspace_bytes);
  });
}

int embscale_dequantize_rows(int32_t type, const void* in, int64_t in_bytes, int32_t row_alignment,
                             const embscale_tensor* rows) {
  return guarded([&]() -> Status {
    embscale::QuantWeightType t;
    embscale::TensorView r;
    EMBSCALE_RETURN_IF_ERROR(to_enum("type", type, &t));
    EMBSCALE_RETURN_IF_ERROR(to_tensor("rows", rows, &r));
    return embscale::dequantize_rows(t, in, in_bytes, row_alignment, r);
  });
}

}  // extern "C"
