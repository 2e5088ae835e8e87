// Can quantize_current_scaling of a 16-32 MiB input beat two passes over x by holding all of x on chip?
// The two-pass floor on the H200: the amax pass reads x from memory and the cast reads it again from L2
// (bounded by L2's bandwidth: ~10 us for bf16 2^24 on the SM that read it,
// `2026-12-04-nvidia-h200-qcs-sm-runs.md`). A grid of one 1024-thread block per SM can hold ~37 MiB:
// registers (4 or 8 vectors a thread: 64 or 128 KiB an SM) and up to 224 KiB of shared memory per SM. One
// launch, x read once:
//   - the block's run beyond its registers goes to shared memory in slots (4-64 KiB): bulk copies
//     (`cp.async.bulk`, one mbarrier a slot) issued by thread 0 or by one lane of several warps, optionally
//     after every thread asks L2 for the lines (`prefetch.global.L2`), or every thread `cp.async`s the vectors
//     it will read (one group a slot); every thread loads its register vectors; the amax takes each slot as
//     it lands;
//   - block amax -> one partial per block, one grid barrier (a counter that only grows, so no reset; the
//     barrier spins, so it needs every block resident: one block per SM on an otherwise idle device),
//     every block reduces all partials (same amax everywhere);
//   - the cast from registers and shared memory, x never read again (or no cast: the read phase alone).
// Standalone (no library): bf16 -> e4m3, against the library's two-pass shape rebuilt here (memset, amax
// over 2 x 512-thread runs an SM, the cast of the same runs last to first with streaming hints). Timed as
// the library's benchmark times: batches of back-to-back calls between CUDA events, inputs rotated over
// copies that reach 3x L2, median batch. Per-phase times of the fused kernel from %globaltimer stamps
// (first block start, last block's amax done, last block past the barrier, last block done).
// y and amax are checked against the host for every mode (amax only where there is no cast). One JSON
// record per line.
// Record: bench/results/2026-12-04-nvidia-h200-qcs-on-chip.md (not adopted).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_check.h"
#include "qcs_bf16.cuh"

