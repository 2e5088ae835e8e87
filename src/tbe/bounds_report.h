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

}  // namespace tbe_bounds
}  // namespace embscale
