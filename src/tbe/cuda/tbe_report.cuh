// The bounds-check report of the CUDA TBE forward and backward: the finalize kernel's words
// (scratch[kReport..kReport+4], tbe/cuda/bounds_check.cuh) read back and turned into a Status with
// the same wording as the CPU backend's (tbe/cpu/tbe_checks.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "tbe/tbe_backend.h"
#include "core/cuda/check.cuh"
#include "tbe/cuda/bounds_check.cuh"

namespace embscale {
namespace cuda {
namespace tbe_report {

// The error-mode report r[0..4] as a Status naming what was wrong; `op` ("tbe forward", "tbe backward")
// names the caller in the message for an unknown report kind.
inline Status report_status(const TableBatchedEmbedding& tbe, int64_t B, int64_t N, const int64_t* r, const char* op) {
  const auto s = [](int64_t v) { return std::to_string(v); };
  switch (r[0]) {
    case tbe_bounds::kReportNone: return Status::Ok();
    case tbe_bounds::kReportNegativeFirst:
      return out_of_range("offsets: position 0 (feature 0, bag 0): value " + s(r[1]) + " is negative");
    case tbe_bounds::kReportDecreasing: {
      const int64_t item = r[1] - 1;  // offsets[i] ends bag i-1
      return out_of_range("offsets: position " + s(r[1]) + " (end of feature " + s(B > 0 ? item / B : 0) + ", bag " +
                          s(B > 0 ? item % B : 0) + "): value " + s(r[2]) + " is less than the previous value " +
                          s(r[3]));
    }
    case tbe_bounds::kReportLastMismatch:
      return out_of_range("offsets: the last value " + s(r[1]) + " differs from the number of indices " + s(N));
    case tbe_bounds::kReportBadIndex: {
      const int64_t item = r[1];
      const int f = static_cast<int>(item / B);
      const int t = tbe.feature_table(f);
      return out_of_range("indices: feature " + s(f) + ", bag " + s(item % B) + ", position " + s(r[2] - r[4]) +
                          " (indices[" + s(r[2]) + "]): index " + s(r[3]) + " is outside table " + s(t) + " (" +
                          s(tbe.config().tables[t].num_rows) + " rows)");
    }
    default: break;
  }
  return Status(StatusCode::kBackendError, std::string(op) + ": unknown bounds-check report " + s(r[0]));
}

// Copies the report from the module's scratch, waits for the stream and returns report_status.
inline Status read_report(const TableBatchedEmbedding& tbe, int64_t B, int64_t N, cudaStream_t stream, const char* op) {
  int64_t report[5] = {0, 0, 0, 0, 0};
  EMBSCALE_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(report, tbe.device_meta().scratch + tbe_bounds::kReport,
                                                       sizeof(report), cudaMemcpyDeviceToHost, stream),
                                       "cudaMemcpyAsync (bounds-check report)"));
  EMBSCALE_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize (bounds-check report)"));
  return report_status(tbe, B, N, report, op);
}

}  // namespace tbe_report
}  // namespace cuda
}  // namespace embscale
