// EMBSCALE_HD marks math written once for both backends: __host__ __device__ under nvcc and hipcc,
// plain inline C++ elsewhere.
#pragma once

#if defined(__HIPCC__)
#include <hip/hip_runtime.h>  // __host__, __device__, __forceinline__
#endif

#if defined(__CUDACC__) || defined(__HIPCC__)
#define EMBSCALE_HD __host__ __device__ __forceinline__
#else
#define EMBSCALE_HD inline
#endif
