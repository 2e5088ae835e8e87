// Host-side argument checks shared by the TBE forward (tbe/tbe.cpp) and backward (tbe/tbe_backward.cpp):
// the backend, the pooling and bounds-check modes, the batch size, the weights buffer, and the
// indices/offsets pair (dtype, 1-D, T*B+1 offsets, int32 addressability), the per-sample weights' dtype and length, and weighted MEAN refused.
// Messages name the argument and the problem.
#pragma once

#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "core/check.h"
#include "embscale/tbe.h"

namespace embscale {
namespace tbe_validate {

using check::shape_str;

// ndim in range, no negative extent, element and byte counts representable (so numel() is
// meaningful), data present unless empty and aligned to the element size.
inline Status check_view(const char* name, const TensorView& t) {
  EMBSCALE_RETURN_IF_ERROR(check::shape(name, t, 1));
  return check::data(name, t);
}

// An optional fp32 vector of exactly n elements (absent: data null).
inline Status check_optional_f32(const char* name, const TensorView& t, int64_t n, const char* what) {
  if (t.data == nullptr) return Status::Ok();
  EMBSCALE_RETURN_IF_ERROR(check_view(name, t));
  if (t.dtype != DType::kF32)
    return invalid_argument(std::string(name) + ": dtype " + dtype_name(t.dtype) + " is not supported; expected fp32");
  if (t.numel() != n)
    return invalid_argument(std::string(name) + ": " + std::to_string(t.numel()) + " elements; expected " + what +
                            " = " + std::to_string(n));
  return Status::Ok();
}

// The lookup arguments common to forward and backward.
struct LookupArgs {
  const TensorView* weights;
  const TensorView* indices;
  const TensorView* offsets;
  const TensorView* per_sample_weights;
  int64_t batch_size;
  PoolingMode pooling;
  BoundsCheckMode bounds_check;
};

// The pooling and bounds-check modes and the batch size, for T features.
inline Status check_modes_and_batch(int64_t T, const LookupArgs& a) {
  if (a.pooling != PoolingMode::kSum && a.pooling != PoolingMode::kMean && a.pooling != PoolingMode::kNone)
    return invalid_argument("pooling: unknown pooling mode " + std::to_string(static_cast<int>(a.pooling)));
  if (a.bounds_check != BoundsCheckMode::kError && a.bounds_check != BoundsCheckMode::kSkip &&
      a.bounds_check != BoundsCheckMode::kOff && a.bounds_check != BoundsCheckMode::kWarn)
    return invalid_argument("bounds_check: unknown mode " + std::to_string(static_cast<int>(a.bounds_check)));
  const int64_t B = a.batch_size;
  if (B < 0) return invalid_argument("batch_size: " + std::to_string(B) + " is negative");
  if (B > (INT64_MAX - 1) / (T > 0 ? T : 1))
    return invalid_argument("batch_size: " + std::to_string(B) + " times " + std::to_string(T) + " features overflows");
  return Status::Ok();
}

// The indices and offsets pair for T features (after check_modes_and_batch), and the per-sample weights.
inline Status check_indices_offsets(int64_t T, const LookupArgs& a) {
  const int64_t B = a.batch_size;
  EMBSCALE_RETURN_IF_ERROR(check_view("indices", *a.indices));
  EMBSCALE_RETURN_IF_ERROR(check_view("offsets", *a.offsets));
  if (!is_index_dtype(a.indices->dtype))
    return invalid_argument(std::string("indices: dtype ") + dtype_name(a.indices->dtype) +
                            " is not supported; expected int32 or int64");
  if (a.offsets->dtype != a.indices->dtype)
    return invalid_argument(std::string("offsets: dtype ") + dtype_name(a.offsets->dtype) +
                            " differs from the indices' dtype " + dtype_name(a.indices->dtype));
  if (a.indices->ndim != 1) return invalid_argument("indices: shape " + shape_str(*a.indices) + " is not 1-D");
  if (a.offsets->ndim != 1) return invalid_argument("offsets: shape " + shape_str(*a.offsets) + " is not 1-D");
  const int64_t N = a.indices->numel();
  if (a.offsets->numel() != T * B + 1)
    return invalid_argument("offsets: " + std::to_string(a.offsets->numel()) + " entries; expected T*B+1 = " +
                            std::to_string(T * B + 1) + " (T = " + std::to_string(T) + " features, B = " +
                            std::to_string(B) + ")");
  if (a.indices->dtype == DType::kI32 && N > INT32_MAX)
    return invalid_argument("indices: " + std::to_string(N) + " entries cannot be addressed by int32 offsets; use int64");

  // Weighted MEAN is refused, as FBGEMM does: whether it should divide by the bag's length or by the
  // sum of its weights is ambiguous, and a caller can pre-scale the per-sample weights instead.
  EMBSCALE_RETURN_IF_ERROR(check_optional_f32("per_sample_weights", *a.per_sample_weights, N, "N (the number of indices)"));
  if (a.per_sample_weights->data != nullptr && a.pooling == PoolingMode::kMean)
    return invalid_argument("per_sample_weights: not supported with mean pooling; use sum with weights scaled by 1/L");
  return Status::Ok();
}

inline Status check_lookup_args(const TableBatchedEmbedding& tbe, const Context& ctx, const LookupArgs& a) {
  if (ctx.backend != tbe.backend())
    return invalid_argument(std::string("ctx: backend ") + backend_name(ctx.backend) +
                            " differs from the backend this TableBatchedEmbedding was created on (" +
                            backend_name(tbe.backend()) + ")");
  EMBSCALE_RETURN_IF_ERROR(check::context(ctx));
  const int64_t T = tbe.num_features();
  EMBSCALE_RETURN_IF_ERROR(check_modes_and_batch(T, a));

  // weights
  EMBSCALE_RETURN_IF_ERROR(check_view("weights", *a.weights));
  if (a.weights->dtype != tbe.config().weights_dtype)
    return invalid_argument(std::string("weights: dtype ") + dtype_name(a.weights->dtype) +
                            " differs from the configured weights dtype " + dtype_name(tbe.config().weights_dtype));
  if (a.weights->numel() != tbe.num_weights())
    return invalid_argument("weights: " + std::to_string(a.weights->numel()) +
                            " elements; expected num_weights() = " + std::to_string(tbe.num_weights()));
  return check_indices_offsets(T, a);
}

// The features of a table-batched op (TbeConfig and QuantTbeConfig alike): cfg.feature_table_map checked
// against num_tables (empty: one feature per table), each feature's first output column ([T + 1], the
// last the total) and the widest D; dim_of(t) is table t's D. invalid_argument naming the bad entry.
template <class DimOf>
inline Status resolve_features(const std::vector<int>& map, int num_tables, DimOf dim_of,
                               std::vector<int>* feature_table, std::vector<int>* output_offsets, int* max_dim) {
  if (map.empty()) {
    feature_table->resize(num_tables);
    for (int t = 0; t < num_tables; ++t) (*feature_table)[t] = t;
  } else {
    *feature_table = map;
    for (size_t f = 0; f < map.size(); ++f) {
      const int t = map[f];
      if (t < 0 || t >= num_tables)
        return invalid_argument("cfg.feature_table_map[" + std::to_string(f) + "]: table " + std::to_string(t) +
                                " does not exist (there are " + std::to_string(num_tables) + " tables)");
    }
  }
  const int T = static_cast<int>(feature_table->size());
  output_offsets->assign(T + 1, 0);
  *max_dim = 0;
  int64_t col = 0;
  for (int f = 0; f < T; ++f) {
    const int d = dim_of((*feature_table)[f]);
    col += d;
    if (col > INT32_MAX)
      return invalid_argument("cfg: the features' dimensions add up to more than 2^31-1 output columns");
    (*output_offsets)[f + 1] = static_cast<int>(col);
    if (d > *max_dim) *max_dim = d;
  }
  return Status::Ok();
}

// Sequence mode (kNone) needs all features of one dimension; returns that D (0 without features).
template <class Tbe>
inline Status check_sequence_dims(const Tbe& tbe, int64_t* D) {
  const int T = tbe.num_features();
  for (int f = 1; f < T; ++f) {
    if (tbe.feature_dim(f) != tbe.feature_dim(0))
      return invalid_argument("pooling: sequence mode (none) needs all features of one dimension; feature 0 has " +
                              std::to_string(tbe.feature_dim(0)) + ", feature " + std::to_string(f) + " has " +
                              std::to_string(tbe.feature_dim(f)));
  }
  *D = T > 0 ? tbe.feature_dim(0) : 0;
  return Status::Ok();
}

// The lookup's output (or its gradient), `name`d in messages: fp32, fp16 or bf16; pooled [B, total_dim()],
// sequence (kNone) [N, D] with all features of one D.
template <class Tbe>
inline Status check_output(const char* name, const TensorView& t, const Tbe& tbe, PoolingMode pooling, int64_t B,
                           int64_t N) {
  EMBSCALE_RETURN_IF_ERROR(check_view(name, t));
  if (!is_float_dtype(t.dtype))
    return invalid_argument(std::string(name) + ": dtype " + dtype_name(t.dtype) +
                            " is not supported; expected fp32, fp16 or bf16");
  if (pooling == PoolingMode::kNone) {
    int64_t D = 0;
    EMBSCALE_RETURN_IF_ERROR(check_sequence_dims(tbe, &D));
    if (t.ndim != 2 || t.shape[0] != N || t.shape[1] != D)
      return invalid_argument(std::string(name) + ": shape " + shape_str(t) + "; sequence mode expects [N, D] = [" +
                              std::to_string(N) + ", " + std::to_string(D) + "]");
  } else if (t.ndim != 2 || t.shape[0] != B || t.shape[1] != tbe.total_dim()) {
    return invalid_argument(std::string(name) + ": shape " + shape_str(t) + "; expected [B, total_dim()] = [" +
                            std::to_string(B) + ", " + std::to_string(tbe.total_dim()) + "]");
  }
  return Status::Ok();
}

}  // namespace tbe_validate
}  // namespace embscale
