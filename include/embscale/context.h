// Where an op runs. Every op takes a Context: the backend, and for CUDA the stream the op is
// enqueued on (a cudaStream_t passed as void* so this header needs no CUDA headers; nullptr is the
// legacy default stream). GPU ops are asynchronous on that stream, never synchronise the host and
// never allocate, so they can be captured in a CUDA graph. CPU ops run synchronously on
// `num_threads` OpenMP threads (0 = all hardware threads); the TBE ops take it as an upper bound and
// run small calls on fewer (one thread per 8 MiB of rows gathered, docs/tbe_cpu.md).
#pragma once

#include <string>

namespace embscale {

enum class Backend { kCpu = 0, kCuda = 1 };
constexpr int kNumBackends = static_cast<int>(Backend::kCuda) + 1;  // values 0 .. count - 1

struct Context {
  Backend backend = Backend::kCpu;
  void* stream = nullptr;  // cudaStream_t for Backend::kCuda
  int num_threads = 0;     // Backend::kCpu only; 0 = all hardware threads; at most 1024, else refused

  static Context cpu(int num_threads = 0) {
    Context c;
    c.backend = Backend::kCpu;
    c.num_threads = num_threads;
    return c;
  }
  static Context cuda(void* stream = nullptr) {
    Context c;
    c.backend = Backend::kCuda;
    c.stream = stream;
    return c;
  }
};

const char* backend_name(Backend b);  // "cpu", "cuda"
bool parse_backend(const std::string& name, Backend* out);
// True when the backend was compiled into this build.
bool backend_compiled(Backend b);
// True when the backend is compiled in and usable now (for CUDA: a device is present).
bool backend_available(Backend b);

}  // namespace embscale
