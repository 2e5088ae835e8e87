// What each backend implements for tbe.h. api/tbe.cpp validates everything that lives on the host
// (null pointers, dtypes, shapes: offsets has T*B+1 entries of the indices' dtype, output shape and
// dtype, per-sample weights only for pooled or sequence modes as documented) before calling these.
// Values in backend memory (offsets monotone, last offset == N, indices in [0, E)) are checked by
// the backend according to args.bounds_check, since only the backend can read them cheaply.
#pragma once

#include <string>
#include <vector>

#include "embscale/tbe.h"

namespace embscale {

namespace cpu {
Status tbe_forward(const Context& ctx, const TableBatchedEmbedding& tbe, const TbeForwardArgs& args);
Status tbe_backward_workspace_size(const TableBatchedEmbedding& tbe, const TbeBackwardArgs& args, size_t* bytes);
Status tbe_backward(const Context& ctx, const TableBatchedEmbedding& tbe, const TbeBackwardArgs& args, void* ws,
                    size_t ws_bytes);
}  // namespace cpu

#if EMBSCALE_WITH_CUDA
namespace cuda {
Status tbe_forward(const Context& ctx, const TableBatchedEmbedding& tbe, const TbeForwardArgs& args);

// Tuning knobs of the CUDA forward, for benchmarks and tests (not part of the public API). Read once,
// at the first forward call, from EMBSCALE_TBE_FWD_VARIANT (a name of tbe_forward_variant_names()),
// EMBSCALE_TBE_FWD_ORDER (tile | feature) and EMBSCALE_TBE_FWD_BAGS (1..64), unless set before.
struct TbeForwardTuning {
  std::string variant = "default";  // kernel shape for pooled fp32 weights and output, int64 indices
  bool feature_inner = false;       // grid (features, bag tiles) instead of (bag tiles, features)
  int bags_per_group = 1;           // bags each lane group walks (the grid shrinks by this factor)
};
std::vector<std::string> tbe_forward_variant_names();  // "default" first
// The tuning in effect; an invalid environment value is an invalid_argument naming the variable.
Status tbe_forward_tuning(TbeForwardTuning* out);
Status set_tbe_forward_tuning(const TbeForwardTuning& t);
}  // namespace cuda
#endif

}  // namespace embscale
