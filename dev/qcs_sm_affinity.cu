// Does the cast of quantize_current_scaling read x from L2 if each SM casts the part of x it read for the
// amax? The H200's L2 is two partitions, each caching for the SMs beside it; when the cast's blocks land on
// other SMs than the amax's blocks that read the same bytes, the second read may miss. Standalone (no
// library): bf16 -> e4m3, amax pass then cast pass over chunks of x, one chunk per block, with
//   - amax:  one block per chunk; block 0..C-1 records which chunk its SM read (sm_chunk[%smid]);
//   - cast:  each block first claims the chunk its SM read ("same"), another SM's chunk ("other": the
//            chunk recorded half the SM ids away) or its own block index ("block"), then claims whatever
//            is left; every chunk is cast exactly once (claim flags reset by the amax pass).
// Timed per call (CUDA events around amax and cast), L2 refilled with other clean data (a 256 MiB read)
// before each call, modes alternated per round. y is checked against the host for every mode. One JSON record per line.
// Record: bench/results/2026-12-04-nvidia-h200-qcs-sm-runs.md (what the library took from it:
// Fp8Policy::kQcsRunsMaxBytes).
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_check.h"
#include "qcs_bf16.cuh"

namespace {

__device__ __forceinline__ unsigned sm_id() {
  unsigned r;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
  return r;
}

constexpr int kMaxSm = 1024;

struct Chunks {
  size_t nvec;  // 16-byte vectors of x (8 bf16)
  int count;
  __device__ size_t begin(int c) const { return nvec * c / count; }
  __device__ size_t end(int c) const { return nvec * (c + 1) / count; }
};

// The block's maximum of every thread's m, folded into *amax_bits with one atomicMax (non-negative floats
// order like their bits).
__device__ __forceinline__ void block_amax_to(unsigned* amax_bits, float m) {
  for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  __shared__ float part[32];
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x < 32) {
    m = threadIdx.x < blockDim.x / 32 ? part[threadIdx.x] : 0.0f;
    for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (threadIdx.x == 0) atomicMax(amax_bits, __float_as_uint(m));
  }
}

template <int U>
__global__ void amax_kernel(const uint4* __restrict__ x, Chunks ch, unsigned* amax_bits, int* sm_chunk, int* claims,
                            int* cursor) {
  const int c = blockIdx.x;
  if (threadIdx.x == 0) {
    sm_chunk[sm_id() % kMaxSm] = c;
    claims[c] = 0;
    if (c == 0) *cursor = 0;
  }
  const size_t b = ch.begin(c), e = ch.end(c);
  float m = 0.0f;
  size_t i = b + threadIdx.x;
  for (; i + (U - 1) * blockDim.x < e; i += U * blockDim.x) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = __ldg(x + i + u * blockDim.x);
#pragma unroll
    for (int u = 0; u < U; ++u) m = fmaxf(m, amax8(v[u]));
  }
  for (; i < e; i += blockDim.x) m = fmaxf(m, amax8(__ldg(x + i)));
  block_amax_to(amax_bits, m);
}

enum Pick { kSame = 0, kOther = 1, kBlock = 2 };

template <int U, bool kReverse, bool kStreamStore>
__global__ void cast_kernel(const uint4* __restrict__ x, uint2* __restrict__ y, Chunks ch, const unsigned* amax_bits,
                            const int* sm_chunk, int* claims, int* cursor, int pick, int nsm) {
  const float amax = __uint_as_float(*amax_bits);
  const float s = amax > 0.0f ? 448.0f / amax : 1.0f;
  __shared__ int chunk;
  if (threadIdx.x == 0) {
    int p = blockIdx.x;
    if (pick == kSame) p = sm_chunk[sm_id() % kMaxSm];
    if (pick == kOther) p = sm_chunk[(sm_id() + nsm / 2) % nsm];
    chunk = (p >= 0 && p < ch.count && atomicCAS(&claims[p], 0, 1) == 0) ? p : -1;
  }
  __syncthreads();
  for (;;) {
    int c = chunk;
    if (c >= 0) {
      const size_t b = ch.begin(c), e = ch.end(c), n = e - b;
      // k-th vector of the walk: forward b+k, reverse e-1-k
      size_t k = threadIdx.x;
      for (; k + (U - 1) * blockDim.x < n; k += U * blockDim.x) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const size_t j = kReverse ? e - 1 - (k + u * blockDim.x) : b + k + u * blockDim.x;
          v[u] = __ldcs(x + j);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const size_t j = kReverse ? e - 1 - (k + u * blockDim.x) : b + k + u * blockDim.x;
          const uint2 q = cast8(v[u], s);
          if (kStreamStore) __stcs(y + j, q); else y[j] = q;
        }
      }
      for (; k < n; k += blockDim.x) {
        const size_t j = kReverse ? e - 1 - k : b + k;
        const uint2 q = cast8(__ldcs(x + j), s);
        if (kStreamStore) __stcs(y + j, q); else y[j] = q;
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int got = -1;
      for (;;) {
        const int k = atomicAdd(cursor, 1);
        if (k >= ch.count) break;
        if (atomicCAS(&claims[k], 0, 1) == 0) {
          got = k;
          break;
        }
      }
      chunk = got;
    }
    __syncthreads();
    if (chunk < 0) break;
  }
}

