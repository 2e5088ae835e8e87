// Other launch shapes of the CUDA TBE forward, measured against the library's (ForwardPolicy,
// src/tbe/cuda/forward/forward_policy.cuh) on the library's own grid sizing, bounds-check protocol and
// report (tbe_fwd::begin_forward and end_forward around the variant's kernel). Built only into the dev
// tools, never into libembscale.
#pragma once

#include <string>
#include <vector>

#include "embscale/context.h"
#include "embscale/status.h"
#include "embscale/tbe.h"

namespace embscale {
namespace dev {

// A compiled kernel shape. The variants are compiled for pooled fp32 weights and output with int64
// indices (the benchmark's headline case); any other call runs the library's kernels.
struct FwdVariant {
  const char* name;
  const char* what;
};
// "default" (the library's shape) first.
const std::vector<FwdVariant>& fwd_variants();
// The variant called `name`, or null.
const FwdVariant* find_fwd_variant(const std::string& name);

// How a forward is launched: a variant and the bags each lane group walks.
struct FwdLaunch {
  std::string variant = "default";
  int bags_per_group = 0;  // 1..64; 0: the policy's rule
};
// An unknown variant or bags_per_group outside 0..64 is an invalid_argument naming the field.
Status check_fwd_launch(const FwdLaunch& launch);

// The forward of `tbe` launched as `launch` (its arguments valid for TableBatchedEmbedding::forward).
Status variant_forward(const Context& ctx, const TableBatchedEmbedding& tbe, const TbeForwardArgs& args,
                       const FwdLaunch& launch);

// The current device's L2 fetch granularity hint (cudaLimitMaxL2FetchGranularity, 0..128 bytes): how
// much the L2 may fetch from memory on a miss. A device-wide setting the library never changes.
Status set_l2_fetch_granularity(int bytes);

}  // namespace dev
}  // namespace embscale
