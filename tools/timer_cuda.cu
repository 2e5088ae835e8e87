// CUDA services for bench_util.cpp: event timing (each batch of back-to-back calls is bracketed by two
// events), an asynchronous device copy for the copy ceiling, and the L2 size.
#include <cuda_runtime.h>

#include <functional>
#include <vector>

#include "cuda/check.cuh"
#include "embscale/status.h"

namespace embscale {
namespace tools {

Status cuda_time_batches(void* stream, int warmup, int batches, int calls_per_batch,
                         const std::function<Status(int)>& op, std::vector<double>* batch_ms) {
  using cuda::cuda_status;
  auto s = static_cast<cudaStream_t>(stream);
  int call = 0;
  for (int i = 0; i < warmup; ++i) EMBSCALE_RETURN_IF_ERROR(op(call++));
  EMBSCALE_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(s), "warm-up"));
  std::vector<cudaEvent_t> ev(2 * batches);
  for (auto& e : ev) EMBSCALE_RETURN_IF_ERROR(cuda_status(cudaEventCreate(&e), "cudaEventCreate"));
  Status st;
  for (int b = 0; b < batches && st.ok(); ++b) {
    cudaEventRecord(ev[2 * b], s);
    for (int c = 0; c < calls_per_batch && st.ok(); ++c) st = op(call++);
    cudaEventRecord(ev[2 * b + 1], s);
  }
  if (st.ok()) st = cuda_status(cudaStreamSynchronize(s), "timed batches");
  batch_ms->clear();
  for (int b = 0; b < batches && st.ok(); ++b) {
    float ms = 0;
    st = cuda_status(cudaEventElapsedTime(&ms, ev[2 * b], ev[2 * b + 1]), "cudaEventElapsedTime");
    batch_ms->push_back(ms);
  }
  for (auto& e : ev) cudaEventDestroy(e);
  return st;
}

// One device-to-device copy enqueued on the stream, without waiting for it.
Status cuda_copy_async(void* dst, const void* src, size_t bytes, void* stream) {
  return cuda::cuda_status(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)),
                           "cudaMemcpyAsync");
}

// L2 size of the current device in bytes, 0 when it cannot be queried.
size_t cuda_l2_bytes() {
  int dev = 0, bytes = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&bytes, cudaDevAttrL2CacheSize, dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return static_cast<size_t>(bytes);
}

}  // namespace tools
}  // namespace embscale
