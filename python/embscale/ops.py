"""torch custom operators (torch.ops.embscale.*) over the C API.

This is the only code that sees torch types. Each operator takes tensors on one device (CPU or CUDA),
runs on the current CUDA stream for CUDA tensors, allocates its workspace through torch (so CUDA graph
capture and the caching allocator work), and has a fake (meta) implementation so torch.compile can
trace it. Inputs are made contiguous; a wrong dtype, device or shape raises TypeError / ValueError
with the reason.
"""

import ctypes
from typing import Optional

import torch
from torch import Tensor

from . import _capi

_DTYPE_CODE = {
    torch.float32: 0,
    torch.float16: 1,
    torch.bfloat16: 2,
    torch.float8_e4m3fn: 3,
    torch.float8_e5m2: 4,
    torch.int32: 5,
    torch.int64: 6,
}
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
INDEX_DTYPES = (torch.int32, torch.int64)

# Layout of a TBE module's hyper-parameter tensor (CPU float64), read by tbe_backward at every call so
# a learning rate set between steps is seen even inside a compiled graph. tbe_backward advances `step`.
HPARAM_FIELDS = ("learning_rate", "eps", "beta1", "beta2", "weight_decay", "max_norm", "gradient_clipping", "step")
HPARAM = {name: i for i, name in enumerate(HPARAM_FIELDS)}


# ---- argument checks and conversions -------------------------------------------------------------------
def _check_dtype(name, t, allowed):
    """t: a tensor, or a torch.dtype argument."""
    dtype = t if isinstance(t, torch.dtype) else t.dtype
    if dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise TypeError(f"{name}: dtype {str(dtype).replace('torch.', '')} is not supported; expected {names}")


def _check_device(name, t, device):
    if t.device != device:
        raise ValueError(f"{name}: is on {t.device}, expected {device} (the device of the other inputs)")


def _check_backend(device):
    if device.type not in _capi.BACKEND:
        raise ValueError(f"device: {device} is not supported; expected a cpu or cuda tensor")
    if device.type == "cuda" and not _capi.backend_available("cuda"):
        raise NotImplementedError("device: this build of embscale has no usable CUDA backend")


def _desc(t, shape=None):
    """A C tensor descriptor of contiguous tensor t, viewed with `shape` (default: flat)."""
    d = _capi.Tensor()
    d.data = t.data_ptr() if t.numel() > 0 else None
    d.dtype = _DTYPE_CODE[t.dtype]
    shape = (t.numel(),) if shape is None else tuple(shape)
    d.ndim = len(shape)
    for i, s in enumerate(shape):
        d.shape[i] = s
    return d


def _ptr(t):
    return None if t is None or t.numel() == 0 else t.data_ptr()


# The address an optional tensor that is given but empty points at: the C API reads an optional tensor
# whose data is NULL as absent, and a given one must reach its length checks (an empty
# per_sample_weights for N > 0 lookups is an error, not "unweighted"). Never dereferenced: it has no elements.
_EMPTY_BUFFER = ctypes.c_int64(0)


def _optional_desc(t):
    """The C descriptor of an optional tensor: absent (all zero) for None, else t viewed flat."""
    if t is None:
        return _capi.Tensor()
    d = _desc(t)
    if d.data is None:
        d.data = ctypes.addressof(_EMPTY_BUFFER)
    return d


def _context(device):
    c = _capi.Context()
    c.backend = _capi.BACKEND[device.type]
    if device.type == "cuda":
        c.stream = torch.cuda.current_stream(device).cuda_stream
    else:
        c.num_threads = torch.get_num_threads()
    return c


def _run(device, fn, *args):
    """Calls C function fn with args on the right CUDA device; raises on a failed status."""
    if device.type == "cuda":
        with torch.cuda.device(device):
            _capi.check(fn(*args))
    else:
        _capi.check(fn(*args))


