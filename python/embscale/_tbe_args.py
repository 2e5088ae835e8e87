"""TableBatchedEmbeddingBags' arguments as a user gives them, coerced and checked: numbers, flags, devices and
hyper-parameters (Python, numpy or one-element tensors alike), FBGEMM's keyword aliases, and the
hyper-parameters checked as the backward checks them. Every refusal names the argument: TypeError for a
value of the wrong kind, ValueError for one out of range."""

import ctypes
import math
import numbers
import warnings

import torch

from . import _capi, _fbgemm_names, ops
from ._ops_common import _check_backend
from ._ops_tbe import check_hparams


def module_device(device):
    """A device a module can live on (cpu, cuda with an index, meta), or ValueError naming it."""
    try:
        device = torch.device("cpu") if device is None else torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device: {device!r} is not a device ({e})") from None
    if device.type not in ("cpu", "cuda", "meta"):
        raise ValueError(f"device: {device} is not supported; expected cpu, cuda or meta")
    if device.type == "cuda":
        _check_backend(device)
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def hyper_parameter(name: str, value) -> float:
    """A hyper-parameter as given to the module (a real number: Python, numpy or a one-element tensor) as a
    float; TypeError naming it for anything else (strings and booleans included), ValueError for a number
    no float holds."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dtype == torch.bool or value.is_complex() or value.device.type == "meta":
            raise TypeError(f"{name}: a tensor of shape {list(value.shape)}, dtype {value.dtype} on {value.device} "
                            "is not a number")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: {value!r} is not a number")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{name}: {value!r} is not a finite number") from None


def _as_float32_text(value: float) -> float:
    """value rounded to float32 and printed as the library prints it (the fewest digits that read back as
    that float32), read back as a Python float."""
    f32 = ctypes.c_float(value).value
    if not math.isfinite(f32):
        return f32
    for digits in range(1, 10):
        text = float(f"{f32:.{digits}g}")
        if ctypes.c_float(text).value == f32:
            return text
    return f32


def check_hyper_parameters(optimizer: str, weight_decay_mode: str, values, names=None, where: str = ""):
    """ops' check_hparams in the caller's words: the library names a field optimizer.<field>; the message
    names it names[<field>] (the caller's argument; default <field>), after `where` (the values' source),
    and says so when the library's float32 of the value is not the value given. Dense-gradient mode
    ("none") reads no hyper-parameter, so nothing is checked there."""
    if optimizer == "none":
        return
    try:
        check_hparams(optimizer, weight_decay_mode, values)
    except ValueError as e:
        message = str(e)
        if message.startswith("optimizer."):
            field, _, rest = message[len("optimizer."):].partition(":")
            message = (names or {}).get(field, field) + ":" + rest
            given = values[ops.HPARAM[field]] if field in ops.HPARAM else None
            if (isinstance(given, float) and math.isfinite(given) and _as_float32_text(given) != given
                    and repr(given) not in rest):  # (not where the message already gives it)
                message += f" (the float32 the optimizer computes with; given {given!r})"
        raise ValueError(where + message) from None


# How each optimizer with decoupled weight decay applies it (src/tbe/optimizer.h), for its warning.
_DECOUPLED = {
    "adam": "w -= learning_rate * weight_decay * w each step, AdamW's",
    "partial_rowwise_adam": "w -= learning_rate * weight_decay * w each step, AdamW's",
    "lamb": "weight_decay * w added to the step that the trust ratio scales",
    "partial_rowwise_lamb": "weight_decay * w added to the step that the trust ratio scales",
    "lars_sgd": "weight_decay * w added to the gradient, and to the norm of the row's learning rate",
}


def warn_ignored_weight_decay(optimizer: str, weight_decay_mode: str, values, name: str, stacklevel: int):
    """Says so where a weight decay does not do what its mode's name suggests, by the optimizer's rule (the
    library's, FBGEMM's: _capi.OPTIMIZER_WEIGHT_DECAY): set while the mode is "none", it is kept and ignored
    by row-wise Adagrad (FBGEMM's meaning of NONE) and by SGD (which applies none; the library refuses any
    other mode there) and by Adagrad (likewise); Adam, LAMB, LARS-SGD and their partial row-wise forms apply
    it by their own decoupled rule whatever the mode, so "l2" there is not torch.optim.Adam's L2. values: the hyper-parameters as set (HPARAM_FIELDS order, already checked
    for this mode)."""
    value = values[ops.HPARAM["weight_decay"]]
    rule = _capi.OPTIMIZER_WEIGHT_DECAY.get(optimizer, "none")
    if optimizer == "none" or value == 0.0:
        return
    if rule == "decoupled":
        if weight_decay_mode == "l2":
            warnings.warn(f"{name}: optimizer '{optimizer}' applies decoupled weight decay ({_DECOUPLED[optimizer]}) "
                          f"whatever weight_decay_mode says, as FBGEMM's {_fbgemm_names.fbgemm_optimizer(optimizer)}: "
                          "weight_decay_mode='l2' is not torch.optim.Adam's L2, which neither embscale nor FBGEMM "
                          "offers; pass weight_decay_mode='decoupled' to say what it does",
                          UserWarning, stacklevel=stacklevel)
        return
    if weight_decay_mode != "none":
        return
    hint = ("pass weight_decay_mode='l2' or 'decoupled' for the optimizer to apply it" if rule == "by_mode"
            else f"optimizer '{optimizer}' applies no weight decay")
    warnings.warn(f"{name}: {value!r} has no effect with weight_decay_mode='none' (the default); {hint}",
                  UserWarning, stacklevel=stacklevel)


def fbgemm_alias(name: str, value, default, fbgemm_name: str, fbgemm_value, convert):
    """An argument that FBGEMM names otherwise (pooling / pooling_mode, ...), given under either name, in
    embscale's spelling (convert: FBGEMM's spelling to embscale's, anything else as given). ValueError naming
    both when both are given and disagree."""
    value = convert(value)
    if fbgemm_value is None:
        return value
    converted = convert(fbgemm_value)
    if value != default and value != converted:
        raise ValueError(f"{fbgemm_name}: {fbgemm_value!r} (FBGEMM's name for {name}) contradicts {name}={value!r}; "
                         "pass one of them")
    return converted


def whole_number(name: str, value) -> int:
    """An integer argument as given (a Python or numpy integer, a one-element integer tensor, or a real
    number holding a whole value, as a config file may give); TypeError naming it for anything else: a
    fraction is not truncated, and a string or a boolean is not taken for a number."""
    given = value
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dtype != torch.bool \
            and not value.is_complex():
        value = value.item()
    if isinstance(value, bool):
        raise TypeError(f"{name}: {given!r} is not a whole number")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and math.isfinite(value) and float(value).is_integer():
        return int(value)
    raise TypeError(f"{name}: {given!r} is not a whole number")


def boolean(name: str, value) -> bool:
    """A flag as given: a bool (numpy's and one-element bool tensors included) or 0 / 1; TypeError naming
    it for anything else (a string such as "no" is not taken for True)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dtype == torch.bool:
        return bool(value.item())
    if isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")):
        return bool(value)  # (numpy's bool is no Python bool)
    if isinstance(value, numbers.Integral) and value in (0, 1):
        return bool(value)
    raise TypeError(f"{name}: {value!r} is not a boolean (True or False)")
