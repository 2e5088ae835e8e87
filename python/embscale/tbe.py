"""Table-batched embedding bags with a fused optimizer, for PyTorch: TableBatchedEmbeddingBags.

    tbe = embscale.TableBatchedEmbeddingBags([(1_000_000, 128), (50_000, 64)], optimizer="rowwise_adagrad",
                                             learning_rate=0.05, device="cuda")
    pooled = tbe(indices, offsets)      # [B, 128 + 64]
    loss(pooled).backward()             # the tables are updated here, in place

Inputs follow FBGEMM's layout: ``indices`` [N] and ``offsets`` [T*B+1], table-major (bag (f, b) is
``indices[offsets[f*B+b]:offsets[f*B+b+1]]``). The backward never materialises a dense gradient: it applies
the optimizer to the rows the lookup touched. The user's guide (checkpoints, bounds checks, what the backward
reads, threads, copies, the meta device, FBGEMM's names) is docs/python.md; replicated tables under
DistributedDataParallel, docs/distributed.md.

This file is the module (its arguments, layout, hyper-parameters, state dict, forward, moves and pickling);
beside it: _tbe_args.py (the arguments coerced and checked), _tbe_autograd.py (the lookup's autograd
Function), _bounds_warnings.py (warn mode's reports), _data_parallel.py (replicated tables) and _cached_tbe.py
(tables in host memory on CUDA).
"""

import math
import warnings
import weakref
from typing import List, Optional, Sequence

import torch
from torch import nn

from . import _bounds_warnings, _capi, _data_parallel, _fbgemm_names, _host_memory, ops
from ._bounds_warnings import BoundsCheckWarning
from ._tbe_args import (boolean, check_hyper_parameters, fbgemm_alias, hyper_parameter, module_device,
                        warn_ignored_weight_decay, whole_number)
from ._tbe_autograd import GRAD_ANCHOR, Lookup, LookupConfig

__all__ = ["BoundsCheckWarning", "TableBatchedEmbeddingBags"]

# The module's tensors that can be large, the tables and the optimizer state: on huge pages on the CPU, and in
# state_dict() per table (views of them) instead of whole.
_TABLE_BUFFERS = ("weights", "momentum1", "momentum2")

# optimizer -> (momentum1, momentum2) as "none" / "rows" / "elements", and the names of the state it keeps,
# from the library's optimizer table ("none" is the dense-gradient mode: no state, a gradient instead).
_MOMENTUM_SHAPES = {name: tuple(s[0] if s else "none" for s in states)
                    for name, states in _capi.OPTIMIZER_STATES.items()}
_STATE_NAMES = {name: tuple(s[1] for s in states if s) for name, states in _capi.OPTIMIZER_STATES.items()}


def _empty(numel: int, dtype: torch.dtype, device: torch.device, host_store_for=None) -> torch.Tensor:
    """torch.empty([numel]), on huge pages from 2 MiB up on the CPU (_host_memory); the host store of tables
    that train on CUDA device `host_store_for` through a row cache (_host_memory.host_store)."""
    if host_store_for is not None:
        return _host_memory.host_store(numel, dtype, host_store_for)
    if device.type == "cpu":
        return _host_memory.empty(numel, dtype)
    return torch.empty(numel, dtype=dtype, device=device)


