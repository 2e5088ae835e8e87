// CPU forward of the quantized TBE (embscale/tbe_quant.h): pooled (SUM, MEAN) and sequence lookups over
// tables of mixed weight types, on OpenMP.
//
// Work is split over (feature, bag) items; one thread reduces a bag in the order of its indices in fp32
// (acc[d] += w * value, value decoded by tbe/quant_rows.h) and converts once to the output dtype, so
// results do not depend on the thread count or the schedule. Compile-time code is small on purpose: the
// index dtype is a template (2 copies), the weight type is a switch per looked-up row into one decoder per
// type (8), and the output dtype a switch per output row; nothing is instantiated per combination.
// Built with -ffp-contract=off (as the training forward), so q * scale + bias stays two roundings on every
// compiler and flag set.
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/dispatch.h"
#include "core/numerics.h"
#include "tbe/bounds_report.h"
#include "tbe/cpu/prefetch.h"
#include "tbe/cpu/tbe_checks.h"
#include "tbe/cpu/thread_policy.h"
#include "tbe/quant_rows.h"
#include "tbe/tbe_quant_backend.h"

namespace embscale {
namespace cpu {
namespace {

using tbe_checks::BadIndex;

// Rows this many lookups ahead are prefetched at the start of each bag (as the training forward).
constexpr int64_t kPrefetchDistance = 32;

inline bool in_table(int64_t r, int64_t E) { return static_cast<uint64_t>(r) < static_cast<uint64_t>(E); }

// One feature's table, resolved once per call.
struct FeatureTable {
  const uint8_t* base;
  int64_t rows;
  int64_t row_bytes;
  int64_t dim;
  int64_t out_col;
  QuantWeightType type;
};

// acc[0, D) += w * row (w = 1 for unweighted lookups: the product is then exact).
inline void accumulate(const FeatureTable& ft, const uint8_t* row, float w, float* __restrict acc) {
  tbe_quant::visit_row(ft.type, row, ft.dim, [&](int64_t c, float v) { acc[c] += w * v; });
}

// D values (divided by `div` when it is not 1) stored in the output dtype at element `at`.
inline void store_row(DType dt, void* out, int64_t at, const float* __restrict v, int64_t D, float div) {
  switch (dt) {
    case DType::kF16: {
      auto* o = static_cast<uint16_t*>(out) + at;
      for (int64_t d = 0; d < D; ++d) o[d] = float_to_fp16(div == 1.0f ? v[d] : v[d] / div);
      return;
    }
    case DType::kBF16: {
      auto* o = static_cast<uint16_t*>(out) + at;
      for (int64_t d = 0; d < D; ++d) o[d] = float_to_bf16(div == 1.0f ? v[d] : v[d] / div);
      return;
    }
    default: {  // fp32 (validated)
      float* o = static_cast<float*>(out) + at;
      if (div == 1.0f) {
        std::memcpy(o, v, static_cast<size_t>(D) * sizeof(float));
      } else {
        // Division (not a reciprocal multiply): each mean is the correctly rounded fp32 quotient.
        for (int64_t d = 0; d < D; ++d) o[d] = v[d] / div;
      }
      return;
    }
  }
}

template <typename I>
Status forward_impl(const Context& ctx, const QuantizedTableBatchedEmbedding& tbe, const QuantTbeForwardArgs& a) {
  const auto* weights = static_cast<const uint8_t*>(a.weights);
  const I* __restrict indices = static_cast<const I*>(a.indices.data);
  const I* __restrict offsets = static_cast<const I*>(a.offsets.data);
  const float* __restrict psw = static_cast<const float*>(a.per_sample_weights.data);
  const int64_t T = tbe.num_features(), B = a.batch_size, N = a.indices.numel();
  const BoundsCheckMode check = tbe_bounds::skips_bad_indices(a.bounds_check) ? BoundsCheckMode::kSkip : a.bounds_check;
  const bool mean = a.pooling == PoolingMode::kMean;
  const bool sequence = a.pooling == PoolingMode::kNone;
  const DType out_dt = a.output.dtype;
  const int64_t out_stride = sequence ? (T > 0 ? tbe.feature_dim(0) : 0) : tbe.total_dim();
  const auto table_of = [&](int f) { return tbe.feature_table(f); };
  const auto rows_of = [&](int t) { return tbe.config().tables[t].num_rows; };

  tbe_bounds::BoundsViolation violation;
  if (!tbe_checks::offsets_valid(offsets, T * B, N, &violation))
    return tbe_bounds::violation_error(B, N, violation, table_of, rows_of);

  std::vector<FeatureTable> features(static_cast<size_t>(T));
  int64_t row_bytes_sum = 0;
  for (int f = 0; f < T; ++f) {
    const int t = tbe.feature_table(f);
    features[f] = FeatureTable{weights + tbe.table_offset(t), tbe.config().tables[t].num_rows, tbe.row_bytes(t),
                               tbe.feature_dim(f), tbe.output_offset(f), tbe.config().tables[t].type};
    row_bytes_sum += tbe.row_bytes(t);
  }

  std::vector<float> zeros(static_cast<size_t>(std::max(tbe.max_dim(), 1)), 0.0f);
  // Sequence mode: rows before offsets[0] belong to no bag and are written as zeros.
  if (sequence && N > 0) {
    const int64_t first = std::min<int64_t>(static_cast<int64_t>(offsets[0]), N);
    for (int64_t r = 0; r < first; ++r) store_row(out_dt, a.output.data, r * out_stride, zeros.data(), out_stride, 1.0f);
  }

  const int64_t items = T * B;
  const int threads = threads_for_call(ctx, T > 0 ? N * (row_bytes_sum / T) : 0);
  BadIndex bad;
  int64_t skipped_total = 0;

#pragma omp parallel num_threads(threads) reduction(+ : skipped_total)
  {
    std::vector<float> acc_storage(static_cast<size_t>(std::max(tbe.max_dim(), 1)));
    float* __restrict acc = acc_storage.data();
    BadIndex my_bad;
    int64_t my_skipped = 0;
    // A bad index: counted (kSkip), recorded (kError, the first in (bag, position) order) or ignored (kOff).
    const auto note_bad = [&](int64_t item, int64_t pos, int64_t idx) {
      if (check == BoundsCheckMode::kSkip) {
        ++my_skipped;
      } else if (check == BoundsCheckMode::kError && item < my_bad.item) {
        my_bad = BadIndex{item, pos, idx};
      }
    };

#pragma omp for schedule(dynamic, 16)
    for (int64_t item = 0; item < items; ++item) {
      const int f = static_cast<int>(item / B);
      const int64_t b = item % B;
      const FeatureTable& ft = features[f];
      const int64_t D = ft.dim;
      const int64_t start = static_cast<int64_t>(offsets[item]);
      const int64_t end = static_cast<int64_t>(offsets[item + 1]);

      if (sequence) {
        for (int64_t pos = start; pos < end; ++pos) {
          const int64_t idx = static_cast<int64_t>(indices[pos]);
          if (!in_table(idx, ft.rows)) {  // dropped in every mode: never read out of bounds
            note_bad(item, pos, idx);
            store_row(out_dt, a.output.data, pos * out_stride, zeros.data(), D, 1.0f);
            continue;
          }
          std::fill(acc, acc + D, 0.0f);
          accumulate(ft, ft.base + idx * ft.row_bytes, psw ? psw[pos] : 1.0f, acc);
          store_row(out_dt, a.output.data, pos * out_stride, acc, D, 1.0f);
        }
        continue;
      }

      // The rows of the lookups kPrefetchDistance ahead, within the feature.
      const int64_t prefetch_end = static_cast<int64_t>(offsets[(f + 1) * B]);
      for (int64_t pos = start + kPrefetchDistance; pos < std::min(end + kPrefetchDistance, prefetch_end); ++pos) {
        const int64_t r = static_cast<int64_t>(indices[pos]);
        if (in_table(r, ft.rows)) prefetch_row(ft.base + r * ft.row_bytes, ft.row_bytes);
      }
      std::fill(acc, acc + D, 0.0f);
      int64_t count = 0;
      for (int64_t pos = start; pos < end; ++pos) {
        const int64_t idx = static_cast<int64_t>(indices[pos]);
        if (!in_table(idx, ft.rows)) {
          note_bad(item, pos, idx);
          continue;
        }
        ++count;
        accumulate(ft, ft.base + idx * ft.row_bytes, psw ? psw[pos] : 1.0f, acc);
      }
      const float div = mean && count > 0 ? static_cast<float>(count) : 1.0f;
      store_row(out_dt, a.output.data, b * out_stride + ft.out_col, acc, D, div);
    }

    skipped_total += my_skipped;
    if (my_bad.item != INT64_MAX) {
#pragma omp critical(embscale_tbe_quant_forward_bad_index)
      {
        tbe_checks::keep_first(my_bad, &bad);
      }
    }
  }

  if (bad.item != INT64_MAX) {
    violation = tbe_bounds::BoundsViolation{};
    violation.kind = tbe_bounds::ViolationKind::kBadIndex;
    violation.position = bad.pos;
    violation.value = bad.value;
    violation.item = bad.item;
    violation.bag_start = static_cast<int64_t>(offsets[bad.item]);
    return tbe_bounds::violation_error(B, N, violation, table_of, rows_of);
  }
  if (check == BoundsCheckMode::kSkip && a.num_skipped != nullptr) *a.num_skipped = skipped_total;
  return Status::Ok();
}

}  // namespace

Status tbe_quant_forward(const Context& ctx, const QuantizedTableBatchedEmbedding& tbe,
                         const QuantTbeForwardArgs& args) {
  return dispatch_index(args.indices.dtype, "indices", [&](auto ti) {
    using I = typename decltype(ti)::type;
    return forward_impl<I>(ctx, tbe, args);
  });
}

}  // namespace cpu
}  // namespace embscale
