// The standalone current-scaling programs' input and host reference, and their element work on one 16-byte
// vector of 8 bf16 (the laboratory's
// own copy: the library's kernels take every dtype through src/fp8/cuda).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

// max |x| of the 8 values.
__device__ __forceinline__ float amax8(uint4 v) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
  float m = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = __bfloat1622float2(p[k]);
    m = fmaxf(m, fmaxf(fabsf(f.x), fabsf(f.y)));
  }
  return m;
}

// The 8 values times s, rounded to e4m3 (saturating to the finite range), in element order.
__device__ __forceinline__ uint2 cast8(uint4 v, float s) {
  const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
  unsigned short q[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    float2 f = __bfloat1622float2(p[k]);
    f.x *= s;
    f.y *= s;
    q[k] = __nv_cvt_float2_to_fp8x2(f, __NV_SATFINITE, __NV_E4M3);
  }
  return make_uint2(q[0] | (unsigned(q[1]) << 16), q[2] | (unsigned(q[3]) << 16));
}

// n bf16 values uniform in [-4, 4) from `seed`, their amax, and the e4m3 codes of current scaling (scale
// 448 / amax) computed on the host.
struct HostCase {
  std::vector<__nv_bfloat16> x;
  float amax = 0.0f;
  std::vector<unsigned char> y;
};

inline HostCase host_case(size_t n, unsigned seed) {
  HostCase c;
  c.x.resize(n);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  for (auto& v : c.x) {
    v = __float2bfloat16(dist(rng));
    c.amax = std::max(c.amax, std::fabs(__bfloat162float(v)));
  }
  c.y.resize(n);
  for (size_t i = 0; i < n; ++i)
    c.y[i] = __nv_cvt_float_to_fp8(__bfloat162float(c.x[i]) * (448.0f / c.amax), __NV_SATFINITE, __NV_E4M3);
  return c;
}
