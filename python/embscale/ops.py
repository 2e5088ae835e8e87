"""torch custom operators (torch.ops.embscale.*) over the C API.

These modules are the only code that sees torch types. Each operator takes tensors on one device (CPU or
CUDA), runs on the current CUDA stream for CUDA tensors, allocates its workspace through torch (so CUDA
graph capture and the caching allocator work), and has a fake (meta) implementation so torch.compile can
trace it. Inputs are made contiguous. Errors: TypeError for a dtype, ValueError for a shape, device or
value, IndexError for an index outside its table, NotImplementedError for what the build lacks; each
message names the argument.

The operators live in three modules, re-exported here under their names:
  _ops_common   dtype tables, argument checks, C descriptors, calls into the C API (no operators)
  _ops_fp8_out  FP8 current scaling writing given outputs (``*_out``), with TransformerEngine's ``noop_flag``;
                its ``_<op>_into`` functions are the only calls of the C library's FP8 operations
  _ops_fp8      the same returning new outputs: each allocates them and writes them with ``_<op>_into``
  _ops_tbe      table-batched embeddings: the registry of C objects (TbeHandle), tbe_forward,
                tbe_backward and tbe_dense_grad
"""

from ._ops_common import FLOAT_DTYPES, FP8_DTYPES, INDEX_DTYPES
from ._ops_fp8 import (activation_amax, amax, amax_nonfinite, cast_transpose, compute_scale, dequantize, quantize,
                       quantize_current_scaling)
from ._ops_fp8_out import (activation_amax_out, amax_out, cast_transpose_out, compute_scale_out, dequantize_out,
                           quantize_current_scaling_out, quantize_out)
from ._ops_tbe import (HPARAM, HPARAM_FIELDS, MAX_STEP, TbeHandle, bump_versions, eager_call, real_tensors,
                       tbe_backward, tbe_backward_eager, tbe_dense_grad, tbe_dense_grad_eager, tbe_forward,
                       tbe_forward_eager, tbe_handle)

__all__ = ["FLOAT_DTYPES", "FP8_DTYPES", "INDEX_DTYPES", "HPARAM", "HPARAM_FIELDS", "MAX_STEP", "TbeHandle",
           "tbe_handle",
           "activation_amax", "amax", "amax_nonfinite", "cast_transpose", "compute_scale", "dequantize", "quantize",
           "quantize_current_scaling", "activation_amax_out", "amax_out", "cast_transpose_out", "compute_scale_out",
           "dequantize_out", "quantize_current_scaling_out", "quantize_out", "tbe_backward", "tbe_dense_grad", "tbe_forward"]
