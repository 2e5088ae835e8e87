"""Table-batched embedding operators (torch.ops.embscale.tbe_forward, tbe_backward) and the registry of
the C objects they run on.

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
from torch.utils import _python_dispatch
from torch import Tensor

from . import _capi
from ._ops_common import (FLOAT_DTYPES, INDEX_DTYPES, _DTYPE_CODE, _call, _check_apart, _check_backend, _check_device,
                          _check_dtype, _check_tensor, _check_writable, _context, _desc, _lookup, _optional_desc, _ptr,
                          _run, _same_device)

# Layout of a TBE module's hyper-parameter tensor (CPU float64), read by tbe_backward at every call so
# a learning rate set between steps is seen even inside a compiled graph. tbe_backward advances `step`.
HPARAM_FIELDS = ("learning_rate", "eps", "beta1", "beta2", "weight_decay", "max_norm", "gradient_clipping", "step",
                 "eta", "momentum")
HPARAM = {name: i for i, name in enumerate(HPARAM_FIELDS)}
# The step is a float64 in hparams, which holds every integer up to 2^53 but not 2^53 + 1: a backward refuses
# a step it could not advance past (step + 1 > 2^53), so the counter never stops silently.
MAX_STEP = 2**53

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
        # The C API takes int64 rows and int32 dims and table numbers: a value beyond them would wrap.
        for name, values, bits in (("num_rows", self.args[1], 64), ("dims", self.args[2], 32),
                                   ("feature_table_map", self.args[3], 32)):
            for i, v in enumerate(values):
                if not -(1 << (bits - 1)) <= v < 1 << (bits - 1):
                    raise ValueError(f"{name}[{i}]: {v} does not fit in the C API's int{bits}")
        self.device = device
        self.weights_dtype = weights_dtype
        self.table_dims = [int(d) for d in dims]
        self.feature_dims = [int(dims[t]) for t in feature_table_map]
        self.num_features = len(self.feature_dims)
        self.lock = threading.Lock()
        self.workspace_bytes = 0  # the backward's, see _run_backward
        self.cpu_workspace = torch.empty(0, dtype=torch.uint8)
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


# ---- eager calls ----------------------------------------------------------------------------------------
# In eager mode the module calls the operators' bodies (tbe_*_eager) directly: the custom-operator dispatch
# costs tens of microseconds per call on the host (bench/results/2026-12-01-cpu-host-overhead.md), more than
# the C call itself on small batches. Under torch.compile, tracing, a dispatch mode (fake tensors,
# functionalization) or a tensor subclass the module goes through torch.ops.embscale.* as before.

_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


def real_tensors(*tensors) -> bool:
    """Whether these tensors (None allowed) hold real data the host may read now: not under compile,
    tracing, a dispatch or torch-function mode or a functorch transform, and not subclasses or meta."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return False
    if _python_dispatch._get_current_dispatch_mode() is not None or torch._C._is_torch_function_mode_enabled():
        return False
    functorch_level = getattr(torch._C._functorch, "maybe_current_level", None)  # vmap, grad, ...
    if functorch_level is not None and functorch_level() is not None:
        return False
    for t in tensors:
        if t is not None and (type(t) not in _PLAIN_TENSORS or t.is_meta):
            return False
    return True


def eager_call(*tensors) -> bool:
    """Whether the module may call an operator's body directly for these arguments (None allowed): real
    tensors (real_tensors), not under the profiler (it sees torch.ops calls), and not where autograd would
    record the call (grad mode on and an argument requiring grad: a double backward through the operator
    must still refuse, not lose its term)."""
    if not real_tensors(*tensors) or torch.autograd._profiler_enabled():
        return False
    grad_mode = torch.is_grad_enabled()
    return not (grad_mode and any(t is not None and t.requires_grad for t in tensors))


