// Explicit instantiations of the TBE forward launchers for fp16 weights (see tbe_forward_launch.cuh).
#include "tbe/cuda/forward/tbe_forward_instances.cuh"

EMBSCALE_TBE_FORWARD_INSTANTIATE(fp16_t)
