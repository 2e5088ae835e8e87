"""torch custom operators (torch.ops.embscale.*) over the C API.

This is the only code that sees torch types. Each operator takes tensors on one device (CPU or CUDA),
runs on the current CUDA stream for CUDA tensors, allocates its workspace through torch (so CUDA graph
capture and the caching allocator work), and has a fake (meta) implementation so torch.compile can
trace it. Inputs are made contiguous. Errors: TypeError for a dtype, ValueError for a shape, device or
value, IndexError for an index outside its table, NotImplementedError for what the build lacks; each
message names the argument.

The real and the fake implementation of an operator share their argument checks: the dtypes, that all
tensor arguments are on one device (a mix of meta and CPU tensors is refused, not run as meta), and for
the TBE operators the shapes the output is allocated from. Everything else is checked once, by the C
library, before it writes anything.

TBE operators take ``handle``, the integer id of a TbeHandle (one per TableBatchedEmbeddingBags, device
and weights dtype), looked up in a registry of live handles: an id that names no live handle raises
ValueError and never reaches the library as a pointer. Calls on one handle are serialised by its lock
(the forward, and the backward with its read and advance of the step counter), so threads sharing a
module lose no update.
"""

import ctypes
import itertools
import math
import threading
import weakref
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


def _same_device(*named):
    """The device shared by the tensors of (name, tensor-or-None) pairs; ValueError naming the first one on
    another device. Used by the real and the fake implementations alike, so a meta tensor among CPU ones is
    refused instead of silently running the fake implementation."""
    device = None
    for name, t in named:
        if t is None:
            continue
        if device is None:
            device = t.device
        else:
            _check_device(name, t, device)
    return device


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
# Each operator's checks run in both its real and its fake implementation; the real one then checks the
# backend (meta is not one).
def _check_scalar(name, s, device):
    _check_dtype(name, s, (torch.float32,))
    _check_device(name, s, device)
    if s.numel() != 1:
        raise ValueError(f"{name}: has {s.numel()} elements, expected 1")


def _amax_checks(x, algo):
    _check_dtype("x", x, FLOAT_DTYPES)
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


def _compute_scale_checks(amax, fp8_dtype):
    _check_dtype("amax", amax, (torch.float32,))
    _check_dtype("fp8_dtype", fp8_dtype, FP8_DTYPES)
    if amax.numel() != 1:
        raise ValueError(f"amax: has {amax.numel()} elements, expected 1")


@torch.library.custom_op("embscale::compute_scale", mutates_args=())
def compute_scale(amax: Tensor, fp8_dtype: torch.dtype, eps: float = 0.0,
                  power_of_2: bool = False) -> tuple[Tensor, Tensor]:
    """(scale, scale_inv) from a 0-dim fp32 amax: scale = fp8_max / max(amax, eps), 1 for 0/inf/NaN."""
    _compute_scale_checks(amax, fp8_dtype)
    _check_backend(amax.device)
    amax = amax.contiguous()
    scale, scale_inv = _scalar(amax.device), _scalar(amax.device)
    ctx = _context(amax.device)
    _run(amax.device, _capi.lib.embscale_compute_scale, ctypes.byref(ctx), amax.data_ptr(), _DTYPE_CODE[fp8_dtype],
         eps, int(power_of_2), scale.data_ptr(), scale_inv.data_ptr())
    return scale, scale_inv


@compute_scale.register_fake
def _(amax, fp8_dtype, eps=0.0, power_of_2=False):
    _compute_scale_checks(amax, fp8_dtype)
    return amax.new_empty((), dtype=torch.float32), amax.new_empty((), dtype=torch.float32)


def _quantize_checks(x, scale, fp8_dtype):
    _check_dtype("x", x, FLOAT_DTYPES)
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
    return torch.empty_like(x, dtype=fp8_dtype)


def _dequantize_checks(y, scale_inv, out_dtype):
    _check_dtype("y", y, FP8_DTYPES)
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
    return torch.empty_like(y, dtype=out_dtype)


def _quantize_current_scaling_checks(x, fp8_dtype, algo):
    _check_dtype("x", x, FLOAT_DTYPES)
    _check_dtype("fp8_dtype", fp8_dtype, FP8_DTYPES)
    return _lookup(_capi.AMAX_ALGO, "algo", algo)


