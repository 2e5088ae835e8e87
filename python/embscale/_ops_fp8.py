"""FP8 current-scaling operators (torch.ops.embscale.amax, compute_scale, quantize, dequantize,
quantize_current_scaling, activation_amax, cast_transpose, amax_nonfinite): each allocates its outputs.
Each operator's checks run in both its real and its fake implementation; the real one then checks the
backend (meta is not one).

Gradients (registered at the end of this file, so that eager autograd and torch.compile's traced backward
agree): amax values, non-finite flags, scales, fp8 codes and dequantized values are not differentiable,
as TransformerEngine's casts are not; those outputs never require grad, also for an input that does (an
nn.Parameter). The one exception is activation_amax's y = act(x), a real activation: its gradient is
grad_y * act'(x), computed in fp32 from x and rounded to x's dtype.
"""

import ctypes
from typing import Optional

import torch
from torch import Tensor

from . import _capi
from ._ops_common import (_DTYPE_CODE, FLOAT_DTYPES, FP8_DTYPES, _check_backend, _check_dtype, _check_eps,
                          _check_scalar, _check_tensor, _context, _desc, _lookup, _ptr, _run, _same_device, _scalar,
                          _workspace)


def _amax_checks(x, algo):
    _check_tensor("x", x, FLOAT_DTYPES)
    return _lookup(_capi.AMAX_ALGO, "algo", algo)


@torch.library.custom_op("embscale::amax", mutates_args=())
def amax(x: Tensor, algo: str = "auto") -> Tensor:
    """max |x| as a 0-dim fp32 tensor on x's device (NaN skipped, empty -> 0)."""
    code = _amax_checks(x, algo)
    _check_backend(x.device)
    x = x.contiguous()
    ctx, xd = _context(x.device), _desc(x)
    ws, nbytes = _workspace(x.device, _capi.lib.embscale_amax_workspace_size, ctypes.byref(ctx), ctypes.byref(xd), code)
    out = _scalar(x.device)
    _run(x.device, _capi.lib.embscale_amax, ctypes.byref(ctx), ctypes.byref(xd), out.data_ptr(), code, None,
         _ptr(ws), nbytes)
    return out


@amax.register_fake
def _(x, algo="auto"):
    _amax_checks(x, algo)
    return x.new_empty((), dtype=torch.float32)


def _compute_scale_checks(amax, fp8_dtype, eps):
    _check_tensor("amax", amax, (torch.float32,))
    _check_dtype("fp8_dtype", fp8_dtype, FP8_DTYPES)
    _check_eps(eps)
    if amax.numel() != 1:
        raise ValueError(f"amax: has {amax.numel()} elements, expected 1")


@torch.library.custom_op("embscale::compute_scale", mutates_args=())
def compute_scale(amax: Tensor, fp8_dtype: torch.dtype, eps: float = 0.0,
                  power_of_2: bool = False) -> tuple[Tensor, Tensor]:
    """(scale, scale_inv) from a 0-dim fp32 amax: scale = fp8_max / max(amax, eps), 1 for 0/inf/NaN."""
    _compute_scale_checks(amax, fp8_dtype, eps)
    _check_backend(amax.device)
    amax = amax.contiguous()
    scale, scale_inv = _scalar(amax.device), _scalar(amax.device)
    ctx = _context(amax.device)
    _run(amax.device, _capi.lib.embscale_compute_scale, ctypes.byref(ctx), amax.data_ptr(), _DTYPE_CODE[fp8_dtype],
         eps, int(power_of_2), scale.data_ptr(), scale_inv.data_ptr())
    return scale, scale_inv


@compute_scale.register_fake
def _(amax, fp8_dtype, eps=0.0, power_of_2=False):
    _compute_scale_checks(amax, fp8_dtype, eps)
    return amax.new_empty((), dtype=torch.float32), amax.new_empty((), dtype=torch.float32)


def _quantize_checks(x, scale, fp8_dtype):
    _check_tensor("x", x, FLOAT_DTYPES)
    _check_dtype("fp8_dtype", fp8_dtype, FP8_DTYPES)
    _check_scalar("scale", scale, _same_device(("x", x), ("scale", scale)))


