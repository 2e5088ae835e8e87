// The C API's shared parts (src/capi): the handles' structs, the last-error keeping, and the conversions
// of the C structs and enumeration values into the C++ API's types, which the entry points of
// embscale_c.cpp (library-wide), capi_fp8.cpp, capi_tbe.cpp and capi_row_cache.cpp use. The enumeration
// ranges come from the C++ enums' counts, their one source.
#pragma once

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
#include "embscale/status.h"

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

namespace embscale {
namespace capi {

// The status as the C API's return code; keeps its message as this thread's last error.
int finish(const Status& st);

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
inline int32_t enum_count<embscale::Backend>() { return embscale::kNumBackends; }
template <>
inline int32_t enum_count<embscale::DType>() { return embscale::kNumDTypes; }
template <>
inline int32_t enum_count<embscale::AmaxAlgo>() { return embscale::kNumAmaxAlgos; }
template <>
inline int32_t enum_count<embscale::Activation>() { return embscale::kNumActivations; }
template <>
inline int32_t enum_count<embscale::PoolingMode>() { return embscale::kNumPoolingModes; }
template <>
inline int32_t enum_count<embscale::BoundsCheckMode>() { return embscale::kNumBoundsCheckModes; }
template <>
inline int32_t enum_count<embscale::OptimizerType>() { return embscale::num_optimizers(); }
template <>
inline int32_t enum_count<embscale::WeightDecayMode>() { return embscale::kNumWeightDecayModes; }
template <>
inline int32_t enum_count<embscale::WeightRounding>() { return embscale::kNumWeightRoundings; }
template <>
inline int32_t enum_count<embscale::TablePlacement>() { return embscale::kNumTablePlacements; }
template <>
inline int32_t enum_count<embscale::CacheAlgorithm>() { return embscale::kNumCacheAlgorithms; }
template <>
inline int32_t enum_count<embscale::QuantWeightType>() { return embscale::kNumQuantWeightTypes; }

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

// The C structs as the C++ API's types; invalid_argument naming the argument where one is wrong.
Status to_context(const embscale_context* c, embscale::Context* out);
Status to_tensor(const char* name, const embscale_tensor* t, embscale::TensorView* out);
// An optional tensor: absent (a default TensorView) when its data is NULL, else checked as to_tensor.
Status to_optional_tensor(const char* name, const embscale_tensor* t, embscale::TensorView* out);
// The arguments every amax-based FP8 call starts with: context, input x and the amax algorithm.
struct AmaxCall {
  embscale::Context ctx;
  embscale::TensorView x;
  embscale::AmaxOptions opts;
};
Status to_amax_call(const embscale_context* ctx, const embscale_tensor* x, int32_t algo, AmaxCall* out);

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

Status to_forward_args(const embscale_tbe_forward_args* a, embscale::TbeForwardArgs* out);
Status to_optimizer(const embscale_optimizer* a, embscale::OptimizerParams* o);
Status to_backward_args(const embscale_tbe_backward_args* a, embscale::TbeBackwardArgs* out);
// A C feature_table_map (NULL: one feature per table, num_features == num_tables) as the config's vector.
Status to_feature_table_map(int32_t num_tables, int32_t num_features, const int32_t* feature_table_map,
                            std::vector<int>* out);
// tbe_handle: invalid_argument naming `tbe` for a null handle.
Status tbe_handle(const embscale_tbe* tbe);

}  // namespace capi
}  // namespace embscale
