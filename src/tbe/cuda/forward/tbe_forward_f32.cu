// Explicit instantiations of the TBE forward launchers for fp32 weights (see tbe_forward_launch.cuh).
#include "tbe/cuda/forward/tbe_forward_instances.cuh"

EMBSCALE_TBE_FORWARD_INSTANTIATE(float)