@torch.library.custom_op("embscale::quantize", mutates_args=())
def quantize(x: Tensor, scale: Tensor, fp8_dtype: torch.dtype) -> Tensor:
    """fp8(saturate(x * scale)), round-to-nearest-even, x's shape."""
    _quantize_checks(x, scale, fp8_dtype)
    _check_backend(x.device)
    x, scale = x.contiguous(), scale.contiguous()
    y = torch.empty(x.shape, dtype=fp8_dtype, device=x.device)
    ctx = _context(x.device)
    _run(x.device, _capi.lib.embscale_quantize, ctypes.byref(ctx), ctypes.byref(_desc(x)), scale.data_ptr(),
         ctypes.byref(_desc(y)))
    return y


@quantize.register_fake
def _(x, scale, fp8_dtype):
    _quantize_checks(x, scale, fp8_dtype)
    return x.new_empty(x.shape, dtype=fp8_dtype)  # contiguous, as the real op's output


def _dequantize_checks(y, scale_inv, out_dtype):
    _check_tensor("y", y, FP8_DTYPES)
    _check_dtype("out_dtype", out_dtype, FLOAT_DTYPES)
    _check_scalar("scale_inv", scale_inv, _same_device(("y", y), ("scale_inv", scale_inv)))


@torch.library.custom_op("embscale::dequantize", mutates_args=())
def dequantize(y: Tensor, scale_inv: Tensor, out_dtype: torch.dtype = torch.float32) -> Tensor:
    """float(y) * scale_inv rounded to out_dtype, y's shape."""
    _dequantize_checks(y, scale_inv, out_dtype)
    _check_backend(y.device)
    y, scale_inv = y.contiguous(), scale_inv.contiguous()
    x = torch.empty(y.shape, dtype=out_dtype, device=y.device)
    ctx = _context(y.device)
    _run(y.device, _capi.lib.embscale_dequantize, ctypes.byref(ctx), ctypes.byref(_desc(y)), scale_inv.data_ptr(),
         ctypes.byref(_desc(x)))
    return x


@dequantize.register_fake
def _(y, scale_inv, out_dtype=torch.float32):
    _dequantize_checks(y, scale_inv, out_dtype)
    return y.new_empty(y.shape, dtype=out_dtype)  # contiguous, as the real op's output


def _quantize_current_scaling_checks(x, fp8_dtype, eps, algo):
    _check_tensor("x", x, FLOAT_DTYPES)
    _check_dtype("fp8_dtype", fp8_dtype, FP8_DTYPES)
    _check_eps(eps)
    return _lookup(_capi.AMAX_ALGO, "algo", algo)


@torch.library.custom_op("embscale::quantize_current_scaling", mutates_args=())
def quantize_current_scaling(x: Tensor, fp8_dtype: torch.dtype, eps: float = 0.0, power_of_2: bool = False,
                             algo: str = "auto") -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """amax -> scale -> cast on x's device without a host synchronisation: (y, amax, scale, scale_inv)."""
    code = _quantize_current_scaling_checks(x, fp8_dtype, eps, algo)
    _check_backend(x.device)
    x = x.contiguous()
    ctx, xd = _context(x.device), _desc(x)
    ws, nbytes = _workspace(x.device, _capi.lib.embscale_quantize_current_scaling_workspace_size, ctypes.byref(ctx),
                            ctypes.byref(xd), code)
    y = torch.empty(x.shape, dtype=fp8_dtype, device=x.device)
    a, s, si = _scalar(x.device), _scalar(x.device), _scalar(x.device)
    _run(x.device, _capi.lib.embscale_quantize_current_scaling, ctypes.byref(ctx), ctypes.byref(xd),
         ctypes.byref(_desc(y)), a.data_ptr(), s.data_ptr(), si.data_ptr(), code, eps, int(power_of_2), None,
         _ptr(ws), nbytes)
    return y, a, s, si


@quantize_current_scaling.register_fake
def _(x, fp8_dtype, eps=0.0, power_of_2=False, algo="auto"):
    _quantize_current_scaling_checks(x, fp8_dtype, eps, algo)
    s = x.new_empty((), dtype=torch.float32)
    return x.new_empty(x.shape, dtype=fp8_dtype), s, torch.empty_like(s), torch.empty_like(s)


def _activation_amax_checks(x, activation, out_dtype, algo):
    """(activation code, amax algorithm code, output dtype)."""
    _check_tensor("x", x, FLOAT_DTYPES)
    out_dtype = x.dtype if out_dtype is None else out_dtype
    _check_dtype("out_dtype", out_dtype, FLOAT_DTYPES)
    return _lookup(_capi.ACTIVATION, "activation", activation), _lookup(_capi.AMAX_ALGO, "algo", algo), out_dtype


