// The HIP build's <thrust/iterator/counting_iterator.h>: CUB's names over rocPRIM (core/hip/cub_on_rocprim.h).
#pragma once

#include "core/hip/cub_on_rocprim.h"