namespace {

constexpr int kThreads = 1024;
constexpr int kRegVecs = 4;                       // 16-byte vectors a thread holds in registers

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ float block_max(float m) {
  __shared__ float part[32];
  for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  __syncthreads();  // part[] may still be read by an earlier call of this function
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = m;
  __syncthreads();
  m = (threadIdx.x & 31) < blockDim.x / 32 ? part[threadIdx.x & 31] : 0.0f;
  for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  return m;  // every thread
}

struct Run {
  long long begin, count;
};
__device__ __forceinline__ Run run_of(long long nvec) {
  const long long g = gridDim.x, b = blockIdx.x, per = nvec / g, rem = nvec % g;
  return {b * per + (b < rem ? b : rem), per + (b < rem ? 1 : 0)};
}

// ---- the fused kernel --------------------------------------------------------------------------------------
// How the part of the run beyond the registers reaches shared memory.
enum Load { kBulk = 0, kCpAsync = 1 };
constexpr int kMaxSharedVecs = 14 * 1024;  // 224 KiB
constexpr int kMaxBars = 64;

__device__ __forceinline__ void cp_async_wait(int pending) {
  switch (pending) {  // cp.async.wait_group takes an immediate
    case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;" ::: "memory"); break;
    case 6: asm volatile("cp.async.wait_group 6;" ::: "memory"); break;
    case 7: asm volatile("cp.async.wait_group 7;" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 8;" ::: "memory"); break;
  }
}

// kSlot: vectors a slot (one mbarrier or one cp.async group each); kRV: vectors a thread holds in registers. kWriteY false: the cast is left out (no y,
// nothing for the next call to write back; for timing the read phase only).
template <int kLoad, int kSlot, bool kWriteY = true, bool kMultiIssue = false, bool kPrefetch = false,
          int kRV = kRegVecs>
__global__ void __launch_bounds__(kThreads, 1)
    fused_kernel(const uint4* __restrict__ x, uint2* __restrict__ y, long long nvec, unsigned* partials,
                 unsigned* counter, unsigned* amax_out, unsigned long long* stamps) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) unsigned long long bar[kMaxBars];
  constexpr int kBlockRV = kThreads * kRV;  // vectors the block holds in registers
  const unsigned long long t0 = now_ns();
  const Run r = run_of(nvec);
  const long long smem_vecs = r.count > kBlockRV ? r.count - kBlockRV : 0;
  const int slots = static_cast<int>((smem_vecs + kSlot - 1) / kSlot);
  uint4* sx = reinterpret_cast<uint4*>(smem);
  const uint4* xs = x + r.begin + kBlockRV;  // the shared-memory part
  if (kPrefetch)  // every thread asks L2 for lines of the shared-memory part (the load path, many in flight)
    for (long long i = static_cast<long long>(threadIdx.x) * 8; i < smem_vecs; i += kThreads * 8)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(xs + i));
  auto issue = [&](int s) {
    const long long left = smem_vecs - static_cast<long long>(s) * kSlot;
    const unsigned bytes = static_cast<unsigned>((left < kSlot ? left : kSlot) * 16);
    const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(&bar[s]));
    const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(sx + static_cast<long long>(s) * kSlot));
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(a), "r"(bytes) : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(d),
        "l"(xs + static_cast<long long>(s) * kSlot), "r"(bytes), "r"(a)
        : "memory");
  };
  if (kLoad == kBulk && threadIdx.x == 0) {
    for (int s = 0; s < slots; ++s) {
      const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(&bar[s]));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(a));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    if (!kMultiIssue)
      for (int s = 0; s < slots; ++s) issue(s);
  }
  if (kLoad == kBulk && kMultiIssue) {  // lane 0 of warp s issues slot s (and s + 32, ...)
    __syncthreads();
    if ((threadIdx.x & 31) == 0)
      for (int s = threadIdx.x >> 5; s < slots; s += kThreads / 32) issue(s);
  }
  uint4 v[kRV];
#pragma unroll
  for (int k = 0; k < kRV; ++k) {
    const long long i = threadIdx.x + static_cast<long long>(k) * kThreads;
    v[k] = i < r.count ? __ldcs(x + r.begin + i) : make_uint4(0, 0, 0, 0);
  }
  if (kLoad == kCpAsync) {  // each thread copies the vectors it will read itself; one group a slot
    for (int s = 0; s < slots; ++s) {
      const long long end = min(static_cast<long long>(s + 1) * kSlot, smem_vecs);
      for (long long i = static_cast<long long>(s) * kSlot + threadIdx.x; i < end; i += kThreads) {
        const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(sx + i));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(xs + i) : "memory");
      }
      asm volatile("cp.async.commit_group;" ::: "memory");
    }
  }
  if (kLoad == kBulk) __syncthreads();  // the mbarriers are initialised before anyone waits on them
  float m = 0.0f;