def _workspace(device, size_fn, *args):
    nbytes = ctypes.c_size_t(0)
    _run(device, size_fn, *args, ctypes.byref(nbytes))
    ws = torch.empty(nbytes.value, dtype=torch.uint8, device=device)
    return ws, nbytes.value


def _scalar(device):
    return torch.empty((), dtype=torch.float32, device=device)


def _lookup(table, name, value):
    if value not in table:
        raise ValueError(f"{name}: '{value}' is not one of {', '.join(table)}")
    return table[value]


# ---- FP8 current scaling --------------------------------------------------------------------------------
@torch.library.custom_op("embscale::amax", mutates_args=())
def amax(x: Tensor, algo: str = "auto") -> Tensor:
    """max |x| as a 0-dim fp32 tensor on x's device (NaN skipped, empty -> 0)."""
    _check_dtype("x", x, FLOAT_DTYPES)
    _check_backend(x.device)
    x = x.contiguous()
    code = _lookup(_capi.AMAX_ALGO, "algo", algo)
    ctx, xd = _context(x.device), _desc(x)
    ws, nbytes = _workspace(x.device, _capi.lib.embscale_amax_workspace_size, ctypes.byref(ctx), ctypes.byref(xd), code)
    out = _scalar(x.device)
    _run(x.device, _capi.lib.embscale_amax, ctypes.byref(ctx), ctypes.byref(xd), out.data_ptr(), code, None,
         _ptr(ws), nbytes)
    return out


@amax.register_fake
def _(x, algo="auto"):
    return x.new_empty((), dtype=torch.float32)


@torch.library.custom_op("embscale::compute_scale", mutates_args=())
def compute_scale(amax: Tensor, fp8_dtype: torch.dtype, eps: float = 0.0,
                  power_of_2: bool = False) -> tuple[Tensor, Tensor]:
    """(scale, scale_inv) from a 0-dim fp32 amax: scale = fp8_max / max(amax, eps), 1 for 0/inf/NaN."""
    _check_dtype("amax", amax, (torch.float32,))
    _check_dtype("fp8_dtype", fp8_dtype, FP8_DTYPES)
    if amax.numel() != 1:
        raise ValueError(f"amax: has {amax.numel()} elements, expected 1")
    _check_backend(amax.device)
    amax = amax.contiguous()
    scale, scale_inv = _scalar(amax.device), _scalar(amax.device)
    ctx = _context(amax.device)
    _run(amax.device, _capi.lib.embscale_compute_scale, ctypes.byref(ctx), amax.data_ptr(), _DTYPE_CODE[fp8_dtype],
         eps, int(power_of_2), scale.data_ptr(), scale_inv.data_ptr())
    return scale, scale_inv


@compute_scale.register_fake
def _(amax, fp8_dtype, eps=0.0, power_of_2=False):
    return amax.new_empty((), dtype=torch.float32), amax.new_empty((), dtype=torch.float32)


def _check_scalar(name, s, device):
    _check_dtype(name, s, (torch.float32,))
    _check_device(name, s, device)
    if s.numel() != 1:
        raise ValueError(f"{name}: has {s.numel()} elements, expected 1")


@torch.library.custom_op("embscale::quantize", mutates_args=())
def quantize(x: Tensor, scale: Tensor, fp8_dtype: torch.dtype) -> Tensor:
    """fp8(saturate(x * scale)), round-to-nearest-even, x's shape."""
    _check_dtype("x", x, FLOAT_DTYPES)
    _check_dtype("fp8_dtype", fp8_dtype, FP8_DTYPES)
    _check_backend(x.device)
    _check_scalar("scale", scale, x.device)
    x, scale = x.contiguous(), scale.contiguous()
    y = torch.empty(x.shape, dtype=fp8_dtype, device=x.device)
    ctx = _context(x.device)
    _run(x.device, _capi.lib.embscale_quantize, ctypes.byref(ctx), ctypes.byref(_desc(x)), scale.data_ptr(),
         ctypes.byref(_desc(y)))
    return y


