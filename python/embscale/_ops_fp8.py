"""FP8 current-scaling operators (torch.ops.embscale.amax, compute_scale, quantize, dequantize,
quantize_current_scaling, activation_amax, cast_transpose, amax_nonfinite). Each checks its arguments and
allocates its outputs in one function, ``_<op>_outputs``, which is also its fake implementation (so
torch.compile and the meta device see the checks, shapes and dtypes of the real operator), then writes them
as its out= operator does: through that operator's C call, ``_<op>_into`` of _ops_fp8_out, the one path
from an FP8 operation into the C library.

Gradients (registered at the end of this file, so that eager autograd and torch.compile's traced backward
agree): amax values, non-finite flags, scales, fp8 codes and dequantized values are not differentiable,
as TransformerEngine's casts are not; those outputs never require grad, also for an input that does (an
nn.Parameter). The one exception is activation_amax's y = act(x), a real activation: its gradient is
grad_y * act'(x), computed in fp32 from x and rounded to x's dtype.
"""

from typing import Optional

import torch
from torch import Tensor

from . import _capi
from ._ops_common import (FLOAT_DTYPES, FP8_DTYPES, _check_backend, _check_dtype, _check_eps, _check_scalar,
                          _check_tensor, _lookup, _same_device)
from ._ops_fp8_out import (_activation_amax_into, _amax_into, _cast_transpose_into, _compute_scale_into,
                           _dequantize_into, _quantize_current_scaling_into, _quantize_into)


def _empty(x, dtype, shape=None):
    """A new contiguous output on x's device (a fake tensor in a fake implementation): `dtype`, x's shape or
    `shape` (() for a scalar)."""
    return torch.empty(x.shape if shape is None else shape, dtype=dtype, device=x.device)


def _scalar(x, dtype=torch.float32):
    """A new 0-dim output on x's device."""
    return _empty(x, dtype, ())


def _amax_outputs(x, algo="auto"):
    _check_tensor("x", x, FLOAT_DTYPES)
    _lookup(_capi.AMAX_ALGO, "algo", algo)
    return _scalar(x)


@torch.library.custom_op("embscale::amax", mutates_args=())
def amax(x: Tensor, algo: str = "auto") -> Tensor:
    """max |x| as a 0-dim fp32 tensor on x's device (NaN skipped, empty -> 0)."""
    out = _amax_outputs(x, algo)
    _check_backend(x.device)
    _amax_into(x, out, None, None, algo)
    return out


amax.register_fake(_amax_outputs)


def _compute_scale_outputs(amax, fp8_dtype, eps=0.0, power_of_2=False):
    _check_tensor("amax", amax, (torch.float32,))
    _check_dtype("fp8_dtype", fp8_dtype, FP8_DTYPES)
    _check_eps(eps)
    if amax.numel() != 1:
        raise ValueError(f"amax: has {amax.numel()} elements, expected 1")
    return _scalar(amax), _scalar(amax)


@torch.library.custom_op("embscale::compute_scale", mutates_args=())
def compute_scale(amax: Tensor, fp8_dtype: torch.dtype, eps: float = 0.0,
                  power_of_2: bool = False) -> tuple[Tensor, Tensor]:
    """(scale, scale_inv) from a 0-dim fp32 amax: scale = fp8_max / max(amax, eps), 1 for 0/inf/NaN."""
    scale, scale_inv = _compute_scale_outputs(amax, fp8_dtype, eps, power_of_2)
    _check_backend(amax.device)
    _compute_scale_into(amax, scale, scale_inv, fp8_dtype, None, eps, power_of_2)
    return scale, scale_inv


compute_scale.register_fake(_compute_scale_outputs)


def _quantize_outputs(x, scale, fp8_dtype):
    _check_tensor("x", x, FLOAT_DTYPES)
    _check_dtype("fp8_dtype", fp8_dtype, FP8_DTYPES)
    _check_scalar("scale", scale, _same_device(("x", x), ("scale", scale)))
    return _empty(x, fp8_dtype)


@torch.library.custom_op("embscale::quantize", mutates_args=())
def quantize(x: Tensor, scale: Tensor, fp8_dtype: torch.dtype) -> Tensor:
    """fp8(saturate(x * scale)), round-to-nearest-even, x's shape."""
    y = _quantize_outputs(x, scale, fp8_dtype)
    _check_backend(x.device)
    _quantize_into(x, scale, y, None)
    return y


