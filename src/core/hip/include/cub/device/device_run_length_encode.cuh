// The HIP build's <cub/device/device_run_length_encode.cuh>: CUB's names over rocPRIM (core/hip/cub_on_rocprim.h).
#pragma once

#include "core/hip/cub_on_rocprim.h"
