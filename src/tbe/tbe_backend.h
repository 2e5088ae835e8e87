// What each backend implements for tbe.h. tbe/tbe.cpp validates everything that lives on the host
// (null pointers, dtypes, shapes: offsets has T*B+1 entries of the indices' dtype, output shape and
// dtype, per-sample weights only for pooled or sequence modes as documented) before calling these.
// Values in backend memory (offsets monotone, last offset == N, indices in [0, E)) are checked by
// the backend according to args.bounds_check, since only the backend can read them cheaply.
#pragma once

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
Status tbe_backward_workspace_size(const TableBatchedEmbedding& tbe, const TbeBackwardArgs& args, size_t* bytes);
Status tbe_backward(const Context& ctx, const TableBatchedEmbedding& tbe, const TbeBackwardArgs& args, void* ws,
                    size_t ws_bytes);
}  // namespace cuda
#endif

}  // namespace embscale
