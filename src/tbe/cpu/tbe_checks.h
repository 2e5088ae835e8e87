// Bounds checks shared by the CPU TBE forward and backward: the offsets check (in order, so the first
// violation is reported) and the report of the first out-of-range index, both worded by
// tbe/bounds_report.h like the CUDA backend's.
#pragma once

#include <climits>
#include <cstdint>

#include "tbe/bounds_report.h"
#include "tbe/tbe_backend.h"

namespace embscale {
namespace cpu {
namespace tbe_checks {

// First bad index seen, ordered by (item, position) so the report does not depend on the schedule.
struct BadIndex {
  int64_t item = INT64_MAX;  // f * B + b
  int64_t pos = 0;           // global position in indices
  int64_t value = 0;
};

// Keeps in *bad the earlier of *bad and `mine` (call inside a critical section).
inline void keep_first(const BadIndex& mine, BadIndex* bad) {
  if (mine.item < bad->item || (mine.item == bad->item && mine.pos < bad->pos)) *bad = mine;
}

// Offsets: not negative at 0, monotone, and the last (offsets[T*B]) equals N. Checked serially (T*B+1
// values, cheap next to the gathers) so the first violation in order is reported: returns false and
// fills *v at the first one, true when there is none.
template <typename I>
bool offsets_valid(const I* offsets, int64_t TB, int64_t N, tbe_bounds::BoundsViolation* v) {
  using tbe_bounds::ViolationKind;
  if (static_cast<int64_t>(offsets[0]) < 0) {
    v->kind = ViolationKind::kNegativeFirstOffset;
    v->value = offsets[0];
    return false;
  }
  for (int64_t i = 1; i <= TB; ++i) {
    if (offsets[i] < offsets[i - 1]) {
      v->kind = ViolationKind::kDecreasingOffset;
      v->position = i;
      v->value = offsets[i];
      v->previous = offsets[i - 1];
      return false;
    }
  }
  if (static_cast<int64_t>(offsets[TB]) != N) {
    v->kind = ViolationKind::kLastOffsetMismatch;
    v->value = offsets[TB];
    return false;
  }
  return true;
}

template <typename I>
Status check_offsets(const TableBatchedEmbedding& tbe, const I* offsets, int64_t T, int64_t B, int64_t N) {
  tbe_bounds::BoundsViolation v;
  if (offsets_valid(offsets, T * B, N, &v)) return Status::Ok();
  return tbe_bounds::violation_error(tbe, B, N, v);
}

// The error for the first bad index `bad` (bad.item != INT64_MAX).
template <typename I>
Status bad_index_error(const TableBatchedEmbedding& tbe, const I* offsets, int64_t B, int64_t N, const BadIndex& bad) {
  tbe_bounds::BoundsViolation v;
  v.kind = tbe_bounds::ViolationKind::kBadIndex;
  v.position = bad.pos;
  v.value = bad.value;
  v.item = bad.item;
  v.bag_start = static_cast<int64_t>(offsets[bad.item]);
  return tbe_bounds::violation_error(tbe, B, N, v);
}

}  // namespace tbe_checks
}  // namespace cpu
}  // namespace embscale
