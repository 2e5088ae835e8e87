// Tuning knobs of the CUDA TBE forward, for benchmarks and tests (not part of the public API); defined
// in tbe/cuda/forward/tbe_forward.cu. Read once, at the first forward call, from EMBSCALE_TBE_FWD_VARIANT (a name
// of tbe_forward_variant_names()), EMBSCALE_TBE_FWD_ORDER (tile | feature) and EMBSCALE_TBE_FWD_BAGS
// (0 = automatic, 1..64), unless set before by set_tbe_forward_tuning.
#pragma once

#include <string>
#include <vector>

#include "embscale/status.h"

namespace embscale {
#if EMBSCALE_WITH_CUDA
namespace cuda {

struct TbeForwardTuning {
  std::string variant = "default";  // kernel shape for pooled fp32 weights and output, int64 indices
  bool feature_inner = false;       // grid (features, bag tiles) instead of (bag tiles, features)
  // Bags each lane group walks (the grid shrinks by this factor); 0: automatic, 2 when the launch's
  // widest lane group is a whole warp (rows of 17 or more vectors), else 1.
  int bags_per_group = 0;
};

std::vector<std::string> tbe_forward_variant_names();  // "default" first
// The tuning in effect; an invalid environment value is an invalid_argument naming the variable.
Status tbe_forward_tuning(TbeForwardTuning* out);
// Replaces the tuning (and the environment's) for later calls; an unknown variant is refused.
Status set_tbe_forward_tuning(const TbeForwardTuning& t);

// The current device's L2 fetch granularity hint (cudaLimitMaxL2FetchGranularity, 0..128 bytes): how
// much the L2 may fetch from memory on a miss. A device-wide setting, so the library never changes it;
// the benchmarks expose it (--l2-fetch-bytes) to measure small gathered rows.
Status set_l2_fetch_granularity(int bytes);

}  // namespace cuda
#endif
}  // namespace embscale
