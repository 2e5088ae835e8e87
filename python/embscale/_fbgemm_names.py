"""FBGEMM's spellings of TableBatchedEmbeddingBags' arguments, taken as FBGEMM's
SplitTableBatchedEmbeddingBagsCodegen takes them, so that a FBGEMM script ports by changing its import: its
enums (EmbOptimType, alias OptimType; SparseType; PoolingMode; BoundsCheckMode; WeightDecayMode;
EmbeddingLocation; ComputeDevice; CacheAlgorithm), its 4-tuple table specs (E, D, EmbeddingLocation, ComputeDevice), the
string values of its optimizer enum ("exact_row_wise_adagrad", ...) and its keyword names
(weights_precision=, pooling_mode=, bounds_check_mode=; gradient_clipping=False, while gradient_clipping=True,
which clips another gradient than embscale's, is refused with both ways to clip).

fbgemm_gpu is never imported (it is not installed beside embscale): an enum member is recognised by its
class's name and module (a fbgemm_gpu module) and read by its ``.name``. Each spelling becomes embscale's
(the module then holds and reports embscale's names); one that embscale cannot take raises an error naming
the argument, what was given and embscale's equivalent or what it offers instead.
"""

import enum
from typing import Optional

import torch

# FBGEMM's optimizer (EmbOptimType member name) -> embscale's. FBGEMM's enum values (str(member)) are taken too.
OPTIMIZERS = {"EXACT_SGD": "sgd", "EXACT_ROWWISE_ADAGRAD": "rowwise_adagrad", "ADAM": "adam",
              "PARTIAL_ROWWISE_ADAM": "partial_rowwise_adam", "EXACT_ADAGRAD": "adagrad", "LAMB": "lamb",
              "PARTIAL_ROWWISE_LAMB": "partial_rowwise_lamb", "LARS_SGD": "lars_sgd", "NONE": "none"}
_OPTIMIZER_VALUES = {"exact_sgd": "sgd", "exact_row_wise_adagrad": "rowwise_adagrad",
                     "exact_rowwise_adagrad": "rowwise_adagrad", "partial_row_wise_adam": "partial_rowwise_adam",
                     "exact_adagrad": "adagrad", "partial_row_wise_lamb": "partial_rowwise_lamb"}
# FBGEMM's optimizers that embscale does not have but whose job one of its optimizers does.
_OPTIMIZER_NEAR = {"SGD": ("sgd", "FBGEMM's SGD (non-deterministic, deprecated) is EXACT_SGD's update applied "
                                  "with atomics"),
                   "ROWWISE_ADAGRAD": ("rowwise_adagrad", "FBGEMM's ROWWISE_ADAGRAD (approximate, deprecated) is "
                                                          "EXACT_ROWWISE_ADAGRAD's update applied per lookup")}
_OPTIMIZER_VALUE_NAMES = {"sgd": "SGD", "row_wise_adagrad": "ROWWISE_ADAGRAD"}

PRECISIONS = {"FP32": torch.float32, "FP16": torch.float16, "BF16": torch.bfloat16}
POOLING = {"SUM": "sum", "MEAN": "mean", "NONE": "none"}
# FBGEMM's V2_ modes are the same checks done by its second implementation.
BOUNDS_CHECK = {"FATAL": "error", "WARNING": "warn", "IGNORE": "skip", "NONE": "off",
                "V2_FATAL": "error", "V2_WARNING": "warn", "V2_IGNORE": "skip"}
WEIGHT_DECAY = {"NONE": "none", "L2": "l2", "DECOUPLE": "decoupled"}
_WEIGHT_DECAY_OTHERS = {
    "COUNTER": "needs FBGEMM's counter-based regularization (counter_based_regularization), which embscale lacks",
    "COWCLIP": "needs FBGEMM's CowClip regularization (cowclip_regularization), which embscale lacks",
    "DECOUPLE_GLOBAL": "is FBGEMM's global weight decay (global_weight_decay), which embscale lacks; "
                       "weight_decay_mode='decoupled' decays the rows a step touches",
}


def member(value, *class_names: str) -> Optional[str]:
    """The member name of a FBGEMM enum member of one of the classes class_names (e.g. "EXACT_SGD"), None for
    anything else. Recognised without importing fbgemm_gpu: an enum.Enum member whose class has one of those
    names and lives in a fbgemm_gpu module."""
    cls = type(value)
    if isinstance(value, enum.Enum) and cls.__name__ in class_names and \
            str(getattr(cls, "__module__", "")).split(".")[0] == "fbgemm_gpu":
        return value.name
    return None


def fbgemm_optimizer(name: str) -> str:
    """FBGEMM's EmbOptimType member name of embscale's optimizer `name`."""
    return next(f for f, e in OPTIMIZERS.items() if e == name)


def _supported(table: dict, prefix: str) -> str:
    return ", ".join(f"{prefix}.{k}" for k in table)


