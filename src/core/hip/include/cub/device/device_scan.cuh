// The HIP build's <cub/device/device_scan.cuh>: CUB's names over rocPRIM (core/hip/cub_on_rocprim.h).
#pragma once

#include "core/hip/cub_on_rocprim.h"
