// Bounds checks shared by the CPU TBE forward and backward: the offsets check (in order, so the first
// violation is reported) and the report of the first out-of-range index, with the same wording as the
// CUDA backend's (tbe/cuda/tbe_report.cuh).
#pragma once

#include <climits>
#include <cstdint>
#include <string>

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
// values, cheap next to the gathers) so the first violation in order is reported.
template <typename I>
Status check_offsets(const I* offsets, int64_t T, int64_t B, int64_t N) {
  const int64_t TB = T * B;
  if (static_cast<int64_t>(offsets[0]) < 0)
    return out_of_range("offsets: position 0 (feature 0, bag 0): value " + std::to_string(offsets[0]) +
                        " is negative");
  for (int64_t i = 1; i <= TB; ++i) {
    if (offsets[i] < offsets[i - 1]) {
      const int64_t item = i - 1;  // offsets[i] ends bag item
      return out_of_range("offsets: position " + std::to_string(i) + " (end of feature " +
                          std::to_string(B > 0 ? item / B : 0) + ", bag " + std::to_string(B > 0 ? item % B : 0) +
                          "): value " + std::to_string(offsets[i]) + " is less than the previous value " +
                          std::to_string(offsets[i - 1]));
    }
  }
  if (static_cast<int64_t>(offsets[TB]) != N)
    return out_of_range("offsets: the last value " + std::to_string(offsets[TB]) +
                        " differs from the number of indices " + std::to_string(N));
  return Status::Ok();
}

// The error for the first bad index `bad` (bad.item != INT64_MAX).
template <typename I>
Status bad_index_error(const TableBatchedEmbedding& tbe, const I* offsets, int64_t B, const BadIndex& bad) {
  const int f = static_cast<int>(bad.item / B);
  const int t = tbe.feature_table(f);
  const int64_t start = static_cast<int64_t>(offsets[bad.item]);
  return out_of_range("indices: feature " + std::to_string(f) + ", bag " + std::to_string(bad.item % B) +
                      ", position " + std::to_string(bad.pos - start) + " (indices[" + std::to_string(bad.pos) +
                      "]): index " + std::to_string(bad.value) + " is outside table " + std::to_string(t) + " (" +
                      std::to_string(tbe.config().tables[t].num_rows) + " rows)");
}

}  // namespace tbe_checks
}  // namespace cpu
}  // namespace embscale
