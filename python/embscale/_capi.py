"""ctypes bindings of the C API (include/embscale/embscale_c.h).

This module knows nothing about torch: it loads libembscale_c, mirrors the C structs and turns a
failed status into a Python exception carrying the library's message (which names the argument).
The library is looked up in this order: $EMBSCALE_LIBRARY, then next to this file (where
``pip install .`` puts it).
"""

import ctypes
import os

# Status codes (embscale::StatusCode).
OK, INVALID_ARGUMENT, UNSUPPORTED, OUT_OF_RANGE, WORKSPACE_TOO_SMALL, BACKEND_ERROR = range(6)

# Enumerations, as the C API numbers them.
BACKEND = {"cpu": 0, "cuda": 1}
AMAX_ALGO = {"auto": 0, "atomic": 1, "two_stage": 2}
ACTIVATION = {"relu": 0, "gelu_tanh": 1, "silu": 2}
POOLING = {"sum": 0, "mean": 1, "none": 2}
BOUNDS_CHECK = {"error": 0, "skip": 1, "off": 2, "warn": 3}
WEIGHT_DECAY = {"none": 0, "l2": 1, "decoupled": 2}
ROUNDING = {"nearest": 0, "stochastic": 1}
PLACEMENT = {"device": 0, "host": 1, "cached": 2}
CACHE_ALGORITHM = {"lru": 0, "lfu": 1}
QUANT_TYPE = {"fp32": 0, "fp16": 1, "bf16": 2, "int8": 3, "int4": 4, "int2": 5, "fp8e4m3": 6, "fp8e5m2": 7}


class Error(RuntimeError):
    """An error reported by the embscale library that has no more specific Python type."""


class Context(ctypes.Structure):
    _fields_ = [("backend", ctypes.c_int32), ("num_threads", ctypes.c_int32), ("stream", ctypes.c_void_p)]


class Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * 4),
    ]


class TbeLayout(ctypes.Structure):
    _fields_ = [
        ("num_weights", ctypes.c_int64),
        ("total_rows", ctypes.c_int64),
        ("total_dim", ctypes.c_int32),
        ("max_dim", ctypes.c_int32),
    ]


# The leading fields both argument structs share, in the C declaration's order.
_LOOKUP_FIELDS = [
    ("weights", Tensor),
    ("indices", Tensor),
    ("offsets", Tensor),
    ("per_sample_weights", Tensor),  # data NULL: unweighted
    ("batch_size", ctypes.c_int64),
    ("pooling", ctypes.c_int32),
    ("bounds_check", ctypes.c_int32),
]


class TbeForwardArgs(ctypes.Structure):
    _fields_ = _LOOKUP_FIELDS + [
        ("output", Tensor),
        ("num_skipped", ctypes.c_void_p),
    ]


class QuantTbeLayout(ctypes.Structure):
    _fields_ = [("total_bytes", ctypes.c_int64), ("total_dim", ctypes.c_int32), ("max_dim", ctypes.c_int32)]


class QuantTbeForwardArgs(ctypes.Structure):
    __slots__ = ()
    # The packed tables as bytes, then the lookup fields and output of TbeForwardArgs.
    _fields_ = [("weights", ctypes.c_void_p), ("weights_bytes", ctypes.c_int64)] + TbeForwardArgs._fields_[1:]


class Optimizer(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int32),
        ("learning_rate", ctypes.c_float),
        ("eps", ctypes.c_float),
        ("beta1", ctypes.c_float),
        ("beta2", ctypes.c_float),
        ("weight_decay", ctypes.c_float),
        ("weight_decay_mode", ctypes.c_int32),
        ("max_norm", ctypes.c_float),
        ("gradient_clipping", ctypes.c_float),
        ("step", ctypes.c_int64),
        ("eta", ctypes.c_float),
        ("momentum", ctypes.c_float),
    ]