def bump_versions(*tensors):
    """What the operator's dispatch does for the arguments it mutates: their version counters advance, so
    autograd refuses a graph that saved one of them before the update (eager calls of tbe_backward)."""
    for t in tensors:
        torch.autograd.graph.increment_version(t)


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
    number of indices skipped by bounds_check "skip" or "warn" (an int64 tensor [1] on the tables' device; -1
    for broken offsets in "warn" mode on CUDA, which never waits for the device; 0 in the other modes)."""
    return tbe_forward_eager(weights, indices, offsets, per_sample_weights, handle, batch_size, pooling,
                             bounds_check, output_cols, output_dtype)


def tbe_forward_eager(weights, indices, offsets, per_sample_weights, handle, batch_size, pooling, bounds_check,
                      output_cols, output_dtype, count_skipped=True, num_skipped_out=None, num_skipped_host=None):
    """tbe_forward's body, which the module calls directly in eager mode (eager_call). With count_skipped
    False the count of skipped indices is None in the modes that skip none ("off", "error"): the module
    does not read it there, and a zeroed tensor costs an allocation and a fill on the device per call.
    In skip and warn modes the module passes its own count buffer as num_skipped_out (an int64 tensor [1]
    on the tables' device, written in place and returned), and in warn mode on CUDA the address of a
    pinned host word as num_skipped_host, which the device also stores the count to (tbe.h)."""
    dev, h, pooling_code, bounds_code, rows = _tbe_forward_checks(
        weights, indices, offsets, per_sample_weights, handle, batch_size, pooling, bounds_check, output_cols,
        output_dtype)
    _check_backend(dev)
    weights, indices, offsets = weights.contiguous(), indices.contiguous(), offsets.contiguous()
    psw = None if per_sample_weights is None else per_sample_weights.contiguous()
    out = torch.empty((rows, output_cols), dtype=output_dtype, device=dev)
    # Skip and warn modes: the call writes the count whenever it succeeds. Off and error: 0, if asked for.
    if num_skipped_out is not None:  # written in place by the library: one int64 on the device
        _check_tensor("num_skipped_out", num_skipped_out, (torch.int64,))
        _check_device("num_skipped_out", num_skipped_out, dev)
        if num_skipped_out.numel() != 1 or not num_skipped_out.is_contiguous():
            raise ValueError(f"num_skipped_out: shape {list(num_skipped_out.shape)}; expected one contiguous element")
    if bounds_check in ("skip", "warn"):
        num_skipped = (torch.empty(1, dtype=torch.int64, device=dev) if num_skipped_out is None
                       else num_skipped_out)
    else:
        num_skipped = torch.zeros(1, dtype=torch.int64, device=dev) if count_skipped else None
    a = _capi.TbeForwardArgs()
    a.weights, a.indices, a.offsets = _desc(weights), _desc(indices), _desc(offsets)
    a.per_sample_weights = _optional_desc(psw)
    a.batch_size = batch_size
    a.pooling, a.bounds_check = pooling_code, bounds_code
    a.output = _desc(out, (rows, output_cols))
    a.num_skipped = None if num_skipped is None else num_skipped.data_ptr()
    with h.lock:
        if num_skipped_host is None:
            _run(dev, _capi.lib.embscale_tbe_forward, ctypes.c_void_p(h.ptr), ctypes.byref(_context(dev)),
                 ctypes.byref(a))
        else:
            _run(dev, _capi.lib.embscale_tbe_forward_host_count, ctypes.c_void_p(h.ptr),
                 ctypes.byref(_context(dev)), ctypes.byref(a), num_skipped_host)
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
    if grad_output.dim() != 2:  # named here: the C call would see it flattened
        raise ValueError(f"grad_output: shape {list(grad_output.shape)} is not 2-D; expected [B, total_dim] "
                         "(pooled) or [N, D] (sequence)")
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
    if not hparams.is_contiguous():  # an expanded one holds one value under every name: its step update writes all
        raise ValueError("hparams: must be contiguous (its step is updated in place)")
    if hparams.is_inference() and not torch.is_inference_mode_enabled():
        raise ValueError("hparams: an inference tensor (the module was built under torch.inference_mode) cannot "
                         "advance its step outside inference mode; build the module outside it to train")
    for name, t in (("weights", weights), ("momentum1", momentum1), ("momentum2", momentum2)):
        _check_writable(name, t)
    codes = (_lookup(_capi.OPTIMIZER, "optimizer", optimizer),
             _lookup(_capi.WEIGHT_DECAY, "weight_decay_mode", weight_decay_mode))
    return device, h, pooling_code, bounds_code, codes


def _checked_step(value):
    """The step counter read from hparams as an integer: finite, integral (ctypes would wrap or truncate
    anything else silently; the library refuses steps below 1) and below MAX_STEP, so that the backward can
    store the next one exactly."""
    if not (math.isfinite(value) and value == math.floor(value) and -2.0**63 <= value < MAX_STEP):
        raise ValueError(f"step: {value!r} (hparams[{HPARAM['step']}]) is not an integer step in [1, 2^53) (the "
                         "float64 hyper-parameters count steps exactly up to 2^53)")
    return int(value)


def _fill_optimizer(o, values):
    """Sets the hyper-parameters and step of the C optimizer struct o from values (HPARAM_FIELDS order).
    The struct holds float32: a value that is not 0 but rounds to 0 there (a learning rate of 1e-50) is
    refused, naming the field, as the library would be told 0 (training would stop, a clipping or a weight
    decay would be off) without knowing it was asked for anything else. Here, where the value becomes a
    float32, is the only place that can see it; the library checks the rest."""
    for field in (f for f in HPARAM_FIELDS if f != "step"):
        value = values[HPARAM[field]]
        setattr(o, field, value)
        if value != 0 and getattr(o, field) == 0:
            raise ValueError(f"optimizer.{field}: {value!r} rounds to 0 in float32, the precision the optimizer "
                             "computes in; expected 0 or a magnitude of at least 1.4e-45")
    o.step = _checked_step(values[HPARAM["step"]])


def check_hparams(optimizer: str, weight_decay_mode: str, values) -> None:
    """Raises ValueError, naming the field, when tbe_backward would refuse these hyper-parameters (a
    sequence in HPARAM_FIELDS order) for this optimizer and weight decay mode: what a module checks when
    a value is set, so that a bad one is refused there rather than at the next backward."""
    o = _capi.Optimizer()
    o.type = _lookup(_capi.OPTIMIZER, "optimizer", optimizer)
    o.weight_decay_mode = _lookup(_capi.WEIGHT_DECAY, "weight_decay_mode", weight_decay_mode)
    _fill_optimizer(o, [float(v) for v in values])
    _capi.check(_capi.lib.embscale_optimizer_check(ctypes.byref(o)))


def _run_backward(dev, h, ctx, a):
    """The C backward with a workspace of the largest size this handle's calls have asked for, so most
    calls skip the size query: the handle's first call asks first; a later call whose workspace is too small
    is refused before it writes anything (WORKSPACE_TOO_SMALL), and is then made again after the size query. On the CPU the buffer itself is
    kept on the handle: the call has finished with it when it returns, and the caller holds the handle's
    lock, so no other call uses it meanwhile (a new buffer per call costs an allocation, and above the C
    allocator's mmap threshold the page faults of fresh memory: a large batch's workspace is tens of MiB).
    On CUDA each call takes one from torch's caching allocator on the current stream, which is cheap and
    follows the stream's order."""
    tbe = ctypes.c_void_p(h.ptr)

    def call():
        size = h.workspace_bytes
        if dev.type == "cpu":
            if h.cpu_workspace.numel() < size:
                h.cpu_workspace = torch.empty(size, dtype=torch.uint8)
            ws = h.cpu_workspace
        else:
            ws = torch.empty(size, dtype=torch.uint8, device=dev)
        return _call(dev, _capi.lib.embscale_tbe_backward, tbe, ctypes.byref(ctx), ctypes.byref(a), _ptr(ws), size)

    def ask():
        nbytes = ctypes.c_size_t(0)
        _run(dev, _capi.lib.embscale_tbe_backward_workspace_size, tbe, ctypes.byref(ctx), ctypes.byref(a),
             ctypes.byref(nbytes))
        h.workspace_bytes = max(h.workspace_bytes, nbytes.value)

    if h.workspace_bytes == 0:
        ask()
    rc = call()
    if rc == _capi.WORKSPACE_TOO_SMALL:
        ask()
        rc = call()
    _capi.check(rc)


def _backward_args(weights, indices, offsets, psw, grad_output, batch_size, pooling_code, bounds_code, grad_psw):
    """The C backward's arguments that the fused update and the dense-gradient mode share (contiguous
    tensors; psw and grad_psw may be None)."""
    a = _capi.TbeBackwardArgs()
    a.weights, a.indices, a.offsets = _desc(weights), _desc(indices), _desc(offsets)
    a.per_sample_weights = _optional_desc(psw)
    a.batch_size = batch_size
    a.pooling, a.bounds_check = pooling_code, bounds_code
    a.grad_output = _desc(grad_output, tuple(grad_output.shape) if grad_output.dim() == 2 else None)
    a.grad_per_sample_weights = _optional_desc(grad_psw)
    return a


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
    grad_psw = tbe_backward_eager(weights, momentum1, momentum2, hparams, grad_output, indices, offsets,
                                  per_sample_weights, handle, batch_size, pooling, bounds_check, optimizer,
                                  weight_decay_mode, stochastic_rounding, seed, grad_per_sample_weights)
    return weights.new_empty((0,), dtype=torch.float32) if grad_psw is None else grad_psw


def tbe_backward_eager(weights, momentum1, momentum2, hparams, grad_output, indices, offsets, per_sample_weights,
                       handle, batch_size, pooling, bounds_check, optimizer, weight_decay_mode, stochastic_rounding,
                       seed, grad_per_sample_weights, rounding_bases=None):
    """tbe_backward's body, which the module calls directly in eager mode (eager_call); the caller bumps
    the version counters of what it updated, as the operator's dispatch does. Returns the per-sample
    weights' gradient, or None when it was not asked for (the operator returns an empty tensor).
    rounding_bases: a row cache's int64 [total_rows] on the tables' device (the library's
    TbeBackwardArgs::rounding_bases), or None."""
    dev, h, pooling_code, bounds_code, (opt_code, wd_code) = _tbe_backward_checks(
        weights, momentum1, momentum2, hparams, grad_output, indices, offsets, per_sample_weights, handle,
        batch_size, pooling, bounds_check, optimizer, weight_decay_mode)
    _check_backend(dev)
    indices, offsets, grad_output = indices.contiguous(), offsets.contiguous(), grad_output.contiguous()
    psw = None if per_sample_weights is None else per_sample_weights.contiguous()
    grad_psw = torch.empty(indices.numel(), dtype=torch.float32, device=dev) if grad_per_sample_weights else None
    a = _backward_args(weights, indices, offsets, psw, grad_output, batch_size, pooling_code, bounds_code, grad_psw)
    # Optimizer state: an empty buffer is how a module says "this optimizer keeps none".
    a.momentum1 = _optional_desc(momentum1 if momentum1.numel() > 0 else None)
    a.momentum2 = _optional_desc(momentum2 if momentum2.numel() > 0 else None)
    a.rounding = _capi.ROUNDING["stochastic" if stochastic_rounding else "nearest"]
    a.seed = seed
    a.rounding_bases = _optional_desc(rounding_bases)
    o = a.optimizer
    o.type, o.weight_decay_mode = opt_code, wd_code
    # The C call checks the buffers it is given against each other; hparams stays on this side.
    _check_apart("hparams", hparams, (("weights", weights), ("momentum1", momentum1), ("momentum2", momentum2),
                                      ("grad_output", grad_output), ("indices", indices), ("offsets", offsets),
                                      ("per_sample_weights", psw)))
    ctx = _context(dev)
    with h.lock:
        _fill_optimizer(o, hparams.tolist())
        _run_backward(dev, h, ctx, a)
        hparams[HPARAM["step"]] = o.step + 1
    return grad_psw


@tbe_backward.register_fake
def _(weights, momentum1, momentum2, hparams, grad_output, indices, offsets, per_sample_weights, handle, batch_size,
      pooling, bounds_check, optimizer, weight_decay_mode, stochastic_rounding, seed, grad_per_sample_weights):
    _tbe_backward_checks(weights, momentum1, momentum2, hparams, grad_output, indices, offsets, per_sample_weights,
                         handle, batch_size, pooling, bounds_check, optimizer, weight_decay_mode)
    n = indices.shape[0] if grad_per_sample_weights else 0
    return weights.new_empty((n,), dtype=torch.float32)


def _tbe_dense_grad_checks(weights, grad_output, indices, offsets, per_sample_weights, handle, batch_size, pooling,
                           bounds_check):
    _check_dtype("grad_output", grad_output, FLOAT_DTYPES)
    return _tbe_lookup_checks(weights, indices, offsets, per_sample_weights, handle, batch_size, pooling,
                              bounds_check, ("grad_output", grad_output))


@torch.library.custom_op("embscale::tbe_dense_grad", mutates_args=())
def tbe_dense_grad(weights: Tensor, grad_output: Tensor, indices: Tensor, offsets: Tensor,
                   per_sample_weights: Optional[Tensor], handle: int, batch_size: int, pooling: str, bounds_check: str,
                   grad_per_sample_weights: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The backward's dense-gradient mode (the library's optimizer "none"): nothing is updated; returns the
    unique rows the lookups touched ([N] int64, linearised as row_offset(t) + r, ascending; the first
    ``num_unique`` are valid), num_unique ([1] int64), their summed fp32 gradients ([N, max_dim]; row u
    uses its table's first D_t columns) and the per-sample weights' gradient ([N]; empty unless asked)."""
    return tbe_dense_grad_eager(weights, grad_output, indices, offsets, per_sample_weights, handle, batch_size,
                                pooling, bounds_check, grad_per_sample_weights)


def tbe_dense_grad_eager(weights, grad_output, indices, offsets, per_sample_weights, handle, batch_size, pooling,
                         bounds_check, grad_per_sample_weights):
    """tbe_dense_grad's body, which the module calls directly in eager mode (eager_call)."""
    dev, h, pooling_code, bounds_code = _tbe_dense_grad_checks(weights, grad_output, indices, offsets,
                                                               per_sample_weights, handle, batch_size, pooling,
                                                               bounds_check)
    _check_backend(dev)
    weights, indices, offsets = weights.contiguous(), indices.contiguous(), offsets.contiguous()
    grad_output = grad_output.contiguous()
    psw = None if per_sample_weights is None else per_sample_weights.contiguous()
    n = indices.numel()
    unique_rows = torch.empty(n, dtype=torch.int64, device=dev)
    num_unique = torch.zeros(1, dtype=torch.int64, device=dev)
    unique_grads = torch.empty((n, h.max_dim), dtype=torch.float32, device=dev)
    grad_psw = torch.empty(n if grad_per_sample_weights else 0, dtype=torch.float32, device=dev)
    a = _backward_args(weights, indices, offsets, psw, grad_output, batch_size, pooling_code, bounds_code,
                       grad_psw if grad_per_sample_weights else None)
    a.unique_rows, a.unique_grads = _optional_desc(unique_rows), _optional_desc(unique_grads)
    a.num_unique = num_unique.data_ptr()
    a.optimizer.type = _capi.OPTIMIZER["none"]
    a.optimizer.step = 1  # read by no rule here, but a step is always checked to be >= 1
    ctx = _context(dev)
    with h.lock:
        _run_backward(dev, h, ctx, a)
    return unique_rows, num_unique, unique_grads, grad_psw


@tbe_dense_grad.register_fake
def _(weights, grad_output, indices, offsets, per_sample_weights, handle, batch_size, pooling, bounds_check,
      grad_per_sample_weights):
    _, h, _, _ = _tbe_dense_grad_checks(weights, grad_output, indices, offsets, per_sample_weights, handle,
                                        batch_size, pooling, bounds_check)
    n = indices.shape[0]
    return (weights.new_empty((n,), dtype=torch.int64), weights.new_empty((1,), dtype=torch.int64),
            weights.new_empty((n, h.max_dim), dtype=torch.float32),
            weights.new_empty((n if grad_per_sample_weights else 0,), dtype=torch.float32))
