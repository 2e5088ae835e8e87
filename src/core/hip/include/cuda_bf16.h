// The HIP build's <cuda_bf16.h> (see cuda_runtime.h here). The kernels convert bf16 in software
// (core/numerics.h), so nothing of CUDA's bf16 header is needed beyond the include.
#pragma once

#include <hip/hip_runtime.h>