class TbeBackwardArgs(ctypes.Structure):
    __slots__ = ()  # a field the C struct lacks (such as the removed "deterministic") is an error, not a no-op
    _fields_ = _LOOKUP_FIELDS + [
        ("grad_output", Tensor),
        ("optimizer", Optimizer),
        ("momentum1", Tensor),  # optional tensors: data NULL = absent
        ("momentum2", Tensor),
        ("grad_per_sample_weights", Tensor),
        ("unique_rows", Tensor),
        ("num_unique", ctypes.c_void_p),
        ("unique_grads", Tensor),
        ("rounding", ctypes.c_int32),
        ("seed", ctypes.c_uint64),
        ("max_warp_segment", ctypes.c_int32),
        ("max_block_segment", ctypes.c_int32),
        ("block_threads", ctypes.c_int32),
        ("num_skipped", ctypes.c_void_p),
        ("rounding_bases", Tensor),  # optional (a row cache's rows' places for stochastic rounding)
    ]


class OptimizerInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("state_layouts", ctypes.c_int32 * 2),
        ("state_names", ctypes.c_char_p * 2),
    ]


class RowCacheInfo(ctypes.Structure):
    _fields_ = [
        ("state_bytes", ctypes.c_int64),
        ("rounding_bases_offset", ctypes.c_int64),
        ("plan_bytes", ctypes.c_int64),
    ]


class RowCacheBuffers(ctypes.Structure):
    _fields_ = [
        ("host_weights", Tensor),
        ("host_momentum1", Tensor),
        ("host_momentum2", Tensor),
        ("cache_weights", Tensor),
        ("cache_momentum1", Tensor),
        ("cache_momentum2", Tensor),
        ("state", ctypes.c_void_p),
        ("state_bytes", ctypes.c_size_t),
    ]


class RowCachePrefetchArgs(ctypes.Structure):
    _fields_ = [
        ("indices", Tensor),
        ("offsets", Tensor),
        ("batch_size", ctypes.c_int64),
        ("step", ctypes.c_int64),
        ("lock_from", ctypes.c_int64),
        ("training", ctypes.c_int32),
        ("remapped", Tensor),
        ("plan", ctypes.c_void_p),
        ("plan_bytes", ctypes.c_size_t),
    ]


