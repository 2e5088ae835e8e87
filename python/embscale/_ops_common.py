"""What every operator module shares: the dtype tables, the argument checks (each names its argument),
the C descriptors of tensors, the context of a device, calls into the C API and workspaces.

The real and the fake implementation of an operator share their argument checks: the dtypes, that all
tensor arguments are on one device (a mix of meta and CPU tensors is refused, not run as meta), and the
shapes outputs are allocated from. Everything else is checked once, by the C library, before it writes
anything.
"""

import ctypes
import numbers

import torch

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


def _check_dtype(name, t, allowed):
    """t: a tensor, or a torch.dtype argument. Anything else (a None passed for a tensor, which the dispatcher
    lets through) is a TypeError naming the argument, not an AttributeError from deep inside."""
    if isinstance(t, torch.dtype):
        dtype = t
    elif isinstance(t, torch.Tensor):
        dtype = t.dtype
    else:
        raise TypeError(f"{name}: expected a tensor, got {type(t).__name__}")
    if dtype not in allowed:
        names = ", ".join(str(d).replace("torch.", "") for d in allowed)
        raise TypeError(f"{name}: dtype {str(dtype).replace('torch.', '')} is not supported; expected {names}")


def _check_dtype_arg(name, dtype, allowed):
    """A torch.dtype argument (not a tensor, a string or a dtype's integer code) that is one of `allowed`."""
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"{name}: expected a torch.dtype, got {type(dtype).__name__}")
    _check_dtype(name, dtype, allowed)


def _check_tensor(name, t, allowed):
    """A dense tensor argument of one of the `allowed` dtypes. A sparse (COO, CSR ...) tensor has no flat
    buffer of its elements to hand to the C library: refused by name instead of failing inside torch."""
    _check_dtype(name, t, allowed)
    if t.layout != torch.strided:
        raise TypeError(f"{name}: layout {t.layout} is not supported; expected a dense (torch.strided) tensor")


# The largest finite fp32: the C library takes eps as a float, where a larger double becomes inf.
FLT_MAX = torch.finfo(torch.float32).max


def _check_eps_type(eps):
    """eps (of a scale) is a real number: not a bool, whose True would silently mean 1.0."""
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(f"eps: expected a real number, got {type(eps).__name__}")


def _check_eps(eps):
    """eps (of a scale): a real number in [0, FLT_MAX]."""
    _check_eps_type(eps)
    if not 0.0 <= eps <= FLT_MAX:  # also refuses NaN
        raise ValueError(f"eps: {eps!r} is not allowed; expected a finite value in [0, {FLT_MAX:g}]")


def _check_writable(name, t):
    """A buffer an operator updates in place: not an inference tensor outside inference mode (as torch's own
    in-place operators demand), and not a tensor that requires grad (the update would bypass autograd; the
    operators run below autograd, where grad mode is always off, so this holds under torch.no_grad() too)."""
    if t.is_inference() and not torch.is_inference_mode_enabled():
        raise RuntimeError(f"{name}: an inference tensor cannot be updated in place outside inference mode")
    if t.requires_grad:
        raise RuntimeError(f"{name}: requires grad; an operator that writes it in place does not support automatic "
                           "differentiation (pass a tensor that does not require grad, e.g. its .detach())")


def _byte_span(t):
    """[first byte, one past the last byte] that tensor t's elements occupy (any strides)."""
    n, first = t.numel(), t.data_ptr()
    if n == 0:
        return first, first
    if t.is_contiguous():
        return first, first + n * t.element_size()
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return first, first + (last + 1) * t.element_size()


def _check_apart(name, t, others):
    """t (written in place) shares no memory with any of the (name, tensor-or-None) pairs: ValueError naming
    both. Real tensors only (the fake implementations have no memory to compare)."""
    a0, a1 = _byte_span(t)
    for other_name, o in others:
        if o is None or o.device != t.device or a0 == a1:
            continue
        b0, b1 = _byte_span(o)
        if a0 < b1 and b0 < a1:
            raise ValueError(f"{name}: overlaps {other_name}; a buffer the operator writes must not share memory with "
                             "another argument")


