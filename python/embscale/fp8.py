"""FP8 current scaling for PyTorch users.

Every function runs on the tensor's device without a host synchronisation. With ``group`` (a
torch.distributed process group) the amax is all-reduced with MAX across the group before the scale is
computed, so all ranks quantize with one scale.

``out=`` writes into given outputs (contiguous, the dtypes and shapes the function would return, on the
input's device) instead of new tensors, and ``noop_flag=`` (TransformerEngine's no-op flag: an fp32 tensor
of one element on the input's device) skips the op when it holds 1.0, leaving those outputs as they were,
so a captured CUDA graph can skip a step without a host synchronisation; it needs ``out`` (the outputs a
skipped op keeps) and is not taken with ``group``. A dtype argument given with ``out`` must be the dtype of
the output it names; left as None it is that output's dtype (without ``out``: e4m3 for an fp8 output,
fp32 for ``dequantize``, x's dtype for ``activation_amax``).

Gradients: amax values, non-finite flags, scales, fp8 codes and dequantized values are not differentiable
(as TransformerEngine's casts), also for inputs that require grad; ``activation_amax``'s y is, with the
derivative of the activation it computes.

    y, scale_inv = embscale.quantize_current_scaling(x, torch.float8_e4m3fn)
    out = torch._scaled_mm(y, w_fp8.t(), scale_a=scale_inv, scale_b=w_scale_inv, out_dtype=torch.bfloat16)
"""

from typing import Optional

import torch

from . import ops
from ._ops_common import FLOAT_DTYPES, FP8_DTYPES, _check_dtype_arg, _check_eps


def _out_for_noop(out, noop_flag, group=None):
    """Whether outputs were given; refuses a noop_flag without `out` (a skipped op would return
    uninitialised tensors) and `out` with `group`."""
    if noop_flag is not None and out is None:
        raise ValueError("noop_flag: needs out= (the outputs a skipped op leaves as they were)")
    if out is not None and group is not None:
        raise ValueError("out: is not taken with group (the all-reduce makes new tensors)")
    return out is not None


def _unpack(out, names):
    """The tensors of an `out` that names several outputs, or ValueError naming `out`."""
    if not isinstance(out, (tuple, list)) or len(out) != len(names) or \
            not all(isinstance(t, torch.Tensor) for t in out):
        raise ValueError(f"out: expected the tensors ({', '.join(names)})")
    return tuple(out)


def _out_dtype(name, dtype, allowed, default, out_name=None, out_tensor=None):
    """The dtype an op writes: `dtype` when given (a torch.dtype among `allowed`), else out's when out= is
    given, else `default`. A given dtype that differs from out's is refused: silently writing out's format
    instead would give the caller values of another format than the one they asked for."""
    if dtype is None:
        return default if out_tensor is None else out_tensor.dtype
    _check_dtype_arg(name, dtype, allowed)
    if out_tensor is not None and out_tensor.dtype != dtype:
        raise ValueError(f"out: {out_name} has dtype {out_tensor.dtype}, but {name} is {dtype}")
    return dtype


def _all_reduce_max(amax, group):
    if group is not None:
        import torch.distributed as dist

        dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=group)
    return amax


def amax(x: torch.Tensor, group=None, algo: str = "auto", return_nonfinite: bool = False, out=None,
         noop_flag: Optional[torch.Tensor] = None):
    """max |x| as a 0-dim fp32 tensor (NaN skipped; empty -> 0), all-reduced over ``group`` when given.

    With return_nonfinite: (amax, nonfinite), nonfinite a 0-dim int32 that is 1 when x (on any rank of
    ``group``) holds an inf or a NaN, else 0 — the signal that amax([1, nan]) = 1 alone does not give.
    ``out``: the amax tensor to write (with return_nonfinite, the pair (amax, nonfinite)).
    """
    if _out_for_noop(out, noop_flag, group):
        if return_nonfinite:
            a, nonfinite = _unpack(out, ("amax", "nonfinite"))
        else:
            (a,), nonfinite = _unpack((out,), ("amax",)), None
        torch.ops.embscale.amax_out(x, a, nonfinite, noop_flag, algo)
        return (a, nonfinite) if return_nonfinite else a
    if not return_nonfinite:
        return _all_reduce_max(torch.ops.embscale.amax(x, algo), group)
    a, nonfinite = torch.ops.embscale.amax_nonfinite(x, algo)
    if group is not None:  # one collective for both: the flag (0 or 1) is exact in fp32
        both = _all_reduce_max(torch.stack([a, nonfinite.to(torch.float32)]), group)
        a, nonfinite = both[0], both[1].to(torch.int32)
    return a, nonfinite


