// Device intrinsics of CUDA that the kernels use and the packaged HIP lacks, written for AMD GPUs (HIP
// build only; included by this folder's cuda_runtime.h). Cache hints that AMD has no equal of are
// dropped (a plain access); the cross-block read (__ldcg) is an atomic load, which bypasses the
// non-coherent L1 as CUDA's does.
#pragma once

#include <hip/hip_runtime.h>

#include <cstdint>

// Loads and stores with cache hints: streaming (__ldcs, __stcs) as plain accesses; __ldcg, which reads
// what other blocks of the same kernel wrote, at device coherence.
template <typename T>
__device__ __forceinline__ T __ldcs(const T* p) {
  return *p;
}
template <typename T>
__device__ __forceinline__ void __stcs(T* p, T v) {
  *p = v;
}
__device__ __forceinline__ uint32_t __ldcg(const uint32_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }

// Per 16-bit half of a 32-bit word: unsigned max, and 0xffff where a > b (CUDA's SIMD video intrinsics).
__device__ __forceinline__ uint32_t __vmaxu2(uint32_t a, uint32_t b) {
  const uint32_t lo = (a & 0xffffu) > (b & 0xffffu) ? (a & 0xffffu) : (b & 0xffffu);
  const uint32_t hi = (a >> 16) > (b >> 16) ? (a >> 16) : (b >> 16);
  return lo | (hi << 16);
}
__device__ __forceinline__ uint32_t __vcmpgtu2(uint32_t a, uint32_t b) {
  const uint32_t lo = (a & 0xffffu) > (b & 0xffffu) ? 0xffffu : 0u;
  const uint32_t hi = (a >> 16) > (b >> 16) ? 0xffff0000u : 0u;
  return lo | hi;
}

// Stops the kernel with an error.
__device__ __forceinline__ void __trap() { __builtin_trap(); }
