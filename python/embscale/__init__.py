"""embscale: memory-bound training kernels for PyTorch — table-batched embeddings with fused optimizers
and FP8 current scaling, on CPU and CUDA tensors.

Operators are registered as torch.ops.embscale.* (with fake implementations for torch.compile); the
modules and helpers below are the user-facing API.
"""

from . import ops  # registers torch.ops.embscale.*
from ._capi import Error, backend_available, version
from .fp8 import (activation_amax, amax, cast_transpose, compute_scale, dequantize, quantize,
                  quantize_current_scaling)
from .tbe import BoundsCheckWarning, TableBatchedEmbeddingBags
from .tbe_quant import QuantizedTableBatchedEmbeddingBags

__version__ = version()

__all__ = [
    "BoundsCheckWarning",
    "Error",
    "QuantizedTableBatchedEmbeddingBags",
    "TableBatchedEmbeddingBags",
    "activation_amax",
    "amax",
    "backend_available",
    "cast_transpose",
    "compute_scale",
    "dequantize",
    "quantize",
    "quantize_current_scaling",
    "version",
]