@quantize.register_fake
def _(x, scale, fp8_dtype):
    return torch.empty_like(x, dtype=fp8_dtype)


@torch.library.custom_op("embscale::dequantize", mutates_args=())
def dequantize(y: Tensor, scale_inv: Tensor, out_dtype: torch.dtype = torch.float32) -> Tensor:
    """float(y) * scale_inv rounded to out_dtype, y's shape."""
    _check_dtype("y", y, FP8_DTYPES)
    _check_dtype("out_dtype", out_dtype, FLOAT_DTYPES)
    _check_backend(y.device)
    _check_scalar("scale_inv", scale_inv, y.device)
    y, scale_inv = y.contiguous(), scale_inv.contiguous()
    x = torch.empty(y.shape, dtype=out_dtype, device=y.device)
    ctx = _context(y.device)
    _run(y.device, _capi.lib.embscale_dequantize, ctypes.byref(ctx), ctypes.byref(_desc(y)), scale_inv.data_ptr(),
         ctypes.byref(_desc(x)))
    return x


@dequantize.register_fake
def _(y, scale_inv, out_dtype=torch.float32):
    return torch.empty_like(y, dtype=out_dtype)


@torch.library.custom_op("embscale::quantize_current_scaling", mutates_args=())
def quantize_current_scaling(x: Tensor, fp8_dtype: torch.dtype, eps: float = 0.0, power_of_2: bool = False,
                             algo: str = "auto") -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """amax -> scale -> cast on x's device without a host synchronisation: (y, amax, scale, scale_inv)."""
    _check_dtype("x", x, FLOAT_DTYPES)
    _check_dtype("fp8_dtype", fp8_dtype, FP8_DTYPES)
    _check_backend(x.device)
    x = x.contiguous()
    code = _lookup(_capi.AMAX_ALGO, "algo", algo)
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
    s = x.new_empty((), dtype=torch.float32)
    return torch.empty_like(x, dtype=fp8_dtype), s, torch.empty_like(s), torch.empty_like(s)


@torch.library.custom_op("embscale::activation_amax", mutates_args=())
def activation_amax(x: Tensor, activation: str, out_dtype: Optional[torch.dtype] = None,
                    algo: str = "auto") -> tuple[Tensor, Tensor]:
    """y = act(x) (relu, gelu_tanh, silu) in out_dtype (default x's) and max |y| of y as stored."""
    _check_dtype("x", x, FLOAT_DTYPES)
    out_dtype = x.dtype if out_dtype is None else out_dtype
    _check_dtype("out_dtype", out_dtype, FLOAT_DTYPES)
    _check_backend(x.device)
    act = _lookup(_capi.ACTIVATION, "activation", activation)
    code = _lookup(_capi.AMAX_ALGO, "algo", algo)
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
    return torch.empty_like(x, dtype=x.dtype if out_dtype is None else out_dtype), x.new_empty((), dtype=torch.float32)


