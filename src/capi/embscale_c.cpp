// The C API (embscale/embscale_c.h): converts flat C structs into the C++ API's types, checks the
// enumeration values a C caller can get wrong (against the C++ enums' counts, the one source of their
// ranges), and keeps the last error message per thread. Nothing else happens in src/capi; validation of
// shapes, dtypes and values is the C++ API's. This file: the conversions (capi_internal.h) and the
// library-wide entry points (version, errors, backends, the optimizers' table); the FP8, TBE and row cache
// entry points are in capi_fp8.cpp, capi_tbe.cpp and capi_row_cache.cpp.
#include <string>

#include "capi/capi_internal.h"

namespace embscale {
namespace capi {
namespace {

thread_local std::string g_last_error;

}  // namespace

int finish(const Status& st) {
  g_last_error = st.ok() ? std::string() : st.message();
  return static_cast<int>(st.code());
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

Status to_amax_call(const embscale_context* ctx, const embscale_tensor* x, int32_t algo, AmaxCall* out) {
  EMBSCALE_RETURN_IF_ERROR(to_context(ctx, &out->ctx));
  EMBSCALE_RETURN_IF_ERROR(to_tensor("x", x, &out->x));
  return to_enum("algo", algo, &out->opts.algo);
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

}  // namespace capi
}  // namespace embscale

using namespace embscale::capi;  // NOLINT: the entry points below are written in its helpers' names
using embscale::Status;

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

}  // extern "C"
