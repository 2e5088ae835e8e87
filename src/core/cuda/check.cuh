// cudaError_t -> Status, naming the call that failed.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "embscale/status.h"

namespace embscale {
namespace cuda {

inline Status cuda_status(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return Status(StatusCode::kBackendError, std::string(what) + ": " + cudaGetErrorName(err) + " (" +
                                               cudaGetErrorString(err) + ")");
}

}  // namespace cuda
}  // namespace embscale

// Checks the launch just made (configuration errors are reported at launch, not at sync).
#define EMBSCALE_CHECK_LAUNCH(what) EMBSCALE_RETURN_IF_ERROR(::embscale::cuda::cuda_status(cudaGetLastError(), what))
