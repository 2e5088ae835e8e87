// The HIP build's <cuda_fp16.h> (see cuda_runtime.h here): HIP's half type and its conversions, which
// keep CUDA's names (__half2float, __float2half_rn, __ushort_as_half, __half22float2).
#pragma once

#include <hip/hip_fp16.h>