@torch.library.custom_op("embscale::cast_transpose", mutates_args=())
def cast_transpose(x: Tensor, scale: Tensor, fp8_dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """(quantize(x), quantize(x).T) of a 2-D x in one pass: shapes [rows, cols] and [cols, rows]."""
    _check_dtype("x", x, FLOAT_DTYPES)
    _check_dtype("fp8_dtype", fp8_dtype, FP8_DTYPES)
    if x.dim() != 2:
        raise ValueError(f"x: has {x.dim()} dimensions, expected 2 ([rows, cols])")
    _check_backend(x.device)
    _check_scalar("scale", scale, x.device)
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
    return torch.empty_like(x, dtype=fp8_dtype), x.new_empty((x.shape[1], x.shape[0]), dtype=fp8_dtype)


# ---- table-batched embeddings ---------------------------------------------------------------------------
def _check_lookup_inputs(weights, indices, offsets, per_sample_weights):
    _check_dtype("weights", weights, FLOAT_DTYPES)
    _check_dtype("indices", indices, INDEX_DTYPES)
    _check_dtype("offsets", offsets, INDEX_DTYPES)
    _check_backend(weights.device)
    _check_device("indices", indices, weights.device)
    _check_device("offsets", offsets, weights.device)
    if per_sample_weights is not None:
        _check_dtype("per_sample_weights", per_sample_weights, (torch.float32,))
        _check_device("per_sample_weights", per_sample_weights, weights.device)
    for name, t in (("indices", indices), ("offsets", offsets)):
        if t.dim() != 1:
            raise ValueError(f"{name}: has {t.dim()} dimensions, expected 1")


@torch.library.custom_op("embscale::tbe_forward", mutates_args=())
def tbe_forward(weights: Tensor, indices: Tensor, offsets: Tensor, per_sample_weights: Optional[Tensor],
                handle: int, batch_size: int, pooling: str, bounds_check: str, output_cols: int,
                output_dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Pooled lookup [batch_size, output_cols] (sum/mean) or sequence rows [N, output_cols] (none) of the
    TableBatchedEmbedding `handle` (created by embscale.TableBatchedEmbeddingBags), and the number of
    indices skipped by bounds_check "skip" (an int64 tensor [1]; 0 in the other modes)."""
    _check_lookup_inputs(weights, indices, offsets, per_sample_weights)
    _check_dtype("output_dtype", output_dtype, FLOAT_DTYPES)
    dev = weights.device
    weights, indices, offsets = weights.contiguous(), indices.contiguous(), offsets.contiguous()
    psw = None if per_sample_weights is None else per_sample_weights.contiguous()
    rows = indices.numel() if pooling == "none" else batch_size
    out = torch.empty((rows, output_cols), dtype=output_dtype, device=dev)
    num_skipped = torch.zeros(1, dtype=torch.int64, device=dev)
    a = _capi.TbeForwardArgs()
    a.weights, a.indices, a.offsets = _desc(weights), _desc(indices), _desc(offsets)
    a.per_sample_weights = _optional_desc(psw)
    a.batch_size = batch_size
    a.pooling = _lookup(_capi.POOLING, "pooling", pooling)
    a.bounds_check = _lookup(_capi.BOUNDS_CHECK, "bounds_check", bounds_check)
    a.output = _desc(out, (rows, output_cols))
    a.num_skipped = num_skipped.data_ptr()
    _run(dev, _capi.lib.embscale_tbe_forward, ctypes.c_void_p(handle), ctypes.byref(_context(dev)), ctypes.byref(a))
    return out, num_skipped


@tbe_forward.register_fake
def _(weights, indices, offsets, per_sample_weights, handle, batch_size, pooling, bounds_check, output_cols,
      output_dtype):
    rows = indices.shape[0] if pooling == "none" else batch_size
    return weights.new_empty((rows, output_cols), dtype=output_dtype), weights.new_empty((1,), dtype=torch.int64)


@torch.library.custom_op("embscale::tbe_backward", mutates_args=("weights", "momentum1", "momentum2", "hparams"))
def tbe_backward(weights: Tensor, momentum1: Tensor, momentum2: Tensor, hparams: Tensor, grad_output: Tensor,
                 indices: Tensor, offsets: Tensor, per_sample_weights: Optional[Tensor], handle: int,
                 batch_size: int, pooling: str, bounds_check: str, optimizer: str, weight_decay_mode: str,
                 stochastic_rounding: bool, seed: int, grad_per_sample_weights: bool) -> Tensor:
    """Backward fused with the optimizer: updates weights and optimizer state in place, advances
    hparams' step, and returns the gradient of the per-sample weights ([N]; empty unless asked)."""
    _check_lookup_inputs(weights, indices, offsets, per_sample_weights)
    _check_dtype("grad_output", grad_output, FLOAT_DTYPES)
    dev = weights.device
    _check_device("grad_output", grad_output, dev)
    for name, m in (("momentum1", momentum1), ("momentum2", momentum2)):
        if m.numel() > 0:
            _check_dtype(name, m, (torch.float32,))
            _check_device(name, m, dev)
            if not m.is_contiguous():
                raise ValueError(f"{name}: must be contiguous (it is updated in place)")
    if not weights.is_contiguous():
        raise ValueError("weights: must be contiguous (they are updated in place)")
    if hparams.device.type != "cpu" or hparams.dtype != torch.float64 or hparams.numel() != len(HPARAM_FIELDS):
        raise ValueError(f"hparams: expected a cpu float64 tensor of {len(HPARAM_FIELDS)} values {HPARAM_FIELDS}")
    indices, offsets, grad_output = indices.contiguous(), offsets.contiguous(), grad_output.contiguous()
    psw = None if per_sample_weights is None else per_sample_weights.contiguous()
    hp = hparams.tolist()
    a = _capi.TbeBackwardArgs()
    a.weights, a.indices, a.offsets = _desc(weights), _desc(indices), _desc(offsets)
    a.per_sample_weights = _optional_desc(psw)
    a.batch_size = batch_size
    a.pooling = _lookup(_capi.POOLING, "pooling", pooling)
    a.bounds_check = _lookup(_capi.BOUNDS_CHECK, "bounds_check", bounds_check)
    a.grad_output = _desc(grad_output, tuple(grad_output.shape) if grad_output.dim() == 2 else None)
    o = a.optimizer
    o.type = _lookup(_capi.OPTIMIZER, "optimizer", optimizer)
    o.learning_rate, o.eps, o.beta1, o.beta2 = hp[HPARAM["learning_rate"]], hp[HPARAM["eps"]], hp[HPARAM["beta1"]], hp[HPARAM["beta2"]]
    o.weight_decay = hp[HPARAM["weight_decay"]]
    o.weight_decay_mode = _lookup(_capi.WEIGHT_DECAY, "weight_decay_mode", weight_decay_mode)
    o.max_norm, o.gradient_clipping = hp[HPARAM["max_norm"]], hp[HPARAM["gradient_clipping"]]
    step = int(hp[HPARAM["step"]])
    o.step = step
    # Optimizer state: an empty buffer is how a module says "this optimizer keeps none".
    a.momentum1 = _optional_desc(momentum1 if momentum1.numel() > 0 else None)
    a.momentum2 = _optional_desc(momentum2 if momentum2.numel() > 0 else None)
    grad_psw = torch.empty(indices.numel() if grad_per_sample_weights else 0, dtype=torch.float32, device=dev)
    a.grad_per_sample_weights = _optional_desc(grad_psw if grad_per_sample_weights else None)
    a.deterministic = 1
    a.rounding = _capi.ROUNDING["stochastic" if stochastic_rounding else "nearest"]
    a.seed = seed
    ctx = _context(dev)
    ws, nbytes = _workspace(dev, _capi.lib.embscale_tbe_backward_workspace_size, ctypes.c_void_p(handle),
                            ctypes.byref(ctx), ctypes.byref(a))
    _run(dev, _capi.lib.embscale_tbe_backward, ctypes.c_void_p(handle), ctypes.byref(ctx), ctypes.byref(a),
         _ptr(ws), nbytes)
    hparams[HPARAM["step"]] = step + 1
    return grad_psw


@tbe_backward.register_fake
def _(weights, momentum1, momentum2, hparams, grad_output, indices, offsets, per_sample_weights, handle, batch_size,
      pooling, bounds_check, optimizer, weight_decay_mode, stochastic_rounding, seed, grad_per_sample_weights):
    n = indices.shape[0] if grad_per_sample_weights else 0
    return weights.new_empty((n,), dtype=torch.float32)