quantize.register_fake(_quantize_outputs)


def _dequantize_outputs(y, scale_inv, out_dtype=torch.float32):
    _check_tensor("y", y, FP8_DTYPES)
    _check_dtype("out_dtype", out_dtype, FLOAT_DTYPES)
    _check_scalar("scale_inv", scale_inv, _same_device(("y", y), ("scale_inv", scale_inv)))
    return _empty(y, out_dtype)


@torch.library.custom_op("embscale::dequantize", mutates_args=())
def dequantize(y: Tensor, scale_inv: Tensor, out_dtype: torch.dtype = torch.float32) -> Tensor:
    """float(y) * scale_inv rounded to out_dtype, y's shape."""
    x = _dequantize_outputs(y, scale_inv, out_dtype)
    _check_backend(y.device)
    _dequantize_into(y, scale_inv, x, None)
    return x


dequantize.register_fake(_dequantize_outputs)


def _quantize_current_scaling_outputs(x, fp8_dtype, eps=0.0, power_of_2=False, algo="auto"):
    """(y, amax, scale, scale_inv)."""
    _check_tensor("x", x, FLOAT_DTYPES)
    _check_dtype("fp8_dtype", fp8_dtype, FP8_DTYPES)
    _check_eps(eps)
    _lookup(_capi.AMAX_ALGO, "algo", algo)
    return _empty(x, fp8_dtype), _scalar(x), _scalar(x), _scalar(x)


@torch.library.custom_op("embscale::quantize_current_scaling", mutates_args=())
def quantize_current_scaling(x: Tensor, fp8_dtype: torch.dtype, eps: float = 0.0, power_of_2: bool = False,
                             algo: str = "auto") -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """amax -> scale -> cast on x's device without a host synchronisation: (y, amax, scale, scale_inv)."""
    y, a, s, si = _quantize_current_scaling_outputs(x, fp8_dtype, eps, power_of_2, algo)
    _check_backend(x.device)
    _quantize_current_scaling_into(x, y, a, s, si, None, None, eps, power_of_2, algo)
    return y, a, s, si


quantize_current_scaling.register_fake(_quantize_current_scaling_outputs)


def _activation_amax_outputs(x, activation, out_dtype=None, algo="auto"):
    """(y, amax); y in out_dtype (None: x's)."""
    _check_tensor("x", x, FLOAT_DTYPES)
    out_dtype = x.dtype if out_dtype is None else out_dtype
    _check_dtype("out_dtype", out_dtype, FLOAT_DTYPES)
    _lookup(_capi.ACTIVATION, "activation", activation)
    _lookup(_capi.AMAX_ALGO, "algo", algo)
    return _empty(x, out_dtype), _scalar(x)


@torch.library.custom_op("embscale::activation_amax", mutates_args=())
def activation_amax(x: Tensor, activation: str, out_dtype: Optional[torch.dtype] = None,
                    algo: str = "auto") -> tuple[Tensor, Tensor]:
    """y = act(x) (relu, gelu_tanh, silu) in out_dtype (default x's) and max |y| of y as stored."""
    y, a = _activation_amax_outputs(x, activation, out_dtype, algo)
    _check_backend(x.device)
    _activation_amax_into(x, activation, y, a, None, algo)
    return y, a


activation_amax.register_fake(_activation_amax_outputs)


def _cast_transpose_outputs(x, scale, fp8_dtype):
    """(y [rows, cols], yt [cols, rows])."""
    _check_tensor("x", x, FLOAT_DTYPES)
    _check_dtype("fp8_dtype", fp8_dtype, FP8_DTYPES)
    if x.dim() != 2:
        raise ValueError(f"x: has {x.dim()} dimensions, expected 2 ([rows, cols])")
    _check_scalar("scale", scale, _same_device(("x", x), ("scale", scale)))
    return _empty(x, fp8_dtype), _empty(x, fp8_dtype, (x.shape[1], x.shape[0]))


