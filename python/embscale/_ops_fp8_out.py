"""FP8 operators that write outputs the caller gives (``*_out``) and take TransformerEngine's optional
``noop_flag``: an fp32 tensor of one element on the inputs' device; when it holds 1.0 the operator writes
nothing, so the outputs keep their values (a CUDA graph captured once can skip the step by setting the
flag on the device, without a host synchronisation). Any other value runs the operator.

torch.ops.embscale.{amax_out, compute_scale_out, quantize_out, dequantize_out, quantize_current_scaling_out,
activation_amax_out, cast_transpose_out} return nothing; they mutate their output arguments. Outputs must have the dtype and
shape the functional operator would return, be contiguous and live on the inputs' device. The checks run
in the real and in the fake implementation alike; the real one also refuses an output that shares memory
with an input or with another output (_check_disjoint), on the caller's tensors as given.

After its checks, each operator's real implementation calls ``_<op>_into``, the one place that calls the C
library for that operation: the functional operators (_ops_fp8) allocate their outputs and call the same
function (directly: a second dispatch through torch.ops costs tens of microseconds a call on the host).
"""

import ctypes
from typing import Optional

import torch
from torch import Tensor

from . import _capi
from ._ops_common import (_DTYPE_CODE, FLOAT_DTYPES, FP8_DTYPES, _check_backend, _check_device, _check_disjoint,
                          _check_dtype, _check_eps, _check_scalar, _check_tensor, _check_writable, _context, _desc,
                          _lookup, _ptr, _run, _same_device, _workspace)


