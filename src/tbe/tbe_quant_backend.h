// What a backend implements for tbe_quant.h. tbe/tbe_quant.cpp validates every host-side argument
// (dtypes, shapes, the packed buffer's size, the output, which memory each pointer is in) before calling
// it; the backend checks the offsets and indices according to args.bounds_check, as for the training
// forward (tbe/tbe_backend.h). The CUDA row quantizer is two steps so that the entry point can read the
// check's verdict back before anything is written.
#pragma once

#include <cstdint>

#include "embscale/tbe_quant.h"

namespace embscale {
namespace cpu {
Status tbe_quant_forward(const Context& ctx, const QuantizedTableBatchedEmbedding& tbe,
                         const QuantTbeForwardArgs& args);
}  // namespace cpu

#if EMBSCALE_WITH_CUDA
namespace cuda {
Status tbe_quant_forward(const Context& ctx, const QuantizedTableBatchedEmbedding& tbe,
                         const QuantTbeForwardArgs& args);
// Enqueues the check of every row of rows ([E, D] fp32, E >= 1): the smallest key r * (D + 1) + c over a
// non-finite column c of row r, and r * (D + 1) + D over an int row whose min or scale overflows fp16
// (tbe/quant_rows.h's int_row_scale), stored as ~key by an atomic max into *verdict (0 before: none).
// Refuses a stream that is being captured (the entry point reads the verdict back).
Status quantize_rows_check(const Context& ctx, QuantWeightType type, const TensorView& rows, int64_t* verdict);
// Enqueues the rows' bytes (checked rows) into out, row_bytes apart; out is zero, so padding stays 0.
Status quantize_rows_write(const Context& ctx, QuantWeightType type, const TensorView& rows, int64_t row_bytes,
                           void* out);
}  // namespace cuda
#endif
}  // namespace embscale
