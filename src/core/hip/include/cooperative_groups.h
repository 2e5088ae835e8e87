// The HIP build's <cooperative_groups.h> (see cuda_runtime.h here): HIP's cooperative groups, whose
// namespace is also cooperative_groups (this_grid().sync() of a cooperative launch).
#pragma once

#include <hip/hip_runtime.h>
#include <hip/hip_cooperative_groups.h>
