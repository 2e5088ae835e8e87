#include "tbe/bounds_report.h"

#include <string>

namespace embscale {
namespace tbe_bounds {

Status violation_error(const TableBatchedEmbedding& tbe, int64_t B, int64_t N, const BoundsViolation& v) {
  return violation_error(
      B, N, v, [&](int f) { return tbe.feature_table(f); },
      [&](int t) { return tbe.config().tables[t].num_rows; });
}

Status violation_error_named(int64_t B, int64_t N, const BoundsViolation& v, int t, int64_t table_rows) {
  const auto s = [](int64_t x) { return std::to_string(x); };
  switch (v.kind) {
    case ViolationKind::kNegativeFirstOffset:
      return out_of_range("offsets: position 0 (feature 0, bag 0): value " + s(v.value) + " is negative");
    case ViolationKind::kDecreasingOffset: {
      const int64_t item = v.position - 1;  // offsets[i] ends bag i - 1
      return out_of_range("offsets: position " + s(v.position) + " (end of feature " + s(B > 0 ? item / B : 0) +
                          ", bag " + s(B > 0 ? item % B : 0) + "): value " + s(v.value) +
                          " is less than the previous value " + s(v.previous));
    }
    case ViolationKind::kLastOffsetMismatch:
      return out_of_range("offsets: the last value " + s(v.value) + " differs from the number of indices " + s(N));
    case ViolationKind::kBadIndex: {
      const int f = static_cast<int>(v.item / B);
      return out_of_range("indices: feature " + s(f) + ", bag " + s(v.item % B) + ", position " +
                          s(v.position - v.bag_start) + " (indices[" + s(v.position) + "]): index " + s(v.value) +
                          " is outside table " + s(t) + " (" + s(table_rows) + " rows)");
    }
  }
  return Status(StatusCode::kBackendError, "bounds check: unknown violation kind " + s(static_cast<int>(v.kind)));
}

}  // namespace tbe_bounds
}  // namespace embscale