#pragma unroll
  for (int k = 0; k < kRV; ++k) m = fmaxf(m, amax8(v[k]));
  for (int s = 0; s < slots; ++s) {
    if (kLoad == kBulk) {
      const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(&bar[s]));
      unsigned done = 0;
      while (!done)
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n selp.u32 %0, 1, 0, p;\n}"
            : "=r"(done)
            : "r"(a)
            : "memory");
    } else {
      cp_async_wait(slots - 1 - s);
    }
    const long long end = min(static_cast<long long>(s + 1) * kSlot, smem_vecs);
    for (long long i = static_cast<long long>(s) * kSlot + threadIdx.x; i < end; i += kThreads)
      m = fmaxf(m, amax8(sx[i]));
  }
  m = block_max(m);
  unsigned long long t1 = 0;
  if (threadIdx.x == 0) {
    t1 = now_ns();
    __stcg(partials + blockIdx.x, __float_as_uint(m));
    __threadfence();
    const unsigned old = atomicAdd(counter, 1u);
    const unsigned target = (old / gridDim.x + 1) * gridDim.x;
    unsigned seen;
    do {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
    } while (static_cast<int>(seen - target) < 0);
  }
  __syncthreads();
  float g = 0.0f;
  for (int b = threadIdx.x; b < gridDim.x; b += kThreads) g = fmaxf(g, __uint_as_float(__ldcg(partials + b)));
  g = block_max(g);
  const unsigned long long t2 = now_ns();
  const float scale = g > 0.0f ? 448.0f / g : 1.0f;
  if (kWriteY) {
#pragma unroll
    for (int k = 0; k < kRV; ++k) {
      const long long i = threadIdx.x + static_cast<long long>(k) * kThreads;
      if (i < r.count) y[r.begin + i] = cast8(v[k], scale);
    }
    for (long long i = threadIdx.x; i < smem_vecs; i += kThreads) y[r.begin + kBlockRV + i] = cast8(sx[i], scale);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned long long t3 = now_ns();
    stamps[4 * blockIdx.x + 0] = t0;
    stamps[4 * blockIdx.x + 1] = t1;
    stamps[4 * blockIdx.x + 2] = t2;
    stamps[4 * blockIdx.x + 3] = t3;
    if (blockIdx.x == 0) *amax_out = __float_as_uint(g);
  }
}

// ---- the two-pass shape (the library's up to 32 MiB) --------------------------------------------------------
__global__ void __launch_bounds__(512) amax_runs(const uint4* __restrict__ x, long long nvec, unsigned* amax_bits) {
  const Run r = run_of(nvec);
  float m = 0.0f;
  long long i = threadIdx.x;
  for (; i + 3 * 512 < r.count; i += 4 * 512) {
    uint4 w[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) w[u] = __ldg(x + r.begin + i + u * 512);
#pragma unroll
    for (int u = 0; u < 4; ++u) m = fmaxf(m, amax8(w[u]));
  }
  for (; i < r.count; i += 512) m = fmaxf(m, amax8(__ldg(x + r.begin + i)));
  m = block_max(m);
  if (threadIdx.x == 0) atomicMax(amax_bits, __float_as_uint(m));
}

__global__ void __launch_bounds__(512)
    cast_runs(const uint4* __restrict__ x, uint2* __restrict__ y, long long nvec, const unsigned* amax_bits) {
  const float amax = __uint_as_float(*amax_bits);
  const float s = amax > 0.0f ? 448.0f / amax : 1.0f;
  const Run r = run_of(nvec);
  const long long e = r.begin + r.count;
  long long k = threadIdx.x;
  for (; k + 3 * 512 < r.count; k += 4 * 512) {
    uint4 w[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) w[u] = __ldcs(x + e - 1 - (k + u * 512));
#pragma unroll
    for (int u = 0; u < 4; ++u) __stcs(y + e - 1 - (k + u * 512), cast8(w[u], s));
  }
  for (; k < r.count; k += 512) __stcs(y + e - 1 - k, cast8(__ldcs(x + e - 1 - k), s));
}

}  // namespace

struct Mode {
  const char* name;
  void (*kernel)(const uint4*, uint2*, long long, unsigned*, unsigned*, unsigned*, unsigned long long*);
  int what;  // 0: fused, 1: two-pass, 2: amax alone (memset + amax_runs), 3: fused without the cast (no y)
  int reg_vecs = kRegVecs;  // the fused kernel's vectors a thread in registers
};

