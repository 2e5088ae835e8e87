// How fast can a kernel move scattered embedding rows between mapped host memory and the GPU?
// The row cache (src/tbe/cuda/cache/tbe_cache.cu) fetches missed rows from the host store and writes
// evicted and staged rows back with kernels that read and write pinned, mapped host memory directly (a
// DMA copy per 516-byte row would be far slower). This measures the shapes such a kernel can take, against
// cudaMemcpy of one contiguous buffer (the link's floor):
//   dir      in (host -> GPU), out (GPU -> host), both (each row: a victim out, then a new row in: what an
//            insert that evicts does, both link directions at once);
//   rows     rows a warp has in flight (its loads issued before its stores): 1, 2, 4, 8;
//   state    the row's 4-byte row-wise state also read or written in host memory (a second access a row),
//            or kept in GPU memory;
//   occ      blocks of 256 threads per SM (4: half the warps an SM holds; 8: all).
//   memory   what the host store is (argument 2, a comma-separated list; default hostalloc):
//            hostalloc (cudaHostAlloc, mapped), register (page-aligned malloc + cudaHostRegister, mapped),
//            register_thp (the same on 2 MiB-aligned memory advised MADV_HUGEPAGE), managed
//            (cudaMallocManaged advised to stay on the host and be accessed by the GPU, as FBGEMM's UVM);
//   quick    argument 3 "quick": only 1 and 4 rows in flight, state in GPU memory, 8 blocks per SM;
//   order    argument 4 "sorted": the same rows in address order (neighbouring warps share host pages), to
//            tell the GPU's address translation of host pages from the link itself.
// Rows are D = 128 fp32 (512 B) at random, distinct places of a 4 GiB host store; results are checked.
// Standalone (no library). One JSON record per line.
//   nvcc -O3 -std=c++17 -arch=sm_90 -Idev dev/host_link_rows.cu -o host-link-rows && ./host-link-rows [rows_moved (default 2^21)]
// Record: bench/results/2026-12-06-nvidia-h100-host-link-rows.jsonl.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <sys/mman.h>

#include "cuda_check.h"

namespace {

constexpr int kThreads = 256;
constexpr int kD = 128;                  // floats a row
constexpr int kVecs = kD / 4;            // 16-byte vectors a row (one per lane)
static_assert(kVecs == 32, "a lane moves one 16-byte vector of each row");

enum Dir { kIn = 0, kOut = 1, kBoth = 2 };

// Warp w moves rows [w*R, w*R + R) of each grid-stride round. in: host row src[i] -> cache row i.
// out: cache row i -> host row dst[i]. both: out of row i's victim, then in of row i.
template <int R, int kDir, bool kHostState>
__global__ void __launch_bounds__(kThreads) move_rows(const float4* __restrict__ host_r, float4* host_w,
                                                      const float* __restrict__ hstate_r, float* hstate_w,
                                                      float4* cache, float* cstate, const int64_t* __restrict__ in_rows,
                                                      const int64_t* __restrict__ out_rows, int64_t n) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kThreads / 32;
  for (int64_t base = warp * R; base < n; base += warps * R) {
    if (kDir != kIn) {  // victims out: cache (HBM) reads are fast, the host writes are posted
      float4 v[R];
      float s = 0.0f;
#pragma unroll
      for (int k = 0; k < R; ++k)
        if (base + k < n) v[k] = cache[(base + k) * kVecs + lane];
      if (lane < R && base + lane < n) s = cstate[base + lane];
#pragma unroll
      for (int k = 0; k < R; ++k)
        if (base + k < n) host_w[out_rows[base + k] * kVecs + lane] = v[k];
      if (lane < R && base + lane < n) {
        if (kHostState) hstate_w[out_rows[base + lane]] = s;
        else cstate[n + out_rows[base + lane] % n] = s;  // a GPU-memory store of the state
      }
    }
    if (kDir != kOut) {  // new rows in: R loads in flight a lane, then the stores
      float4 v[R];
      float s = 0.0f;
#pragma unroll
      for (int k = 0; k < R; ++k)
        if (base + k < n) v[k] = host_r[in_rows[base + k] * kVecs + lane];
      if (lane < R && base + lane < n) s = kHostState ? hstate_r[in_rows[base + lane]] : cstate[n + in_rows[base + lane] % n];
#pragma unroll
      for (int k = 0; k < R; ++k)
        if (base + k < n) cache[(base + k) * kVecs + lane] = v[k];
      if (lane < R && base + lane < n) cstate[base + lane] = s;
    }
  }
}

