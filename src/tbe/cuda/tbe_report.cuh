// The bounds-check report of the CUDA TBE forward and backward and of the quantized TBE's forward: the
// finalize kernel's words (scratch[kReport..kReport+4], tbe/cuda/bounds_check.cuh) read back and turned into
// a Status worded by tbe/bounds_report.h, like the CPU backend's.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "tbe/bounds_report.h"
#include "tbe/tbe_backend.h"
#include "core/cuda/check.cuh"
#include "tbe/cuda/bounds_check.cuh"

namespace embscale {
namespace cuda {
namespace tbe_report {

// The error-mode report r[0..4] as a Status naming what was wrong: to_status(violation) words it (the
// op's tbe_bounds::violation_error); `op` ("tbe forward", "tbe backward") names the caller in the message
// for an unknown report kind.
template <class ToStatus>
inline Status report_status(const int64_t* r, const char* op, ToStatus to_status) {
  // The host-side wording (tbe/bounds_report.h), not the device-side words of cuda::tbe_bounds.
  using ::embscale::tbe_bounds::ViolationKind;
  ::embscale::tbe_bounds::BoundsViolation v;
  switch (r[0]) {
    case tbe_bounds::kReportNone: return Status::Ok();
    case tbe_bounds::kReportNegativeFirst:
      v.kind = ViolationKind::kNegativeFirstOffset;
      v.value = r[1];
      break;
    case tbe_bounds::kReportDecreasing:
      v.kind = ViolationKind::kDecreasingOffset;
      v.position = r[1];
      v.value = r[2];
      v.previous = r[3];
      break;
    case tbe_bounds::kReportLastMismatch:
      v.kind = ViolationKind::kLastOffsetMismatch;
      v.value = r[1];
      break;
    case tbe_bounds::kReportBadIndex:
      v.kind = ViolationKind::kBadIndex;
      v.item = r[1];
      v.position = r[2];
      v.value = r[3];
      v.bag_start = r[4];
      break;
    default:
      return Status(StatusCode::kBackendError, std::string(op) + ": unknown bounds-check report " + std::to_string(r[0]));
  }
  return to_status(v);
}

inline Status report_status(const TableBatchedEmbedding& tbe, int64_t B, int64_t N, const int64_t* r, const char* op) {
  return report_status(r, op, [&](const ::embscale::tbe_bounds::BoundsViolation& v) {
    return ::embscale::tbe_bounds::violation_error(tbe, B, N, v);
  });
}

// Whether `stream` is capturing a CUDA graph (only asked when a bounds check runs: off mode never reads
// anything back), and the refusal of error mode inside a capture, which reads its report back.
inline Status capture_state(BoundsCheckMode mode, cudaStream_t stream, bool* capturing) {
  *capturing = false;
  if (mode == BoundsCheckMode::kOff) return Status::Ok();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  EMBSCALE_RETURN_IF_ERROR(cuda_status(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing"));
  *capturing = capture != cudaStreamCaptureStatusNone;
  if (mode == BoundsCheckMode::kError && *capturing)
    return invalid_argument(
        "bounds_check: error mode reads its result back and synchronises the stream, which cannot happen "
        "inside a CUDA graph capture; use skip, warn or off");
  return Status::Ok();
}

// Copies the report from an object's scratch words, waits for the stream and returns report_status.
template <class ToStatus>
inline Status read_report(const int64_t* scratch, cudaStream_t stream, const char* op, ToStatus to_status) {
  int64_t report[5] = {0, 0, 0, 0, 0};
  EMBSCALE_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(report, scratch + tbe_bounds::kReport, sizeof(report),
                                                       cudaMemcpyDeviceToHost, stream),
                                       "cudaMemcpyAsync (bounds-check report)"));
  EMBSCALE_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize (bounds-check report)"));
  return report_status(report, op, to_status);
}

inline Status read_report(const TableBatchedEmbedding& tbe, int64_t B, int64_t N, cudaStream_t stream, const char* op) {
  return read_report(tbe.device_meta().scratch, stream, op, [&](const ::embscale::tbe_bounds::BoundsViolation& v) {
    return ::embscale::tbe_bounds::violation_error(tbe, B, N, v);
  });
}

}  // namespace tbe_report
}  // namespace cuda
}  // namespace embscale