_P = ctypes.POINTER
_VP = ctypes.c_void_p
_SIGNATURES = {
    "embscale_version": ([], ctypes.c_char_p),
    "embscale_last_error": ([], ctypes.c_char_p),
    "embscale_backend_available": ([ctypes.c_int32], ctypes.c_int),
    "embscale_backend_compiled": ([ctypes.c_int32], ctypes.c_int),
    "embscale_amax_workspace_size": ([_P(Context), _P(Tensor), ctypes.c_int32, _P(ctypes.c_size_t)], ctypes.c_int),
    "embscale_amax": (
        [_P(Context), _P(Tensor), _VP, ctypes.c_int32, _VP, _VP, ctypes.c_size_t, _VP], ctypes.c_int),
    "embscale_compute_scale": (
        [_P(Context), _VP, ctypes.c_int32, ctypes.c_float, ctypes.c_int32, _VP, _VP, _VP], ctypes.c_int),
    "embscale_quantize": ([_P(Context), _P(Tensor), _VP, _P(Tensor), _VP], ctypes.c_int),
    "embscale_dequantize": ([_P(Context), _P(Tensor), _VP, _P(Tensor), _VP], ctypes.c_int),
    "embscale_quantize_current_scaling_workspace_size": (
        [_P(Context), _P(Tensor), ctypes.c_int32, _P(ctypes.c_size_t)], ctypes.c_int),
    "embscale_quantize_current_scaling": (
        [_P(Context), _P(Tensor), _P(Tensor), _VP, _VP, _VP, ctypes.c_int32, ctypes.c_float, ctypes.c_int32, _VP,
         _VP, ctypes.c_size_t, _VP], ctypes.c_int),
    "embscale_activation_amax_workspace_size": (
        [_P(Context), _P(Tensor), ctypes.c_int32, _P(ctypes.c_size_t)], ctypes.c_int),
    "embscale_activation_amax": (
        [_P(Context), ctypes.c_int32, _P(Tensor), _P(Tensor), _VP, ctypes.c_int32, _VP, ctypes.c_size_t, _VP],
        ctypes.c_int),
    "embscale_cast_transpose": ([_P(Context), _P(Tensor), _VP, _P(Tensor), _P(Tensor), _VP], ctypes.c_int),
    "embscale_num_optimizers": ([], ctypes.c_int32),
    "embscale_optimizer_info_get": ([ctypes.c_int32, _P(OptimizerInfo)], ctypes.c_int),
    "embscale_optimizer_weight_decay_get": ([ctypes.c_int32, _P(ctypes.c_int32)], ctypes.c_int),
    "embscale_optimizer_check": ([_P(Optimizer)], ctypes.c_int),
    "embscale_tbe_create": (
        [_P(Context), ctypes.c_int32, _P(ctypes.c_int64), _P(ctypes.c_int32), ctypes.c_int32, _P(ctypes.c_int32),
         ctypes.c_int32, _P(_VP)], ctypes.c_int),
    "embscale_tbe_destroy": ([_VP], None),
    "embscale_tbe_layout_get": ([_VP, _P(TbeLayout)], ctypes.c_int),
    "embscale_tbe_table_offsets": ([_VP, _P(ctypes.c_int64), _P(ctypes.c_int64)], ctypes.c_int),
    "embscale_tbe_forward": ([_VP, _P(Context), _P(TbeForwardArgs)], ctypes.c_int),
    "embscale_tbe_forward_host_count": ([_VP, _P(Context), _P(TbeForwardArgs), _VP], ctypes.c_int),
    "embscale_tbe_backward_workspace_size": (
        [_VP, _P(Context), _P(TbeBackwardArgs), _P(ctypes.c_size_t)], ctypes.c_int),
    "embscale_tbe_backward": ([_VP, _P(Context), _P(TbeBackwardArgs), _VP, ctypes.c_size_t], ctypes.c_int),
    "embscale_quant_tbe_create": (
        [_P(Context), ctypes.c_int32, _P(ctypes.c_int64), _P(ctypes.c_int32), _P(ctypes.c_int32), ctypes.c_int32,
         _P(ctypes.c_int32), ctypes.c_int32, ctypes.c_int32, _P(_VP)], ctypes.c_int),
    "embscale_quant_tbe_destroy": ([_VP], None),
    "embscale_quant_tbe_layout_get": ([_VP, _P(QuantTbeLayout), _P(ctypes.c_int64), _P(ctypes.c_int64)], ctypes.c_int),
    "embscale_quant_tbe_forward": ([_VP, _P(Context), _P(QuantTbeForwardArgs)], ctypes.c_int),
    "embscale_dequantize_rows": ([ctypes.c_int32, _VP, ctypes.c_int64, ctypes.c_int32, _P(Tensor)], ctypes.c_int),
    "embscale_quantize_rows_workspace_size": (
        [_P(Context), ctypes.c_int32, _P(Tensor), ctypes.c_int32, _P(ctypes.c_size_t)], ctypes.c_int),
    "embscale_quantize_rows": (
        [_P(Context), ctypes.c_int32, _P(Tensor), ctypes.c_int32, _VP, ctypes.c_int64, _VP, ctypes.c_size_t],
        ctypes.c_int),
    "embscale_row_cache_create": (
        [_P(Context), ctypes.c_int32, _P(ctypes.c_int64), _P(ctypes.c_int32), ctypes.c_int32, _P(ctypes.c_int32),
         ctypes.c_int32, _P(ctypes.c_int32), _P(ctypes.c_int64), ctypes.c_int32, ctypes.c_int32, ctypes.c_int64,
         _P(_VP)], ctypes.c_int),
    "embscale_row_cache_destroy": ([_VP], None),
    "embscale_host_store_malloc": ([ctypes.c_uint64, _P(_VP)], ctypes.c_int),
    "embscale_host_store_free": ([_VP], None),
    "embscale_row_cache_tbe": ([_VP], _VP),
    "embscale_row_cache_info_get": ([_VP, _P(RowCacheInfo), _P(ctypes.c_int64)], ctypes.c_int),
    "embscale_row_cache_load": ([_VP, _P(Context), _P(RowCacheBuffers)], ctypes.c_int),
    "embscale_row_cache_prefetch": ([_VP, _P(Context), _P(RowCacheBuffers), _P(RowCachePrefetchArgs)], ctypes.c_int),
    "embscale_row_cache_fetch": ([_VP, _P(Context), _P(RowCacheBuffers), _VP, ctypes.c_size_t], ctypes.c_int),
    "embscale_row_cache_write_back": ([_VP, _P(Context), _P(RowCacheBuffers), _VP, ctypes.c_size_t], ctypes.c_int),
    "embscale_row_cache_flush": ([_VP, _P(Context), _P(RowCacheBuffers)], ctypes.c_int),
}