@torch.library.custom_op("embscale::quantize_current_scaling", mutates_args=())
def quantize_current_scaling(x: Tensor, fp8_dtype: torch.dtype, eps: float = 0.0, power_of_2: bool = False,
                             algo: str = "auto") -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """amax -> scale -> cast on x's device without a host synchronisation: (y, amax, scale, scale_inv)."""
    code = _quantize_current_scaling_checks(x, fp8_dtype, algo)
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
    _quantize_current_scaling_checks(x, fp8_dtype, algo)
    s = x.new_empty((), dtype=torch.float32)
    return torch.empty_like(x, dtype=fp8_dtype), s, torch.empty_like(s), torch.empty_like(s)


def _activation_amax_checks(x, activation, out_dtype, algo):
    """(activation code, amax algorithm code, output dtype)."""
    _check_dtype("x", x, FLOAT_DTYPES)
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
    return torch.empty_like(x, dtype=out_dtype), x.new_empty((), dtype=torch.float32)


def _cast_transpose_checks(x, scale, fp8_dtype):
    _check_dtype("x", x, FLOAT_DTYPES)
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
    return torch.empty_like(x, dtype=fp8_dtype), x.new_empty((x.shape[1], x.shape[0]), dtype=fp8_dtype)


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


# ---- table-batched embeddings ---------------------------------------------------------------------------
# Live handles by id. Weak references: a handle lives as long as its module holds it, and ids are never
# reused, so a stale id finds nothing instead of another module's tables.
_TBE_HANDLES = weakref.WeakValueDictionary()
_TBE_IDS = itertools.count(1)