int main(int argc, char** argv) {
  const unsigned seed = 20261205;
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 15;
  const int calls = 20;
  std::fprintf(stderr, "seed %u\n", seed);
  int nsm = 0, l2 = 0, smem_optin = 0;
  CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  CK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  std::fprintf(stderr, "SMs %d, L2 %d B, shared memory per block up to %d B\n", nsm, l2, smem_optin);
  const Mode modes[] = {
      {"fused_bulk_16k", fused_kernel<kBulk, 1024>, 0},
      {"fused_bulk_4k", fused_kernel<kBulk, 256>, 0},
      {"fused_bulk_64k", fused_kernel<kBulk, 4096>, 0},
      {"fused_cp_async_16k", fused_kernel<kCpAsync, 1024>, 0},
      {"fused_cp_async_32k", fused_kernel<kCpAsync, 2048>, 0},
      {"fused_bulk_64k_no_y", fused_kernel<kBulk, 4096, false>, 3},
      {"fused_bulk_16k_multi_issue", fused_kernel<kBulk, 1024, true, true>, 0},
      {"fused_bulk_64k_multi_issue", fused_kernel<kBulk, 4096, true, true>, 0},
      {"fused_bulk_64k_prefetch", fused_kernel<kBulk, 4096, true, false, true>, 0},
      {"fused_bulk_16k_prefetch", fused_kernel<kBulk, 1024, true, false, true>, 0},
      {"fused_bulk_64k_prefetch_no_y", fused_kernel<kBulk, 4096, false, false, true>, 3},
      {"fused_bulk_64k_8_reg_vecs", fused_kernel<kBulk, 4096, true, false, false, 8>, 0, 8},
      {"fused_bulk_64k_8_reg_vecs_no_y", fused_kernel<kBulk, 4096, false, false, false, 8>, 3, 8},
      {"two_pass_runs", nullptr, 1},
      {"amax_runs_alone", nullptr, 2},
  };
  const int nmodes = sizeof(modes) / sizeof(modes[0]);
  const int max_dyn = kMaxSharedVecs * 16;
  for (const Mode& md : modes) {
    if (!md.kernel) continue;
    CK(cudaFuncSetAttribute(md.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_dyn));
    // The grid barrier spins: every block of the grid must be resident at once.
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, md.kernel, kThreads, max_dyn));
    if (per_sm < 1) {
      std::fprintf(stderr, "%s: one block an SM does not fit\n", md.name);
      return 1;
    }
  }
  unsigned *partials = nullptr, *counter = nullptr, *amax_bits = nullptr;
  unsigned long long* stamps = nullptr;
  CK(cudaMalloc(&partials, nsm * sizeof(unsigned)));
  CK(cudaMalloc(&counter, sizeof(unsigned)));
  CK(cudaMalloc(&amax_bits, sizeof(unsigned)));
  CK(cudaMalloc(&stamps, 4 * nsm * sizeof(unsigned long long)));
  CK(cudaMemset(counter, 0, sizeof(unsigned)));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (long long n : {1LL << 23, 1LL << 24, (1LL << 24) + (1LL << 20)}) {
    const long long nvec = n / 8;
    const long long per_block = (nvec + nsm - 1) / nsm;
    if (per_block > kThreads * kRegVecs + kMaxSharedVecs) {  // (the 4-vector modes hold the least)
      std::fprintf(stderr, "n %lld does not fit on chip\n", n);
      continue;
    }
    const HostCase hc = host_case(n, seed + static_cast<unsigned>(n % 1000003));
    const std::vector<__nv_bfloat16>& h = hc.x;
    const float want = hc.amax;
    const std::vector<unsigned char>& want_y = hc.y;
    const int copies = static_cast<int>(std::min<long long>(16, (3LL * l2) / (n * 3) + 2));
    std::vector<uint4*> xs(copies);
    std::vector<uint2*> ys(copies);
    for (int c = 0; c < copies; ++c) {
      CK(cudaMalloc(&xs[c], n * 2));
      CK(cudaMalloc(&ys[c], n));
      CK(cudaMemcpy(xs[c], h.data(), n * 2, cudaMemcpyHostToDevice));
    }
    auto call = [&](const Mode& md, int c) {
      if (md.what == 0 || md.what == 3) {
        const long long smem_vecs = std::max(0LL, per_block - static_cast<long long>(kThreads) * md.reg_vecs);
        const int dyn = static_cast<int>(smem_vecs * 16);
        md.kernel<<<nsm, kThreads, dyn>>>(xs[c], ys[c], nvec, partials, counter, amax_bits, stamps);
      } else {
        CK(cudaMemsetAsync(amax_bits, 0, sizeof(unsigned)));
        amax_runs<<<2 * nsm, 512>>>(xs[c], nvec, amax_bits);
        if (md.what == 1) cast_runs<<<2 * nsm, 512>>>(xs[c], ys[c], nvec, amax_bits);
      }
    };
    std::vector<std::vector<float>> t(nmodes);
    std::vector<std::vector<double>> ph(3 * nmodes);
    int next = 0;
    for (int r = 0; r < rounds + 2; ++r) {
      for (int m = 0; m < nmodes; ++m) {
        const Mode& md = modes[m];
        CK(cudaEventRecord(e0));
        for (int k = 0; k < calls; ++k) call(md, next++ % copies);
        CK(cudaEventRecord(e1));
        CK(cudaGetLastError());
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 2) t[m].push_back(ms * 1000 / calls);
        if ((md.what == 0 || md.what == 3) && r >= 2) {  // the last call's phases
          std::vector<unsigned long long> st(4 * nsm);
          CK(cudaMemcpy(st.data(), stamps, st.size() * 8, cudaMemcpyDeviceToHost));
          unsigned long long a = ~0ULL, b = 0, c2 = 0, d = 0;
          for (int i = 0; i < nsm; ++i) {
            a = std::min(a, st[4 * i]);
            b = std::max(b, st[4 * i + 1]);
            c2 = std::max(c2, st[4 * i + 2]);
            d = std::max(d, st[4 * i + 3]);
          }
          ph[3 * m + 0].push_back((b - a) / 1e3);
          ph[3 * m + 1].push_back((c2 - b) / 1e3);
          ph[3 * m + 2].push_back((d - c2) / 1e3);
        }
        if (r == 0) {
          CK(cudaDeviceSynchronize());
          const int c = (next - 1) % copies;
          unsigned got_bits = 0;
          CK(cudaMemcpy(&got_bits, amax_bits, 4, cudaMemcpyDeviceToHost));
          float got_amax;
          std::memcpy(&got_amax, &got_bits, 4);
          long long bad = 0, first = -1;
          std::vector<unsigned char> got(n);
          if (md.what < 2) {
            CK(cudaMemcpy(got.data(), ys[c], n, cudaMemcpyDeviceToHost));
            for (long long i = 0; i < n; ++i)
              if (got[i] != want_y[i]) {
                if (first < 0) first = i;
                ++bad;
              }
          }
          if (got_amax != want || bad != 0) {
            std::fprintf(stderr, "MISMATCH %s n %lld amax %g want %g: %lld bytes differ, first at %lld\n", md.name, n,
                         got_amax, want, bad, first);
            return 1;
          }
        }
      }
    }
    auto med = [](std::vector<float> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    auto medd = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    for (int m = 0; m < nmodes; ++m) {
      std::printf("{\"experiment\":\"qcs_on_chip\",\"mode\":\"%s\",\"dtype\":\"bf16\",\"n\":%lld,\"median_us\":%.2f,"
                  "\"min_us\":%.2f,\"calls_per_batch\":%d,\"rounds\":%d,\"copies\":%d,\"seed\":%u",
                  modes[m].name, n, med(t[m]), *std::min_element(t[m].begin(), t[m].end()), calls, rounds, copies,
                  seed);
      if (modes[m].what == 0 || modes[m].what == 3)
        std::printf(",\"read_amax_us\":%.2f,\"barrier_us\":%.2f,\"cast_us\":%.2f", medd(ph[3 * m]),
                    medd(ph[3 * m + 1]), medd(ph[3 * m + 2]));
      std::printf("}\n");
    }
    std::fflush(stdout);
    for (int c = 0; c < copies; ++c) {
      CK(cudaFree(xs[c]));
      CK(cudaFree(ys[c]));
    }
  }
  return 0;
}