def compute_scale(amax: torch.Tensor, fp8_dtype: torch.dtype = torch.float8_e4m3fn, eps: float = 0.0,
                  power_of_2: bool = False, out=None, noop_flag: Optional[torch.Tensor] = None):
    """(scale, scale_inv): scale = fp8_max / max(amax, eps); 1 when that is 0, inf or NaN.
    ``out``: the pair (scale, scale_inv) to write."""
    _check_dtype_arg("fp8_dtype", fp8_dtype, FP8_DTYPES)
    _check_eps(eps)
    if _out_for_noop(out, noop_flag):
        scale, scale_inv = _unpack(out, ("scale", "scale_inv"))
        torch.ops.embscale.compute_scale_out(amax, scale, scale_inv, fp8_dtype, noop_flag, eps, power_of_2)
        return scale, scale_inv
    return torch.ops.embscale.compute_scale(amax, fp8_dtype, eps, power_of_2)


def quantize(x: torch.Tensor, scale: torch.Tensor, fp8_dtype: Optional[torch.dtype] = None, out=None,
             noop_flag: Optional[torch.Tensor] = None) -> torch.Tensor:
    """fp8(saturate(x * scale)) with round-to-nearest-even, in fp8_dtype (None: e4m3, or out's dtype).
    ``out``: the fp8 tensor to write (its dtype is the format; a given fp8_dtype must match it)."""
    if _out_for_noop(out, noop_flag):
        y, = _unpack((out,), ("y",))
        _out_dtype("fp8_dtype", fp8_dtype, FP8_DTYPES, torch.float8_e4m3fn, "y", y)
        torch.ops.embscale.quantize_out(x, scale, y, noop_flag)
        return y
    return torch.ops.embscale.quantize(x, scale, _out_dtype("fp8_dtype", fp8_dtype, FP8_DTYPES, torch.float8_e4m3fn))


def dequantize(y: torch.Tensor, scale_inv: torch.Tensor, out_dtype: Optional[torch.dtype] = None, out=None,
               noop_flag: Optional[torch.Tensor] = None) -> torch.Tensor:
    """float(y) * scale_inv in out_dtype (None: fp32, or out's dtype). ``out``: the tensor to write (its
    dtype is used; a given out_dtype must match it)."""
    if _out_for_noop(out, noop_flag):
        x, = _unpack((out,), ("x",))
        _out_dtype("out_dtype", out_dtype, FLOAT_DTYPES, torch.float32, "x", x)
        torch.ops.embscale.dequantize_out(y, scale_inv, x, noop_flag)
        return x
    return torch.ops.embscale.dequantize(y, scale_inv, _out_dtype("out_dtype", out_dtype, FLOAT_DTYPES, torch.float32))


