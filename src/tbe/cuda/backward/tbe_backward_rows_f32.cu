// Explicit instantiation of the TBE backward row launchers for fp32 weights (see tbe_backward_launch.cuh).
#include "tbe/cuda/backward/tbe_backward_rows.cuh"

EMBSCALE_TBE_BACKWARD_INSTANTIATE(float)