// The baseline's shape: many blocks, each a contiguous run, grid-sized to 4 blocks of 512 per SM (cast in
// reverse), the amax as a grid-stride loop of 4 blocks of 512 per SM.
__global__ void amax_grid(const uint4* __restrict__ x, size_t nvec, unsigned* amax_bits) {
  float m = 0.0f;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < nvec; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = __ldg(x + i + u * stride);
#pragma unroll
    for (int u = 0; u < 4; ++u) m = fmaxf(m, amax8(v[u]));
  }
  for (; i < nvec; i += stride) m = fmaxf(m, amax8(__ldg(x + i)));
  block_amax_to(amax_bits, m);
}

// Leaves L2 holding clean lines of another buffer (a memset would leave it dirty, and the next kernel would
// pay for writing them back).
__global__ void flush_read(const uint4* __restrict__ p, size_t nvec, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < nvec; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcg(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

struct Mode {
  const char* name;
  int amax_threads;  // 0: amax_grid, -1: no amax (the cast alone, x cold; amax from the call before)
  int chunks_per_sm;
  int cast_threads;
  int pick;
  bool reverse, stream_store;
};

}  // namespace

int main(int argc, char** argv) {
  const unsigned seed = 20261204;
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 15;
  std::fprintf(stderr, "seed %u\n", seed);
  int nsm = 0, l2 = 0;
  CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
  std::fprintf(stderr, "SMs %d, L2 %d B\n", nsm, l2);
  const Mode modes[] = {
      {"grid_amax+block_cast_rev", 0, 4, 512, kBlock, true, true},
      {"cold_cast_only", -1, 1, 1024, kBlock, true, true},
      {"same_sm_rev_cs", 1024, 1, 1024, kSame, true, true},
      {"other_sm_rev_cs", 1024, 1, 1024, kOther, true, true},
      {"block_rev_cs", 1024, 1, 1024, kBlock, true, true},
      {"same_sm_fwd_cs", 1024, 1, 1024, kSame, false, true},
      {"same_sm_rev_st", 1024, 1, 1024, kSame, true, false},
      {"same_sm_2x512_rev_cs", 512, 2, 512, kSame, true, true},
      {"block_1x512_rev_cs", 512, 1, 512, kBlock, true, true},
      {"block_2x1024_rev_cs", 1024, 2, 1024, kBlock, true, true},
      {"block_2x512_rev_cs", 512, 2, 512, kBlock, true, true},
      {"block_4x512_rev_cs", 512, 4, 512, kBlock, true, true},
      {"block_8x256_rev_cs", 256, 8, 256, kBlock, true, true},
  };
  const int nmodes = sizeof(modes) / sizeof(modes[0]);
  void* flush = nullptr;
  const size_t flush_bytes = size_t{256} << 20;
  CK(cudaMalloc(&flush, flush_bytes));
  CK(cudaMemset(flush, 0x5a, flush_bytes));
  unsigned* sink = nullptr;
  CK(cudaMalloc(&sink, sizeof(unsigned)));
  unsigned* amax_bits = nullptr;
  int *sm_chunk = nullptr, *claims = nullptr, *cursor = nullptr;
  CK(cudaMalloc(&amax_bits, sizeof(unsigned)));
  CK(cudaMalloc(&sm_chunk, kMaxSm * sizeof(int)));
  CK(cudaMalloc(&claims, 8 * kMaxSm * sizeof(int)));
  CK(cudaMalloc(&cursor, sizeof(int)));
  CK(cudaMemset(sm_chunk, 0xff, kMaxSm * sizeof(int)));
  cudaEvent_t e0, e1, e2;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventCreate(&e2));
  for (int lg : {22, 23, 24, 25}) {
    const size_t n = size_t{1} << lg, nvec = n / 8;
    const HostCase hc = host_case(n, seed + lg);
    const std::vector<__nv_bfloat16>& h = hc.x;
    const float want = hc.amax;
    const std::vector<unsigned char>& want_y = hc.y;
    uint4* x = nullptr;
    uint2* y = nullptr;
    CK(cudaMalloc(&x, n * 2));
    CK(cudaMalloc(&y, n));
    CK(cudaMemcpy(x, h.data(), n * 2, cudaMemcpyHostToDevice));
    std::vector<std::vector<float>> t_amax(nmodes), t_cast(nmodes), t_all(nmodes);
    for (int r = 0; r < rounds + 2; ++r) {
      for (int m = 0; m < nmodes; ++m) {
        const Mode& md = modes[m];
        CK(cudaMemset(y, 0, n));
        flush_read<<<4 * nsm, 512>>>(static_cast<const uint4*>(flush), flush_bytes / 16, sink);
        if (md.amax_threads >= 0) CK(cudaMemsetAsync(amax_bits, 0, sizeof(unsigned)));
        const Chunks ch{nvec, md.chunks_per_sm * nsm};
        if (md.amax_threads <= 0) {  // the cast's claims and cursor, reset outside the timed calls
          CK(cudaMemsetAsync(claims, 0, ch.count * sizeof(int)));
          CK(cudaMemsetAsync(cursor, 0, sizeof(int)));
        }
        CK(cudaEventRecord(e0));
        if (md.amax_threads == 0) {
          amax_grid<<<4 * nsm, 512>>>(x, nvec, amax_bits);
        } else if (md.amax_threads > 0) {
          amax_kernel<4><<<ch.count, md.amax_threads>>>(x, ch, amax_bits, sm_chunk, claims, cursor);
        }
        CK(cudaEventRecord(e1));
        if (md.reverse && md.stream_store)
          cast_kernel<4, true, true><<<ch.count, md.cast_threads>>>(x, y, ch, amax_bits, sm_chunk, claims, cursor,
                                                                    md.pick, nsm);
        else if (md.reverse)
          cast_kernel<4, true, false><<<ch.count, md.cast_threads>>>(x, y, ch, amax_bits, sm_chunk, claims, cursor,
                                                                     md.pick, nsm);
        else
          cast_kernel<4, false, true><<<ch.count, md.cast_threads>>>(x, y, ch, amax_bits, sm_chunk, claims, cursor,
                                                                     md.pick, nsm);
        CK(cudaEventRecord(e2));
        CK(cudaGetLastError());
        CK(cudaEventSynchronize(e2));
        float a = 0, c = 0;
        CK(cudaEventElapsedTime(&a, e0, e1));
        CK(cudaEventElapsedTime(&c, e1, e2));
        if (r >= 2) {
          t_amax[m].push_back(a * 1000);
          t_cast[m].push_back(c * 1000);
          t_all[m].push_back((a + c) * 1000);
        }
        if (r == 0) {
          unsigned got_bits = 0;
          CK(cudaMemcpy(&got_bits, amax_bits, 4, cudaMemcpyDeviceToHost));
          std::vector<unsigned char> got(n);
          CK(cudaMemcpy(got.data(), y, n, cudaMemcpyDeviceToHost));
          float got_amax;
          std::memcpy(&got_amax, &got_bits, 4);
          if (got_amax != want || std::memcmp(got.data(), want_y.data(), n) != 0) {
            std::fprintf(stderr, "MISMATCH mode %s 2^%d amax %g want %g\n", md.name, lg, got_amax, want);
            return 1;
          }
        }
      }
    }
    auto med = [](std::vector<float> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    for (int m = 0; m < nmodes; ++m)
      std::printf(
          "{\"experiment\":\"qcs_sm_affinity\",\"mode\":\"%s\",\"dtype\":\"bf16\",\"n\":%zu,\"amax_us\":%.2f,"
          "\"cast_us\":%.2f,\"total_us\":%.2f,\"min_total_us\":%.2f,\"rounds\":%d,\"seed\":%u}\n",
          modes[m].name, n, med(t_amax[m]), med(t_cast[m]), med(t_all[m]),
          *std::min_element(t_all[m].begin(), t_all[m].end()), rounds, seed);
    CK(cudaFree(x));
    CK(cudaFree(y));
  }
  return 0;
}
