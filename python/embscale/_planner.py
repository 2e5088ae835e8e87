"""TorchRec's planner estimating embscale's kernels from embscale's own cost model.

TorchRec's planner ranks sharding options by the per-shard estimates of its ShardEstimators: a perf
estimate (``Perf``: forward and backward compute and communication, in ms) and a storage estimate
(``Storage``: device and host memory, in bytes). Its own estimators model FBGEMM's kernels. The two here
wrap them: every option is estimated by TorchRec's estimator first, then the options whose module is one of
embscale.torchrec's collections get embscale's numbers:

- EmbscalePerfEstimator: the compute of each shard (``fwd_compute``, ``bwd_compute``; ``prefetch_compute``
  0, since embscale's row cache fetches a batch's rows in its forward) from _planner_model, the bandwidth
  model fitted to recorded runs of embscale's kernels; the communication stays TorchRec's. On a topology
  whose compute device is not CUDA, TorchRec's numbers stay (the model is of the CUDA kernels).
- EmbscaleStorageEstimator: each shard's memory as embscale allocates it: the rows and the optimizer's state
  (fp32, per the library's optimizer table), in device memory (FUSED, data-parallel) or in host memory
  (FUSED_UVM, FUSED_UVM_CACHING); for those, the row cache's device memory (a cached table's slots and their
  bookkeeping, the staging rows of two batches, the batch plans); and the batch's indices and outputs.

``embscale_enumerator()`` gives TorchRec's EmbeddingEnumerator with both, the way TorchRec's planner takes
estimators (``EmbeddingShardingPlanner(enumerator=...)``). docs/distributed.md describes the model and its
limits.
"""

import dataclasses
import math
from typing import Any, Dict, List, NamedTuple, Optional, Union

import torch
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.planner.constants import BATCH_SIZE, UVM_CACHING_RATIO
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
from torchrec.distributed.planner.shard_estimators import (EmbeddingPerfEstimator, EmbeddingStorageEstimator,
                                                           get_num_poolings)
from torchrec.distributed.planner.types import Perf, ShardEstimator, Storage
from torchrec.distributed.planner.utils import sharder_name
from torchrec.distributed.types import ShardingType

from . import _capi, _fbgemm_names
from . import _planner_model as model

_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
# The placement each plan kernel gives a table (as embscale.torchrec's sharders map them).
_PLACEMENT = {EmbeddingComputeKernel.FUSED.value: "device", EmbeddingComputeKernel.FUSED_UVM.value: "host",
              EmbeddingComputeKernel.FUSED_UVM_CACHING.value: "cached"}
_INDEX_BYTES = 8  # indices as the TBE reads them (int64), as TorchRec counts them
# The row cache's device memory (include/embscale/tbe_cache.h, src/tbe/tbe_cache.cpp and its CUDA backend):
_WAYS = 32  # ways of a set: a table's slots are its cache rows rounded up to whole sets
_SLOT_BYTES = 8 + 8 + 1  # a slot's tag, stamp and dirty flag
_ROUNDING_BASE_BYTES = 8  # per row of the cache's tables (slots and staging rows)
_LFU_BYTES = 4  # per row of the host tables, under LFU
_PLAN_BYTES = 8 * 6 + 4 * 5 + 1  # per staged lookup of one batch's plan (two plans: two batches in flight)
_MIN_STAGED_LOOKUPS = 1 << 16  # the staging rows' default: the batch's lookups rounded up to a power of two


class _Collection(NamedTuple):
    """What the estimates need of an embscale collection: its optimizer, dtype names and cache_max_lookups."""
    optimizer: str
    weights: str
    output: str
    cache_max_lookups: Optional[int]


class _Work(NamedTuple):
    """A shard's lookups and output rows per batch, in its forward and in its backward."""
    lookups: float
    outputs: float
    bwd_lookups: float
    bwd_outputs: float


def _collection(option) -> Optional[_Collection]:
    """The facts of the option's module when it is one of embscale.torchrec's collections, else None."""
    from .torchrec import _TbeCollection  # here: embscale.torchrec imports this module

    module = option.module[1]
    if not isinstance(module, _TbeCollection):
        return None
    settings = module._optimizer_settings
    output = _fbgemm_names.dtype("output_dtype", settings.get("output_dtype", torch.float32))
    return _Collection(settings["optimizer"], _DTYPE_NAMES[settings["weights_dtype"]], _DTYPE_NAMES[output],
                       settings.get("cache_max_lookups"))


