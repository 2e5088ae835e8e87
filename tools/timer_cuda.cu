// CUDA services for bench_util.cpp: event timing (each batch of back-to-back calls is bracketed by two
// events), an asynchronous device copy for the copy ceiling, the L2 size and the free device memory.
#include <cuda_runtime.h>

#include <functional>
#include <vector>

#include "core/cuda/check.cuh"
#include "embscale/status.h"

namespace embscale {
namespace tools {

// Records `batches` event-bracketed batches of back-to-back calls on s, waits, reads the elapsed times.
static Status timed_batches(cudaStream_t s, int batches, int calls_per_batch, int* call,
                            const std::function<Status(int)>& op, const std::vector<cudaEvent_t>& ev,
                            std::vector<double>* batch_ms) {
  using cuda::cuda_status;
  for (int b = 0; b < batches; ++b) {
    EMBSCALE_RETURN_IF_ERROR(cuda_status(cudaEventRecord(ev[2 * b], s), "cudaEventRecord"));
    for (int c = 0; c < calls_per_batch; ++c) EMBSCALE_RETURN_IF_ERROR(op((*call)++));
    EMBSCALE_RETURN_IF_ERROR(cuda_status(cudaEventRecord(ev[2 * b + 1], s), "cudaEventRecord"));
  }
  EMBSCALE_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(s), "timed batches"));
  batch_ms->clear();
  for (int b = 0; b < batches; ++b) {
    float ms = 0;
    EMBSCALE_RETURN_IF_ERROR(cuda_status(cudaEventElapsedTime(&ms, ev[2 * b], ev[2 * b + 1]), "cudaEventElapsedTime"));
    batch_ms->push_back(ms);
  }
  return Status::Ok();
}

Status cuda_time_batches(void* stream, int warmup, int batches, int calls_per_batch,
                         const std::function<Status(int)>& op, std::vector<double>* batch_ms) {
  using cuda::cuda_status;
  auto s = static_cast<cudaStream_t>(stream);
  int call = 0;
  for (int i = 0; i < warmup; ++i) EMBSCALE_RETURN_IF_ERROR(op(call++));
  EMBSCALE_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(s), "warm-up"));
  std::vector<cudaEvent_t> ev(2 * batches, nullptr);
  Status created;
  for (auto& e : ev) {
    const Status c = cuda_status(cudaEventCreate(&e), "cudaEventCreate");
    if (!c.ok()) {
      e = nullptr;
      created = c;
      break;
    }
  }
  const Status st = created.ok() ? timed_batches(s, batches, calls_per_batch, &call, op, ev, batch_ms) : created;
  for (auto& e : ev)
    if (e != nullptr) cudaEventDestroy(e);
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

// Free memory of the current device in bytes, 0 when it cannot be queried.
size_t cuda_free_memory_bytes() {
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return free_bytes;
}

}  // namespace tools
}  // namespace embscale
