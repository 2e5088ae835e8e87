// The HIP build's <cub/block/block_reduce.cuh>: CUB's names over rocPRIM (core/hip/cub_on_rocprim.h).
#pragma once

#include "core/hip/cub_on_rocprim.h"