class TbeHandle:
    """One C TableBatchedEmbedding for one device and weights dtype, registered under a unique integer id
    (``id``) that the TBE operators take as ``handle``; its ``lock`` serialises the calls on it.

    On the meta device there is no C object (``ptr`` is None): the layout is read from a CPU one that is
    freed at once, so a module built on meta knows its shapes and traces through the fake implementations.
    A copy (copy.deepcopy, pickling) builds a new C object with a new id.
    """

    def __init__(self, device, num_rows, dims, feature_table_map, weights_dtype):
        device = torch.device(device)
        _check_dtype("weights_dtype", weights_dtype, FLOAT_DTYPES)
        if device.type != "meta":
            _check_backend(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.args = (device, [int(r) for r in num_rows], [int(d) for d in dims],
                     [int(t) for t in feature_table_map], weights_dtype)
        self.device = device
        self.weights_dtype = weights_dtype
        self.feature_dims = [int(dims[t]) for t in feature_table_map]
        self.num_features = len(self.feature_dims)
        self.lock = threading.Lock()
        self.ptr = None
        ctx = _capi.Context()
        ctx.backend = _capi.BACKEND["cpu" if device.type == "meta" else device.type]
        T = len(num_rows)
        rows = (ctypes.c_int64 * T)(*num_rows)
        ds = (ctypes.c_int32 * T)(*dims)
        fmap = (ctypes.c_int32 * self.num_features)(*feature_table_map)
        out = ctypes.c_void_p()
        create = (_capi.lib.embscale_tbe_create, ctypes.byref(ctx), T, rows, ds, self.num_features, fmap,
                  _DTYPE_CODE[weights_dtype], ctypes.byref(out))
        _run(device if device.type != "meta" else torch.device("cpu"), *create)
        try:
            layout = _capi.TbeLayout()
            _capi.check(_capi.lib.embscale_tbe_layout_get(out.value, ctypes.byref(layout)))
            weight_offsets, row_offsets = (ctypes.c_int64 * T)(), (ctypes.c_int64 * T)()
            _capi.check(_capi.lib.embscale_tbe_table_offsets(out.value, weight_offsets, row_offsets))
        except BaseException:
            _capi.lib.embscale_tbe_destroy(out.value)
            raise
        self.num_weights, self.total_rows = layout.num_weights, layout.total_rows
        self.total_dim, self.max_dim = layout.total_dim, layout.max_dim
        self.weight_offsets, self.row_offsets = list(weight_offsets), list(row_offsets)
        if device.type == "meta":
            _capi.lib.embscale_tbe_destroy(out.value)
        else:
            self.ptr = out.value
        self.id = next(_TBE_IDS)
        _TBE_HANDLES[self.id] = self

    def __deepcopy__(self, memo):
        return TbeHandle(*self.args)

    def __reduce__(self):
        return (TbeHandle, self.args)

    def __del__(self):
        ptr, self.ptr = getattr(self, "ptr", None), None
        if ptr:
            _capi.lib.embscale_tbe_destroy(ptr)


def tbe_handle(handle):
    """The live TbeHandle whose id is `handle`; ValueError naming `handle` when there is none."""
    h = _TBE_HANDLES.get(handle) if isinstance(handle, int) and not isinstance(handle, bool) else None
    if h is None:
        raise ValueError(f"handle: {handle!r} is not the id of a live TableBatchedEmbedding handle (the id a "
                         "TableBatchedEmbeddingBags passes; ids of freed handles are never reused)")
    return h


def _tbe_lookup_checks(weights, indices, offsets, per_sample_weights, handle, batch_size, pooling, bounds_check,
                       *more_tensors):
    """Checks shared by the real and fake implementations of tbe_forward and tbe_backward, all made before
    anything is allocated: dtypes, one device, 1-D lookups, the handle and the batch size against its
    layout. Returns (device, handle, pooling code, bounds-check code)."""
    _check_dtype("weights", weights, FLOAT_DTYPES)
    _check_dtype("indices", indices, INDEX_DTYPES)
    _check_dtype("offsets", offsets, INDEX_DTYPES)
    if offsets.dtype != indices.dtype:
        raise TypeError(f"offsets: dtype {str(offsets.dtype).replace('torch.', '')} differs from the indices' dtype "
                        f"{str(indices.dtype).replace('torch.', '')}")
    if per_sample_weights is not None:
        _check_dtype("per_sample_weights", per_sample_weights, (torch.float32,))
    device = _same_device(("weights", weights), ("indices", indices), ("offsets", offsets),
                          ("per_sample_weights", per_sample_weights), *more_tensors)
    for name, t in (("indices", indices), ("offsets", offsets), ("per_sample_weights", per_sample_weights)):
        if t is not None and t.dim() != 1:
            raise ValueError(f"{name}: has {t.dim()} dimensions, expected 1")
    pooling_code = _lookup(_capi.POOLING, "pooling", pooling)
    bounds_code = _lookup(_capi.BOUNDS_CHECK, "bounds_check", bounds_check)
    h = tbe_handle(handle)
    if device.type != "meta" and h.device != device:
        raise ValueError(f"handle: {handle} is a TableBatchedEmbedding on {h.device}; the tensors are on {device}")
    T = h.num_features
    if batch_size < 0:
        raise ValueError(f"batch_size: {batch_size} is negative")
    if offsets.shape[0] != T * batch_size + 1:
        raise ValueError(f"batch_size: {batch_size} needs offsets of T*B+1 = {T * batch_size + 1} entries (T = {T} "
                         f"features); offsets has {offsets.shape[0]}")
    return device, h, pooling_code, bounds_code


def _tbe_forward_checks(weights, indices, offsets, per_sample_weights, handle, batch_size, pooling, bounds_check,
                        output_cols, output_dtype):
    device, h, pooling_code, bounds_code = _tbe_lookup_checks(weights, indices, offsets, per_sample_weights, handle,
                                                              batch_size, pooling, bounds_check)
    _check_dtype("output_dtype", output_dtype, FLOAT_DTYPES)
    if pooling == "none":
        if len(set(h.feature_dims)) > 1:
            raise ValueError(f"pooling: 'none' (sequence) needs all features of one dimension; the features have "
                             f"{h.feature_dims}")
        want, what = (h.feature_dims[0] if h.feature_dims else 0), "D (sequence)"
    else:
        want, what = h.total_dim, "total_dim (pooled)"
    if output_cols != want:
        raise ValueError(f"output_cols: {output_cols}; expected {what} = {want}")
    rows = indices.shape[0] if pooling == "none" else batch_size
    return device, h, pooling_code, bounds_code, rows


@torch.library.custom_op("embscale::tbe_forward", mutates_args=())
def tbe_forward(weights: Tensor, indices: Tensor, offsets: Tensor, per_sample_weights: Optional[Tensor],
                handle: int, batch_size: int, pooling: str, bounds_check: str, output_cols: int,
                output_dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Pooled lookup [batch_size, output_cols] (sum/mean) or sequence rows [N, output_cols] (none) of the
    TableBatchedEmbedding whose handle id is `handle` (a TableBatchedEmbeddingBags' ``_handle_id``), and the
    number of indices skipped by bounds_check "skip" (an int64 tensor [1]; 0 in the other modes)."""
    dev, h, pooling_code, bounds_code, rows = _tbe_forward_checks(
        weights, indices, offsets, per_sample_weights, handle, batch_size, pooling, bounds_check, output_cols,
        output_dtype)
    _check_backend(dev)
    weights, indices, offsets = weights.contiguous(), indices.contiguous(), offsets.contiguous()
    psw = None if per_sample_weights is None else per_sample_weights.contiguous()
    out = torch.empty((rows, output_cols), dtype=output_dtype, device=dev)
    num_skipped = torch.zeros(1, dtype=torch.int64, device=dev)
    a = _capi.TbeForwardArgs()
    a.weights, a.indices, a.offsets = _desc(weights), _desc(indices), _desc(offsets)
    a.per_sample_weights = _optional_desc(psw)
    a.batch_size = batch_size
    a.pooling, a.bounds_check = pooling_code, bounds_code
    a.output = _desc(out, (rows, output_cols))
    a.num_skipped = num_skipped.data_ptr()
    with h.lock:
        _run(dev, _capi.lib.embscale_tbe_forward, ctypes.c_void_p(h.ptr), ctypes.byref(_context(dev)),
             ctypes.byref(a))
    return out, num_skipped


@tbe_forward.register_fake
def _(weights, indices, offsets, per_sample_weights, handle, batch_size, pooling, bounds_check, output_cols,
      output_dtype):
    _, _, _, _, rows = _tbe_forward_checks(weights, indices, offsets, per_sample_weights, handle, batch_size, pooling,
                                           bounds_check, output_cols, output_dtype)
    return weights.new_empty((rows, output_cols), dtype=output_dtype), weights.new_empty((1,), dtype=torch.int64)


def _tbe_backward_checks(weights, momentum1, momentum2, hparams, grad_output, indices, offsets, per_sample_weights,
                         handle, batch_size, pooling, bounds_check, optimizer, weight_decay_mode):
    _check_dtype("grad_output", grad_output, FLOAT_DTYPES)
    for name, m in (("momentum1", momentum1), ("momentum2", momentum2)):
        if m.numel() > 0:  # empty: this optimizer keeps no such state
            _check_dtype(name, m, (torch.float32,))
    device, h, pooling_code, bounds_code = _tbe_lookup_checks(
        weights, indices, offsets, per_sample_weights, handle, batch_size, pooling, bounds_check,
        ("grad_output", grad_output), ("momentum1", momentum1), ("momentum2", momentum2))
    # Updated in place through a flat view: strides the C API cannot see must be plain.
    for name, t in (("weights", weights), ("momentum1", momentum1), ("momentum2", momentum2)):
        if not t.is_contiguous():
            raise ValueError(f"{name}: must be contiguous (it is updated in place)")
    if hparams.device.type != "cpu" or hparams.dtype != torch.float64 or hparams.shape != (len(HPARAM_FIELDS),):
        raise ValueError(f"hparams: expected a cpu float64 tensor of {len(HPARAM_FIELDS)} values {HPARAM_FIELDS}")
    codes = (_lookup(_capi.OPTIMIZER, "optimizer", optimizer),
             _lookup(_capi.WEIGHT_DECAY, "weight_decay_mode", weight_decay_mode))
    return device, h, pooling_code, bounds_code, codes


def _checked_step(value):
    """The step counter read from hparams as an int64: finite and integral (ctypes would wrap or truncate
    anything else silently; the library refuses steps below 1)."""
    if not (math.isfinite(value) and value == math.floor(value) and -2.0**63 <= value < 2.0**63):
        raise ValueError(f"step: {value!r} (hparams[{HPARAM['step']}]) is not an integer step in [1, 2^63-1]")
    return int(value)


@torch.library.custom_op("embscale::tbe_backward", mutates_args=("weights", "momentum1", "momentum2", "hparams"))
def tbe_backward(weights: Tensor, momentum1: Tensor, momentum2: Tensor, hparams: Tensor, grad_output: Tensor,
                 indices: Tensor, offsets: Tensor, per_sample_weights: Optional[Tensor], handle: int,
                 batch_size: int, pooling: str, bounds_check: str, optimizer: str, weight_decay_mode: str,
                 stochastic_rounding: bool, seed: int, grad_per_sample_weights: bool) -> Tensor:
    """Backward fused with the optimizer: updates weights and optimizer state in place, advances
    hparams' step, and returns the gradient of the per-sample weights ([N]; empty unless asked).

    The hyper-parameters are read from hparams when the call starts, under the handle's lock, and the
    step is advanced under it, so concurrent calls on one handle each see and advance their own step.
    Any error leaves weights, optimizer state and step as they were."""
    dev, h, pooling_code, bounds_code, (opt_code, wd_code) = _tbe_backward_checks(
        weights, momentum1, momentum2, hparams, grad_output, indices, offsets, per_sample_weights, handle,
        batch_size, pooling, bounds_check, optimizer, weight_decay_mode)
    _check_backend(dev)
    indices, offsets, grad_output = indices.contiguous(), offsets.contiguous(), grad_output.contiguous()
    psw = None if per_sample_weights is None else per_sample_weights.contiguous()
    a = _capi.TbeBackwardArgs()
    a.weights, a.indices, a.offsets = _desc(weights), _desc(indices), _desc(offsets)
    a.per_sample_weights = _optional_desc(psw)
    a.batch_size = batch_size
    a.pooling, a.bounds_check = pooling_code, bounds_code
    a.grad_output = _desc(grad_output, tuple(grad_output.shape) if grad_output.dim() == 2 else None)
    # Optimizer state: an empty buffer is how a module says "this optimizer keeps none".
    a.momentum1 = _optional_desc(momentum1 if momentum1.numel() > 0 else None)
    a.momentum2 = _optional_desc(momentum2 if momentum2.numel() > 0 else None)
    grad_psw = torch.empty(indices.numel() if grad_per_sample_weights else 0, dtype=torch.float32, device=dev)
    a.grad_per_sample_weights = _optional_desc(grad_psw if grad_per_sample_weights else None)
    a.rounding = _capi.ROUNDING["stochastic" if stochastic_rounding else "nearest"]
    a.seed = seed
    o = a.optimizer
    o.type, o.weight_decay_mode = opt_code, wd_code
    ctx = _context(dev)
    with h.lock:
        hp = hparams.tolist()
        step = _checked_step(hp[HPARAM["step"]])
        o.learning_rate, o.eps = hp[HPARAM["learning_rate"]], hp[HPARAM["eps"]]
        o.beta1, o.beta2 = hp[HPARAM["beta1"]], hp[HPARAM["beta2"]]
        o.weight_decay, o.max_norm = hp[HPARAM["weight_decay"]], hp[HPARAM["max_norm"]]
        o.gradient_clipping = hp[HPARAM["gradient_clipping"]]
        o.step = step
        ws, nbytes = _workspace(dev, _capi.lib.embscale_tbe_backward_workspace_size, ctypes.c_void_p(h.ptr),
                                ctypes.byref(ctx), ctypes.byref(a))
        _run(dev, _capi.lib.embscale_tbe_backward, ctypes.c_void_p(h.ptr), ctypes.byref(ctx), ctypes.byref(a),
             _ptr(ws), nbytes)
        hparams[HPARAM["step"]] = step + 1
    return grad_psw


@tbe_backward.register_fake
def _(weights, momentum1, momentum2, hparams, grad_output, indices, offsets, per_sample_weights, handle, batch_size,
      pooling, bounds_check, optimizer, weight_decay_mode, stochastic_rounding, seed, grad_per_sample_weights):
    _tbe_backward_checks(weights, momentum1, momentum2, hparams, grad_output, indices, offsets, per_sample_weights,
                         handle, batch_size, pooling, bounds_check, optimizer, weight_decay_mode)
    n = indices.shape[0] if grad_per_sample_weights else 0
    return weights.new_empty((n,), dtype=torch.float32)