def quantize_current_scaling(x: torch.Tensor, fp8_dtype: Optional[torch.dtype] = None, eps: float = 0.0,
                             power_of_2: bool = False, group=None, return_amax: bool = False,
                             return_nonfinite: bool = False, out=None, noop_flag: Optional[torch.Tensor] = None):
    """Current scaling: returns (y, scale_inv), then amax with return_amax, then the non-finite flag (as
    ``amax``'s) with return_nonfinite. y is in fp8_dtype (None: e4m3, or the dtype of out's y).

    scale_inv is the dequantisation factor torch._scaled_mm expects as scale_a / scale_b.
    ``out``: (y, amax, scale, scale_inv), and nonfinite after them with return_nonfinite, written in one
    call (y's dtype is the format; a given fp8_dtype must match it).
    """
    _check_eps(eps)
    nonfinite = None
    if _out_for_noop(out, noop_flag, group):
        names = ("y", "amax", "scale", "scale_inv") + (("nonfinite",) if return_nonfinite else ())
        y, a, scale, scale_inv, *rest = _unpack(out, names)
        _out_dtype("fp8_dtype", fp8_dtype, FP8_DTYPES, torch.float8_e4m3fn, "y", y)
        nonfinite = rest[0] if return_nonfinite else None
        torch.ops.embscale.quantize_current_scaling_out(x, y, a, scale, scale_inv, nonfinite, noop_flag, eps,
                                                        power_of_2)
    elif group is None and not return_nonfinite:
        fp8_dtype = _out_dtype("fp8_dtype", fp8_dtype, FP8_DTYPES, torch.float8_e4m3fn)
        y, a, _, scale_inv = torch.ops.embscale.quantize_current_scaling(x, fp8_dtype, eps, power_of_2)
    else:
        fp8_dtype = _out_dtype("fp8_dtype", fp8_dtype, FP8_DTYPES, torch.float8_e4m3fn)
        a = amax(x, group, return_nonfinite=return_nonfinite)
        if return_nonfinite:
            a, nonfinite = a
        scale, scale_inv = compute_scale(a, fp8_dtype, eps, power_of_2)
        y = quantize(x, scale, fp8_dtype)
    return (y, scale_inv) + ((a,) if return_amax else ()) + ((nonfinite,) if return_nonfinite else ())


def activation_amax(x: torch.Tensor, activation: str, out_dtype: Optional[torch.dtype] = None, group=None,
                    out=None, noop_flag: Optional[torch.Tensor] = None):
    """(act(x), max |act(x)|) for activation in relu, gelu_tanh, silu, in one pass over x; y is in out_dtype
    (None: x's dtype) and differentiable (the amax is not). ``out``: the pair (y, amax) to write (y's dtype is
    the output dtype; out_dtype, when given, must match it); y written in place has no gradient, so out= is
    refused for an x that requires grad while grad mode is on (as torch's out= functions refuse it)."""
    if _out_for_noop(out, noop_flag, group):
        y, a = _unpack(out, ("y", "amax"))
        _out_dtype("out_dtype", out_dtype, FLOAT_DTYPES, None, "y", y)
        if torch.is_grad_enabled() and isinstance(x, torch.Tensor) and x.requires_grad:
            raise RuntimeError("out: activation_amax with out= does not support automatic differentiation, but x "
                               "requires grad (call it without out= for y's gradient, or under torch.no_grad())")
        torch.ops.embscale.activation_amax_out(x, activation, y, a, noop_flag)
        return y, a
    if out_dtype is not None:
        _check_dtype_arg("out_dtype", out_dtype, FLOAT_DTYPES)
    y, a = torch.ops.embscale.activation_amax(x, activation, out_dtype)
    return y, _all_reduce_max(a, group)


def cast_transpose(x: torch.Tensor, scale: torch.Tensor, fp8_dtype: Optional[torch.dtype] = None, out=None,
                   noop_flag: Optional[torch.Tensor] = None):
    """(quantize(x), quantize(x).T contiguous) of a 2-D x, in one pass, in fp8_dtype (None: e4m3, or out's
    dtype). ``out``: the pair (y, yt) to write (a given fp8_dtype must match y's dtype)."""
    if _out_for_noop(out, noop_flag):
        y, yt = _unpack(out, ("y", "yt"))
        _out_dtype("fp8_dtype", fp8_dtype, FP8_DTYPES, torch.float8_e4m3fn, "y", y)
        torch.ops.embscale.cast_transpose_out(x, scale, y, yt, noop_flag)
        return y, yt
    return torch.ops.embscale.cast_transpose(x, scale,
                                             _out_dtype("fp8_dtype", fp8_dtype, FP8_DTYPES, torch.float8_e4m3fn))


# FP8 training of linear layers (imported last: it builds on the operators above).
from .fp8_training import (Float8Linear, clear_float8_weight_amax, convert_to_float8_training,  # noqa: E402
                           default_module_filter, float8_linears, sync_float8_weight_amax)

__all__ = ["amax", "compute_scale", "quantize", "dequantize", "quantize_current_scaling", "activation_amax",
           "cast_transpose", "ops", "Float8Linear", "convert_to_float8_training", "default_module_filter",
           "float8_linears", "sync_float8_weight_amax", "clear_float8_weight_amax"]