@torch.library.custom_op("embscale::activation_amax", mutates_args=())
def activation_amax(x: Tensor, activation: str, out_dtype: Optional[torch.dtype] = None,
                    algo: str = "auto") -> tuple[Tensor, Tensor]:
    """y = act(x) (relu, gelu_tanh, silu) in out_dtype (default x's) and max |y| of y as stored."""
    act, code, out_dtype = _activation_amax_checks(x, activation, out_dtype, algo)
    _check_backend(x.device)
    x = x.contiguous()
    y = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    ctx, xd = _context(x.device), _desc(x)
    ws, nbytes = _workspace(x.device, _capi.lib.embscale_activation_amax_workspace_size, ctypes.byref(ctx),
                            ctypes.byref(xd), code)
    a = _scalar(x.device)
    _run(x.device, _capi.lib.embscale_activation_amax, ctypes.byref(ctx), act, ctypes.byref(xd),
         ctypes.byref(_desc(y)), a.data_ptr(), code, _ptr(ws), nbytes)
    return y, a


@activation_amax.register_fake
def _(x, activation, out_dtype=None, algo="auto"):
    _, _, out_dtype = _activation_amax_checks(x, activation, out_dtype, algo)
    return x.new_empty(x.shape, dtype=out_dtype), x.new_empty((), dtype=torch.float32)


def _cast_transpose_checks(x, scale, fp8_dtype):
    _check_tensor("x", x, FLOAT_DTYPES)
    _check_dtype("fp8_dtype", fp8_dtype, FP8_DTYPES)
    if x.dim() != 2:
        raise ValueError(f"x: has {x.dim()} dimensions, expected 2 ([rows, cols])")
    _check_scalar("scale", scale, _same_device(("x", x), ("scale", scale)))


@torch.library.custom_op("embscale::cast_transpose", mutates_args=())
def cast_transpose(x: Tensor, scale: Tensor, fp8_dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """(quantize(x), quantize(x).T) of a 2-D x in one pass: shapes [rows, cols] and [cols, rows]."""
    _cast_transpose_checks(x, scale, fp8_dtype)
    _check_backend(x.device)
    x, scale = x.contiguous(), scale.contiguous()
    rows, cols = x.shape
    y = torch.empty((rows, cols), dtype=fp8_dtype, device=x.device)
    yt = torch.empty((cols, rows), dtype=fp8_dtype, device=x.device)
    ctx = _context(x.device)
    _run(x.device, _capi.lib.embscale_cast_transpose, ctypes.byref(ctx), ctypes.byref(_desc(x, (rows, cols))),
         scale.data_ptr(), ctypes.byref(_desc(y, (rows, cols))), ctypes.byref(_desc(yt, (cols, rows))))
    return y, yt


@cast_transpose.register_fake
def _(x, scale, fp8_dtype):
    _cast_transpose_checks(x, scale, fp8_dtype)
    return x.new_empty(x.shape, dtype=fp8_dtype), x.new_empty((x.shape[1], x.shape[0]), dtype=fp8_dtype)


@torch.library.custom_op("embscale::amax_nonfinite", mutates_args=())
def amax_nonfinite(x: Tensor, algo: str = "auto") -> tuple[Tensor, Tensor]:
    """(amax, nonfinite): amax as embscale::amax, and a 0-dim int32 that is 1 when x holds an inf or a NaN."""
    code = _amax_checks(x, algo)
    _check_backend(x.device)
    x = x.contiguous()
    ctx, xd = _context(x.device), _desc(x)
    ws, nbytes = _workspace(x.device, _capi.lib.embscale_amax_workspace_size, ctypes.byref(ctx), ctypes.byref(xd), code)
    out = _scalar(x.device)
    flag = torch.empty((), dtype=torch.int32, device=x.device)
    _run(x.device, _capi.lib.embscale_amax, ctypes.byref(ctx), ctypes.byref(xd), out.data_ptr(), code,
         flag.data_ptr(), _ptr(ws), nbytes)
    return out, flag


@amax_nonfinite.register_fake
def _(x, algo="auto"):
    _amax_checks(x, algo)
    return x.new_empty((), dtype=torch.float32), x.new_empty((), dtype=torch.int32)


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
