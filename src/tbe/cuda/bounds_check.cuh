// The bounds checks of the CUDA TBE forward and backward (tbe.h): the check modes, the scratch words in
// which the kernels record what they find (TableBatchedEmbedding::DeviceMeta::scratch), the report the
// finalize kernel makes of them and the kernel itself. tbe_report.cuh reads the report back on the host.
//
// The recording kernels clamp every bag to [0, N] in every mode; in error and skip modes a decreasing
// offset is recorded as the smallest such position (record_min_position: an atomic max of ~position),
// an invalid index likewise (error mode) or counted (skip mode). tbe_bounds_finalize_kernel, next in
// stream order, checks offsets[0] and the last offset, turns the records into a report (or the skip
// count into *num_skipped, and *num_skipped_host when given) and clears them for the next call.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace embscale {
namespace cuda {
namespace tbe_bounds {

enum CheckKind : int { kCheckError = 0, kCheckSkip = 1, kCheckOff = 2 };

// Scratch words (TableBatchedEmbedding::kScratchWords = 8, zero between calls).
enum ScratchWord : int {
  kSkipCount = 0,    // skip mode: invalid indices seen
  kBadIndexKey = 1,  // error mode: ~(smallest invalid position), 0 = none
  kBadOffsetKey = 2, // ~(smallest i with offsets[i] < offsets[i-1]), 0 = none
  kReport = 3,       // [3..7] written by the finalize kernel: kind, a, b, c, d
};

// Report kinds (scratch[kReport]) and the meaning of a, b, c, d.
enum ReportKind : int64_t {
  kReportNone = 0,
  kReportNegativeFirst = 1,  // a = offsets[0]
  kReportDecreasing = 2,     // a = i, b = offsets[i], c = offsets[i-1]
  kReportLastMismatch = 3,   // a = offsets[T*B]
  kReportBadIndex = 4,       // a = bag item (f*B+b), b = position in indices, c = index, d = bag start
};

__device__ __forceinline__ void record_min_position(int64_t* word, int64_t position) {
  atomicMax(reinterpret_cast<unsigned long long*>(word), ~static_cast<unsigned long long>(position));
}

// One thread: the checks on offsets[0] and the last offset, then the report (error mode) or the skip
// count (skip mode), then the records are cleared so the next call starts from zero. Stream order puts
// it after the kernel that recorded (the forward's bags kernel, the backward's linearize), so no host
// synchronisation is needed (capturable).
template <typename I>
__global__ void tbe_bounds_finalize_kernel(const I* offsets, const I* indices, int64_t num_items, int64_t num_indices,
                                           int check, int64_t* scratch, int64_t* num_skipped,
                                           int64_t* num_skipped_host = nullptr) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const int64_t first = static_cast<int64_t>(offsets[0]);
  const int64_t last = static_cast<int64_t>(offsets[num_items]);
  const unsigned long long bad_offset = static_cast<unsigned long long>(scratch[kBadOffsetKey]);
  const unsigned long long bad_index = static_cast<unsigned long long>(scratch[kBadIndexKey]);
  int64_t report[5] = {kReportNone, 0, 0, 0, 0};
  if (first < 0) {
    report[0] = kReportNegativeFirst;
    report[1] = first;
  } else if (bad_offset != 0) {
    const int64_t i = static_cast<int64_t>(~bad_offset);
    report[0] = kReportDecreasing;
    report[1] = i;
    report[2] = static_cast<int64_t>(offsets[i]);
    report[3] = static_cast<int64_t>(offsets[i - 1]);
  } else if (last != num_indices) {
    report[0] = kReportLastMismatch;
    report[1] = last;
  } else if (bad_index != 0) {
    // Offsets are valid here, so the bag holding position q is the last item whose start is <= q.
    const int64_t q = static_cast<int64_t>(~bad_index);
    int64_t lo = 0, hi = num_items;  // invariant: offsets[lo] <= q < offsets[hi]
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (static_cast<int64_t>(offsets[mid]) <= q) lo = mid; else hi = mid;
    }
    report[0] = kReportBadIndex;
    report[1] = lo;
    report[2] = q;
    report[3] = static_cast<int64_t>(indices[q]);
    report[4] = static_cast<int64_t>(offsets[lo]);
  }
  const int64_t skipped = report[0] != kReportNone ? -1 : scratch[kSkipCount];
  if (check == kCheckSkip && num_skipped != nullptr) *num_skipped = skipped;
  if (check == kCheckSkip && num_skipped_host != nullptr) {
    __threadfence_system();  // (the count above first: a host that sees this one may read that one)
    *reinterpret_cast<volatile int64_t*>(num_skipped_host) = skipped;
  }
  scratch[kSkipCount] = 0;
  scratch[kBadIndexKey] = 0;
  scratch[kBadOffsetKey] = 0;
  for (int k = 0; k < 5; ++k) scratch[kReport + k] = report[k];
}

}  // namespace tbe_bounds
}  // namespace cuda
}  // namespace embscale