@torch.library.custom_op("embscale::cast_transpose", mutates_args=())
def cast_transpose(x: Tensor, scale: Tensor, fp8_dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """(quantize(x), quantize(x).T) of a 2-D x in one pass: shapes [rows, cols] and [cols, rows]."""
    y, yt = _cast_transpose_outputs(x, scale, fp8_dtype)
    _check_backend(x.device)
    _cast_transpose_into(x, scale, y, yt, None)
    return y, yt


cast_transpose.register_fake(_cast_transpose_outputs)


def _amax_nonfinite_outputs(x, algo="auto"):
    """(amax, nonfinite)."""
    return _amax_outputs(x, algo), _scalar(x, torch.int32)


@torch.library.custom_op("embscale::amax_nonfinite", mutates_args=())
def amax_nonfinite(x: Tensor, algo: str = "auto") -> tuple[Tensor, Tensor]:
    """(amax, nonfinite): amax as embscale::amax, and a 0-dim int32 that is 1 when x holds an inf or a NaN."""
    out, flag = _amax_nonfinite_outputs(x, algo)
    _check_backend(x.device)
    _amax_into(x, out, flag, None, algo)
    return out, flag


amax_nonfinite.register_fake(_amax_nonfinite_outputs)


# ---- gradients -------------------------------------------------------------------------------------------
def _mark_outputs_non_differentiable(ctx, inputs, output):
    ctx.mark_non_differentiable(*(output if isinstance(output, tuple) else (output,)))


def _no_gradient(ctx, *grads):
    """The backward of an op whose outputs are all non-differentiable: autograd never calls it with a
    gradient to pass on, but wants one (None) per input."""
    return (None,) * len(ctx.needs_input_grad)


for _op in (amax, amax_nonfinite, compute_scale, quantize, dequantize, quantize_current_scaling, cast_transpose):
    _op.register_autograd(_no_gradient, setup_context=_mark_outputs_non_differentiable)

_SQRT_2_OVER_PI = 0.7978845608028654  # gelu_tanh's k, as src/fp8/activation.h
_GELU_CUBIC = 0.044715


def _activation_grad(activation, grad_y, x):
    """grad_y * act'(x) in fp32, for the activations of src/fp8/activation.h:
    relu(v) = v for v > 0, else 0, NaN kept (the derivative 0 for v <= 0, 1 elsewhere, NaN included, as
    torch.relu's);
    gelu_tanh(v) = v sigmoid(z) with z = 2k (v + 0.044715 v^3), k = sqrt(2 / pi) (the tanh approximation,
    not the erf GELU); silu(v) = v sigmoid(z) with z = v. For the last two,
    d/dv v sigmoid(z) = sigmoid(z) + v sigmoid'(z) dz/dv, with sigmoid formed from t = exp(-|z|) as the
    kernels form it, so that nothing overflows."""
    g, v = grad_y.float(), x.float()
    if activation == "relu":
        return torch.where(v <= 0, 0.0, g)
    if activation == "gelu_tanh":
        z = 2.0 * _SQRT_2_OVER_PI * (v + _GELU_CUBIC * v * v * v)
        dz = 2.0 * _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_CUBIC * v * v)
    else:  # silu
        z, dz = v, 1.0
    t = torch.exp(-z.abs())
    sigmoid = torch.where(z >= 0, 1.0 / (1.0 + t), t / (1.0 + t))
    slope = t / ((1.0 + t) * (1.0 + t))  # sigmoid'(z) = sigmoid(z) sigmoid(-z)
    # Where sigmoid'(z) underflows to 0 (|z| > ~104, +-inf included) the second term is 0, even though
    # v * dz may be infinite there (0 * inf would make a NaN of a derivative that is 0 or 1).
    return g * (sigmoid + torch.where(slope == 0, 0.0, v * dz * slope))


def _activation_amax_setup(ctx, inputs, output):
    ctx.mark_non_differentiable(output[1])  # the amax
    ctx.save_for_backward(inputs[0])
    ctx.activation = inputs[1]


def _activation_amax_backward(ctx, grad_y, grad_amax):
    x, = ctx.saved_tensors
    grad_x = _activation_grad(ctx.activation, grad_y, x).to(x.dtype) if ctx.needs_input_grad[0] else None
    return (grad_x,) + (None,) * (len(ctx.needs_input_grad) - 1)


activation_amax.register_autograd(_activation_amax_backward, setup_context=_activation_amax_setup)
