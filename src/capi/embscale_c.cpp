// The C API (embscale/embscale_c.h): converts flat C structs into the C++ API's types, checks the
// enumeration values a C caller can get wrong (against the C++ enums' counts, the one source of their
// ranges), and keeps the last error message per thread. Nothing else happens here; validation of
// shapes, dtypes and values is the C++ API's.
#include "embscale/embscale_c.h"

#include <cstdint>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "embscale/fp8.h"
#include "embscale/memory.h"
#include "embscale/tbe.h"
#include "embscale/tbe_cache.h"
#include "embscale/tbe_quant.h"

// A TBE the caller created (owned), or a row cache's tables lent to the caller (embscale_row_cache_tbe).
struct embscale_tbe {
  std::unique_ptr<embscale::TableBatchedEmbedding> owned;
  const embscale::TableBatchedEmbedding* impl = nullptr;
};

struct embscale_quant_tbe {
  std::unique_ptr<embscale::QuantizedTableBatchedEmbedding> impl;
};

struct embscale_row_cache {
  std::unique_ptr<embscale::RowCache> impl;
  embscale_tbe tables;  // impl->cache_tbe(), lent
};

namespace {

using embscale::Status;
using embscale::StatusCode;

thread_local std::string g_last_error;

int finish(const Status& st) {
  g_last_error = st.ok() ? std::string() : st.message();
  return static_cast<int>(st.code());
}

// Runs `body` (returning Status) and turns an escaping exception (allocation failure) into a status.
template <typename F>
int guarded(F&& body) {
  try {
    return finish(body());
  } catch (const std::bad_alloc&) {
    return finish(Status(StatusCode::kBackendError, "host allocation failed"));
  } catch (const std::exception& e) {
    return finish(Status(StatusCode::kBackendError, e.what()));
  }
}

static_assert(static_cast<int>(embscale::OptimizerStateLayout::kAbsent) == EMBSCALE_STATE_ABSENT &&
                  static_cast<int>(embscale::OptimizerStateLayout::kRowwise) == EMBSCALE_STATE_ROWWISE &&
                  static_cast<int>(embscale::OptimizerStateLayout::kElementwise) == EMBSCALE_STATE_ELEMENTWISE,
              "the C API's state layouts are OptimizerStateLayout's values");
static_assert(static_cast<int>(embscale::OptimizerWeightDecay::kNone) == EMBSCALE_WEIGHT_DECAY_NONE &&
                  static_cast<int>(embscale::OptimizerWeightDecay::kByMode) == EMBSCALE_WEIGHT_DECAY_BY_MODE &&
                  static_cast<int>(embscale::OptimizerWeightDecay::kDecoupled) == EMBSCALE_WEIGHT_DECAY_DECOUPLED,
              "the C API's weight decay rules are OptimizerWeightDecay's values");

// The number of values of each enumeration the C API takes (its values are 0 .. count - 1).
template <typename E>
int32_t enum_count();
template <>
int32_t enum_count<embscale::Backend>() { return embscale::kNumBackends; }
template <>
int32_t enum_count<embscale::DType>() { return embscale::kNumDTypes; }
template <>
int32_t enum_count<embscale::AmaxAlgo>() { return embscale::kNumAmaxAlgos; }
template <>
int32_t enum_count<embscale::Activation>() { return embscale::kNumActivations; }
template <>
int32_t enum_count<embscale::PoolingMode>() { return embscale::kNumPoolingModes; }
template <>
int32_t enum_count<embscale::BoundsCheckMode>() { return embscale::kNumBoundsCheckModes; }
template <>
int32_t enum_count<embscale::OptimizerType>() { return embscale::num_optimizers(); }
template <>
int32_t enum_count<embscale::WeightDecayMode>() { return embscale::kNumWeightDecayModes; }
template <>
int32_t enum_count<embscale::WeightRounding>() { return embscale::kNumWeightRoundings; }
template <>
int32_t enum_count<embscale::TablePlacement>() { return embscale::kNumTablePlacements; }
template <>
int32_t enum_count<embscale::CacheAlgorithm>() { return embscale::kNumCacheAlgorithms; }
template <>
int32_t enum_count<embscale::QuantWeightType>() { return embscale::kNumQuantWeightTypes; }

// A C enumeration value as its C++ enum, or invalid_argument naming the argument, its value and the range.
template <typename E>
Status to_enum(const std::string& name, int32_t value, E* out) {
  const int32_t count = enum_count<E>();
  if (value < 0 || value >= count) {
    return embscale::invalid_argument(name + ": value " + std::to_string(value) + " is out of range [0, " +
                                      std::to_string(count - 1) + "]");
  }
  *out = static_cast<E>(value);
  return Status::Ok();
}

Status to_context(const embscale_context* c, embscale::Context* out) {
  if (c == nullptr) return embscale::invalid_argument("ctx: must not be null");
  embscale::Backend backend;
  EMBSCALE_RETURN_IF_ERROR(to_enum("ctx.backend", c->backend, &backend));
  *out = backend == embscale::Backend::kCpu ? embscale::Context::cpu(c->num_threads)
                                            : embscale::Context::cuda(c->stream);
  return Status::Ok();
}

Status to_tensor(const char* name, const embscale_tensor* t, embscale::TensorView* out) {
  if (t == nullptr) return embscale::invalid_argument(std::string(name) + ": must not be null");
  EMBSCALE_RETURN_IF_ERROR(to_enum(std::string(name) + ".dtype", t->dtype, &out->dtype));
  if (t->ndim < 1 || t->ndim > embscale::kMaxDims) {
    return embscale::invalid_argument(std::string(name) + ": ndim " + std::to_string(t->ndim) +
                                      " is out of range [1, " + std::to_string(embscale::kMaxDims) + "]");
  }
  out->data = t->data;
  out->ndim = t->ndim;
  for (int i = 0; i < embscale::kMaxDims; ++i) out->shape[i] = i < t->ndim ? t->shape[i] : 0;
  return Status::Ok();
}

// An optional tensor: absent (a default TensorView) when its data is NULL, else checked as to_tensor.
Status to_optional_tensor(const char* name, const embscale_tensor* t, embscale::TensorView* out) {
  if (t->data == nullptr) {
    *out = embscale::TensorView();
    return Status::Ok();
  }
  return to_tensor(name, t, out);
}

// The arguments every amax-based FP8 call starts with: context, input x and the amax algorithm.
struct AmaxCall {
  embscale::Context ctx;
  embscale::TensorView x;
  embscale::AmaxOptions opts;
};
Status to_amax_call(const embscale_context* ctx, const embscale_tensor* x, int32_t algo, AmaxCall* out) {
  EMBSCALE_RETURN_IF_ERROR(to_context(ctx, &out->ctx));
  EMBSCALE_RETURN_IF_ERROR(to_tensor("x", x, &out->x));
  return to_enum("algo", algo, &out->opts.algo);
}

// The lookup fields the forward and backward arguments share (same names in the C and C++ structs).
template <typename CArgs, typename Args>
Status to_lookup_fields(const CArgs* a, Args* out) {
  if (a == nullptr) return embscale::invalid_argument("args: must not be null");
  EMBSCALE_RETURN_IF_ERROR(to_tensor("weights", &a->weights, &out->weights));
  EMBSCALE_RETURN_IF_ERROR(to_tensor("indices", &a->indices, &out->indices));
  EMBSCALE_RETURN_IF_ERROR(to_tensor("offsets", &a->offsets, &out->offsets));
  EMBSCALE_RETURN_IF_ERROR(to_enum("pooling", a->pooling, &out->pooling));
  EMBSCALE_RETURN_IF_ERROR(to_enum("bounds_check", a->bounds_check, &out->bounds_check));
  EMBSCALE_RETURN_IF_ERROR(to_optional_tensor("per_sample_weights", &a->per_sample_weights, &out->per_sample_weights));
  out->batch_size = a->batch_size;
  out->num_skipped = a->num_skipped;
  return Status::Ok();
}

Status to_forward_args(const embscale_tbe_forward_args* a, embscale::TbeForwardArgs* out) {
  EMBSCALE_RETURN_IF_ERROR(to_lookup_fields(a, out));
  return to_tensor("output", &a->output, &out->output);
}

Status to_optimizer(const embscale_optimizer* a, embscale::OptimizerParams* o) {
  EMBSCALE_RETURN_IF_ERROR(to_enum("optimizer.type", a->type, &o->type));
  EMBSCALE_RETURN_IF_ERROR(to_enum("optimizer.weight_decay_mode", a->weight_decay_mode, &o->weight_decay_mode));
  o->learning_rate = a->learning_rate;
  o->eps = a->eps;
  o->beta1 = a->beta1;
  o->beta2 = a->beta2;
  o->weight_decay = a->weight_decay;
  o->max_norm = a->max_norm;
  o->gradient_clipping = a->gradient_clipping;
  o->step = a->step;
  o->eta = a->eta;
  o->momentum = a->momentum;
  return Status::Ok();
}

Status to_backward_args(const embscale_tbe_backward_args* a, embscale::TbeBackwardArgs* out) {
  EMBSCALE_RETURN_IF_ERROR(to_lookup_fields(a, out));
  EMBSCALE_RETURN_IF_ERROR(to_tensor("grad_output", &a->grad_output, &out->grad_output));
  EMBSCALE_RETURN_IF_ERROR(to_optimizer(&a->optimizer, &out->optimizer));
  EMBSCALE_RETURN_IF_ERROR(to_enum("rounding", a->rounding, &out->rounding));
  EMBSCALE_RETURN_IF_ERROR(to_optional_tensor("momentum1", &a->momentum1, &out->momentum1));
  EMBSCALE_RETURN_IF_ERROR(to_optional_tensor("momentum2", &a->momentum2, &out->momentum2));
  EMBSCALE_RETURN_IF_ERROR(
      to_optional_tensor("grad_per_sample_weights", &a->grad_per_sample_weights, &out->grad_per_sample_weights));
  EMBSCALE_RETURN_IF_ERROR(to_optional_tensor("unique_rows", &a->unique_rows, &out->unique_rows));
  out->num_unique = a->num_unique;
  EMBSCALE_RETURN_IF_ERROR(to_optional_tensor("unique_grads", &a->unique_grads, &out->unique_grads));
  EMBSCALE_RETURN_IF_ERROR(to_optional_tensor("rounding_bases", &a->rounding_bases, &out->rounding_bases));
  out->seed = a->seed;
  out->tuning.max_warp_segment = a->max_warp_segment;
  out->tuning.max_block_segment = a->max_block_segment;
  out->tuning.block_threads = a->block_threads;
  return Status::Ok();
}

// A C feature_table_map (NULL: one feature per table, num_features == num_tables) as the config's vector.
Status to_feature_table_map(int32_t num_tables, int32_t num_features, const int32_t* feature_table_map,
                            std::vector<int>* out) {
  if (feature_table_map == nullptr) {
    if (num_features != num_tables)
      return embscale::invalid_argument("num_features: must equal num_tables when feature_table_map is null");
    return Status::Ok();
  }
  if (num_features < 1)
    return embscale::invalid_argument("num_features: " + std::to_string(num_features) +
                                      " with a feature_table_map; at least one feature is required (a NULL map "
                                      "gives one feature per table)");
  out->assign(feature_table_map, feature_table_map + num_features);
  return Status::Ok();
}

Status tbe_handle(const embscale_tbe* tbe) {
  if (tbe == nullptr || !tbe->impl) return embscale::invalid_argument("tbe: must not be null");
  return Status::Ok();
}

}  // namespace