def _find_library():
    explicit = os.environ.get("EMBSCALE_LIBRARY")
    if explicit:
        return explicit
    here = os.path.dirname(os.path.abspath(__file__))
    for name in ("libembscale_c.so", "libembscale_c.dylib", "embscale_c.dll"):
        path = os.path.join(here, name)
        if os.path.exists(path):
            return path
    raise ImportError(
        "embscale: the native library libembscale_c was not found next to the package; install the package "
        "with `pip install .` from the repository, or point EMBSCALE_LIBRARY at a built libembscale_c.so")


def _load():
    lib = ctypes.CDLL(_find_library())
    for name, (argtypes, restype) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = restype
    return lib


lib = _load()

# The optimizers as the library describes them (embscale_optimizer_info_get): name -> C enum value, and
# name -> its state buffers (momentum1, momentum2), each None when absent or (layout, Python name) with
# layout "rows" (one float per row of all tables) or "elements" (one per weight); and name -> how it applies
# weight_decay (embscale_optimizer_weight_decay_get): "none", "by_mode" (as weight_decay_mode says: L2,
# decoupled, or ignored in mode none) or "decoupled" (whenever weight_decay != 0, whatever the mode).
_STATE_LAYOUTS = {1: "rows", 2: "elements"}
_WEIGHT_DECAY_RULES = {0: "none", 1: "by_mode", 2: "decoupled"}


def _optimizers():
    codes, states, decays = {}, {}, {}
    for code in range(lib.embscale_num_optimizers()):
        info, rule = OptimizerInfo(), ctypes.c_int32()
        if lib.embscale_optimizer_info_get(code, ctypes.byref(info)) != OK or \
                lib.embscale_optimizer_weight_decay_get(code, ctypes.byref(rule)) != OK:
            raise ImportError("embscale: " + lib.embscale_last_error().decode("utf-8", "replace"))
        name = info.name.decode()
        codes[name] = code
        states[name] = tuple(
            (_STATE_LAYOUTS[info.state_layouts[k]], info.state_names[k].decode()) if info.state_layouts[k] else None
            for k in range(2))
        decays[name] = _WEIGHT_DECAY_RULES[rule.value]
    return codes, states, decays


OPTIMIZER, OPTIMIZER_STATES, OPTIMIZER_WEIGHT_DECAY = _optimizers()


def check(rc):
    """Raises the Python exception matching a C API status code, with the library's message."""
    if rc == OK:
        return
    message = lib.embscale_last_error().decode("utf-8", "replace")
    if rc == INVALID_ARGUMENT:
        raise ValueError(message)
    if rc == OUT_OF_RANGE:
        raise IndexError(message)
    if rc == UNSUPPORTED:
        raise NotImplementedError(message)
    raise Error(message)


def version():
    return lib.embscale_version().decode()


def backend_available(name):
    return bool(lib.embscale_backend_available(BACKEND[name]))