def _check_out(name, t, dtype, shape, device):
    """An output written in place: `dtype`, `shape` (None: one element), contiguous, on `device`."""
    _check_tensor(name, t, (dtype,))
    _check_device(name, t, device)
    if shape is None:
        if t.numel() != 1:
            raise ValueError(f"{name}: has {t.numel()} elements, expected 1")
    elif tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name}: has shape {list(t.shape)}, expected {list(shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous (it is written in place)")
    _check_writable(name, t)


def _check_noop(noop_flag, device):
    if noop_flag is not None:
        _check_scalar("noop_flag", noop_flag, device)


def _amax_out_checks(x, amax, nonfinite, noop_flag, algo):
    _check_tensor("x", x, FLOAT_DTYPES)
    _check_out("amax", amax, torch.float32, None, x.device)
    if nonfinite is not None:
        _check_out("nonfinite", nonfinite, torch.int32, None, x.device)
    _check_noop(noop_flag, x.device)
    _lookup(_capi.AMAX_ALGO, "algo", algo)


@torch.library.custom_op("embscale::amax_out", mutates_args=("amax", "nonfinite"))
def amax_out(x: Tensor, amax: Tensor, nonfinite: Optional[Tensor], noop_flag: Optional[Tensor],
             algo: str = "auto") -> None:
    """amax <- max |x| (as embscale::amax), nonfinite (when given) <- 1 if x holds an inf or a NaN else 0."""
    _amax_out_checks(x, amax, nonfinite, noop_flag, algo)
    _check_backend(x.device)
    _check_disjoint((("amax", amax), ("nonfinite", nonfinite)), (("x", x), ("noop_flag", noop_flag)))
    _amax_into(x, amax, nonfinite, noop_flag, algo)


def _amax_into(x, amax, nonfinite, noop_flag, algo):
    """amax_out's C call, its arguments checked (by amax_out, or allocated by embscale::amax and amax_nonfinite)."""
    x = x.contiguous()
    code = _capi.AMAX_ALGO[algo]
    ctx, xd = _context(x.device), _desc(x)
    ws, nbytes = _workspace(x.device, _capi.lib.embscale_amax_workspace_size, ctypes.byref(ctx), ctypes.byref(xd), code,
                            key=(xd.dtype, x.numel(), code))
    _run(x.device, _capi.lib.embscale_amax, ctypes.byref(ctx), ctypes.byref(xd), amax.data_ptr(), code,
         _ptr(nonfinite), _ptr(ws), nbytes, _ptr(noop_flag))


@amax_out.register_fake
def _(x, amax, nonfinite, noop_flag, algo="auto"):
    _amax_out_checks(x, amax, nonfinite, noop_flag, algo)


def _compute_scale_out_checks(amax, scale, scale_inv, fp8_dtype, noop_flag, eps):
    _check_tensor("amax", amax, (torch.float32,))
    _check_dtype("fp8_dtype", fp8_dtype, FP8_DTYPES)
    _check_eps(eps)
    if amax.numel() != 1:
        raise ValueError(f"amax: has {amax.numel()} elements, expected 1")
    for name, t in (("scale", scale), ("scale_inv", scale_inv)):
        _check_out(name, t, torch.float32, None, amax.device)
    _check_noop(noop_flag, amax.device)


@torch.library.custom_op("embscale::compute_scale_out", mutates_args=("scale", "scale_inv"))
def compute_scale_out(amax: Tensor, scale: Tensor, scale_inv: Tensor, fp8_dtype: torch.dtype,
                      noop_flag: Optional[Tensor], eps: float = 0.0, power_of_2: bool = False) -> None:
    """(scale, scale_inv) <- embscale::compute_scale(amax, fp8_dtype, eps, power_of_2)."""
    _compute_scale_out_checks(amax, scale, scale_inv, fp8_dtype, noop_flag, eps)
    _check_backend(amax.device)
    _check_disjoint((("scale", scale), ("scale_inv", scale_inv)), (("amax", amax), ("noop_flag", noop_flag)))
    _compute_scale_into(amax, scale, scale_inv, fp8_dtype, noop_flag, eps, power_of_2)


def _compute_scale_into(amax, scale, scale_inv, fp8_dtype, noop_flag, eps, power_of_2):
    """compute_scale_out's C call, its arguments checked."""
    amax = amax.contiguous()
    _run(amax.device, _capi.lib.embscale_compute_scale, ctypes.byref(_context(amax.device)), amax.data_ptr(),
         _DTYPE_CODE[fp8_dtype], eps, int(power_of_2), scale.data_ptr(), scale_inv.data_ptr(), _ptr(noop_flag))


@compute_scale_out.register_fake
def _(amax, scale, scale_inv, fp8_dtype, noop_flag, eps=0.0, power_of_2=False):
    _compute_scale_out_checks(amax, scale, scale_inv, fp8_dtype, noop_flag, eps)


def _cast_out_checks(x_name, x, x_dtypes, s_name, s, y_name, y, y_dtypes, noop_flag):
    """The checks of a cast x -> y with scalar s, y written in place with x's shape."""
    _check_tensor(x_name, x, x_dtypes)
    _check_scalar(s_name, s, _same_device((x_name, x), (s_name, s)))
    _check_tensor(y_name, y, y_dtypes)
    _check_out(y_name, y, y.dtype, x.shape, x.device)
    _check_noop(noop_flag, x.device)


@torch.library.custom_op("embscale::quantize_out", mutates_args=("y",))
def quantize_out(x: Tensor, scale: Tensor, y: Tensor, noop_flag: Optional[Tensor]) -> None:
    """y (fp8, x's shape) <- fp8(saturate(x * scale))."""
    _cast_out_checks("x", x, FLOAT_DTYPES, "scale", scale, "y", y, FP8_DTYPES, noop_flag)
    _check_backend(x.device)
    _check_disjoint((("y", y),), (("x", x), ("scale", scale), ("noop_flag", noop_flag)))
    _quantize_into(x, scale, y, noop_flag)


def _quantize_into(x, scale, y, noop_flag):
    """quantize_out's C call, its arguments checked."""
    x, scale = x.contiguous(), scale.contiguous()
    _run(x.device, _capi.lib.embscale_quantize, ctypes.byref(_context(x.device)), ctypes.byref(_desc(x)),
         scale.data_ptr(), ctypes.byref(_desc(y)), _ptr(noop_flag))


@quantize_out.register_fake
def _(x, scale, y, noop_flag):
    _cast_out_checks("x", x, FLOAT_DTYPES, "scale", scale, "y", y, FP8_DTYPES, noop_flag)


@torch.library.custom_op("embscale::dequantize_out", mutates_args=("x",))
def dequantize_out(y: Tensor, scale_inv: Tensor, x: Tensor, noop_flag: Optional[Tensor]) -> None:
    """x (fp32/fp16/bf16, y's shape) <- float(y) * scale_inv."""
    _cast_out_checks("y", y, FP8_DTYPES, "scale_inv", scale_inv, "x", x, FLOAT_DTYPES, noop_flag)
    _check_backend(y.device)
    _check_disjoint((("x", x),), (("y", y), ("scale_inv", scale_inv), ("noop_flag", noop_flag)))
    _dequantize_into(y, scale_inv, x, noop_flag)


def _dequantize_into(y, scale_inv, x, noop_flag):
    """dequantize_out's C call, its arguments checked."""
    y, scale_inv = y.contiguous(), scale_inv.contiguous()
    _run(y.device, _capi.lib.embscale_dequantize, ctypes.byref(_context(y.device)), ctypes.byref(_desc(y)),
         scale_inv.data_ptr(), ctypes.byref(_desc(x)), _ptr(noop_flag))


@dequantize_out.register_fake
def _(y, scale_inv, x, noop_flag):
    _cast_out_checks("y", y, FP8_DTYPES, "scale_inv", scale_inv, "x", x, FLOAT_DTYPES, noop_flag)


def _quantize_current_scaling_out_checks(x, y, amax, scale, scale_inv, nonfinite, noop_flag, eps, algo):
    _check_tensor("x", x, FLOAT_DTYPES)
    _check_tensor("y", y, FP8_DTYPES)
    _check_eps(eps)
    _check_out("y", y, y.dtype, x.shape, x.device)
    for name, t in (("amax", amax), ("scale", scale), ("scale_inv", scale_inv)):
        _check_out(name, t, torch.float32, None, x.device)
    if nonfinite is not None:
        _check_out("nonfinite", nonfinite, torch.int32, None, x.device)
    _check_noop(noop_flag, x.device)
    _lookup(_capi.AMAX_ALGO, "algo", algo)


@torch.library.custom_op("embscale::quantize_current_scaling_out",
                         mutates_args=("y", "amax", "scale", "scale_inv", "nonfinite"))
def quantize_current_scaling_out(x: Tensor, y: Tensor, amax: Tensor, scale: Tensor, scale_inv: Tensor,
                                 nonfinite: Optional[Tensor], noop_flag: Optional[Tensor], eps: float = 0.0,
                                 power_of_2: bool = False, algo: str = "auto") -> None:
    """amax -> scale -> cast into the given outputs (y's dtype is the fp8 format), as
    embscale::quantize_current_scaling; nonfinite (when given) as amax_out's."""
    _quantize_current_scaling_out_checks(x, y, amax, scale, scale_inv, nonfinite, noop_flag, eps, algo)
    _check_backend(x.device)
    _check_disjoint((("y", y), ("amax", amax), ("scale", scale), ("scale_inv", scale_inv), ("nonfinite", nonfinite)),
                    (("x", x), ("noop_flag", noop_flag)))
    _quantize_current_scaling_into(x, y, amax, scale, scale_inv, nonfinite, noop_flag, eps, power_of_2, algo)


def _quantize_current_scaling_into(x, y, amax, scale, scale_inv, nonfinite, noop_flag, eps, power_of_2, algo):
    """quantize_current_scaling_out's C call, its arguments checked."""
    x = x.contiguous()
    code = _capi.AMAX_ALGO[algo]
    ctx, xd = _context(x.device), _desc(x)
    ws, nbytes = _workspace(x.device, _capi.lib.embscale_quantize_current_scaling_workspace_size, ctypes.byref(ctx),
                            ctypes.byref(xd), code, key=(xd.dtype, x.numel(), code))
    _run(x.device, _capi.lib.embscale_quantize_current_scaling, ctypes.byref(ctx), ctypes.byref(xd),
         ctypes.byref(_desc(y)), amax.data_ptr(), scale.data_ptr(), scale_inv.data_ptr(), code, eps, int(power_of_2),
         _ptr(nonfinite), _ptr(ws), nbytes, _ptr(noop_flag))


@quantize_current_scaling_out.register_fake
def _(x, y, amax, scale, scale_inv, nonfinite, noop_flag, eps=0.0, power_of_2=False, algo="auto"):
    _quantize_current_scaling_out_checks(x, y, amax, scale, scale_inv, nonfinite, noop_flag, eps, algo)


def _activation_amax_out_checks(x, activation, y, amax, noop_flag, algo):
    _check_tensor("x", x, FLOAT_DTYPES)
    _check_tensor("y", y, FLOAT_DTYPES)
    _check_out("y", y, y.dtype, x.shape, x.device)
    _check_out("amax", amax, torch.float32, None, x.device)
    _check_noop(noop_flag, x.device)
    _lookup(_capi.ACTIVATION, "activation", activation)
    _lookup(_capi.AMAX_ALGO, "algo", algo)


@torch.library.custom_op("embscale::activation_amax_out", mutates_args=("y", "amax"))
def activation_amax_out(x: Tensor, activation: str, y: Tensor, amax: Tensor, noop_flag: Optional[Tensor],
                        algo: str = "auto") -> None:
    """y (x's shape, y's float dtype) <- act(x) (relu, gelu_tanh, silu) and amax <- max |y| as stored."""
    _activation_amax_out_checks(x, activation, y, amax, noop_flag, algo)
    _check_backend(x.device)
    _check_disjoint((("y", y), ("amax", amax)), (("x", x), ("noop_flag", noop_flag)))
    _activation_amax_into(x, activation, y, amax, noop_flag, algo)


def _activation_amax_into(x, activation, y, amax, noop_flag, algo):
    """activation_amax_out's C call, its arguments checked."""
    x = x.contiguous()
    act, code = _capi.ACTIVATION[activation], _capi.AMAX_ALGO[algo]
    ctx, xd = _context(x.device), _desc(x)
    ws, nbytes = _workspace(x.device, _capi.lib.embscale_activation_amax_workspace_size, ctypes.byref(ctx),
                            ctypes.byref(xd), code, key=(xd.dtype, x.numel(), code))
    _run(x.device, _capi.lib.embscale_activation_amax, ctypes.byref(ctx), act, ctypes.byref(xd),
         ctypes.byref(_desc(y)), amax.data_ptr(), code, _ptr(ws), nbytes, _ptr(noop_flag))


@activation_amax_out.register_fake
def _(x, activation, y, amax, noop_flag, algo="auto"):
    _activation_amax_out_checks(x, activation, y, amax, noop_flag, algo)


def _cast_transpose_out_checks(x, scale, y, yt, noop_flag):
    _check_tensor("x", x, FLOAT_DTYPES)
    if x.dim() != 2:
        raise ValueError(f"x: has {x.dim()} dimensions, expected 2 ([rows, cols])")
    _check_scalar("scale", scale, _same_device(("x", x), ("scale", scale)))
    _check_tensor("y", y, FP8_DTYPES)
    _check_out("y", y, y.dtype, x.shape, x.device)
    _check_out("yt", yt, y.dtype, (x.shape[1], x.shape[0]), x.device)
    _check_noop(noop_flag, x.device)


@torch.library.custom_op("embscale::cast_transpose_out", mutates_args=("y", "yt"))
def cast_transpose_out(x: Tensor, scale: Tensor, y: Tensor, yt: Tensor, noop_flag: Optional[Tensor]) -> None:
    """y [rows, cols] <- quantize(x) and yt [cols, rows] <- its transpose, in one pass (y's fp8 format)."""
    _cast_transpose_out_checks(x, scale, y, yt, noop_flag)
    _check_backend(x.device)
    _check_disjoint((("y", y), ("yt", yt)), (("x", x), ("scale", scale), ("noop_flag", noop_flag)))
    _cast_transpose_into(x, scale, y, yt, noop_flag)


def _cast_transpose_into(x, scale, y, yt, noop_flag):
    """cast_transpose_out's C call, its arguments checked."""
    x, scale = x.contiguous(), scale.contiguous()
    rows, cols = x.shape
    _run(x.device, _capi.lib.embscale_cast_transpose, ctypes.byref(_context(x.device)),
         ctypes.byref(_desc(x, (rows, cols))), scale.data_ptr(), ctypes.byref(_desc(y, (rows, cols))),
         ctypes.byref(_desc(yt, (cols, rows))), _ptr(noop_flag))


@cast_transpose_out.register_fake
def _(x, scale, y, yt, noop_flag):
    _cast_transpose_out_checks(x, scale, y, yt, noop_flag)
