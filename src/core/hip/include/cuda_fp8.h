// The HIP build's <cuda_fp8.h> (see cuda_runtime.h here). The packaged HIP has no fp8 type; the fp8
// casts of core/numerics.h take their software path on AMD (the hardware cvt is used from sm_89 on
// NVIDIA only), which computes the same function.
#pragma once

#include <hip/hip_runtime.h>