extern "C" {

const char* embscale_version(void) { return "0.1.0"; }

const char* embscale_last_error(void) { return g_last_error.c_str(); }

int embscale_backend_available(int32_t backend) {
  embscale::Backend b;
  return to_enum("backend", backend, &b).ok() && embscale::backend_available(b);
}

int embscale_backend_compiled(int32_t backend) {
  embscale::Backend b;
  return to_enum("backend", backend, &b).ok() && embscale::backend_compiled(b);
}

int32_t embscale_num_optimizers(void) { return embscale::num_optimizers(); }

int embscale_optimizer_info_get(int32_t optimizer, embscale_optimizer_info* out) {
  return guarded([&]() -> Status {
    embscale::OptimizerType type;
    EMBSCALE_RETURN_IF_ERROR(to_enum("optimizer", optimizer, &type));
    if (out == nullptr) return embscale::invalid_argument("out: must not be null");
    embscale::OptimizerInfo info;
    EMBSCALE_RETURN_IF_ERROR(embscale::optimizer_info(type, &info));
    out->name = info.name;
    out->state_layouts[0] = static_cast<int32_t>(info.momentum1.layout);
    out->state_layouts[1] = static_cast<int32_t>(info.momentum2.layout);
    out->state_names[0] = info.momentum1.name;
    out->state_names[1] = info.momentum2.name;
    return Status::Ok();
  });
}

int embscale_optimizer_weight_decay_get(int32_t optimizer, int32_t* out) {
  return guarded([&]() -> Status {
    embscale::OptimizerType type;
    EMBSCALE_RETURN_IF_ERROR(to_enum("optimizer", optimizer, &type));
    if (out == nullptr) return embscale::invalid_argument("out: must not be null");
    embscale::OptimizerInfo info;
    EMBSCALE_RETURN_IF_ERROR(embscale::optimizer_info(type, &info));
    *out = static_cast<int32_t>(info.weight_decay);
    return Status::Ok();
  });
}

int embscale_optimizer_check(const embscale_optimizer* optimizer) {
  return guarded([&]() -> Status {
    if (optimizer == nullptr) return embscale::invalid_argument("optimizer: must not be null");
    embscale::OptimizerParams o;
    EMBSCALE_RETURN_IF_ERROR(to_optimizer(optimizer, &o));
    return embscale::check_optimizer_params(o);
  });
}

int embscale_amax_workspace_size(const embscale_context* ctx, const embscale_tensor* x, int32_t algo,
                                 size_t* bytes) {
  return guarded([&]() -> Status {
    AmaxCall a;
    EMBSCALE_RETURN_IF_ERROR(to_amax_call(ctx, x, algo, &a));
    return embscale::amax_workspace_size(a.ctx, a.x, a.opts, bytes);
  });
}

int embscale_amax(const embscale_context* ctx, const embscale_tensor* x, float* amax, int32_t algo,
                  int32_t* nonfinite_flag, void* workspace, size_t workspace_bytes) {
  return embscale_amax_noop(ctx, x, amax, algo, nonfinite_flag, workspace, workspace_bytes, nullptr);
}

int embscale_amax_noop(const embscale_context* ctx, const embscale_tensor* x, float* amax, int32_t algo,
                       int32_t* nonfinite_flag, void* workspace, size_t workspace_bytes, const float* noop_flag) {
  return guarded([&]() -> Status {
    AmaxCall a;
    EMBSCALE_RETURN_IF_ERROR(to_amax_call(ctx, x, algo, &a));
    a.opts.nonfinite_flag = nonfinite_flag;
    a.opts.noop_flag = noop_flag;
    return embscale::amax(a.ctx, a.x, amax, a.opts, workspace, workspace_bytes);
  });
}

int embscale_compute_scale(const embscale_context* ctx, const float* amax, int32_t fp8_dtype, float eps,
                           int32_t power_of_2, float* scale, float* scale_inv) {
  return embscale_compute_scale_noop(ctx, amax, fp8_dtype, eps, power_of_2, scale, scale_inv, nullptr);
}

int embscale_compute_scale_noop(const embscale_context* ctx, const float* amax, int32_t fp8_dtype, float eps,
                                int32_t power_of_2, float* scale, float* scale_inv, const float* noop_flag) {
  return guarded([&]() -> Status {
    embscale::Context c;
    EMBSCALE_RETURN_IF_ERROR(to_context(ctx, &c));
    embscale::DType fp8;
    EMBSCALE_RETURN_IF_ERROR(to_enum("fp8_dtype", fp8_dtype, &fp8));
    embscale::ScaleOptions opts;
    opts.eps = eps;
    opts.power_of_2 = power_of_2 != 0;
    return embscale::compute_scale(c, amax, fp8, opts, scale, scale_inv, noop_flag);
  });
}

int embscale_quantize(const embscale_context* ctx, const embscale_tensor* x, const float* scale,
                      const embscale_tensor* y) {
  return embscale_quantize_noop(ctx, x, scale, y, nullptr);
}

int embscale_quantize_noop(const embscale_context* ctx, const embscale_tensor* x, const float* scale,
                           const embscale_tensor* y, const float* noop_flag) {
  return guarded([&]() -> Status {
    embscale::Context c;
    embscale::TensorView xv, yv;
    EMBSCALE_RETURN_IF_ERROR(to_context(ctx, &c));
    EMBSCALE_RETURN_IF_ERROR(to_tensor("x", x, &xv));
    EMBSCALE_RETURN_IF_ERROR(to_tensor("y", y, &yv));
    return embscale::quantize(c, xv, scale, yv, noop_flag);
  });
}

int embscale_dequantize(const embscale_context* ctx, const embscale_tensor* y, const float* scale_inv,
                        const embscale_tensor* x) {
  return embscale_dequantize_noop(ctx, y, scale_inv, x, nullptr);
}

int embscale_dequantize_noop(const embscale_context* ctx, const embscale_tensor* y, const float* scale_inv,
                             const embscale_tensor* x, const float* noop_flag) {
  return guarded([&]() -> Status {
    embscale::Context c;
    embscale::TensorView xv, yv;
    EMBSCALE_RETURN_IF_ERROR(to_context(ctx, &c));
    EMBSCALE_RETURN_IF_ERROR(to_tensor("y", y, &yv));
    EMBSCALE_RETURN_IF_ERROR(to_tensor("x", x, &xv));
    return embscale::dequantize(c, yv, scale_inv, xv, noop_flag);
  });
}

int embscale_quantize_current_scaling_workspace_size(const embscale_context* ctx, const embscale_tensor* x,
                                                     int32_t algo, size_t* bytes) {
  return guarded([&]() -> Status {
    AmaxCall a;
    EMBSCALE_RETURN_IF_ERROR(to_amax_call(ctx, x, algo, &a));
    embscale::CurrentScalingOptions opts;
    opts.amax = a.opts;
    return embscale::quantize_current_scaling_workspace_size(a.ctx, a.x, opts, bytes);
  });
}

int embscale_quantize_current_scaling(const embscale_context* ctx, const embscale_tensor* x,
                                      const embscale_tensor* y, float* amax, float* scale, float* scale_inv,
                                      int32_t algo, float eps, int32_t power_of_2, int32_t* nonfinite_flag,
                                      void* workspace, size_t workspace_bytes) {
  return embscale_quantize_current_scaling_noop(ctx, x, y, amax, scale, scale_inv, algo, eps, power_of_2,
                                                nonfinite_flag, workspace, workspace_bytes, nullptr);
}

int embscale_quantize_current_scaling_noop(const embscale_context* ctx, const embscale_tensor* x,
                                           const embscale_tensor* y, float* amax, float* scale, float* scale_inv,
                                           int32_t algo, float eps, int32_t power_of_2, int32_t* nonfinite_flag,
                                           void* workspace, size_t workspace_bytes, const float* noop_flag) {
  return guarded([&]() -> Status {
    AmaxCall a;
    embscale::TensorView yv;
    EMBSCALE_RETURN_IF_ERROR(to_amax_call(ctx, x, algo, &a));
    EMBSCALE_RETURN_IF_ERROR(to_tensor("y", y, &yv));
    embscale::CurrentScalingOptions opts;
    opts.amax = a.opts;
    opts.amax.nonfinite_flag = nonfinite_flag;
    opts.amax.noop_flag = noop_flag;
    opts.scale.eps = eps;
    opts.scale.power_of_2 = power_of_2 != 0;
    return embscale::quantize_current_scaling(a.ctx, a.x, yv, amax, scale, scale_inv, opts, workspace,
                                              workspace_bytes);
  });
}

int embscale_activation_amax_workspace_size(const embscale_context* ctx, const embscale_tensor* x, int32_t algo,
                                            size_t* bytes) {
  return guarded([&]() -> Status {
    AmaxCall a;
    EMBSCALE_RETURN_IF_ERROR(to_amax_call(ctx, x, algo, &a));
    return embscale::activation_amax_workspace_size(a.ctx, a.x, a.opts, bytes);
  });
}

int embscale_activation_amax(const embscale_context* ctx, int32_t activation, const embscale_tensor* x,
                             const embscale_tensor* y, float* amax, int32_t algo, void* workspace,
                             size_t workspace_bytes) {
  return embscale_activation_amax_noop(ctx, activation, x, y, amax, algo, workspace, workspace_bytes, nullptr);
}

int embscale_activation_amax_noop(const embscale_context* ctx, int32_t activation, const embscale_tensor* x,
                                  const embscale_tensor* y, float* amax, int32_t algo, void* workspace,
                                  size_t workspace_bytes, const float* noop_flag) {
  return guarded([&]() -> Status {
    AmaxCall a;
    embscale::TensorView yv;
    EMBSCALE_RETURN_IF_ERROR(to_amax_call(ctx, x, algo, &a));
    embscale::Activation act;
    EMBSCALE_RETURN_IF_ERROR(to_enum("activation", activation, &act));
    EMBSCALE_RETURN_IF_ERROR(to_tensor("y", y, &yv));
    a.opts.noop_flag = noop_flag;
    return embscale::activation_amax(a.ctx, act, a.x, yv, amax, a.opts, workspace, workspace_bytes);
  });
}

int embscale_cast_transpose(const embscale_context* ctx, const embscale_tensor* x, const float* scale,
                            const embscale_tensor* y, const embscale_tensor* yt) {
  return embscale_cast_transpose_noop(ctx, x, scale, y, yt, nullptr);
}

int embscale_cast_transpose_noop(const embscale_context* ctx, const embscale_tensor* x, const float* scale,
                                 const embscale_tensor* y, const embscale_tensor* yt, const float* noop_flag) {
  return guarded([&]() -> Status {
    embscale::Context c;
    embscale::TensorView xv, yv, ytv;
    EMBSCALE_RETURN_IF_ERROR(to_context(ctx, &c));
    EMBSCALE_RETURN_IF_ERROR(to_tensor("x", x, &xv));
    EMBSCALE_RETURN_IF_ERROR(to_tensor("y", y, &yv));
    EMBSCALE_RETURN_IF_ERROR(to_tensor("yt", yt, &ytv));
    return embscale::cast_transpose(c, xv, scale, yv, ytv, noop_flag);
  });
}

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

int embscale_quantize_rows(int32_t type, const embscale_tensor* rows, int32_t row_alignment, void* out,
                           int64_t out_bytes) {
  return guarded([&]() -> Status {
    embscale::QuantWeightType t;
    embscale::TensorView r;
    EMBSCALE_RETURN_IF_ERROR(to_enum("type", type, &t));
    EMBSCALE_RETURN_IF_ERROR(to_tensor("rows", rows, &r));
    return embscale::quantize_rows(t, r, row_alignment, out, out_bytes);
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