def _fused_params(option, sharder_map) -> Dict[str, Any]:
    """The sharder's fused_params (TorchRec 1.9 hands estimators a SharderData per module type, 1.6 the sharder)."""
    entry = (sharder_map or {}).get(sharder_name(type(option.module[1])))
    return dict(getattr(entry, "fused_params", None) or {})


def _work(option, shard, topology, constraints) -> _Work:
    """Lookups and outputs of one shard per batch. TorchRec's planner's batch_size is a process's batch: a
    sharded table sees the lookups of every process's batch, a row-wise shard the share its rows take (indices
    drawn evenly), a pooled shard writes a row per bag of the global batch (row-wise shards write partial sums);
    a data-parallel table looks up its own batch and, in embscale's backward, applies the global batch's."""
    c = (constraints or {}).get(option.name)
    n = len(option.input_lengths)
    batch_sizes = c.batch_sizes if c is not None and c.batch_sizes else [option.batch_size] * n
    poolings = get_num_poolings(constraints, option)
    local = sum(length * p * b for length, p, b in zip(option.input_lengths, poolings, batch_sizes))
    bags = (sum(min(1.0, length) * p * b for length, p, b in zip(option.input_lengths, poolings, batch_sizes))
            if option.is_pooled else local)
    world = topology.world_size
    if option.sharding_type == ShardingType.DATA_PARALLEL.value:
        return _Work(local, bags, local * world, bags * world)
    lookups = local * world * shard.size[0] / option.tensor.shape[0]
    outputs = bags * world if option.is_pooled else lookups
    return _Work(lookups, outputs, lookups, outputs)


def _placement(option) -> str:
    if option.sharding_type == ShardingType.DATA_PARALLEL.value:
        return "device"
    return _PLACEMENT.get(option.compute_kernel, "device")


def _load_factor(option, fused) -> float:
    """A cached table's load factor as embscale's sharder takes it: the plan's cache_params, the sharder's
    fused_params, TorchRec's planner's default."""
    factor = option.cache_load_factor
    if factor is None:
        factor = fused.get("cache_load_factor")
    return UVM_CACHING_RATIO if factor is None else factor


def _cache_stats(option):
    params = option.cache_params
    return getattr(params, "stats", None) if params is not None else None


def _state_bytes(optimizer: str, cols: int) -> int:
    return model.state_bytes_per_row(_capi.OPTIMIZER_STATES[optimizer], cols)