using Kernel = void (*)(const float4*, float4*, const float*, float*, float4*, float*, const int64_t*,
                        const int64_t*, int64_t);

template <int R, int kDir>
Kernel pick(bool host_state) {
  return host_state ? move_rows<R, kDir, true> : move_rows<R, kDir, false>;
}
template <int kDir>
Kernel pick_r(int r, bool host_state) {
  switch (r) {
    case 1: return pick<1, kDir>(host_state);
    case 2: return pick<2, kDir>(host_state);
    case 4: return pick<4, kDir>(host_state);
    default: return pick<8, kDir>(host_state);
  }
}
Kernel pick_kernel(int dir, int r, bool host_state) {
  return dir == kIn ? pick_r<kIn>(r, host_state) : dir == kOut ? pick_r<kOut>(r, host_state) : pick_r<kBoth>(r, host_state);
}

const char* dir_name(int d) { return d == kIn ? "in" : d == kOut ? "out" : "both"; }

// The host store of one memory kind: the CPU's pointer and the GPU's.
struct HostStore {
  void* cpu = nullptr;
  void* gpu = nullptr;
  std::string kind;
  size_t bytes = 0;
};

HostStore host_store(const std::string& kind, size_t bytes, int dev) {
  HostStore h;
  h.kind = kind;
  h.bytes = bytes;
  if (kind == "hostalloc") {
    CK(cudaHostAlloc(&h.cpu, bytes, cudaHostAllocMapped));
  } else if (kind == "register" || kind == "register_thp") {
    const size_t align = kind == "register" ? 4096 : (size_t{1} << 21);
    if (posix_memalign(&h.cpu, align, bytes) != 0) {
      std::fprintf(stderr, "posix_memalign of %zu bytes failed\n", bytes);
      std::exit(1);
    }
    if (kind == "register_thp") madvise(h.cpu, bytes, MADV_HUGEPAGE);
    std::memset(h.cpu, 0, bytes);  // the pages exist before they are registered
    CK(cudaHostRegister(h.cpu, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
  } else if (kind == "managed") {
    CK(cudaMallocManaged(&h.cpu, bytes));
    cudaMemLocation host{};
    host.type = cudaMemLocationTypeHost;
    cudaMemLocation gpu{};
    gpu.type = cudaMemLocationTypeDevice;
    gpu.id = dev;
    CK(cudaMemAdvise(h.cpu, bytes, cudaMemAdviseSetPreferredLocation, host));
    CK(cudaMemAdvise(h.cpu, bytes, cudaMemAdviseSetAccessedBy, gpu));
    h.gpu = h.cpu;
    return h;
  } else {
    std::fprintf(stderr, "unknown memory kind '%s' (hostalloc, register, register_thp, managed)\n", kind.c_str());
    std::exit(2);
  }
  CK(cudaHostGetDevicePointer(&h.gpu, h.cpu, 0));
  return h;
}

void free_store(HostStore& h) {
  if (h.kind == "hostalloc") {
    CK(cudaFreeHost(h.cpu));
  } else if (h.kind == "managed") {
    CK(cudaFree(h.cpu));
  } else {
    CK(cudaHostUnregister(h.cpu));
    std::free(h.cpu);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : (int64_t{1} << 21);
  const std::string kinds_arg = argc > 2 ? argv[2] : "hostalloc";
  const bool quick = argc > 3 && std::string(argv[3]) == "quick";
  const bool sorted = argc > 4 && std::string(argv[4]) == "sorted";
  const int64_t store_rows = int64_t{1} << 23;  // 4 GiB of host rows
  if (n <= 0 || 2 * n > store_rows) {
    std::fprintf(stderr, "rows_moved must be in [1, %lld]\n", static_cast<long long>(store_rows / 2));
    return 2;
  }
  std::vector<std::string> kinds;
  for (size_t a = 0; a <= kinds_arg.size();) {
    const size_t b = std::min(kinds_arg.find(',', a), kinds_arg.size());
    kinds.push_back(kinds_arg.substr(a, b - a));
    a = b + 1;
  }
  int dev = 0, sms = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  const size_t row_bytes = kD * sizeof(float);

  // Distinct random rows: the first n of a permutation come in, the next n go out.
  std::vector<int64_t> perm(store_rows);
  std::iota(perm.begin(), perm.end(), int64_t{0});
  std::mt19937_64 rng(20261206);
  std::shuffle(perm.begin(), perm.end(), rng);
  if (sorted) {  // the same rows in address order: neighbouring warps share host pages
    std::sort(perm.begin(), perm.begin() + n);
    std::sort(perm.begin() + n, perm.begin() + 2 * n);
  }
  int64_t *in_rows = nullptr, *out_rows = nullptr;
  float4* cache = nullptr;
  float* cstate = nullptr;
  CK(cudaMalloc(&in_rows, n * sizeof(int64_t)));
  CK(cudaMalloc(&out_rows, n * sizeof(int64_t)));
  CK(cudaMalloc(&cache, n * row_bytes));
  CK(cudaMalloc(&cstate, 2 * n * sizeof(float)));
  CK(cudaMemcpy(in_rows, perm.data(), n * sizeof(int64_t), cudaMemcpyHostToDevice));
  CK(cudaMemcpy(out_rows, perm.data() + n, n * sizeof(int64_t), cudaMemcpyHostToDevice));

  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const auto time_ms = [&](auto&& fn, int reps) {
    fn();  // warm-up
    std::vector<float> t;
    for (int i = 0; i < reps; ++i) {
      CK(cudaEventRecord(e0));
      fn();
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };

  bool all_ok = true;
  for (const std::string& kind : kinds) {
    HostStore rows = host_store(kind, store_rows * row_bytes, dev);
    HostStore states = host_store(kind, store_rows * sizeof(float), dev);
    float* h = static_cast<float*>(rows.cpu);
    float* hstate = static_cast<float*>(states.cpu);
    for (int64_t r = 0; r < store_rows; ++r) {
      for (int j = 0; j < kD; ++j) h[r * kD + j] = static_cast<float>(r) + j * 1e-3f;
      hstate[r] = static_cast<float>(r);
    }
    float4* host_dev = static_cast<float4*>(rows.gpu);
    float* hstate_dev = static_cast<float*>(states.gpu);

    // The floor: one contiguous copy of the same bytes each way, and both at once on two streams.
    if (kind == kinds.front()) {
      const size_t bytes = n * row_bytes;
      cudaStream_t s1, s2;
      CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
      CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
      cudaEvent_t j1, j2;
      CK(cudaEventCreateWithFlags(&j1, cudaEventDisableTiming));
      CK(cudaEventCreateWithFlags(&j2, cudaEventDisableTiming));
      float4* scratch = nullptr;
      CK(cudaMalloc(&scratch, bytes));
      float4* far_rows = static_cast<float4*>(rows.cpu) + store_rows / 2 * kVecs;
      const char* names[] = {"memcpy_in", "memcpy_out", "memcpy_both"};
      for (int d = 0; d < 3; ++d) {
        const float ms = time_ms([&] {
          CK(cudaEventRecord(j1, 0));
          CK(cudaStreamWaitEvent(s1, j1));
          CK(cudaStreamWaitEvent(s2, j1));
          if (d != kOut) CK(cudaMemcpyAsync(cache, rows.cpu, bytes, cudaMemcpyDefault, s1));
          if (d != kIn) CK(cudaMemcpyAsync(far_rows, scratch, bytes, cudaMemcpyDefault, s2));
          CK(cudaEventRecord(j1, s1));
          CK(cudaEventRecord(j2, s2));
          CK(cudaStreamWaitEvent(0, j1));
          CK(cudaStreamWaitEvent(0, j2));
        }, 5);
        const double moved = static_cast<double>(bytes) * (d == kBoth ? 2 : 1);
        std::printf("{\"shape\": \"%s\", \"memory\": \"%s\", \"device\": \"%s\", \"rows\": %lld, \"ms\": %.3f, "
                    "\"GBps\": %.2f}\n", names[d], kind.c_str(), prop.name, static_cast<long long>(n), ms,
                    moved / (ms * 1e-3) / 1e9);
      }
      CK(cudaFree(scratch));
      for (int64_t r = store_rows / 2; r < store_rows / 2 + n; ++r)  // restore what the D2H copy overwrote
        for (int j = 0; j < kD; ++j) h[r * kD + j] = static_cast<float>(r) + j * 1e-3f;
    }

    for (int dir : {kIn, kOut, kBoth}) {
      for (bool host_state : {true, false}) {
        if (quick && host_state) continue;
        for (int occ : {4, 8}) {
          if (quick && occ != 8) continue;
          for (int r : {1, 2, 4, 8}) {
            if (quick && r != 1 && r != 4) continue;
            const Kernel k = pick_kernel(dir, r, host_state);
            const unsigned grid = static_cast<unsigned>(sms * occ);
            const float ms = time_ms([&] {
              k<<<grid, kThreads>>>(host_dev, host_dev, hstate_dev, hstate_dev, cache, cstate, in_rows, out_rows, n);
            }, 5);
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            // Check: in moves host row in_rows[i] into cache row i (and, with host state, its state).
            bool ok = true;
            if (dir != kOut) {
              std::vector<float> got(kD);
              for (int64_t i : {int64_t{0}, n / 2, n - 1}) {
                CK(cudaMemcpy(got.data(), cache + i * kVecs, row_bytes, cudaMemcpyDeviceToHost));
                float st = 0;
                CK(cudaMemcpy(&st, cstate + i, sizeof(float), cudaMemcpyDeviceToHost));
                const int64_t rr = perm[i];
                for (int j = 0; j < kD; ++j) ok = ok && got[j] == static_cast<float>(rr) + j * 1e-3f;
                if (host_state) ok = ok && st == static_cast<float>(rr);
              }
            }
            all_ok = all_ok && ok;
            const int per_row = static_cast<int>(row_bytes) + (host_state ? 4 : 0);
            const double moved = static_cast<double>(n) * per_row * (dir == kBoth ? 2 : 1);
            std::printf("{\"shape\": \"kernel\", \"memory\": \"%s\", \"dir\": \"%s\", \"rows_in_flight\": %d, "
                        "\"host_state\": %s, \"blocks_per_sm\": %d, \"order\": \"%s\", \"rows\": %lld, \"ms\": %.3f, "
                        "\"GBps\": %.2f, \"check\": \"%s\"}\n",
                        kind.c_str(), dir_name(dir), r, host_state ? "true" : "false", occ, sorted ? "sorted" : "random",
                        static_cast<long long>(n), ms, moved / (ms * 1e-3) / 1e9, ok ? "ok" : "FAILED");
            std::fflush(stdout);
          }
        }
      }
    }
    free_store(rows);
    free_store(states);
  }
  return all_ok ? 0 : 1;
}