def optimizer(value, embscale_names) -> str:
    """FBGEMM's EmbOptimType member or value string, or embscale's name, as embscale's name; ValueError naming
    `optimizer`, with embscale's equivalent where one does the job, for anything else."""
    offered = ", ".join(f"'{e}' (FBGEMM's {f})" for f, e in OPTIMIZERS.items())
    name = member(value, "EmbOptimType", "OptimType")
    if name is None:
        if isinstance(value, str) and value in embscale_names:
            return value
        if isinstance(value, str) and value in _OPTIMIZER_VALUES:
            return _OPTIMIZER_VALUES[value]
        near = _OPTIMIZER_VALUE_NAMES.get(value) if isinstance(value, str) else None
        if near is None:
            raise ValueError(f"optimizer: {value!r} is not one of {', '.join(embscale_names)}; embscale's optimizers "
                             f"are {offered}")
        name, shown = near, repr(value)
    else:
        shown = f"EmbOptimType.{name}"
    if name in OPTIMIZERS:
        return OPTIMIZERS[name]
    if name in _OPTIMIZER_NEAR:
        equivalent, why = _OPTIMIZER_NEAR[name]
        raise ValueError(f"optimizer: {shown} is not supported ({why}); use optimizer='{equivalent}' "
                         f"(FBGEMM's EXACT_{name})")
    raise ValueError(f"optimizer: {shown} is not supported; embscale's optimizers are {offered}")


def _mapped(argument: str, value, class_name: str, table: dict, others: Optional[dict] = None):
    """value as embscale spells it, when it is a member of FBGEMM's class_name (None when it is not one)."""
    name = member(value, class_name)
    if name is None:
        return None
    if name in table:
        return table[name]
    why = (others or {}).get(name, "is not supported")
    raise ValueError(f"{argument}: {class_name}.{name} {why}; embscale takes {_supported(table, class_name)}")


def pooling(value):
    """FBGEMM's PoolingMode member as embscale's pooling name; anything else as given."""
    got = _mapped("pooling_mode", value, "PoolingMode", POOLING)
    return value if got is None else got


def bounds_check(value):
    """FBGEMM's BoundsCheckMode member as embscale's bounds_check name; anything else as given."""
    got = _mapped("bounds_check_mode", value, "BoundsCheckMode", BOUNDS_CHECK)
    return value if got is None else got


def weight_decay_mode(value):
    """FBGEMM's WeightDecayMode member as embscale's weight_decay_mode name; anything else as given."""
    got = _mapped("weight_decay_mode", value, "WeightDecayMode", WEIGHT_DECAY, _WEIGHT_DECAY_OTHERS)
    return value if got is None else got


def dtype(argument: str, value):
    """FBGEMM's SparseType member as a torch dtype (TypeError naming `argument` for a precision embscale's tables
    and outputs do not have: they are fp32, fp16 or bf16); anything else as given."""
    name = member(value, "SparseType")
    if name is None:
        return value
    if name not in PRECISIONS:
        raise TypeError(f"{argument}: SparseType.{name} is not supported; embscale takes "
                        f"{_supported(PRECISIONS, 'SparseType')} (torch.float32, float16, bfloat16)")
    return PRECISIONS[name]


# Where a table lives: embscale's placement names, and FBGEMM's EmbeddingLocation names for them.
PLACEMENTS = ("device", "host", "cached")
LOCATIONS = {"DEVICE": "device", "MANAGED": "host", "MANAGED_CACHING": "cached", "HOST": "device"}
CACHE_ALGORITHMS = {"LRU": "lru", "LFU": "lfu"}


def placement(t: int, value) -> str:
    """A table's placement as embscale names it: "device", "host" or "cached", FBGEMM's EmbeddingLocation
    member or name (DEVICE, MANAGED, MANAGED_CACHING; HOST is a CPU table, in host memory anyway); ValueError
    naming embedding_specs[t] for anything else."""
    name = member(value, "EmbeddingLocation")
    if name is None and isinstance(value, str):
        name = value if value in PLACEMENTS else None
        if name is None and value in LOCATIONS:
            return LOCATIONS[value]
        if name is not None:
            return name
    elif name in LOCATIONS:
        return LOCATIONS[name]
    raise ValueError(f"embedding_specs[{t}]: placement {value!r} is not one of {', '.join(map(repr, PLACEMENTS))} "
                     f"(FBGEMM's EmbeddingLocation.{', '.join(LOCATIONS)} are taken too)")


def cache_algorithm(value) -> str:
    """"lru" or "lfu", or FBGEMM's CacheAlgorithm member or name, as embscale's name; ValueError naming
    cache_algorithm for anything else."""
    name = member(value, "CacheAlgorithm")
    if name is None and isinstance(value, str):
        if value in CACHE_ALGORITHMS.values():
            return value
        name = value
    if name in CACHE_ALGORITHMS:
        return CACHE_ALGORITHMS[name]
    raise ValueError(f"cache_algorithm: {value!r} is not 'lru' or 'lfu' (FBGEMM's CacheAlgorithm.LRU, LFU)")