class EmbscalePerfEstimator(ShardEstimator):
    """TorchRec's perf estimator for embscale's collections: TorchRec's EmbeddingPerfEstimator (or the one
    given) estimates every option, then each shard of an option of embscale's collections takes the compute
    of embscale's cost model (``fwd_compute``, ``bwd_compute``; ``prefetch_compute`` 0) on a CUDA topology;
    communication stays TorchRec's estimate.

    ``index_distribution``: "uniform" or "zipf", or {table name: either} (others uniform): which fitted
    bandwidths a table's lookups take (Zipf-distributed indices hit the GPU's L2 and move fewer rows). Rows of
    host and cached tables moved over the host link: per batch, every row a shard's lookups touch (a cached
    table's misses, and their victims), as the plan's ``cache_params.stats`` expect them where given
    (``expected_lookups``, ``expected_miss_rate``), else for uniformly drawn indices (the hit rate the load
    factor): an upper bound for skewed indices."""

    def __init__(self, topology, constraints=None, index_distribution: Union[str, Dict[str, str]] = "uniform",
                 torchrec_estimator: Optional[ShardEstimator] = None, is_inference: bool = False) -> None:
        for d in (index_distribution.values() if isinstance(index_distribution, dict) else [index_distribution]):
            if d not in model.INDEX_DISTRIBUTIONS:
                raise ValueError(f"index_distribution: {d!r}; expected one of {', '.join(model.INDEX_DISTRIBUTIONS)} "
                                 "(or a dict of table names to them)")
        self._topology = topology
        self._constraints = constraints
        self._distribution = index_distribution
        self._torchrec = torchrec_estimator if torchrec_estimator is not None else EmbeddingPerfEstimator(
            topology=topology, constraints=constraints, is_inference=is_inference)

    def _indices(self, table: str) -> str:
        d = self._distribution
        return d.get(table, "uniform") if isinstance(d, dict) else d

    def estimate(self, sharding_options: List, sharder_data_map=None) -> None:
        self._torchrec.estimate(sharding_options, sharder_data_map)
        if self._topology.compute_device != "cuda":
            return
        for option in sharding_options:
            facts = _collection(option)
            if facts is None:
                continue
            fused = _fused_params(option, sharder_data_map)
            for shard in option.shards:
                fwd, bwd = self.compute_ms(option, shard, facts, fused)
                perf = shard.perf if shard.perf is not None else Perf(fwd_compute=0.0, fwd_comms=0.0, bwd_compute=0.0,
                                                                       bwd_comms=0.0)
                shard.perf = dataclasses.replace(perf, fwd_compute=fwd, bwd_compute=bwd, prefetch_compute=0.0)

    def compute_ms(self, option, shard, facts: _Collection, fused: Dict[str, Any]):
        """(forward, backward) compute of one shard in ms: the kernels over the shard's rows (for host and
        cached tables, the row cache's tables in device memory), plus for host and cached tables the rows moved
        over the host link (a cached table's misses and victims in its forward; a host table's rows in its
        forward and back after its backward)."""
        work = _work(option, shard, self._topology, self._constraints)
        rows, cols = shard.size
        indices = self._indices(option.name)
        weights = model.weights_key(facts.weights)
        e, out = model.ELEMENT_BYTES[facts.weights], model.ELEMENT_BYTES[facts.output]
        state = _state_bytes(facts.optimizer, cols)
        f = model.FITTED[("forward", "", weights, indices)]
        fwd = model.milliseconds(model.forward_bytes(work.lookups, work.outputs, cols, e, out, f.floor, f.overhead),
                                 f.gbps)
        has_state = any(s is not None for s in _capi.OPTIMIZER_STATES[facts.optimizer])
        b = model.FITTED[("backward", model.backward_key(facts.optimizer, has_state), weights, indices)]
        bwd = model.milliseconds(model.backward_bytes(work.bwd_lookups, work.bwd_outputs, cols, e, out, state, b.floor,
                                                      b.overhead), b.gbps)
        placement = _placement(option)
        if placement == "device":
            return fwd, bwd
        link = model.FITTED[("link", placement, "", indices)]
        stats = _cache_stats(option)
        if stats is not None:  # unique rows of the global batch, the shard's share of them
            expected = stats.expected_lookups() if callable(stats.expected_lookups) else stats.expected_lookups
            unique = min(float(rows), expected * rows / option.tensor.shape[0])
        else:
            unique = model.expected_unique_rows(work.lookups, rows)
        if placement == "host":
            one_way = model.milliseconds(model.link_bytes(unique, cols, e, state), link.gbps)
            return fwd + one_way, bwd + one_way
        factor = _load_factor(option, fused)
        miss = stats.expected_miss_rate(factor) if stats is not None else 1.0 - min(factor, 1.0)
        return fwd + model.milliseconds(model.link_bytes(2 * unique * miss, cols, e, state), link.gbps), bwd


