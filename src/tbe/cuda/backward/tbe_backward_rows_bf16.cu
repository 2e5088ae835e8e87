// Explicit instantiation of the TBE backward row launchers for bf16 weights (see tbe_backward_launch.cuh).
#include "tbe/cuda/backward/tbe_backward_rows.cuh"

EMBSCALE_TBE_BACKWARD_INSTANTIATE(bf16_t)