def table_specs(specs, device):
    """The tables as (E, D) pairs with a placement each ("device", "host" or "cached"), and the device the
    specs put them on. Taken: (E, D) (placement "device"); (E, D, placement) with embscale's placement names or
    FBGEMM's EmbeddingLocation; FBGEMM's 4-tuples (E, D, EmbeddingLocation, ComputeDevice): DEVICE, MANAGED
    and MANAGED_CACHING with ComputeDevice.CUDA (the current CUDA device), HOST with ComputeDevice.CPU (the
    CPU). Returns (pairs, placements, device, fbgemm) with fbgemm True when FBGEMM's 4-tuples were given.
    ValueError naming embedding_specs[t] for a location that does not go with its compute device, a placement
    embscale does not have, tables on different devices, or a device= that contradicts them."""
    pairs, placements, kinds = [], [], set()
    for t, s in enumerate(specs):
        if isinstance(s, (tuple, list)) and len(s) == 4 and member(s[3], "ComputeDevice") is not None:
            location, compute = member(s[2], "EmbeddingLocation"), member(s[3], "ComputeDevice")
            wanted = {"DEVICE": "CUDA", "MANAGED": "CUDA", "MANAGED_CACHING": "CUDA", "HOST": "CPU"}.get(location)
            if wanted is None:
                raise ValueError(f"embedding_specs[{t}]: {s[2]!r} is not supported; embscale takes "
                                 "EmbeddingLocation.DEVICE, MANAGED, MANAGED_CACHING (with ComputeDevice.CUDA) and "
                                 "HOST (with ComputeDevice.CPU)")
            if compute != wanted:
                raise ValueError(f"embedding_specs[{t}]: EmbeddingLocation.{location} goes with ComputeDevice."
                                 f"{wanted}, not ComputeDevice.{compute}")
            kinds.add(compute)
            pairs.append((s[0], s[1]))
            placements.append(LOCATIONS[location])
        elif isinstance(s, (tuple, list)) and len(s) == 4 and member(s[2], "EmbeddingLocation") is not None:
            raise ValueError(f"embedding_specs[{t}]: {s[3]!r} is not a ComputeDevice (FBGEMM's specs are "
                             "(num_embeddings, embedding_dim, EmbeddingLocation, ComputeDevice))")
        elif isinstance(s, (tuple, list)) and len(s) == 3:
            kinds.add(None)
            pairs.append((s[0], s[1]))
            placements.append(placement(t, s[2]))
        else:
            kinds.add(None)
            pairs.append(s)
            placements.append("device")
    if kinds <= {None}:
        return pairs, placements, device, False
    if len(kinds) > 1:
        raise ValueError("embedding_specs: the tables name different compute devices (or some none); embscale's "
                         "tables all live on the module's device")
    kind = kinds.pop()
    implied = "cuda" if kind == "CUDA" else "cpu"
    if device is None:
        return pairs, placements, implied, True
    try:
        given = torch.device(device).type
    except (RuntimeError, TypeError):
        return pairs, placements, device, True  # (the module's device check names it)
    if given != implied and given != "meta":
        raise ValueError(f"device: {device!r} contradicts embedding_specs' ComputeDevice.{kind} (tables on {implied})")
    return pairs, placements, device, True


def gradient_clipping(value, max_gradient):
    """embscale's clip value (a number: 0 is off) as given; FBGEMM's gradient_clipping=False as 0. FBGEMM's
    gradient_clipping=True is refused (ValueError naming gradient_clipping): FBGEMM clamps each element of the
    output gradient (d loss / d output, before it is summed into the rows), embscale each row's summed gradient, so
    the one cannot stand for the other; the message says how to get either. max_gradient without FBGEMM's flag is
    refused too (FBGEMM reads it only with gradient_clipping=True)."""
    is_flag = isinstance(value, bool) or (type(value).__module__ == "numpy"
                                          and type(value).__name__ in ("bool", "bool_"))
    if is_flag and not value:
        return 0.0
    if is_flag:
        g = 1.0 if max_gradient is None else max_gradient
        raise ValueError(f"gradient_clipping: FBGEMM's gradient_clipping=True (max_gradient={g!r}) clamps each element "
                         "of the output gradient, before it is summed into the rows; embscale's gradient_clipping=g "
                         "clamps each row's summed gradient instead. For FBGEMM's meaning clamp the output gradient: "
                         f"out.register_hook(lambda g: g.clamp({-g!r}, {g!r})); for embscale's pass "
                         f"gradient_clipping={g!r}")
    if max_gradient is not None:
        raise ValueError(f"max_gradient: FBGEMM's clip value, read with gradient_clipping=True only; got "
                         f"gradient_clipping={value!r} (embscale's gradient_clipping=g clips at g itself)")
    return value
