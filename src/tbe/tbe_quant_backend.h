// What a backend implements for tbe_quant.h. tbe/tbe_quant.cpp validates every host-side argument
// (dtypes, shapes, the packed buffer's size, the output) before calling it; the backend checks the
// offsets and indices according to args.bounds_check, as for the training forward (tbe/tbe_backend.h).
// Only the CPU has one; the CUDA kernel is not written yet (docs/tbe_quant.md).
#pragma once

#include "embscale/tbe_quant.h"

namespace embscale {
namespace cpu {
Status tbe_quant_forward(const Context& ctx, const QuantizedTableBatchedEmbedding& tbe,
                         const QuantTbeForwardArgs& args);
}  // namespace cpu
}  // namespace embscale