class TableBatchedEmbeddingBags(nn.Module):
    """Many embedding tables, looked up and pooled in one call, trained by a fused optimizer.

    Args:
        embedding_specs: (num_embeddings, embedding_dim) per table; any dim >= 1, mixed.
        feature_table_map: table of each feature (several features may share a table); default one
            feature per table. The output has the features' columns side by side.
        optimizer: "sgd", "rowwise_adagrad" (FBGEMM's exact row-wise Adagrad), "adam", "partial_rowwise_adam",
            "adagrad" (element-wise, FBGEMM's EXACT_ADAGRAD), "lamb", "partial_rowwise_lamb" or "lars_sgd";
            default "rowwise_adagrad" (with FBGEMM's 4-tuple embedding_specs, FBGEMM's default, "sgd").
            Hyper-parameters: learning_rate, eps, beta1, beta2 (Adam and LAMB), weight_decay, max_norm (row-wise
            Adagrad), gradient_clipping, and the keywords eta and momentum (LARS-SGD). Weight decay is
            FBGEMM's: row-wise Adagrad applies it as weight_decay_mode says ("l2", "decoupled", or "none",
            which ignores it, with a warning); Adam, LAMB, LARS-SGD and their partial row-wise forms apply it
            by their own decoupled rule (Adam's ``w -= lr * wd * w`` in the step, LAMB's ``wd * w`` in the
            direction the trust ratio scales, LARS's ``wd * w`` added to the gradient) whatever
            weight_decay_mode says (torch.optim.Adam's L2 is not offered; "l2" with them warns); SGD and
            Adagrad apply none. docs/python.md has each optimizer's update.
            "none" (FBGEMM's OptimType.NONE) is the dense-gradient mode: the backward updates nothing and
            gives ``weights`` (then a Parameter that requires grad) a sparse COO gradient of the touched
            rows' elements, for a torch optimizer to step (one that takes sparse gradients: SGD, Adagrad,
            SparseAdam), or with ``sparse=False`` a dense one; the hyper-parameters are not used. Its
            gradient is reduced across processes by the caller, so data_parallel_group does not apply:
            under DistributedDataParallel pass ``sparse=False`` (DDP reduces dense gradients only, as for
            nn.EmbeddingBag; the gradient then holds every table's elements). Eager mode.
        sparse: optimizer "none" only: True (default) for a sparse COO gradient of ``weights``, False for a
            dense one (the tables' size, zeros outside the touched rows).
        table_names: a name per table (unique, without "."), the keys of its state_dict entries
            (``<name>.weight``, ``<name>.<state>``); default ``table_<t>``.
        pooling: "sum", "mean" or "none" (sequence: one output row per index; all dims equal).
        weights_dtype: torch.float32, float16 or bfloat16; output_dtype likewise.
        bounds_check: "warn" (default; bad indices are dropped and counted in ``num_skipped``, and a
            BoundsCheckWarning reports them without making the step wait for the device; broken offsets:
            on CUDA their bags are clamped, the update is skipped and the warning says so, on the CPU
            IndexError), "error" (an index outside its table raises IndexError naming feature, bag and
            position; on CUDA this reads one value back per call), "skip" (dropped and counted, no
            warning) or "off" (trusted).
        stochastic_rounding: fp16/bf16 weights are rounded stochastically after an update (seeded by
            ``seed`` and the step), else to nearest.
        device: where the tables live: cpu, cuda or meta (shapes only; docs/python.md's "The meta device").
        embedding_specs entries may name a placement, (E, D, placement): "device" (default), "host" (the table
            stays in host memory; each batch's rows are staged into device memory and written back) or
            "cached" (host memory with a cache of rows in device memory), or FBGEMM's EmbeddingLocation. On
            CUDA a module with a host or cached table keeps its tables in host memory and trains through a row
            cache, bit for bit as with every table in device memory (docs/tbe_cache.md); on the CPU every
            placement is host memory.
        cache_load_factor: the share of a cached table's rows its cache holds, in (0, 1] (FBGEMM's; default 0.2).
        cache_algorithm: "lru" (default) or "lfu" (or FBGEMM's CacheAlgorithm).
        cache_max_lookups: the most lookups a batch has (the cache's staging rows); default: the first batch's,
            rounded up to a power of two (at least 65,536); a larger batch rebuilds the cache after a flush.
        data_parallel_group: the process group over which the tables are replicas (each backward applies
            the update of all processes' batches together), None for tables of this process alone, or
            "auto" (default): the default group when torch.distributed is initialized with more than one
            process, else none. Copies and pickles keep "auto" or None; a group given explicitly becomes
            "auto" in them (a group cannot be pickled).

    FBGEMM's spellings are taken as FBGEMM's SplitTableBatchedEmbeddingBagsCodegen takes them, with its meaning,
    so a FBGEMM script ports by changing its import: its enums (EmbOptimType, SparseType, PoolingMode,
    BoundsCheckMode, WeightDecayMode; recognised without importing fbgemm_gpu) wherever embscale's names go,
    embedding_specs as (E, D, EmbeddingLocation, ComputeDevice) (DEVICE with CUDA, HOST with CPU: the tables
    then live on that device; MANAGED and MANAGED_CACHING with CUDA: the placements "host" and "cached"), its
    CacheAlgorithm, and the keywords
    ``weights_precision`` (for weights_dtype), ``pooling_mode`` (pooling) and ``bounds_check_mode`` (bounds_check).
    What embscale cannot take raises ValueError (TypeError for a precision) naming the argument and embscale's
    equivalent: FBGEMM's ``gradient_clipping=True`` with ``max_gradient`` clamps the output gradient, not the
    rows' summed gradients as embscale's ``gradient_clipping`` does, so it is refused with both ways to clip.

    Tables are initialised uniformly in [-sqrt(1/E_t), sqrt(1/E_t)] from torch's default generator
    (``reset_parameters()`` does it again). ``.to()``, ``.cuda()``, ``.half()``, ``.bfloat16()`` move or cast
    the tables (the optimizer state stays fp32, the hyper-parameters on the CPU); a dtype other than
    fp32/fp16/bf16 raises TypeError and a device other than cpu/cuda/meta ValueError, and the module is
    left as it was.
    """

    def __init__(self, embedding_specs: Sequence[tuple], feature_table_map: Optional[Sequence[int]] = None,
                 optimizer: Optional[str] = None, learning_rate: float = 0.01, eps: float = 1e-8,
                 beta1: float = 0.9, beta2: float = 0.999, weight_decay: float = 0.0, weight_decay_mode: str = "none",
                 max_norm: float = 0.0, gradient_clipping: float = 0.0, pooling: str = "sum",
                 weights_dtype: torch.dtype = torch.float32, output_dtype: torch.dtype = torch.float32,
                 bounds_check: str = "warn", stochastic_rounding: bool = True, seed: int = 0, device=None,
                 data_parallel_group="auto", table_names: Optional[Sequence[str]] = None, sparse: bool = True, *,
                 cache_load_factor: float = 0.2, cache_algorithm: str = "lru", cache_max_lookups: Optional[int] = None,
                 eta: float = 0.001, momentum: float = 0.9,
                 weights_precision=None, pooling_mode=None, bounds_check_mode=None, max_gradient=None):
        super().__init__()
        # FBGEMM's spellings (its enums, 4-tuple specs and keyword names) become embscale's (_fbgemm_names).
        embedding_specs, placements, device, fbgemm_specs = _fbgemm_names.table_specs(list(embedding_specs), device)
        cache_algorithm = _fbgemm_names.cache_algorithm(cache_algorithm)
        cache_load_factor = hyper_parameter("cache_load_factor", cache_load_factor)
        if not 0.0 < cache_load_factor <= 1.0:
            raise ValueError(f"cache_load_factor: {cache_load_factor!r}; expected the share of a cached table's rows "
                             "its cache holds, in (0, 1]")
        if cache_max_lookups is not None:
            cache_max_lookups = whole_number("cache_max_lookups", cache_max_lookups)
            if not 1 <= cache_max_lookups < 2**31:
                raise ValueError(f"cache_max_lookups: {cache_max_lookups}; expected 1 .. 2^31 - 1 lookups a batch")
        if optimizer is None:  # FBGEMM's default optimizer is EXACT_SGD: a FBGEMM-spelled config keeps it
            optimizer = "sgd" if fbgemm_specs else "rowwise_adagrad"
        optimizer = _fbgemm_names.optimizer(optimizer, list(_MOMENTUM_SHAPES))
        pooling = fbgemm_alias("pooling", pooling, "sum", "pooling_mode", pooling_mode, _fbgemm_names.pooling)
        bounds_check = fbgemm_alias("bounds_check", bounds_check, "warn", "bounds_check_mode", bounds_check_mode,
                                     _fbgemm_names.bounds_check)
        weights_dtype = fbgemm_alias("weights_dtype", weights_dtype, torch.float32, "weights_precision",
                                      weights_precision, lambda v: _fbgemm_names.dtype("weights_precision", v))
        output_dtype = _fbgemm_names.dtype("output_dtype", output_dtype)
        weight_decay_mode = _fbgemm_names.weight_decay_mode(weight_decay_mode)
        gradient_clipping = _fbgemm_names.gradient_clipping(gradient_clipping, max_gradient)
        specs = []
        for t, s in enumerate(embedding_specs):
            try:
                specs.append(tuple(whole_number(f"embedding_specs[{t}]", v) for v in s))
            except TypeError:
                raise ValueError(f"embedding_specs[{t}]: {s!r} is not (num_embeddings, embedding_dim) as integers") \
                    from None
        if not specs:
            raise ValueError("embedding_specs: at least one table is needed")
        for t, s in enumerate(specs):
            if len(s) != 2 or not 1 <= s[0] < 1 << 63 or not 1 <= s[1] < 1 << 31:
                raise ValueError(f"embedding_specs[{t}]: {s} is not (num_embeddings, embedding_dim) with "
                                 f"1 <= num_embeddings < 2^63 and 1 <= embedding_dim < 2^31")
        try:
            fmap = (list(range(len(specs))) if feature_table_map is None
                    else [whole_number("feature_table_map", t) for t in feature_table_map])
        except TypeError:
            raise ValueError(f"feature_table_map: {feature_table_map!r} is not a list of table numbers") from None
        if not fmap:
            raise ValueError("feature_table_map: empty; at least one feature is needed (None means one feature "
                             "per table)")
        for f, t in enumerate(fmap):
            if not 0 <= t < len(specs):
                raise ValueError(f"feature_table_map[{f}]: table {t} does not exist ({len(specs)} tables)")
        for name, value, table in (("optimizer", optimizer, _MOMENTUM_SHAPES), ("pooling", pooling, _capi.POOLING),
                                   ("weight_decay_mode", weight_decay_mode, _capi.WEIGHT_DECAY),
                                   ("bounds_check", bounds_check, _capi.BOUNDS_CHECK)):
            if value not in table:
                raise ValueError(f"{name}: '{value}' is not one of {', '.join(table)}")
        hp_values = [0.0] * len(ops.HPARAM_FIELDS)
        for name, value in (("learning_rate", learning_rate), ("eps", eps), ("beta1", beta1), ("beta2", beta2),
                            ("weight_decay", weight_decay), ("max_norm", max_norm),
                            ("gradient_clipping", gradient_clipping), ("step", 1), ("eta", eta),
                            ("momentum", momentum)):
            hp_values[ops.HPARAM[name]] = hyper_parameter(name, value)
        check_hyper_parameters(optimizer, weight_decay_mode, hp_values)
        warn_ignored_weight_decay(optimizer, weight_decay_mode, hp_values, "weight_decay", stacklevel=3)
        for name, dt in (("weights_dtype", weights_dtype), ("output_dtype", output_dtype)):
            if dt not in ops.FLOAT_DTYPES:
                raise TypeError(f"{name}: {dt} is not supported; expected torch.float32, float16 or bfloat16")
        _data_parallel.check_group_spec(data_parallel_group)
        names = [f"table_{t}" for t in range(len(specs))] if table_names is None else list(table_names)
        if isinstance(table_names, str) or len(names) != len(specs) or len(set(names)) != len(names) or \
                not all(isinstance(n, str) and n and "." not in n for n in names):
            raise ValueError(f"table_names: {table_names!r} is not one unique name without '.' per table "
                             f"({len(specs)} tables)")
        dims = [d for _, d in specs]
        if pooling == "none" and len({dims[t] for t in fmap}) > 1:
            raise ValueError("pooling: 'none' (sequence) needs all features of one embedding_dim")

        self.embedding_specs = specs
        self.table_names = names
        self.feature_table_map = fmap
        self.optimizer = optimizer
        self.weight_decay_mode = weight_decay_mode
        self.pooling = pooling
        self.output_dtype = output_dtype
        self.bounds_check = bounds_check
        self.stochastic_rounding = boolean("stochastic_rounding", stochastic_rounding)
        self.seed = whole_number("seed", seed)
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"seed: {seed!r}; expected an integer in [0, 2^63) (the operators take an int64)")
        self.data_parallel_group = data_parallel_group
        self.sparse = boolean("sparse", sparse)
        if not self.sparse and optimizer != "none":
            raise ValueError(f"sparse: False applies to optimizer='none' only (with optimizer={optimizer!r} the "
                             f"backward updates the tables and gives them no gradient)")
        self.feature_dims = [dims[t] for t in fmap]
        self.total_dim = sum(self.feature_dims)
        self._handles = {}
        self.placements = placements
        self.cache_load_factor, self.cache_algorithm = cache_load_factor, cache_algorithm

        device = module_device(device)
        # Tables in host memory on CUDA: the module is built on the CPU (its tables there are the host store)
        # and trains on the CUDA device through a row cache (_cached_tbe).
        cache_device = None
        if device.type == "cuda" and any(p != "device" for p in placements):
            if optimizer == "none":
                raise ValueError("optimizer: 'none' (dense-gradient mode) names rows by their place in memory; tables "
                                 "in host memory (placements 'host', 'cached') train with a fused optimizer")
            cache_device, device = device, torch.device("cpu")
        handle = self._handle_for(device, weights_dtype)
        # The tables do not require grad: the backward updates them in place through the fused optimizer
        # (an in-place update of a leaf that requires grad is refused by autograd and by torch.compile).
        # GRAD_ANCHOR is what makes the lookup's output require grad so the backward runs. In
        # dense-gradient mode the backward updates nothing and the tables get a gradient instead.
        # CPU tables and optimizer state of 2 MiB or more live on transparent huge pages, and those that train
        # on CUDA through a row cache in its host store (_host_memory).
        self.weights = nn.Parameter(_empty(handle.num_weights, weights_dtype, device, cache_device),
                                    requires_grad=(optimizer == "none"))
        # The id of the handle of the tables' device and dtype, which the operators look up (never a pointer).
        self._handle_id = handle.id
        sizes = {"none": 0, "rows": handle.total_rows, "elements": handle.num_weights}
        m1, m2 = _MOMENTUM_SHAPES[optimizer]
        self.register_buffer("momentum1", _empty(sizes[m1], torch.float32, device, cache_device).zero_())
        self.register_buffer("momentum2", _empty(sizes[m2], torch.float32, device, cache_device).zero_())
        self.register_buffer("hparams", torch.tensor(hp_values, dtype=torch.float64, device="cpu"))
        self.register_buffer("num_skipped", torch.zeros(1, dtype=torch.int64, device=device))
        if cache_device is not None:
            from ._cached_tbe import make_cached

            make_cached(self, placements, cache_load_factor, cache_algorithm, cache_max_lookups, cache_device)
        self.reset_parameters()

    def reset_parameters(self):
        """Initialises the tables uniformly in [-sqrt(1/E_t), sqrt(1/E_t)] from torch's default generator,
        zeroes the optimizer state and restarts the step count at 0 (the other hyper-parameters are kept): what a
        module materialised from the meta device by ``to_empty()`` needs before it trains."""
        with torch.no_grad():
            self._draw_tables()
            self.momentum1.zero_()
            self.momentum2.zero_()
            self.num_skipped.zero_()
            self.hparams[ops.HPARAM["step"]] = 1

    def _draw_tables(self):
        for t, (rows, _) in enumerate(self.embedding_specs):
            bound = math.sqrt(1.0 / rows)
            self._table_view(self.weights, t).uniform_(-bound, bound)

    @classmethod
    def from_embedding_bags(cls, bags: Sequence[nn.EmbeddingBag], **kwargs):
        """A TBE holding copies of the tables of a list of nn.EmbeddingBag (mode sum or mean). Options the TBE
        does not have (padding_idx, max_norm, scale_grad_by_freq) are refused rather than dropped."""
        bags = list(bags)
        if not bags:
            raise ValueError("bags: empty; at least one nn.EmbeddingBag is needed")
        for t, b in enumerate(bags):
            for option, unset in (("padding_idx", None), ("max_norm", None), ("scale_grad_by_freq", False)):
                if getattr(b, option) != unset:
                    raise ValueError(f"bags[{t}]: {option}={getattr(b, option)!r} is not supported by "
                                     f"TableBatchedEmbeddingBags (it would be silently ignored)")
        modes = {b.mode for b in bags}
        if len(modes) != 1 or not modes <= {"sum", "mean"}:
            raise ValueError(f"bags: all modes must be one of sum or mean, got {sorted(modes)}")
        w0 = bags[0].weight
        kwargs.setdefault("pooling", modes.pop())
        kwargs.setdefault("weights_dtype", w0.dtype)
        kwargs.setdefault("device", w0.device)
        tbe = cls([(b.num_embeddings, b.embedding_dim) for b in bags], **kwargs)
        with torch.no_grad():
            for t, b in enumerate(bags):
                tbe._table_view(tbe.weights, t).copy_(b.weight)
        return tbe

    # ---- layout ------------------------------------------------------------------------------------
    def _handle_for(self, device, dtype):
        """The module's handle for a device and weights dtype, created on first use (kept: moving back and
        forth reuses it)."""
        key = (device.type, device.index, dtype)
        if key not in self._handles:
            self._handles[key] = ops.TbeHandle(device, [r for r, _ in self.embedding_specs],
                                               [d for _, d in self.embedding_specs], self.feature_table_map, dtype)
        return self._handles[key]

    @property
    def _layout(self):
        return self._handle_for(self.weights.device, self.weights.dtype)

    def _table_view(self, flat, t, rowwise=False):
        rows, dim = self.embedding_specs[t]
        h = self._layout
        if rowwise:
            start = h.row_offsets[t]
            return flat[start:start + rows]
        start = h.weight_offsets[t]
        return flat[start:start + rows * dim].view(rows, dim)

    def prefetch(self, indices: torch.Tensor, offsets: torch.Tensor):
        """FBGEMM's prefetch: plans a batch's rows of tables in host memory ahead of its forward. Tables in the
        memory of the module's device have nothing to plan: it does nothing (a cached module's plans it)."""

    def flush(self):
        """FBGEMM's flush: writes cached rows back to host memory. Tables in the memory of the module's device
        have none: it does nothing (a cached module's writes them)."""

    def split_embedding_weights(self):
        """Views [E_t, D_t] of each table (writes through)."""
        return [self._table_view(self.weights.data, t) for t in range(len(self.embedding_specs))]

    def optimizer_state(self):
        """Per table, a dict of views of the optimizer state: rowwise_adagrad {"sum": [E]}; adagrad {"sum": [E, D]};
        adam and lamb {"exp_avg": [E, D], "exp_avg_sq": [E, D]}; partial_rowwise_adam and partial_rowwise_lamb
        {"exp_avg": [E, D], "exp_avg_sq": [E]}; lars_sgd {"momentum_buffer": [E, D]}."""
        kinds = _MOMENTUM_SHAPES[self.optimizer]
        out = []
        for t in range(len(self.embedding_specs)):
            state = {}
            for name, kind, buf in zip(_STATE_NAMES[self.optimizer], kinds, (self.momentum1, self.momentum2)):
                state[name] = self._table_view(buf, t, rowwise=(kind == "rows"))
            out.append(state)
        return out

    @property
    def learning_rate(self) -> float:
        return float(self.hparams[ops.HPARAM["learning_rate"]])

    def set_learning_rate(self, lr: float):
        """Takes effect at the next backward, also inside a compiled model. A value the optimizer would
        refuse (negative, not finite, or not 0 but 0 in float32) raises ValueError here and changes nothing."""
        self._set_hyper_parameters({"learning_rate": lr}, {"learning_rate": "lr"})

    def _set_hyper_parameters(self, values: dict, names: dict):
        """Sets hparams fields (field -> value as given) after checking the whole set as the backward will;
        names: field -> the caller's name for it, for the message. Inside torch.compile they are written
        as they are (the library's check cannot be traced; the backward checks them)."""
        if torch.compiler.is_compiling():
            for field, value in values.items():
                self.hparams[ops.HPARAM[field]] = value
            return
        values = {field: hyper_parameter(names[field], value) for field, value in values.items()}
        new = self.hparams.tolist()
        for field, value in values.items():
            new[ops.HPARAM[field]] = value
        check_hyper_parameters(self.optimizer, self.weight_decay_mode, new, names)
        if "weight_decay" in values:
            warn_ignored_weight_decay(self.optimizer, self.weight_decay_mode, new, names["weight_decay"],
                                       stacklevel=4)
        for field, value in values.items():
            self.hparams[ops.HPARAM[field]] = value

    @property
    def step(self) -> int:
        """The number of optimizer steps taken (updates applied; each backward takes one): FBGEMM's ``iter`` after
        as many training steps. The next backward is step ``step + 1`` (Adam's bias correction and the
        stochastic-rounding seed use that one; ``hparams`` holds it). FBGEMM advances ``iter`` at every forward
        instead (evaluation ones too) and not at all for EXACT_SGD."""
        return int(self.hparams[ops.HPARAM["step"]]) - 1

    # ---- FBGEMM's names (SplitTableBatchedEmbeddingBagsCodegen), for code moving over -----------------
    # Hyper-parameters FBGEMM's update_hyper_parameters takes, and the hparams field each sets.
    _FBGEMM_HYPER_PARAMETERS = {"lr": "learning_rate", "eps": "eps", "beta1": "beta1", "beta2": "beta2",
                                "weight_decay": "weight_decay", "eta": "eta", "momentum": "momentum"}

    def get_learning_rate(self) -> float:
        """FBGEMM's name for ``learning_rate``."""
        return self.learning_rate

    def split_optimizer_states(self) -> List[List[torch.Tensor]]:
        """Per table, its optimizer state tensors in FBGEMM's order (momentum1, then momentum2 where the
        optimizer keeps one), as optimizer_state() names them: row-wise Adagrad [sum [E_t]]; Adam
        [exp_avg [E_t, D_t], exp_avg_sq [E_t, D_t]]; partial row-wise Adam [exp_avg [E_t, D_t], exp_avg_sq [E_t]];
        and so on; SGD and dense mode []. Views (writes go through), as FBGEMM's."""
        return [list(state.values()) for state in self.optimizer_state()]

    def update_hyper_parameters(self, params_dict: dict):
        """Sets hyper-parameters by FBGEMM's names: ``lr``, ``eps``, ``beta1``, ``beta2``, ``weight_decay``,
        ``eta``, ``momentum``.
        Each value is a real number checked as the backward checks it; an unknown name or a bad value is
        refused before anything is set. Takes effect
        at the next backward."""
        if not isinstance(params_dict, dict):
            raise TypeError(f"params_dict: expected a dict of hyper-parameters, got {type(params_dict).__name__}")
        values, names = {}, {}
        for name, value in params_dict.items():
            field = self._FBGEMM_HYPER_PARAMETERS.get(name)
            if field is None:
                known = ", ".join(self._FBGEMM_HYPER_PARAMETERS)
                raise ValueError(f"params_dict: {name!r} is not a hyper-parameter this module takes ({known})")
            values[field] = value
            names[field] = f"params_dict[{name!r}]"
        self._set_hyper_parameters(values, names)

    def set_optimizer_step(self, step: int):
        """FBGEMM's step count: ``step`` optimizer steps have been taken (``self.step`` then reads ``step``), so
        the next backward is step ``step + 1`` (Adam's bias correction uses it). The count is kept exactly up to
        ops.MAX_STEP (2^53, the float64 hyper-parameters' integers): a step the next backward could not count
        past is refused."""
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < ops.MAX_STEP - 1:
            raise ValueError(f"step: {step!r} is not a whole number of steps in [0, 2^53 - 1) (the next step, "
                             "step + 1, must leave the counter room to advance below 2^53)")
        self.hparams[ops.HPARAM["step"]] = step + 1

    # ---- state dict: per-table entries -------------------------------------------------------------
    # state_dict() holds, per table, ``<name>.weight`` [E_t, D_t] and its optimizer state under the names of
    # optimizer_state() (FBGEMM's get_optimizer_state names: ``<name>.sum`` [E_t] for row-wise Adagrad,
    # ``<name>.exp_avg`` / ``<name>.exp_avg_sq`` for Adam), all views of the module's buffers; then
    # ``hparams`` (hyper-parameters and step), ``num_skipped``, and ``_extra_state`` naming the optimizer, its
    # weight decay mode and the tables, so a checkpoint of another optimizer, mode or tables is refused by
    # name. load_state_dict checks every entry before it writes any (_check_loaded_entries).

    def _table_entries(self):
        """(key, view) of every per-table state_dict entry, in table order."""
        for name, weight, state in zip(self.table_names, self.split_embedding_weights(), self.optimizer_state()):
            yield f"{name}.weight", weight
            for state_name, view in state.items():
                yield f"{name}.{state_name}", view

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name in _TABLE_BUFFERS:
            del destination[prefix + name]
        for key, view in self._table_entries():
            destination[prefix + key] = view.detach()

    def get_extra_state(self):
        return {"optimizer": self.optimizer, "embedding_specs": [list(s) for s in self.embedding_specs],
                "table_names": list(self.table_names), "weight_decay_mode": self.weight_decay_mode}

    def set_extra_state(self, state):
        """Checks a checkpoint's ``_extra_state`` against this module: ValueError naming both optimizers, both
        weight decay modes, or both table lists, when they differ (the state of one optimizer cannot train
        with another, and the checkpoint's ``hparams`` carry a weight decay meant for its own mode)."""
        if not isinstance(state, dict) or not {"optimizer", "embedding_specs", "weight_decay_mode"} <= state.keys():
            raise ValueError(f"state_dict: _extra_state {state!r} does not describe a TableBatchedEmbeddingBags")
        if state["optimizer"] != self.optimizer:
            raise ValueError(f"state_dict: the checkpoint was written with optimizer '{state['optimizer']}'; this "
                             f"module's optimizer is '{self.optimizer}' (to load only the tables, pass the "
                             "'<table>.weight' entries with strict=False)")
        mode = state["weight_decay_mode"]
        if mode != self.weight_decay_mode:
            raise ValueError(f"state_dict: the checkpoint was written with weight_decay_mode {mode!r}; this module's "
                             f"is {self.weight_decay_mode!r}, and its hparams' weight_decay would be applied another "
                             f"way (build the module with weight_decay_mode={mode!r}, or pass only the "
                             "'<table>.weight' entries with strict=False)")
        try:
            specs = [tuple(s) for s in state["embedding_specs"]]
        except TypeError:
            raise ValueError(f"state_dict: _extra_state's embedding_specs {state['embedding_specs']!r} is not a list "
                             "of (num_embeddings, embedding_dim)") from None
        if specs != self.embedding_specs:
            raise ValueError(f"state_dict: the checkpoint's tables (num_embeddings, embedding_dim) are {specs}; "
                             f"this module's are {self.embedding_specs}")

    # Optimizer states that are sums of squares (row-wise Adagrad's accumulator, Adam's second moments): the
    # update divides by their square root, so a negative one gives NaN or a huge step.
    _NON_NEGATIVE_STATES = ("sum", "exp_avg_sq")

    def _load_targets(self, prefix):
        """(key, the module's tensor the entry is copied into, its optimizer state's name or None) of every
        entry a load may write: the per-table entries, then the module's other parameters and persistent
        buffers, which torch's loader copies."""
        targets = [(prefix + key, view, None if key.endswith(".weight") else key.rpartition(".")[2])
                   for key, view in self._table_entries()]
        own = [*self._parameters.items(), *((name, buf) for name, buf in self._buffers.items()
                                             if name not in self._non_persistent_buffers_set)]
        return targets + [(prefix + name, t, None) for name, t in own if t is not None and name not in
                          _TABLE_BUFFERS]

    def _check_loaded_entries(self, rest, prefix, materialising):
        """Every entry a load would write is checked before the first write, so a refused checkpoint changes
        nothing (torch's loader copies entry by entry, and a bad entry's copy_ fails without naming it): a
        dense tensor of this module's shape, holding values (not on the meta device, unless the module is
        on meta and stays there), of its tensor's kind of dtype (floating point; an integer num_skipped);
        optimizer state finite, and not negative where it is a sum of squares (_NON_NEGATIVE_STATES);
        hparams as the backward checks them. materialising: an assign=True load will make a meta module
        real (_materialize_for) first."""
        for key, own, state in self._load_targets(prefix):
            if key not in rest:
                continue
            t = rest[key]
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"state_dict: {key} is a {type(t).__name__}, not a tensor")
            if t.layout != torch.strided:
                raise ValueError(f"state_dict: {key} is a {t.layout} tensor; expected a dense (strided) one")
            if t.is_meta and not (own.is_meta and not materialising):
                raise ValueError(f"state_dict: {key} is on the meta device (it holds no values to load)")
            floating = own.is_floating_point()
            if t.dtype == torch.bool or t.is_complex() or t.is_floating_point() != floating:
                raise TypeError(f"state_dict: {key} has dtype {t.dtype}; expected "
                                f"{'a floating-point' if floating else 'an integer'} dtype (this module's is "
                                f"{own.dtype})")
            if tuple(t.shape) != tuple(own.shape):
                raise ValueError(f"state_dict: {key} has shape {list(t.shape)}; this module's is {list(own.shape)}"
                                 + (" (the checkpoint holds other tables)" if key.endswith(".weight") else ""))
            if state is not None and not t.is_meta:
                values = t.detach().to(own.dtype)  # (as the module will hold them: a float64 1e300 is inf)
                bad = ~torch.isfinite(values)
                if state in self._NON_NEGATIVE_STATES:
                    bad |= values < 0
                if bad.any():
                    at = [int(i) for i in torch.unravel_index(bad.reshape(-1).nonzero()[0, 0], bad.shape)]
                    rule = " and >= 0 (a sum of squares)" if state in self._NON_NEGATIVE_STATES else ""
                    raise ValueError(f"state_dict: {key}{at} is {values[tuple(at)].item()!r}; the optimizer "
                                     f"state {state!r} must be finite{rule}")
        key = prefix + "hparams"
        if key in rest:
            check_hyper_parameters(self.optimizer, self.weight_decay_mode, rest[key].tolist(),
                                    where=f"state_dict: {key}: ")

    def _materialize_for(self, loaded):
        """load_state_dict(assign=True) into a module on the meta device (torch's way of filling a model built
        without memory): the module is first made on the device of the checkpoint's tables, as if built there
        (to_empty, then reset_parameters: entries the checkpoint lacks hold a fresh module's values), so
        that the tables can be copied in. Called after every check, for a module on meta and a `loaded` (the
        checkpoint's first table) that is not: a meta checkpoint leaves the module on meta."""
        self.to_empty(device=loaded.device)
        self.reset_parameters()

    def _as_own_buffers(self, rest, prefix, names):
        """The buffers `names` (checked entries) given to the loader converted to this module's dtype, device
        and layout, and as copies: with assign=True, which installs the checkpoint's tensors as they are,
        the module stays usable and shares no buffer with the module the checkpoint came from (never a step
        or a learning rate; its tables are copied in any case). Without assign the loader copies them in."""
        for name in names:
            key, own = prefix + name, getattr(self, name)
            if key in rest and not rest[key].is_meta:
                rest[key] = rest[key].detach().to(device=own.device, dtype=own.dtype, copy=True).contiguous()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        extra_key = prefix + "_extra_state"
        if extra_key in state_dict:
            self.set_extra_state(state_dict[extra_key])
        rest = {k: v for k, v in state_dict.items() if k != extra_key}
        # The whole tables and state are no entries (their per-table views are), though torch's loader would
        # copy them in by their names, unchecked.
        for key in [prefix + name for name in _TABLE_BUFFERS if prefix + name in rest]:
            del rest[key]
            if strict:
                unexpected_keys.append(key)
        assign = local_metadata.get("assign_to_params_buffers", False)
        first = next((rest[prefix + key] for key, _ in self._table_entries() if prefix + key in rest), None)
        materialising = (assign and self.weights.is_meta and isinstance(first, torch.Tensor)
                         and not first.is_meta)
        self._check_loaded_entries(rest, prefix, materialising)
        # hparams stay CPU float64 whatever the checkpoint's were (they are read on the host at every step).
        self._as_own_buffers(rest, prefix, ("hparams",))
        if materialising:
            self._materialize_for(first)
        if assign:
            self._as_own_buffers(rest, prefix, ("num_skipped",))
        elif self.weights.is_meta and first is not None and not first.is_meta:
            warnings.warn(f"{prefix}tables: copying a checkpoint's tables into a module on the meta device loads "
                          "nothing (as torch's loader warns for parameters); pass assign=True to load them",
                          UserWarning, stacklevel=4)
        entries = [(prefix + key, view) for key, view in self._table_entries()]  # (materialised: new views)
        with torch.no_grad():
            for key, view in entries:
                if key in rest:
                    view.copy_(rest.pop(key))
                elif strict:
                    missing_keys.append(key)
        handled = {extra_key} | {prefix + name for name in _TABLE_BUFFERS}
        first_new = len(missing_keys)
        super()._load_from_state_dict(rest, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        missing_keys[first_new:] = [k for k in missing_keys[first_new:] if k not in handled]

    # ---- forward -----------------------------------------------------------------------------------
    def forward(self, indices: torch.Tensor, offsets: torch.Tensor,
                per_sample_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        T = len(self.feature_table_map)
        if offsets.dim() != 1 or (offsets.shape[0] - 1) % T != 0 or offsets.shape[0] < 1:
            raise ValueError(f"offsets: shape {tuple(offsets.shape)}; expected [T*B+1] with T = {T} features")
        batch_size = (offsets.shape[0] - 1) // T
        if (indices.dtype != offsets.dtype and indices.dtype in ops.INDEX_DTYPES
                and offsets.dtype in ops.INDEX_DTYPES):
            # As FBGEMM: int32 and int64 mixed (e.g. int64 indices with int32 offsets) run as int64.
            indices, offsets = indices.long(), offsets.long()
        cols = self.feature_dims[0] if self.pooling == "none" else self.total_dim
        cfg = LookupConfig(handle=self._handle_id, batch_size=batch_size, pooling=self.pooling,
                           bounds_check=self.bounds_check, output_cols=cols, output_dtype=self.output_dtype,
                           optimizer=self.optimizer, weight_decay_mode=self.weight_decay_mode,
                           stochastic_rounding=self.stochastic_rounding, seed=self.seed, sparse=self.sparse)
        group = None if self.optimizer == "none" else _data_parallel.resolve_group(self.data_parallel_group)
        lookup_args = (GRAD_ANCHOR, self.weights, self.momentum1, self.momentum2, self.hparams, indices,
                       offsets, per_sample_weights, cfg)
        owner = None if torch.compiler.is_compiling() else weakref.ref(self)  # (_tbe_autograd.backward_state)
        if group is None:
            counts = (_bounds_warnings.count_targets(self) if self.bounds_check in ("skip", "warn")
                      and not torch.compiler.is_compiling() else None)
            try:
                out, num_skipped = Lookup.apply(*lookup_args, counts, owner)
            except (TypeError, ValueError, NotImplementedError):
                # Refused before anything was launched (the argument checks, the library's validation): the
                # word is free again. After a launch (any other error, or one raised once the call has
                # returned) the device may still write it, so it is dropped, never reused.
                if counts is not None and not counts.written:
                    counts.give_back_word()
                raise
            if counts is not None and counts.written:
                if counts.buffer is not None:
                    ops.bump_versions(counts.buffer)  # (written in place by the library, as copy_ would)
                elif torch.is_inference_mode_enabled() or not self.num_skipped.is_inference():
                    self.num_skipped.copy_(counts.tensor)
                if self.bounds_check == "warn":
                    _bounds_warnings.note_bounds(self, counts.tensor, counts.word)
                return out
            if counts is not None:
                counts.give_back_word()
        else:
            if per_sample_weights is not None and per_sample_weights.requires_grad:
                raise NotImplementedError("per_sample_weights: their gradient is not computed for replicated "
                                          "tables (data_parallel_group); pass weights that do not require grad, "
                                          "or data_parallel_group=None for tables of this process alone")
            out, num_skipped = _data_parallel.ReplicatedLookup.apply(*lookup_args, group, owner)
        # (a buffer made in inference mode can only change there; compile sees no inference tensors)
        if self.bounds_check in ("skip", "warn") and (torch.compiler.is_compiling() or torch.is_inference_mode_enabled()
                                                       or not self.num_skipped.is_inference()):
            self.num_skipped.copy_(num_skipped)
        if self.bounds_check == "warn":
            _bounds_warnings.note_bounds(self, num_skipped)
        return out

    def check_bounds(self):
        """Waits for the bounds reports of this module's earlier warn-mode calls on CUDA (for the work queued
        on their devices) and issues their warnings now (without it they come at later calls, as the device
        finishes)."""
        _bounds_warnings.read_bounds_reports(self, wait=True, stacklevel=4)

    def _apply(self, fn, recurse=True):
        # .to() / .cuda() / .half() / .to_empty() move or cast the tables; optimizer state stays fp32 and the
        # hyper-parameters stay on the CPU (they are read on the host at every step). What the tables would
        # become is found first, on an empty tensor, and checked, and the handle for it made, before anything
        # is changed: an unsupported dtype or device leaves the module as it was.
        probe = fn(torch.empty(0, dtype=self.weights.dtype, device=self.weights.device))
        if probe.dtype not in ops.FLOAT_DTYPES:
            raise TypeError(f"weights_dtype: {probe.dtype} is not supported (the tables stay {self.weights.dtype}); "
                            "expected torch.float32, float16 or bfloat16")
        if probe.device.type == "cuda" and any(p != "device" for p in getattr(self, "placements", ())):
            raise ValueError(f"device: a module whose placements are {self.placements} trains on CUDA through a row "
                             "cache, which it gets when it is built there: build it with device='cuda' (on the CPU "
                             "every placement is host memory)")
        handle = self._handle_for(module_device(probe.device), probe.dtype)
        kept = {name: getattr(self, name) for name in ("momentum1", "momentum2", "hparams")}
        before = {name: getattr(self, name).data_ptr() for name in _TABLE_BUFFERS}
        super()._apply(fn, recurse)
        for name in ("momentum1", "momentum2"):
            moved = getattr(self, name)
            if moved.dtype != torch.float32:  # a dtype cast: keep the fp32 values, follow the device
                setattr(self, name, kept[name].to(moved.device))
        self.hparams = kept["hparams"]
        self._host_tables_on_huge_pages([n for n in _TABLE_BUFFERS if getattr(self, n).data_ptr() != before[n]])
        self._handle_id = handle.id
        return self

    # Pickling and copy.deepcopy: the handles (C objects) are not state; the copy or the loaded module builds
    # its own for the device and dtype its tables have.
    def __getstate__(self):
        state = super().__getstate__()
        state.pop("_handles", None)
        state.pop("_handle_id", None)
        state.pop("_bounds_reports", None)
        state.pop("_bounds_free", None)
        if state.get("data_parallel_group") is not None:
            state["data_parallel_group"] = "auto"
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        if self.hparams.device.type != "cpu":  # torch.load(map_location=...) moves every tensor
            self.hparams = self.hparams.cpu()
        # hparams written directly (past set_learning_rate's check) may hold a value the backward refuses.
        check_hyper_parameters(self.optimizer, self.weight_decay_mode, self.hparams.tolist(),
                                where="pickle: hparams: ")
        self._handles = {}
        self._handle_id = self._handle_for(self.weights.device, self.weights.dtype).id

    def _host_tables_on_huge_pages(self, names):
        """Copies the named tables or optimizer state that are new CPU tensors of 2 MiB or more (a move to the
        CPU, a cast, to_empty) onto memory advised for huge pages (_host_memory), in place of the tensor torch
        made (the Parameter object is kept). Shared and pinned memory (share_memory(), pin_memory(), tensors
        received from another process) is left where it is: that is what they were asked for. An unpickled
        module is not moved either (its tensors may be shared with views saved beside it, or mapped from the
        file by torch.load(mmap=True))."""
        for name in names:
            t = getattr(self, name)
            small = t.numel() * t.element_size() < _host_memory.HUGE_PAGE_BYTES
            if t.device.type != "cpu" or small or t.is_shared() or t.is_pinned():
                continue
            with torch.no_grad():
                placed = _host_memory.empty(t.numel(), t.dtype).copy_(t.reshape(-1)).view(t.shape)
            if isinstance(t, nn.Parameter):
                t.data = placed
            else:
                setattr(self, name, placed)

    def extra_repr(self):
        return (f"tables={self.embedding_specs}, features={len(self.feature_table_map)}, optimizer={self.optimizer}, "
                f"pooling={self.pooling}, weights_dtype={self.weights.dtype}")