def _check_disjoint(written, read):
    """What an operator writes against everything else it is given, as the C library's check::disjoint: each
    written (name, tensor-or-None) pair against the written ones after it and every read one. Run on the
    caller's tensors, with their own strides, before any .contiguous() copy that the C check would see
    instead of the caller's memory."""
    for i, (name, t) in enumerate(written):
        if t is not None:
            _check_apart(name, t, tuple(written[i + 1:]) + tuple(read))


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


_cuda_usable = False  # set once the library has found a CUDA device (which it then keeps for the process)


def _check_backend(device):
    global _cuda_usable
    if device.type not in _capi.BACKEND:
        raise ValueError(f"device: {device} is not supported; expected a cpu or cuda tensor")
    if device.type == "cuda" and not _cuda_usable:
        if not _capi.backend_available("cuda"):  # a device query: asked until the answer is yes
            raise NotImplementedError("device: this build of embscale has no usable CUDA backend")
        _cuda_usable = True


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


# The current stream of a CUDA device as a raw cudaStream_t, without building a torch.cuda.Stream (the
# accessor torch's own generated code uses; torch.cuda.current_stream where a build lacks it).
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _context(device):
    c = _capi.Context()
    c.backend = _capi.BACKEND[device.type]
    if device.type == "cuda":
        c.stream = (_raw_stream(device.index) if _raw_stream is not None and device.index is not None
                    else torch.cuda.current_stream(device).cuda_stream)
    else:
        c.num_threads = torch.get_num_threads()
    return c


def _call(device, fn, *args):
    """Calls C function fn with args on the right CUDA device; returns its status code."""
    if device.type == "cuda" and device.index != torch.cuda.current_device():
        with torch.cuda.device(device):
            return fn(*args)
    return fn(*args)


def _run(device, fn, *args):
    """Calls C function fn with args on the right CUDA device; raises on a failed status."""
    _capi.check(_call(device, fn, *args))


# Workspace sizes already asked: (size function's name, device type, device index) + the caller's key -> bytes.
# Cleared whole when it outgrows _WORKSPACE_BYTES_MAX entries (a few shapes repeat in training; a stream of
# new shapes must not grow it without bound).
_WORKSPACE_BYTES = {}
_WORKSPACE_BYTES_MAX = 256


def _workspace(device, size_fn, *args, key=None):
    """A workspace for a C call on `device`: (uint8 tensor, its bytes), the size from C function size_fn called
    with args and then a size_t*. key: None to ask on every call, or a hashable tuple of everything besides
    the size function and the device that the size depends on (e.g. dtype code, numel, algo code); then the
    size is asked once per key and device (its index picks the SM count a CUDA size depends on), and a call
    with the same key makes no size query. The op's own call checks the arguments and the workspace again,
    so a size taken from here is never trusted unchecked."""
    if key is not None:
        key = (size_fn.__name__, device.type, device.index) + tuple(key)
        nbytes = _WORKSPACE_BYTES.get(key)
    if key is None or nbytes is None:
        size = ctypes.c_size_t(0)
        _run(device, size_fn, *args, ctypes.byref(size))
        nbytes = size.value
        if key is not None:
            if len(_WORKSPACE_BYTES) >= _WORKSPACE_BYTES_MAX:
                _WORKSPACE_BYTES.clear()
            _WORKSPACE_BYTES[key] = nbytes
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return ws, nbytes


def _lookup(table, name, value):
    if value not in table:
        raise ValueError(f"{name}: '{value}' is not one of {', '.join(table)}")
    return table[value]


def _check_scalar(name, s, device):
    """A one-element dense fp32 tensor on `device` (a sparse one is refused by name)."""
    _check_tensor(name, s, (torch.float32,))
    _check_device(name, s, device)
    if s.numel() != 1:
        raise ValueError(f"{name}: has {s.numel()} elements, expected 1")
