// The bounds-check errors of the TBE forward and backward, worded once for every backend: the CPU
// checks (tbe/cpu/tbe_checks.h) and the CUDA report read back from the device (tbe/cuda/tbe_report.cuh)
// both describe the first violation as a BoundsViolation and turn it into a Status here.
#pragma once

#include <cstdint>

#include "embscale/status.h"
#include "embscale/tbe.h"

namespace embscale {
namespace tbe_bounds {

enum class ViolationKind {
  kNegativeFirstOffset,  // offsets[0] < 0
  kDecreasingOffset,     // offsets[position] < offsets[position - 1]
  kLastOffsetMismatch,   // offsets[T*B] != N
  kBadIndex,             // indices[position] outside its table
};

struct BoundsViolation {
  ViolationKind kind = ViolationKind::kBadIndex;
  int64_t position = 0;   // offsets: the position in offsets; kBadIndex: the global position in indices
  int64_t value = 0;      // the offending offset or index
  int64_t previous = 0;   // kDecreasingOffset: offsets[position - 1]
  int64_t item = 0;       // kBadIndex: the bag, f * B + b
  int64_t bag_start = 0;  // kBadIndex: offsets[item]
};

// The modes that drop a bad index and count it (kWarn differs from kSkip only in what the CUDA backend
// waits for; the CPU backend waits for nothing, so there the two are one).
inline bool skips_bad_indices(BoundsCheckMode m) { return m == BoundsCheckMode::kSkip || m == BoundsCheckMode::kWarn; }

// The kOutOfRange Status naming the argument, the feature, bag and position, the value and the bound;
// B is the batch size and N the number of indices.
Status violation_error(const TableBatchedEmbedding& tbe, int64_t B, int64_t N, const BoundsViolation& v);
// The same for any table-batched op: table_of_feature(f) and table_rows(t) name the table of a bad index
// (read for kBadIndex only). The quantized TBE (tbe_quant.h) reports through this one.
template <class TableOf, class RowsOf>
Status violation_error(int64_t B, int64_t N, const BoundsViolation& v, TableOf table_of_feature, RowsOf table_rows);
Status violation_error_named(int64_t B, int64_t N, const BoundsViolation& v, int table, int64_t table_rows);
template <class TableOf, class RowsOf>
Status violation_error(int64_t B, int64_t N, const BoundsViolation& v, TableOf table_of_feature, RowsOf table_rows) {
  if (v.kind != ViolationKind::kBadIndex || B <= 0) return violation_error_named(B, N, v, 0, 0);
  const int t = table_of_feature(static_cast<int>(v.item / B));
  return violation_error_named(B, N, v, t, table_rows(t));
}

}  // namespace tbe_bounds
}  // namespace embscale