class EmbscaleStorageEstimator(ShardEstimator):
    """TorchRec's storage estimator for embscale's collections: TorchRec's EmbeddingStorageEstimator (or the one
    given) estimates every option, then each shard of an option of embscale's collections takes the memory
    embscale allocates for it (Storage(hbm, ddr), bytes):

    - the shard's rows and its optimizer state (fp32: a value a row for row-wise state, a row of values for
      element-wise state, as the library's optimizer table has them), in device memory for FUSED and
      data-parallel tables, in host memory for FUSED_UVM and FUSED_UVM_CACHING (on a CPU topology all in host
      memory);
    - for FUSED_UVM_CACHING its cache: the load factor's rows rounded up to whole 32-way sets, with their state
      and bookkeeping (tag, stamp, dirty flag, rounding base; a count a host row under LFU);
    - for FUSED_UVM and FUSED_UVM_CACHING the staging rows of two batches (with their state) and two batch
      plans, of ``cache_max_lookups`` lookups (the collection's, else the shard's lookups rounded up to a power of
      two, at least 65,536). The row cache of a shard group holds one set of staging rows per embedding
      dimension for all its tables; the estimate charges each table the staging of its own lookups;
    - the batch's indices (8 bytes each) and output rows, in device memory on CUDA (host memory on the CPU).
    """

    def __init__(self, topology, constraints=None, torchrec_estimator: Optional[ShardEstimator] = None) -> None:
        self._topology = topology
        self._constraints = constraints
        self._torchrec = torchrec_estimator if torchrec_estimator is not None else EmbeddingStorageEstimator(
            topology=topology, constraints=constraints)

    def estimate(self, sharding_options: List, sharder_data_map=None) -> None:
        self._torchrec.estimate(sharding_options, sharder_data_map)
        for option in sharding_options:
            facts = _collection(option)
            if facts is None:
                continue
            fused = _fused_params(option, sharder_data_map)
            for shard in option.shards:
                shard.storage = self.shard_storage(option, shard, facts, fused)

    def shard_storage(self, option, shard, facts: _Collection, fused: Dict[str, Any]) -> Storage:
        rows, cols = shard.size
        work = _work(option, shard, self._topology, self._constraints)
        row_bytes = cols * model.ELEMENT_BYTES[facts.weights] + _state_bytes(facts.optimizer, cols)
        io = math.ceil(work.lookups * _INDEX_BYTES + work.outputs * cols * model.ELEMENT_BYTES[facts.output])
        tables = rows * row_bytes
        if self._topology.compute_device != "cuda":
            return Storage(hbm=0, ddr=tables + io)
        placement = _placement(option)
        if placement == "device":
            return Storage(hbm=tables + io, ddr=0)
        staged = facts.cache_max_lookups or max(_MIN_STAGED_LOOKUPS,
                                                1 << max(0, math.ceil(work.lookups) - 1).bit_length())
        cache_rows = 2 * staged  # staging rows: two batches
        device = 2 * staged * _PLAN_BYTES
        if placement == "cached":
            wanted = max(1, int(round(_load_factor(option, fused) * rows)))
            slots = -(-wanted // _WAYS) * _WAYS
            cache_rows += slots
            device += slots * _SLOT_BYTES
            algorithm = option.cache_params.algorithm if option.cache_params is not None else None
            algorithm = algorithm if algorithm is not None else fused.get("cache_algorithm")
            if algorithm is not None and _fbgemm_names.cache_algorithm(algorithm) == "lfu":
                device += rows * _LFU_BYTES
        device += cache_rows * (row_bytes + _ROUNDING_BASE_BYTES)
        return Storage(hbm=device + io, ddr=tables)


def embscale_estimators(topology, constraints=None, index_distribution: Union[str, Dict[str, str]] = "uniform"
                        ) -> List[ShardEstimator]:
    """[EmbscalePerfEstimator, EmbscaleStorageEstimator] for ``topology``: the estimators TorchRec's
    EmbeddingEnumerator takes (``estimator=``)."""
    return [EmbscalePerfEstimator(topology, constraints, index_distribution=index_distribution),
            EmbscaleStorageEstimator(topology, constraints)]


def embscale_enumerator(topology, batch_size: Optional[int] = None, constraints=None,
                        index_distribution: Union[str, Dict[str, str]] = "uniform") -> EmbeddingEnumerator:
    """TorchRec's EmbeddingEnumerator with embscale's estimators, for TorchRec's planner::

        planner = EmbeddingShardingPlanner(topology=topology, batch_size=B, constraints=constraints,
                                           enumerator=embscale_enumerator(topology, B, constraints))

    Give the planner and the enumerator the same batch size and constraints. Options of modules that are not
    embscale's get TorchRec's own estimates."""
    return EmbeddingEnumerator(topology=topology, batch_size=batch_size or BATCH_SIZE, constraints=constraints,
                               estimator=embscale_estimators(topology, constraints, index_distribution))
