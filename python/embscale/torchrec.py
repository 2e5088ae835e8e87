"""embscale's kernels under TorchRec: an EmbeddingBagCollection (pooled embeddings) and an EmbeddingCollection
(sequence embeddings) trained by embscale's fused optimizer, and for each a sharder that plugs embscale in as
TorchRec's customized compute kernel.

    from embscale.torchrec import EmbeddingBagCollection, EmbeddingBagCollectionSharder
    ebc = EmbeddingBagCollection(tables, optimizer="rowwise_adagrad", learning_rate=0.05)  # the one changed line
    model = DistributedModelParallel(Dlrm(ebc), sharders=[EmbeddingBagCollectionSharder()], plan=plan)
    opt = CombinedOptimizer([model.fused_optimizer, KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(model.named_parameters())), lambda p: torch.optim.Adam(p))])

The module takes a KeyedJaggedTensor and returns a KeyedTensor like torchrec's EmbeddingBagCollection,
from one TableBatchedEmbeddingBags over all its tables. EmbeddingCollection returns a JaggedTensor of rows per
feature like torchrec's EmbeddingCollection, from one TableBatchedEmbeddingBags with pooling "none"; its
sharder (EmbeddingCollectionSharder) shards it as below, behind TorchRec's sequence input and output
distributions, column-wise tables in shards of one width. Sharded (table-wise, row-wise, column-wise or
data-parallel; the bag collection also table-row-wise and grid, as TorchRec's own EmbeddingBagCollection,
whose sequence counterpart takes neither), every shard group on a process is one TableBatchedEmbeddingBags over
the local shards;
TorchRec's planner, input and output distributions and all-to-alls are used as they are. The plan may
name the FUSED kernel (TorchRec's planner does not estimate a customized one) or DENSE for data-parallel
tables: the sharder makes every table's kernel the customized one, embscale's. TorchRec's planner estimates
these kernels from embscale's own cost model with ``embscale_enumerator(topology, batch_size)`` as its
enumerator (EmbscalePerfEstimator, EmbscaleStorageEstimator; docs/distributed.md), else as FBGEMM's. A process may hold several
column shards of one table (column_wise(ranks=[0, 1, 0, 1])), of one width.

Table-row-wise (TWRW) and grid plans cut a table (a grid table: each of its column shards) over the processes of
one node, which TorchRec reads from LOCAL_WORLD_SIZE (torch.distributed.elastic's; unset, the world is one node),
not from the plan: each process holds TorchRec's row block ceil(rows / node) of it, and its lookups come from
the whole batch, bucketized by row and staggered by local rank (the batches of every node's first process,
node by node, then of every node's second...), in which order each row's gradient is summed; the node's
partial pools are added up (reduce-scatter) and sent back between nodes (all-to-all). A plan made for another
node size (a Topology's local_world_size), whose shards would not hold the rows TorchRec sends them, is refused
by name (_check_node_shards).

Tables larger than device memory: the plan's kernel gives each table its placement in its shard group's
TableBatchedEmbeddingBags (docs/tbe_cache.md): FUSED "device", FUSED_UVM "host" (FBGEMM's MANAGED: host
memory), FUSED_UVM_CACHING "cached" (MANAGED_CACHING: host memory behind a row cache in device memory); a
data-parallel table stays in device memory. A cached table's cache takes the plan's cache_params
(load_factor, algorithm), else the sharder's fused_params (``cache_load_factor``, ``cache_algorithm``), else
TorchRec's planner's default load factor (0.2) and LRU; a shard group (TorchRec groups FUSED, FUSED_UVM and
FUSED_UVM_CACHING tables together, apart by cache algorithm) is one TBE with a placement per table and one
load factor, its cached tables' averaged weighted by their rows, as TorchRec averages them for FBGEMM. The
sharder offers TorchRec's planner FUSED_UVM and FUSED_UVM_CACHING on CUDA topologies, as TorchRec's own
sharder does, so a Topology whose device memory cannot hold the tables gets such a plan. Other kernels
(KEY_VALUE, the virtual tables, DENSE for sharded tables) and cache_params embscale cannot honour (a cache
precision other than the table's) are refused by name. TorchRec's prefetch (PrefetchTrainPipelineSparseDist,
on its prefetch stream a batch ahead) reaches each shard group with a table in host memory, whose TBE plans
the batch; its forward then hands the TBE the same indices and offsets tensors, by which the row cache finds
the plan. On CUDA such a group keeps all its tables in the TBE's host store: their parameters and
ShardedTensors view host memory (their metadata places them on the CPU), stay there when
DistributedModelParallel moves the model, are flushed before ``state_dict()`` and reloaded into the cache
after ``load_state_dict()``. On the CPU every placement is host memory: the same plans run there.

Training matches one process with the global batch (the processes' batches side by side in rank order):
TorchRec lays each shard's lookups out in that order, so each row's gradient is summed as there; the
output gradients come back divided by the world size (TorchRec's gradient division, as DDP averages the
dense gradients). A column-wise shard keeps its own row-wise optimizer state (of its columns), as
TorchRec's kernels do. Data-parallel tables are replicas: each backward applies the global batch's update
(TableBatchedEmbeddingBags' data_parallel_group). MEAN pooling is TorchRec's: where a row-wise table is in
the collection, the kernels pool SUM and TorchRec divides the outputs by the bags' lengths (plus 1e-6)
after its output distribution, as for its own kernels (ShardedEmbeddingBagCollection._create_lookups); a
table-row-wise or grid MEAN table does the same.

A batch size per feature (TorchRec's variable batch, "VBE": a KeyedJaggedTensor with stride_per_key_per_rank and
inverse_indices) goes in as into torchrec's modules, unsharded and sharded, forward and backward: the output is the
full batch, each feature's bags expanded by inverse_indices. A TableBatchedEmbeddingBags reads one batch size, so
the batch is padded into one with empty bags (each feature's bags up to the largest feature's batch; sharded, each
rank's bags in a block as wide as that rank's largest batch), which change no real bag and train nothing; the real
bags' rows are read back from the TBE's output (_PaddedBatch). The TBE then pools features x padded batch bags.
Without inverse_indices, features of different batch sizes are refused naming ``features``; sharded, TorchRec's
output distribution needs them. The sharded sequence collection gets such a batch padded by TorchRec itself; on the
CPU TorchRec's expansion of its rows has no gradient, so it is refused there while gradients are on.

State is laid out as TorchRec's FUSED kernels lay theirs, so a checkpoint moves between them: sharded tables
and their optimizer state appear in ``state_dict()`` and ``fused_optimizer.state_dict()`` as ShardedTensors
over the local shards, the state under ``<table>.momentum1`` (row-wise Adagrad's sum, Adam's exp_avg; a
second buffer under its FBGEMM name), a column-wise or grid table's row-wise state [column shards * rows]. So
torch.distributed.checkpoint saves them and loads them into another plan, world size, or TorchRec's own
kernels, and back. The tables are tagged as trained in the backward (``_in_backward_optimizers``), so
TorchRec's usual CombinedOptimizer setup above leaves them to the fused optimizer.

Needs torchrec (with fbgemm_gpu): ``pip install .[torchrec]``.
"""

import copy
import dataclasses
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor, ShardedTensorMetadata, TensorProperties
from torch.nn.modules.module import _IncompatibleKeys
from torchrec.distributed.embedding_lookup import GroupedEmbeddingsLookup, GroupedPooledEmbeddingsLookup
from torchrec.distributed.embedding_kernel import BaseEmbedding
from torchrec.distributed.embedding_types import EmbeddingComputeKernel, GroupedEmbeddingConfig
import torchrec.distributed.embedding as _torchrec_ec_module
import torchrec.distributed.embeddingbag as _torchrec_ebc_module
from torchrec.distributed.embedding import EmbeddingCollectionSharder as _TorchrecECSharder
from torchrec.distributed.embedding import ShardedEmbeddingCollection as _TorchrecShardedEC
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder as _TorchrecSharder
from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection as _TorchrecShardedEBC
from torchrec.distributed.planner.constants import UVM_CACHING_RATIO
from torchrec.distributed.sharding.cw_sequence_sharding import CwSequenceEmbeddingSharding
from torchrec.distributed.sharding.cw_sharding import CwPooledEmbeddingSharding
from torchrec.distributed.sharding.dp_sequence_sharding import DpSequenceEmbeddingSharding
from torchrec.distributed.sharding.dp_sharding import DpPooledEmbeddingSharding
from torchrec.distributed.sharding.grid_sharding import GridPooledEmbeddingSharding
from torchrec.distributed.sharding.rw_sequence_sharding import RwSequenceEmbeddingSharding
from torchrec.distributed.sharding.rw_sharding import RwPooledEmbeddingSharding
from torchrec.distributed.sharding.tw_sequence_sharding import TwSequenceEmbeddingSharding
from torchrec.distributed.sharding.tw_sharding import TwPooledEmbeddingSharding
from torchrec.distributed.sharding.twrw_sharding import TwRwPooledEmbeddingSharding
from torchrec.distributed.types import ShardingType
from torchrec.modules.embedding_configs import DataType, data_type_to_dtype
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig, PoolingType
from torchrec.modules.embedding_modules import get_embedding_names_by_table
from torchrec.optim.fused import EmptyFusedOptimizer, FusedOptimizer, FusedOptimizerModule
from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor, KeyedTensor
from torchrec.tensor_types import UIntXTensor

from . import _fbgemm_names
from . import tbe as _tbe
from .tbe_quant import QuantizedTableBatchedEmbeddingBags

_POOLING = {PoolingType.SUM: "sum", PoolingType.MEAN: "mean"}
_KERNEL_POOLING = {**_POOLING, PoolingType.NONE: "none"}  # a shard group's: TorchRec's sequence groups pool NONE
_FUSED_KEY = "embscale"  # the fused_params entry that carries the module's optimizer settings to its shards
# The sharding types embscale serves, on each collection those TorchRec serves on its own counterpart: its sharded
# EmbeddingCollection takes table-wise, row-wise, column-wise and data-parallel plans; its EmbeddingBagCollection
# also table-row-wise and grid (torchrec 1.6.1 to 1.9.2).
_SHARDING_TYPES = (ShardingType.TABLE_WISE.value, ShardingType.ROW_WISE.value, ShardingType.COLUMN_WISE.value,
                   ShardingType.DATA_PARALLEL.value)
_NODE_SHARDING_TYPES = (ShardingType.TABLE_ROW_WISE.value, ShardingType.GRID_SHARD.value)  # cut over a node's processes
_BAG_SHARDING_TYPES = _SHARDING_TYPES + _NODE_SHARDING_TYPES
# The plan's compute kernels embscale serves for sharded tables, and the placement each gives a table: TorchRec's
# FUSED (FBGEMM's EmbeddingLocation.DEVICE), FUSED_UVM (MANAGED: host memory) and FUSED_UVM_CACHING
# (MANAGED_CACHING: host memory behind a cache in device memory). Data-parallel tables are replicas in device
# memory (the plan names DENSE, or FUSED).
_KERNEL_PLACEMENT = {EmbeddingComputeKernel.FUSED.value: "device", EmbeddingComputeKernel.FUSED_UVM.value: "host",
                     EmbeddingComputeKernel.FUSED_UVM_CACHING.value: "cached"}
_DATA_PARALLEL_KERNELS = (EmbeddingComputeKernel.DENSE.value, EmbeddingComputeKernel.FUSED.value)
_PLACEMENTS_KEY = "embscale_placements"  # the fused_params entry that carries each table's placement to its shards
_PLAN_KERNEL = "_embscale_compute_kernel"  # where shard() records, on a ParameterSharding, the kernel it replaced


def _pooling(configs):
    modes = {c.pooling for c in configs}
    if len(modes) != 1 or not modes <= set(_POOLING):
        raise ValueError(f"tables: pooling {sorted(str(m) for m in modes)}; embscale needs one of SUM or MEAN for "
                         "all tables of a collection")
    return _POOLING[modes.pop()]


def _weights_dtype(configs, optimizer_kwargs):
    """The tables' dtype from the configs' data_type (FP32, FP16 or BF16, one for all tables: one
    TableBatchedEmbeddingBags holds them), which a weights_dtype among the optimizer arguments must agree
    with; ValueError naming the table otherwise."""
    dtypes = {}
    for i, c in enumerate(configs):
        dtype = data_type_to_dtype(c.data_type)
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"tables[{i}].data_type: {c.data_type} is not supported; embscale's tables are FP32, "
                             "FP16 or BF16")
        dtypes.setdefault(dtype, c.name)
    if len(dtypes) > 1:
        raise ValueError(f"tables: data types {[str(d).replace('torch.', '') for d in dtypes]} differ (e.g. tables "
                         f"{list(dtypes.values())}); one collection holds tables of one data_type")
    dtype = next(iter(dtypes))
    given = optimizer_kwargs.get("weights_dtype", dtype)
    if given != dtype:
        raise ValueError(f"weights_dtype: {given} differs from the tables' data_type ({configs[0].data_type}); set "
                         "EmbeddingBagConfig.data_type instead")
    return dtype


class EmbscaleFusedOptimizer(FusedOptimizer):
    """TorchRec's view of a TableBatchedEmbeddingBags' fused optimizer, keyed as TorchRec's FUSED kernels key
    theirs so that a checkpoint moves between them: ``params`` maps ``<table>.weight`` (``embedding_bags.``
    before it in a collection) to the table's weights, and ``state[weights]`` its optimizer state under
    ``<table>.momentum1`` and so on (``_state_entries``). All are views of the module's buffers (ShardedTensors
    over them where the table is sharded), updated in the backward. ``step()`` and ``zero_grad()`` apply a
    learning rate set in ``param_groups`` to the module, as TorchRec's fused optimizers do; the update itself
    happens in the backward."""

    def __init__(self, tbe: _tbe.TableBatchedEmbeddingBags, params: Dict[str, torch.Tensor],
                 state: Dict[torch.Tensor, Dict[str, torch.Tensor]]):
        self._tbe = tbe
        group = {"params": list(params.values()), "lr": tbe.learning_rate, "optimizer": tbe.optimizer}
        super().__init__(params, state, [group])

    def step(self, closure: Any = None) -> None:
        self._tbe.set_learning_rate(self.param_groups[0]["lr"])

    def zero_grad(self, set_to_none: bool = False) -> None:
        # As TorchRec's fused optimizers: a training loop's zero_grad() comes before the backward, so a rate a
        # schedule set after the last step() reaches this step's update.
        self._tbe.set_learning_rate(self.param_groups[0]["lr"])

    def state_dict(self) -> Dict[str, Any]:
        flush = getattr(self._tbe, "flush", None)  # tables in host memory (CUDA): the views made current
        if flush is not None:
            flush()
        return super().state_dict()

    def post_load_state_dict(self) -> None:
        super().post_load_state_dict()
        load = getattr(self._tbe, "load_cache", None)  # written through the views: the cache drops its copies
        if load is not None:
            load()


def _state_entries(table: str, state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """A table's optimizer state under TorchRec's keys (torchrec 1.9.2's EmbeddingFusedOptimizer):
    ``<table>.momentum1`` for the first buffer whatever FBGEMM calls it (``sum`` of row-wise Adagrad,
    ``exp_avg`` of Adam), ``<table>.<FBGEMM's name>`` for a second (``exp_avg_sq``); none for SGD."""
    return {f"{table}.{'momentum1' if i == 0 else name}": v for i, (name, v) in enumerate(state.items())}


def _mark_trained_in_backward(params, optimizer) -> None:
    """Tags parameters as trained by an optimizer in the backward (``_in_backward_optimizers``, the attribute
    torch's apply_optimizer_in_backward sets and TorchRec's own kernels set on their tables), so that
    torchrec.optim.in_backward_optimizer_filter leaves them out of the dense optimizer that
    CombinedOptimizer puts beside the fused one. Callers tag only tables that do not require grad: DDP
    hands a tagged parameter's gradient to the tagged optimizer (its optimizer-in-backward hook)."""
    for p in params:
        p._in_backward_optimizers = [optimizer]


def _table_params(tbe):
    """Per table, a Parameter viewing its rows in the module's tables (writes through, no grad)."""
    return [nn.Parameter(w, requires_grad=False) for w in tbe.split_embedding_weights()]


def _state_layout(state: torch.Tensor, table: ShardedTensorMetadata):
    """The layout TorchRec's FUSED kernels give a sharded table's optimizer state (facts of torchrec 1.9.2's
    EmbeddingFusedOptimizer), so that checkpoints move between them and embscale: element-wise state is
    [rows, columns], sharded as the table; row-wise state is one value per row, [rows] sharded as the
    table's rows (row-wise and table-row-wise shards at their first row), except in a table cut into column
    shards, each of which keeps its own row-wise state (of its columns): then the column shards follow one
    another from the left, each taking as many places as it has rows. A column-wise table of k shards has
    [k * rows], the k-th column shard from the left at [k * rows, (k+1) * rows); a grid-sharded one (column
    shards each cut into row shards) the same, the row shards of a column shard one after the other in the
    plan's order (their rows' order: _check_node_shards).
    Returns the state's metadata and, per shard of the table ((offsets, sizes)), its shard of the state."""
    props = TensorProperties(dtype=state.dtype)
    shards = table.shards_metadata
    if state.dim() == 2:
        place = {(tuple(m.shard_offsets), tuple(m.shard_sizes)): m for m in shards}
        return ShardedTensorMetadata(shards_metadata=list(shards), size=table.size, tensor_properties=props), place
    rows, cols = table.size
    if all(m.shard_sizes[1] == cols for m in shards):
        placed = [(m, ShardMetadata([m.shard_offsets[0]], [m.shard_sizes[0]], m.placement)) for m in shards]
        size = rows
    else:
        placed, size = [], 0
        for m in sorted(shards, key=lambda m: m.shard_offsets[1]):  # (stable: row shards keep the plan's order)
            placed.append((m, ShardMetadata([size], [m.shard_sizes[0]], m.placement)))
            size += m.shard_sizes[0]
    place = {(tuple(m.shard_offsets), tuple(m.shard_sizes)): sm for m, sm in placed}
    meta = ShardedTensorMetadata(shards_metadata=[sm for _, sm in placed], size=torch.Size([size]),
                                 tensor_properties=props)
    return meta, place


class _NoDdpWrap(nn.parallel.DistributedDataParallel):
    """Stands for DistributedDataParallel while TorchRec before 1.7 builds a sharded collection: holds the
    data-parallel lookup as ``module`` (where TorchRec unwraps it) and forwards to it, with none of DDP's
    gradient reduction (see ShardedEmbeddingBagCollection.init_data_parallel)."""

    def __init__(self, module: nn.Module, **_ddp_arguments) -> None:  # pylint: disable=super-init-not-called
        nn.Module.__init__(self)  # pylint: disable=non-parent-init-called
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)


def _sharded(locals_, metadata: ShardedTensorMetadata, pg) -> ShardedTensor:
    """A ShardedTensor over this process's shards (tensor, ShardMetadata); the tensors are views, so reads
    and writes go to the module's buffers.

    A shard kept in host memory by a process that computes on CUDA (the tables of a shard group with a
    "host" or "cached" table live in the TableBatchedEmbeddingBags' host store) is placed on the CPU in its
    metadata, pinned as that memory is: ShardedTensor checks each local shard's device and pinning against
    its metadata. The other processes' shards keep the plan's placement."""
    moved = {}
    for t, m in locals_:
        if m.placement is not None and m.placement.device() != t.device:
            moved[(tuple(m.shard_offsets), tuple(m.shard_sizes))] = ShardMetadata(
                list(m.shard_offsets), list(m.shard_sizes), f"rank:{m.placement.rank()}/{t.device}")
    if moved:
        def placed(m):
            return moved.get((tuple(m.shard_offsets), tuple(m.shard_sizes)), m)

        locals_ = [(t, placed(m)) for t, m in locals_]
        props = dataclasses.replace(metadata.tensor_properties, pin_memory=locals_[0][0].is_pinned())
        metadata = ShardedTensorMetadata(shards_metadata=[placed(m) for m in metadata.shards_metadata],
                                         size=metadata.size, tensor_properties=props)
    return ShardedTensor._init_from_local_shards_and_global_metadata(
        local_shards=[Shard(tensor=t, metadata=m) for t, m in locals_], sharded_tensor_metadata=metadata,
        process_group=pg)


def _check_tables(tables) -> None:
    """A collection's tables: at least one, of unique names (ValueError naming ``tables`` otherwise)."""
    if not tables:
        raise ValueError("tables: at least one table config is needed")
    names = [t.name for t in tables]
    if len(set(names)) != len(names):
        raise ValueError(f"tables: names {names} are not unique")


class _TbeCollection(nn.Module, FusedOptimizerModule):
    """What embscale's two collections share: all tables in one TableBatchedEmbeddingBags (``tbe``), trained in
    the backward by its fused optimizer, exposed as TorchRec's FusedOptimizer over per-table views keyed as
    torchrec keys the tables (``<_TABLES>.<table>.weight``: ``embedding_bags`` for the bag collection,
    ``embeddings`` for the sequence one).

    ``state_dict()`` has those keys and the TableBatchedEmbeddingBags' own entries (``tbe.*``: per table its
    weights and optimizer state, hyper-parameters and step)."""

    _TABLES = ""  # the ModuleDict of the per-table views, as torchrec names it

    def _build(self, tables, feature_table_map, pooling, device, optimizer, optimizer_kwargs) -> None:
        """The TBE over ``tables`` (its features' tables ``feature_table_map``), the views and the optimizer."""
        names = [t.name for t in tables]
        self._optimizer_settings = {"optimizer": optimizer, **optimizer_kwargs,
                                    "weights_dtype": _weights_dtype(tables, optimizer_kwargs)}
        # the tables' own names key the TableBatchedEmbeddingBags' state too (tbe.<table>.weight, ...) where
        # they can (a state_dict key part has no ".")
        self.tbe = _tbe.TableBatchedEmbeddingBags([(t.num_embeddings, t.embedding_dim) for t in tables],
                                                  feature_table_map=feature_table_map, pooling=pooling, device=device,
                                                  table_names=None if any("." in n for n in names) else names,
                                                  **self._optimizer_settings)
        setattr(self, self._TABLES, nn.ModuleDict({n: nn.Module() for n in names}))
        self._register_table_views()
        self.reset_parameters()
        self.register_load_state_dict_post_hook(_TbeCollection._tables_after_load)

    def _configs(self) -> list:
        raise NotImplementedError

    def _views(self) -> nn.ModuleDict:
        return getattr(self, self._TABLES)

    @staticmethod
    def _tables_after_load(module, incompatible_keys):
        """After load_state_dict: with assign=True torch installs the checkpoint's own tensors as
        ``<_TABLES>.<table>.weight``, which are then no views of the module's tables (training would
        leave them stale, and the fused optimizer would keep the old views). Their values are copied into
        the tables (a module on the meta device is made on their device first) and the views are made
        again. Without assign the views were written through and stay."""
        self = module
        views = self._views()
        replaced = False
        for t, (name, view) in enumerate(zip(views, self.tbe.split_embedding_weights())):
            loaded = views[name].weight
            if loaded.device == view.device and loaded.data_ptr() == view.data_ptr():
                continue  # still the view (written through by a load without assign)
            replaced = True
            if loaded.is_meta:  # nothing to copy (the module's own tables may have been loaded, as tbe.*)
                continue
            if self.tbe.weights.is_meta:
                self.tbe.to_empty(device=loaded.device)
                self.tbe.reset_parameters()
            with torch.no_grad():
                self.tbe.split_embedding_weights()[t].copy_(loaded)
        if replaced:  # new views, and a fused optimizer over them
            self._register_table_views()

    def reset_parameters(self):
        """Each table drawn by its config's init_fn (torchrec's: uniform in [weight_init_min, weight_init_max],
        by default +-sqrt(1/num_embeddings)), the optimizer state zeroed and the step count restarted at 0, as
        TableBatchedEmbeddingBags.reset_parameters does; nothing on the meta device."""
        if self.device.type == "meta":
            return
        self.tbe.reset_parameters()
        views = self._views()
        with torch.no_grad():
            for config in self._configs():
                if config.init_fn is not None:
                    config.init_fn(views[config.name].weight)

    def _register_table_views(self):
        """``<_TABLES>.<table>.weight`` as views of the module's tables, and the fused optimizer over them,
        keyed as the module's state_dict keys them (as TorchRec's sharded collections key their fused
        optimizers); the views and the module's tables tagged as trained in the backward."""
        views = self._views()
        params = _table_params(self.tbe)
        for name, p in zip(views, params):
            views[name].weight = p
        keyed = {f"{self._TABLES}.{name}.weight": p for name, p in zip(views, params)}
        state = {p: _state_entries(name, s) for name, p, s in zip(views, params, self.tbe.optimizer_state())}
        self._optim = EmbscaleFusedOptimizer(self.tbe, keyed, state)
        if not self.tbe.weights.requires_grad:
            _mark_trained_in_backward([*params, self.tbe.weights], self._optim)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self._register_table_views()  # the views follow the tables' new storage
        return self

    def __setstate__(self, state):
        """A copy (copy.deepcopy, pickle, torch.load) has its own tables, but torch does not always keep the
        views sharing them: a Parameter's deepcopy clones its data, and plain pickle stores each view's
        storage apart. The views and the fused optimizer are made again over the copy's tables (with the
        same values: the views were equal to them when copied)."""
        super().__setstate__(state)
        self._register_table_views()

    @property
    def device(self) -> torch.device:
        return self.tbe.weights.device

    @property
    def fused_optimizer(self) -> FusedOptimizer:
        return self._optim

    def _ordered(self, features: KeyedJaggedTensor, order: List[str]) -> KeyedJaggedTensor:
        return _ordered_features(features, order)


def _ordered_features(features: KeyedJaggedTensor, order: List[str]) -> KeyedJaggedTensor:
    """The batch's features in a TBE's order (a feature may come more than once; a batch size per feature
    follows its feature); ValueError naming ``features`` where one is missing."""
    keys = features.keys()
    missing = [f for f in dict.fromkeys(order) if f not in keys]
    if missing:
        raise ValueError(f"features: keys {keys} lack {missing}")
    if keys != order:
        features = features.permute([keys.index(f) for f in order])
    return features


class EmbeddingBagCollection(_TbeCollection):
    """torchrec's EmbeddingBagCollection on embscale's kernels: ``tables`` (EmbeddingBagConfig, all of one
    pooling, SUM or MEAN), KeyedJaggedTensor in, KeyedTensor (the features' pooled rows side by side, in
    the tables' order) out; the tables are trained in the backward by the fused optimizer (``optimizer``
    and its hyper-parameters as TableBatchedEmbeddingBags takes them), exposed as TorchRec's FusedOptimizer.

    ``state_dict()`` has ``embedding_bags.<table>.weight`` (torchrec's keys) and the TableBatchedEmbeddingBags'
    own entries (``tbe.*``: per table its weights and optimizer state, hyper-parameters and step)."""

    _TABLES = "embedding_bags"

    def __init__(self, tables: List[EmbeddingBagConfig], is_weighted: bool = False, device=None,
                 optimizer: str = "rowwise_adagrad", **optimizer_kwargs):
        super().__init__()
        _check_tables(tables)
        self._embedding_bag_configs = list(tables)
        self._is_weighted = bool(is_weighted)
        self._feature_names = [f for t in tables for f in t.feature_names]
        if len(set(self._feature_names)) != len(self._feature_names):
            raise ValueError(f"tables: feature names {self._feature_names} are not unique")
        self._lengths_per_key = [t.embedding_dim for t in tables for _ in t.feature_names]
        fmap = [i for i, t in enumerate(tables) for _ in t.feature_names]
        self._build(tables, fmap, _pooling(tables), device, optimizer, optimizer_kwargs)

    def _configs(self):
        return self._embedding_bag_configs

    def embedding_bag_configs(self) -> List[EmbeddingBagConfig]:
        return self._embedding_bag_configs

    def is_weighted(self) -> bool:
        return self._is_weighted

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """The features' pooled rows [batch, sum of the dims]. As torchrec's module: where ``features`` has
        inverse_indices, each feature's bags are expanded to the batch by them (sample b of feature f: its bag
        inverse_indices[f][b]); a batch size per feature (a variable batch) needs them. Such a batch is laid into
        the TBE's one batch size, each feature padded with empty bags to the largest (_PaddedBatch)."""
        inverse = features.inverse_indices_or_none()
        features = self._ordered(features, self._feature_names)
        strides = features.stride_per_key()
        if inverse is None and len(set(strides)) > 1:
            raise ValueError(f"features: a batch size per feature (stride_per_key {strides} for keys "
                             f"{features.keys()}) needs inverse_indices (KeyedJaggedTensor(..., inverse_indices=(keys, "
                             "[keys, batch size] tensor))), by which each feature's bags are expanded to the batch")
        rows = _inverse_rows(inverse, self._feature_names, strides) if inverse is not None else None
        values = features.values()
        weights = features.weights_or_none() if self._is_weighted else None
        if features.variable_stride_per_key():
            offsets = _PaddedBatch([[s] for s in strides], features.lengths(), values.dtype).offsets
        else:
            offsets = features.offsets().to(values.dtype)
        pooled = self.tbe(values, offsets, weights)
        if rows is not None:  # (a padded batch: each feature's bags are its first rows)
            pooled = torch.cat([p.index_select(0, r) for p, r in zip(pooled.split(self._lengths_per_key, 1), rows)], 1)
        return KeyedTensor(keys=self._feature_names, length_per_key=self._lengths_per_key, values=pooled)


# TorchRec's DataType of a quantized table's rows -> embscale's weight type, and the dtypes of a qconfig's weight
# observer (TorchRec's from_float convention) -> the same.
_QUANT_DATA_TYPES = {DataType.FP32: "fp32", DataType.FP16: "fp16", DataType.BF16: "bf16", DataType.INT8: "int8",
                     DataType.INT4: "int4", DataType.INT2: "int2"}
_QCONFIG_DTYPES = {torch.qint8: DataType.INT8, torch.quint8: DataType.INT8, torch.quint4x2: DataType.INT4,
                   torch.quint2x4: DataType.INT2, torch.float16: DataType.FP16, torch.bfloat16: DataType.BF16,
                   torch.float32: DataType.FP32}


class QuantEmbeddingBagCollection(nn.Module):
    """torchrec.quant.EmbeddingBagCollection on embscale's quantized tables (QuantizedTableBatchedEmbeddingBags,
    docs/tbe_quant.md), for inference: ``tables`` (EmbeddingBagConfig, all of one pooling, SUM or MEAN; each
    table's rows in its ``data_type``: INT8, INT4, INT2 with a per-row scale and bias, FP16, BF16 or FP32),
    KeyedJaggedTensor in, KeyedTensor out (the features' pooled rows side by side, in the tables' order).
    Build it ``from_float`` a trained collection (TorchRec's or embscale's).

    ``state_dict()`` has TorchRec's keys, ``embedding_bags.<table>.weight``: each table's rows as uint8
    [num_embeddings, row bytes] in FBGEMM's IntNBit layout (scale and bias before the data, each row padded to
    ``row_alignment``, 16 as TorchRec's default), the same bytes TorchRec's quantized collection holds.

    ``bounds_check`` is "warn" as TorchRec's collection runs FBGEMM's (its WARNING mode: an index outside its table
    is dropped and counted, a warning comes at a later call, and a call on CUDA never waits for the device);
    "error" raises at the call, and on CUDA waits for the device at every call (the module's notes)."""

    def __init__(self, tables: List[EmbeddingBagConfig], is_weighted: bool = False, device=None,
                 output_dtype: torch.dtype = torch.float32, row_alignment: int = 16, bounds_check: str = "warn"):
        super().__init__()
        _check_tables(tables)
        types = []
        for i, t in enumerate(tables):
            if t.data_type not in _QUANT_DATA_TYPES:
                raise ValueError(f"tables[{i}].data_type: {t.data_type} is not supported; embscale's quantized tables "
                                 f"are {', '.join(d.name for d in _QUANT_DATA_TYPES)}")
            types.append(_QUANT_DATA_TYPES[t.data_type])
        self._embedding_bag_configs = list(tables)
        self._is_weighted = bool(is_weighted)
        self._output_dtype = output_dtype
        self._feature_names = [f for t in tables for f in t.feature_names]
        if len(set(self._feature_names)) != len(self._feature_names):
            raise ValueError(f"tables: feature names {self._feature_names} are not unique")
        self._lengths_per_key = [t.embedding_dim for t in tables for _ in t.feature_names]
        self.tbe = QuantizedTableBatchedEmbeddingBags(
            [(t.num_embeddings, t.embedding_dim, w) for t, w in zip(tables, types)],
            feature_table_map=[i for i, t in enumerate(tables) for _ in t.feature_names], pooling=_pooling(tables),
            output_dtype=output_dtype, row_alignment=row_alignment, bounds_check=bounds_check,
            device=torch.device("cpu") if device is None else device)
        for name in ("weights", "num_skipped"):  # saved as TorchRec saves them: the views below
            self.tbe.register_buffer(name, getattr(self.tbe, name), persistent=False)
        self.embedding_bags = nn.ModuleDict({t.name: nn.Module() for t in tables})
        self._register_table_views()

    def _register_table_views(self):
        """``embedding_bags.<table>.weight``: views of the packed tables (a load writes through them)."""
        for name, view in zip(self.embedding_bags, self.tbe.split_embedding_weights()):
            self.embedding_bags[name].register_buffer("weight", view)

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self._register_table_views()
        return self

    def __setstate__(self, state):
        super().__setstate__(state)  # (a copy's views are copies: made again over the copy's tables)
        self._register_table_views()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # TorchRec keeps INT4 and INT2 rows as its UInt4Tensor / UInt2Tensor (a wrapper of the same uint8 rows,
        # `elem`): loaded as those bytes.
        for name in self.embedding_bags:
            key = f"{prefix}embedding_bags.{name}.weight"
            if isinstance(state_dict.get(key), UIntXTensor):
                state_dict[key] = state_dict[key].elem
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def embedding_bag_configs(self) -> List[EmbeddingBagConfig]:
        return self._embedding_bag_configs

    def is_weighted(self) -> bool:
        return self._is_weighted

    def output_dtype(self) -> torch.dtype:
        return self._output_dtype

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        _check_one_batch_size(features)  # (as torchrec's quantized collection, which reads one batch size)
        features = _ordered_features(features, self._feature_names)
        values = features.values()
        weights = features.weights_or_none() if self._is_weighted else None
        pooled = self.tbe(values, features.offsets().to(values.dtype), weights)
        return KeyedTensor(keys=self._feature_names, length_per_key=self._lengths_per_key, values=pooled)

    @classmethod
    def from_float(cls, module: nn.Module, data_types=None, output_dtype: torch.dtype = torch.float32,
                   row_alignment: int = 16, bounds_check: str = "warn") -> "QuantEmbeddingBagCollection":
        """The quantized collection of a trained one: torchrec's EmbeddingBagCollection or embscale's (its tables,
        features, pooling and weighting), each table quantized to its DataType: ``data_types`` (one for all, or
        one per table), else the dtype of ``module.qconfig``'s weight observer as TorchRec's from_float reads
        it (torch.quint8 or qint8: INT8, quint4x2: INT4, quint2x4: INT2, float16: FP16), else INT8."""
        configs = module.embedding_bag_configs()
        if data_types is None:
            qconfig = getattr(module, "qconfig", None)
            dtype = qconfig.weight().dtype if qconfig is not None else torch.quint8
            if dtype not in _QCONFIG_DTYPES:
                raise ValueError(f"module.qconfig: weight dtype {dtype} is not supported; expected one of "
                                 f"{', '.join(str(d) for d in _QCONFIG_DTYPES)}")
            data_types = _QCONFIG_DTYPES[dtype]
        types = list(data_types) if isinstance(data_types, (list, tuple)) else [data_types] * len(configs)
        if len(types) != len(configs):
            raise ValueError(f"data_types: {len(types)} given for {len(configs)} tables")
        floats = [module.embedding_bags[c.name].weight for c in configs]
        q = cls([dataclasses.replace(c, data_type=d) for c, d in zip(configs, types)], module.is_weighted(),
                device=floats[0].device, output_dtype=output_dtype, row_alignment=row_alignment,
                bounds_check=bounds_check)
        q.tbe.load_float(floats)
        return q


class EmbeddingCollection(_TbeCollection):
    """torchrec's EmbeddingCollection (sequence embeddings: one row per index, nothing pooled) on embscale's
    kernels: ``tables`` (EmbeddingConfig, all of one embedding_dim, as torchrec's), KeyedJaggedTensor in,
    ``Dict[str, JaggedTensor]`` out, per feature its rows ([values of the feature, embedding_dim]) with the
    feature's lengths (and its indices as ``weights()`` with ``need_indices``); a feature of several tables
    comes out once per table, as ``<feature>@<table>``. One TableBatchedEmbeddingBags with pooling "none"
    holds the tables, trained in the backward by its fused optimizer (``optimizer`` and its hyper-parameters
    as TableBatchedEmbeddingBags takes them), exposed as TorchRec's FusedOptimizer. A config without
    feature_names gets its table's name as its one feature, as torchrec's module gives it.

    ``state_dict()`` has ``embeddings.<table>.weight`` (torchrec's keys) and the TableBatchedEmbeddingBags'
    own entries (``tbe.*``: per table its weights and optimizer state, hyper-parameters and step)."""

    _TABLES = "embeddings"

    def __init__(self, tables: List[EmbeddingConfig], device=None, need_indices: bool = False,
                 optimizer: str = "rowwise_adagrad", **optimizer_kwargs):
        super().__init__()
        _check_tables(tables)
        dims = [t.embedding_dim for t in tables]
        if len(set(dims)) > 1:
            raise ValueError(f"tables: embedding_dim {dims} differ; the tables of a sequence collection have one "
                             "embedding_dim (as torchrec's EmbeddingCollection's)")
        for t in tables:
            if not t.feature_names:
                t.feature_names = [t.name]
        self._embedding_configs = list(tables)
        self._need_indices = bool(need_indices)
        self._embedding_names_by_table = get_embedding_names_by_table(tables)
        self._features = [f for t in tables for f in t.feature_names]  # the TBE's features (one per table using it)
        self._embedding_names = [e for names in self._embedding_names_by_table for e in names]
        fmap = [i for i, t in enumerate(tables) for _ in t.feature_names]
        self._build(tables, fmap, "none", device, optimizer, optimizer_kwargs)

    def _configs(self):
        return self._embedding_configs

    def embedding_configs(self) -> List[EmbeddingConfig]:
        return self._embedding_configs

    def embedding_names_by_table(self) -> List[List[str]]:
        return self._embedding_names_by_table

    def embedding_dim(self) -> int:
        return self._embedding_configs[0].embedding_dim

    def need_indices(self) -> bool:
        return self._need_indices

    # TorchRec's sharded collection reads these choices of its output distribution from the module: its defaults.
    def use_gather_select(self) -> bool:
        return False

    def use_gather_select_per_sharding(self) -> Optional[Dict[str, bool]]:
        return None

    def use_sorted_select(self) -> bool:
        return False

    def forward(self, features: KeyedJaggedTensor) -> Dict[str, JaggedTensor]:
        features = self._ordered(features, self._features)
        values = features.values()
        if features.variable_stride_per_key():  # a batch size per feature: its own lengths, as torchrec's module
            strides = features.stride_per_key()
            offsets = _PaddedBatch([[s] for s in strides], features.lengths(), values.dtype).offsets
            lengths = features.lengths().split(strides)
        else:
            offsets = features.offsets().to(values.dtype)
            lengths = features.lengths().view(len(self._features), features.stride())
        rows = self.tbe(values, offsets)
        counts = features.length_per_key()
        return {name: JaggedTensor(values=emb, lengths=lens, weights=ids if self._need_indices else None)
                for name, emb, ids, lens in zip(self._embedding_names, rows.split(counts), values.split(counts),
                                                lengths)}


def _check_one_batch_size(features: KeyedJaggedTensor):
    """For the modules that take one batch size for every feature (the quantized collection, as TorchRec's):
    a KeyedJaggedTensor with a batch size per feature (torchrec's variable batch) is refused by name."""
    if features.variable_stride_per_key():
        raise ValueError(f"features: a batch size per feature (stride_per_key {features.stride_per_key()}) is not "
                         "supported; every feature needs the same batch size")


# ---- a batch size per feature (TorchRec's variable batch, "VBE") ----------------------------------------------
# A TableBatchedEmbeddingBags reads one batch size B for all its features (offsets [T*B+1]). A KeyedJaggedTensor
# whose features have batch sizes of their own (stride_per_key_per_rank: per feature, its bags from each rank) is
# laid into one: each rank's bags take a block of rows as wide as that rank's largest batch, every feature's bags
# at the top of the block and empty bags below (_PaddedBatch). The TBE pools the padded batch and its output
# rows are read back at the real bags' places; the padded bags look nothing up, so they neither change a real
# bag's result (whatever the pooling) nor train anything, and their output gradients are zero.


def _ranges(starts: torch.Tensor, sizes: torch.Tensor, total: int) -> torch.Tensor:
    """The positions start, start + 1, ..., start + size - 1 of each segment, one segment after another
    (``total``: the sum of the sizes, known on the host)."""
    firsts = torch.cumsum(sizes, 0) - sizes
    return (torch.repeat_interleave(starts - firsts, sizes, output_size=total)
            + torch.arange(total, dtype=starts.dtype, device=starts.device))


class _PaddedBatch:
    """A batch with a batch size per feature and rank (``strides[f][r]`` bags of feature f from rank r, the
    features' bags feature-major, each feature's rank by rank, as a KeyedJaggedTensor holds them) laid into one
    batch size for a TableBatchedEmbeddingBags: rank r's bags take rows [starts[r], starts[r] + widths[r]) of
    every feature, widths[r] its largest batch; feature f's s = strides[f][r] bags the first s of them, empty
    bags the rest. ``offsets``: the padded batch's [F * batch_size + 1]."""

    def __init__(self, strides: List[List[int]], lengths: torch.Tensor, dtype: torch.dtype):
        self.strides = strides
        num_features = len(strides)
        ranks = len(strides[0]) if num_features else 0
        self.widths = [max(s[r] for s in strides) for r in range(ranks)]
        self.starts = [sum(self.widths[:r]) for r in range(ranks)]
        self.batch_size = sum(self.widths)
        device = lengths.device
        first = torch.tensor([f * self.batch_size + self.starts[r] for f in range(num_features) for r in range(ranks)],
                             dtype=torch.int64, device=device)
        sizes = torch.tensor([n for s in strides for n in s], dtype=torch.int64, device=device)
        padded = lengths.new_zeros(num_features * self.batch_size)
        padded[_ranges(first, sizes, lengths.numel())] = lengths
        self.offsets = torch.cat([padded.new_zeros(1), torch.cumsum(padded, 0)]).to(dtype)

    def rank_major(self, pooled: torch.Tensor, dims: List[int]) -> torch.Tensor:
        """The real bags' rows of the TBE's output ``pooled`` [batch_size, sum(dims)], laid out as TorchRec's
        variable-batch output distributions take a lookup's output: one flat tensor, rank by rank, in each
        rank's part feature by feature, each feature's bags [strides[f][r], dims[f]] row by row."""
        num_features, ranks = len(self.strides), len(self.widths)
        columns = [sum(dims[:f]) for f in range(num_features)]
        order = [(r, f) for r in range(ranks) for f in range(num_features)]
        device = pooled.device
        rows = [self.strides[f][r] for r, f in order]
        row_sizes = torch.tensor(rows, dtype=torch.int64, device=device)
        first_row = torch.tensor([self.starts[r] for r, _ in order], dtype=torch.int64, device=device)
        at = torch.tensor([columns[f] for _, f in order], dtype=torch.int64, device=device)
        width = torch.tensor([dims[f] for _, f in order], dtype=torch.int64, device=device)
        total_rows = sum(rows)
        tbe_rows = _ranges(first_row, row_sizes, total_rows)  # each output row's row of the padded batch
        row_start = tbe_rows * pooled.shape[1] + torch.repeat_interleave(at, row_sizes, output_size=total_rows)
        row_width = torch.repeat_interleave(width, row_sizes, output_size=total_rows)
        total = sum(n * dims[f] for n, (_, f) in zip(rows, order))
        return pooled.reshape(-1).index_select(0, _ranges(row_start, row_width, total))

    def segments(self, dims: List[int]) -> List[int]:
        """The sizes of rank_major's parts, rank by rank and feature by feature (strides[f][r] * dims[f])."""
        return [self.strides[f][r] * dims[f] for r in range(len(self.widths)) for f in range(len(self.strides))]


def _inverse_rows(inverse, names: List[str], strides: List[int]) -> torch.Tensor:
    """Per feature of ``names`` (its batch size ``strides``), its row of a KeyedJaggedTensor's inverse_indices
    ``inverse`` (``(keys, [keys, batch size] tensor)``: for each sample of the batch, which of the feature's bags it
    takes), as int64 [features, batch size]. ValueError naming ``features.inverse_indices()`` where they do not fit:
    another shape, a feature missing, an index outside its feature's bags (read on the host only where they are
    there; on a device, an asynchronous assertion)."""
    keys, table = inverse
    if (not isinstance(table, torch.Tensor) or table.dim() != 2 or table.shape[0] != len(keys)
            or table.dtype.is_floating_point or table.dtype == torch.bool or table.is_complex()):
        shape = tuple(table.shape) if isinstance(table, torch.Tensor) else type(table).__name__
        dtype = getattr(table, "dtype", None)
        raise ValueError(f"features.inverse_indices(): {shape} ({dtype}) for keys {list(keys)}; expected an integer "
                         f"tensor [{len(keys)} keys, batch size]")
    missing = [n for n in dict.fromkeys(names) if n not in keys]
    if missing:
        raise ValueError(f"features.inverse_indices(): keys {list(keys)} lack {missing}")
    keys = list(keys)
    rows = table.index_select(0, torch.tensor([keys.index(n) for n in names], device=table.device)).long()
    if rows.numel():
        bound = torch.tensor(strides, dtype=torch.int64, device=rows.device)[:, None]
        bad = (rows < 0) | (rows >= bound)
        if rows.device.type == "cpu":
            if bad.any():
                f, b = (int(i) for i in bad.nonzero()[0])
                raise ValueError(f"features.inverse_indices(): feature {names[f]!r} has {strides[f]} bags, but sample "
                                 f"{b} takes bag {int(rows[f, b])}")
        else:
            torch._assert_async(~bad.any(), "features.inverse_indices(): an index outside its feature's bags")
    return rows


def _check_variable_batch(features: KeyedJaggedTensor, names: List[str]) -> None:
    """A variable batch (a batch size per feature) for TorchRec's sharded collection: its inverse_indices must be
    there (TorchRec's output distribution expands every feature's bags to the batch by them) and fit
    (_inverse_rows); ValueError naming ``features`` otherwise."""
    if features.inverse_indices_or_none() is None:
        raise ValueError(f"features: a batch size per feature (stride_per_key {features.stride_per_key()}) needs "
                         "inverse_indices (KeyedJaggedTensor(..., inverse_indices=(keys, [keys, batch size] "
                         "tensor))), by which each feature's bags are expanded to the batch")
    per_key = dict(zip(features.keys(), features.stride_per_key()))
    missing = [n for n in dict.fromkeys(names) if n not in per_key]
    if missing:
        raise ValueError(f"features: keys {features.keys()} lack {missing}")
    _inverse_rows(features.inverse_indices(), names, [per_key[n] for n in names])


def _cache_settings(tables, placements) -> Dict[str, Any]:
    """cache_load_factor and cache_algorithm of a shard group's TableBatchedEmbeddingBags, from its cached
    tables' fused params, where TorchRec puts a plan's ParameterSharding.cache_params (over the sharder's
    fused_params). The TBE takes one load factor, as FBGEMM's does: the tables' own, averaged weighted by
    their rows as TorchRec averages them for FBGEMM's TBE; where none is given, TorchRec's planner's default
    (UVM_CACHING_RATIO), which its memory estimate assumed. TorchRec groups tables by their cache
    algorithm, so a group has one (FBGEMM's LRU where none is given). Nothing for a group without a cached
    table."""
    cached = [t for t, p in zip(tables, placements) if p == "cached"]
    if not cached:
        return {}
    given = [(t.fused_params or {}).get("cache_load_factor") for t in cached]
    weighted = [(f, t.num_embeddings) for f, t in zip(given, cached) if f is not None]
    factor = (sum(f * rows for f, rows in weighted) / sum(rows for _, rows in weighted) if weighted
              else UVM_CACHING_RATIO)
    settings: Dict[str, Any] = {"cache_load_factor": factor}
    algorithms = {_fbgemm_names.cache_algorithm(a) for a in ((t.fused_params or {}).get("cache_algorithm")
                                                             for t in cached) if a is not None}
    if len(algorithms) > 1:
        raise ValueError(f"fused_params: cache algorithms {sorted(algorithms)} in one shard group (tables "
                         f"{[t.name for t in cached]}); one TableBatchedEmbeddingBags has one")
    if algorithms:
        settings["cache_algorithm"] = algorithms.pop()
    return settings


class _ShardKernel(BaseEmbedding, FusedOptimizerModule):
    """One TableBatchedEmbeddingBags over a group of local shards: forward(KeyedJaggedTensor of the
    group's features, feature-major) -> [batch, sum of the shards' columns]. A process may hold several
    column shards of one table (column_wise(ranks=[0, 1, 0, 1])): each is a table of the TBE, and the
    table's parameter, state_dict entry and fused optimizer entry cover them all, as TorchRec's kernels'.

    Each table takes the placement its plan's compute kernel gave it (fused_params[_PLACEMENTS_KEY]: "device",
    "host" or "cached"), and the group's TBE the cache settings of its cached tables (_cache_settings). On
    CUDA a group with a table in host memory keeps all its tables in the TBE's host store and trains through
    its row cache; ``prefetch`` plans a batch ahead (TorchRec's prefetch pipeline) and the forward of that
    batch uses the plan."""

    def __init__(self, config: GroupedEmbeddingConfig, pg, device, sharding_type):
        super().__init__()
        self._config = config
        tables = config.embedding_tables
        fused = config.fused_params or {}
        settings = dict(fused.get(_FUSED_KEY, ()))
        if not settings:
            raise ValueError("fused_params: no embscale optimizer settings; shard embscale.torchrec's collections "
                             "with their sharders (EmbeddingBagCollectionSharder, EmbeddingCollectionSharder)")
        placement_of = dict(fused.get(_PLACEMENTS_KEY, ()))
        placements = [placement_of.get(t.name, "device") for t in tables]
        settings.update(_cache_settings(tables, placements))
        fmap = [i for i, t in enumerate(tables) for _ in range(t.num_features())]
        self._sharding_type = sharding_type
        self._pg = pg
        group = pg if sharding_type == ShardingType.DATA_PARALLEL else None
        self.tbe = _tbe.TableBatchedEmbeddingBags([(t.local_rows, t.local_cols, p) for t, p in zip(tables, placements)],
                                                  feature_table_map=fmap, pooling=_KERNEL_POOLING[config.pooling],
                                                  device=device, data_parallel_group=group, **settings)
        # On CUDA, tables in host memory: the module's parameters view the TBE's host store (CPU tensors)
        self.host_tables = self.tbe.weights.device.type == "cpu" and torch.device(device or "cpu").type != "cpu"
        self._prefetched = None  # (the batch's key, indices, offsets) of the batch planned by prefetch()
        self._params = _table_params(self.tbe)  # per local shard
        self._shards: Dict[str, List[int]] = OrderedDict()  # table -> its shards' positions in `tables`
        for i, t in enumerate(tables):
            self._shards.setdefault(t.name, []).append(i)
        self._tables = OrderedDict((name, self._stacked(shards)) for name, shards in self._shards.items())
        self._optim = self._fused_optimizer()
        _mark_trained_in_backward(self._tables.values(), self._optim)

    def _stacked(self, shards: List[int]) -> nn.Parameter:
        """One Parameter over a table's local shards: the shard itself, or several column shards stacked
        on their rows ([shards * rows, columns]), as TorchRec's kernels register such a table (its
        load_state_dict copies the ShardedTensor's local shards into that parameter in that order). They
        are consecutive tables of the TBE, so consecutive in its buffer."""
        if len(shards) == 1:
            return self._params[shards[0]]
        views = [self._params[i] for i in shards]
        cols = {v.shape[1] for v in views}
        name = self._config.embedding_tables[shards[0]].name
        consecutive = all(b.storage_offset() == a.storage_offset() + a.numel() for a, b in zip(views, views[1:]))
        if len(cols) != 1 or not consecutive:
            raise ValueError(f"table {name!r}: its {len(shards)} shards on this process "
                             f"({[tuple(v.shape) for v in views]}) are not consecutive shards of one width")
        start = views[0].storage_offset() - self.tbe.weights.storage_offset()
        flat = self.tbe.weights.data.view(-1)[start:start + sum(v.numel() for v in views)]
        return nn.Parameter(flat.view(-1, cols.pop()), requires_grad=False)

    def _fused_optimizer(self) -> EmbscaleFusedOptimizer:
        """Per table ``<table>.weight`` and its state under TorchRec's keys (``_state_entries``). Sharded
        tables (not data-parallel ones) are ShardedTensors over the local shards, their state laid out as
        TorchRec's FUSED kernels lay it out (``_state_layout``), so that a checkpoint reshards and moves
        between TorchRec's kernels and embscale's (torch.distributed.checkpoint)."""
        tables = self._config.embedding_tables
        shard_states = self.tbe.optimizer_state()
        params, state = {}, {}
        for name, shards in self._shards.items():
            whole = tables[shards[0]].global_metadata
            if self._sharding_type == ShardingType.DATA_PARALLEL or whole is None:
                weight, entries = self._tables[name], shard_states[shards[0]]
            else:
                meta = copy.deepcopy(whole)
                meta.tensor_properties = TensorProperties(dtype=self.tbe.weights.dtype)
                weight = _sharded([(self._params[i].detach(), tables[i].local_metadata) for i in shards], meta,
                                  self._pg)
                entries = {}
                for key, first in shard_states[shards[0]].items():
                    layout, place = _state_layout(first, whole)
                    local = [(shard_states[i][key], place[(tuple(tables[i].local_metadata.shard_offsets),
                                                           tuple(tables[i].local_metadata.shard_sizes))])
                             for i in shards]
                    entries[key] = _sharded(local, layout, self._pg)
            params[f"{name}.weight"] = weight
            state[weight] = _state_entries(name, entries)
        return EmbscaleFusedOptimizer(self.tbe, params, state)

    @property
    def config(self) -> GroupedEmbeddingConfig:
        return self._config

    def reset_parameters(self, table_configs: Optional[Dict[str, EmbeddingBagConfig]] = None):
        """The tables drawn again and the optimizer state zeroed (TableBatchedEmbeddingBags.reset_parameters),
        each local shard then drawn by its table's init_fn (table_configs: name -> the collection's config;
        None: the library's default draw only),
        as TorchRec's kernels are; data-parallel replicas then take the first process's tables, so that
        they start equal (each process draws its own). Nothing on the meta device."""
        if self.tbe.weights.is_meta:
            return
        self.tbe.reset_parameters()
        with torch.no_grad():
            for t, p in zip(self._config.embedding_tables, self._params):
                init_fn = table_configs[t.name].init_fn if table_configs is not None else None
                if init_fn is not None:
                    init_fn(p)
            if (self._sharding_type == ShardingType.DATA_PARALLEL and self._pg is not None and dist.is_initialized()
                    and dist.get_world_size(self._pg) > 1):
                dist.broadcast(self.tbe.weights, src=dist.get_global_rank(self._pg, 0), group=self._pg)
        self.reload_cache()

    @property
    def sharding_type(self) -> ShardingType:
        return self._sharding_type

    def pool_sums(self) -> None:
        """Pools SUM whatever the tables' pooling: the collection divides by the bags' lengths after the
        output distribution (ShardedEmbeddingBagCollection._create_lookups says when)."""
        self.tbe.pooling = "sum"

    @property
    def params(self) -> List[nn.Parameter]:
        """Per local shard, its rows in the module's tables (views)."""
        return self._params

    @property
    def fused_optimizer(self) -> FusedOptimizer:
        return self._optim

    @staticmethod
    def _lookup_args(features: KeyedJaggedTensor):
        """The TBE's indices and offsets of a batch, and for a batch size per feature and rank (TorchRec's
        variable batch, after its input distribution) the padded batch they are of (else None)."""
        values = features.values()
        if features.variable_stride_per_key():
            padded = _PaddedBatch(features.stride_per_key_per_rank(), features.lengths(), values.dtype)
            return values, padded.offsets, padded
        return values, features.offsets().to(values.dtype), None

    @staticmethod
    def _batch_key(features: KeyedJaggedTensor):
        """What identifies a batch between its prefetch and its forward: its values and lengths (or offsets)
        tensors by storage, version and size, and its batch size. TorchRec's lookup splits the batch into
        the shard groups' parts again for the forward (new KeyedJaggedTensors viewing the same tensors, whose
        offsets it computes again); nothing is read from the device."""
        lengths = features.lengths_or_none()
        parts = [features.values(), lengths if lengths is not None else features.offsets_or_none()]
        batch = (tuple(map(tuple, features.stride_per_key_per_rank())) if features.variable_stride_per_key()
                 else features.stride())
        return (batch,) + tuple((t.data_ptr(), t._version, t.numel(), t.dtype, t.device)
                                            for t in parts if t is not None)

    def prefetch(self, features: KeyedJaggedTensor, forward_stream=None) -> None:
        """Plans a batch's lookups before its forward, on the current stream (TorchRec's prefetch pipeline
        calls it on its prefetch stream while the previous batch trains): the TBE's prefetch, on CUDA where the
        group has tables in host memory; nothing for tables in device memory or on the CPU. The forward of the
        same batch then passes the TBE the very indices and offsets tensors planned here, by which it finds
        the plan (a forward of another batch drops it). One batch is planned ahead: a second prefetch
        replaces the first, as in the TBE. ``forward_stream``: the tensors made here are kept from reuse
        until the work queued on that stream is done (FBGEMM's argument)."""
        plan = getattr(self.tbe, "prefetch", None)
        if plan is None or all(p == "device" for p in self.tbe.placements):
            return
        indices, offsets, padded = self._lookup_args(features)
        plan(indices, offsets)
        if forward_stream is not None and indices.is_cuda:
            indices.record_stream(forward_stream)
            offsets.record_stream(forward_stream)
        self._prefetched = (self._batch_key(features), indices, offsets, padded)

    def forward(self, features: KeyedJaggedTensor, vbe_output: Optional[torch.Tensor] = None,
                vbe_output_offsets: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The group's pooled rows [batch, sum of the shards' columns] (sequence groups: [lookups, columns]).
        A batch size per feature and rank (TorchRec's variable batch) is looked up as a padded batch
        (_PaddedBatch) and its real bags' rows come back flat, rank by rank, as TorchRec's variable-batch output
        distributions take them; given ``vbe_output`` and ``vbe_output_offsets`` (TorchRec's lookup of several
        groups: per rank, where each of the group's features starts in the lookup's flat output), they are
        written there and the whole returned."""
        prefetched, self._prefetched = self._prefetched, None
        if prefetched is not None and prefetched[0] == self._batch_key(features):
            _, values, offsets, padded = prefetched  # the tensors the TBE planned
            if values.is_cuda:  # made on the prefetch stream: not reused before this stream is done with them
                stream = torch.cuda.current_stream(values.device)
                values.record_stream(stream)
                offsets.record_stream(stream)
        else:
            values, offsets, padded = self._lookup_args(features)
        weights = features.weights_or_none() if self._config.is_weighted else None
        out = self.tbe(values, offsets, weights)
        if padded is None or self.tbe.pooling == "none":  # (sequence rows: one per index, padding or not)
            return out
        dims = self.tbe.feature_dims
        out = padded.rank_major(out, dims)
        if vbe_output is None:
            return out
        sizes = torch.tensor(padded.segments(dims), dtype=torch.int64, device=out.device)
        at = _ranges(vbe_output_offsets.to(out.device, torch.int64).reshape(-1), sizes, out.numel())
        return vbe_output.index_copy(0, at, out.to(vbe_output.dtype))

    def copy_from_full_tables(self, full: Dict[str, torch.Tensor]):
        """Fills each local shard from the whole table it is a part of (name -> [rows, dim])."""
        with torch.no_grad():
            for t, w in zip(self._config.embedding_tables, self.tbe.split_embedding_weights()):
                md = t.local_metadata
                r0, c0 = (md.shard_offsets[0], md.shard_offsets[1]) if md is not None else (0, 0)
                w.copy_(full[t.name][r0:r0 + t.local_rows, c0:c0 + t.local_cols])
        self.reload_cache()

    def reload_cache(self) -> None:
        """After the tables were written through their views of the host store (a load, an init): the TBE's
        cache drops its copies (TableBatchedEmbeddingBags.load_cache; nothing without a cache)."""
        load = getattr(self.tbe, "load_cache", None)
        if load is not None:
            load()

    def named_parameters_by_table(self):
        """(table, its parameter over the local shards), which TorchRec registers as the collection's
        ``embedding_bags.<table>.weight``."""
        yield from self._tables.items()

    @property
    def tables(self) -> Dict[str, nn.Parameter]:
        """table -> its parameter over the local shards."""
        return self._tables

    def state_dict(self, destination=None, prefix: str = "", keep_vars: bool = False):
        self.flush()  # tables in host memory: their views current
        destination = {} if destination is None else destination
        for name, p in self._tables.items():
            destination[f"{prefix}{name}.weight"] = p if keep_vars else p.detach()
        return destination

    def named_split_embedding_weights(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        for name, p in self._tables.items():
            yield f"{prefix}{name}.weight", p

    def flush(self) -> None:
        """Tables in host memory: the cache's changed rows written to the host store (TableBatchedEmbeddingBags
        .flush). Tables in device memory are updated in place at every backward: nothing is held back."""
        flush = getattr(self.tbe, "flush", None)
        if flush is not None:
            flush()

    def purge(self) -> None:
        """The cache emptied, its changes written back first (nothing is lost; nothing without a cache)."""
        self.flush()
        self.reload_cache()


class _Lookup(GroupedPooledEmbeddingsLookup):
    """TorchRec's grouped lookup with embscale's kernel for the customized compute kernel."""

    def _create_embedding_kernel(self, config, device, pg, sharding_type, env):
        if config.compute_kernel != EmbeddingComputeKernel.CUSTOMIZED_KERNEL:
            return super()._create_embedding_kernel(config, device, pg, sharding_type, env)
        return _ShardKernel(config, pg, device, sharding_type)

    def prefetch(self, sparse_features: KeyedJaggedTensor, forward_stream=None) -> None:
        """TorchRec's prefetch (ShardedEmbeddingBagCollection.prefetch, from its prefetch pipeline): each
        shard group's part of the batch goes to its kernel's prefetch, which plans it where the group has
        tables in host memory. TorchRec's own lookup asks each table's compute kernel whether to prefetch,
        and sees the customized one."""
        if not self._emb_modules:
            return
        for kernel, features in zip(self._emb_modules, sparse_features.split(self._feature_splits)):
            if isinstance(kernel, _ShardKernel):
                kernel.prefetch(features, forward_stream)


class _TwSharding(TwPooledEmbeddingSharding):
    def create_lookup(self, device=None, fused_params=None, feature_processor=None):
        return _Lookup(grouped_configs=self._grouped_embedding_configs, pg=self._pg,
                       device=device if device is not None else self._device, feature_processor=feature_processor,
                       sharding_type=ShardingType.TABLE_WISE, env=self._env)


class _RwSharding(RwPooledEmbeddingSharding):
    def create_lookup(self, device=None, fused_params=None, feature_processor=None):
        return _Lookup(grouped_configs=self._grouped_embedding_configs, pg=self._pg,
                       device=device if device is not None else self._device, feature_processor=feature_processor,
                       sharding_type=ShardingType.ROW_WISE, env=self._env)


class _CwSharding(CwPooledEmbeddingSharding):
    def create_lookup(self, device=None, fused_params=None, feature_processor=None):
        return _Lookup(grouped_configs=self._grouped_embedding_configs, pg=self._pg,
                       device=device if device is not None else self._device, feature_processor=feature_processor,
                       sharding_type=ShardingType.COLUMN_WISE, env=self._env)


class _DpSharding(DpPooledEmbeddingSharding):
    def create_lookup(self, device=None, fused_params=None, feature_processor=None):
        return _Lookup(grouped_configs=self._grouped_embedding_configs, pg=self._env.process_group,
                       device=device if device is not None else self._device, feature_processor=feature_processor,
                       scale_weight_gradients=False, sharding_type=ShardingType.DATA_PARALLEL, env=self._env)


class _TwRwSharding(TwRwPooledEmbeddingSharding):
    """TorchRec's table-row-wise sharding: each table on the processes of one node (TorchRec's intra-node group,
    LOCAL_WORLD_SIZE processes), its rows cut among them; the lookups of the whole batch bucketized by row and
    sent to the node, the partial pools summed over the node (reduce-scatter) and sent back to their processes
    (all-to-all between nodes). This process's shard groups run embscale's kernels."""

    def create_lookup(self, device=None, fused_params=None, feature_processor=None):
        return _Lookup(grouped_configs=self._grouped_embedding_configs_per_rank[self._rank], pg=self._pg,
                       device=device if device is not None else self._device, feature_processor=feature_processor,
                       sharding_type=ShardingType.TABLE_ROW_WISE, env=self._env)


class _GridSharding(GridPooledEmbeddingSharding):
    """TorchRec's grid sharding: a table cut into column shards, each placed on one node as a table-row-wise
    table is (its rows cut among the node's processes); the outputs of a feature's column shards put side by
    side after the output distribution. TorchRec's lookups of grid shards are table-row-wise ones, as here."""

    def create_lookup(self, device=None, fused_params=None, feature_processor=None):
        return _Lookup(grouped_configs=self._grouped_embedding_configs_per_rank[self._rank], pg=self._pg,
                       device=device if device is not None else self._device, feature_processor=feature_processor,
                       sharding_type=ShardingType.TABLE_ROW_WISE, env=self._env)


class _SequenceLookup(GroupedEmbeddingsLookup):
    """TorchRec's grouped lookup of sequence embeddings (its EmbeddingCollection's) with embscale's kernel for
    the customized compute kernel: a shard group's kernel gives its lookups' rows [lookups, columns], which
    TorchRec flattens, as from its own kernels. TorchRec's sequence lookup is not told its sharding type,
    which embscale's kernel needs (data-parallel tables are replicas): the sharding gives it here."""

    def __init__(self, sharding, sharding_type: ShardingType, pg, device=None):
        self._embscale_sharding_type = sharding_type  # read by _create_embedding_kernel, in TorchRec's __init__
        super().__init__(grouped_configs=sharding._grouped_embedding_configs, pg=pg,
                         device=device if device is not None else sharding._device, env=sharding._env)

    def _create_embedding_kernel(self, config, pg, device, env=None):
        if config.compute_kernel != EmbeddingComputeKernel.CUSTOMIZED_KERNEL:
            return super()._create_embedding_kernel(config, pg, device, env)
        return _ShardKernel(config, pg, device, self._embscale_sharding_type)


class _TwSequenceSharding(TwSequenceEmbeddingSharding):
    def create_lookup(self, device=None, fused_params=None, feature_processor=None):
        return _SequenceLookup(self, ShardingType.TABLE_WISE, self._pg, device)


class _RwSequenceSharding(RwSequenceEmbeddingSharding):
    def create_lookup(self, device=None, fused_params=None, feature_processor=None):
        return _SequenceLookup(self, ShardingType.ROW_WISE, self._pg, device)


class _CwSequenceSharding(CwSequenceEmbeddingSharding):
    def create_lookup(self, device=None, fused_params=None, feature_processor=None):
        return _SequenceLookup(self, ShardingType.COLUMN_WISE, self._pg, device)


class _DpSequenceSharding(DpSequenceEmbeddingSharding):
    def create_lookup(self, device=None, fused_params=None, feature_processor=None):
        return _SequenceLookup(self, ShardingType.DATA_PARALLEL, self._env.process_group, device)


def _unsupported_sharding(sharding_type, collection: str, supported) -> ValueError:
    return ValueError(f"sharding_type: {sharding_type} is not supported by embscale's {collection} (nor by TorchRec's "
                      f"own); expected one of {', '.join(supported)}")


class _ShardedCollection:
    """What embscale's sharded collections add to TorchRec's (mixed in before TorchRec's class): each table's
    local shards as one ShardedTensor in the state (``<_TABLES>.<table>.weight``), tables in host memory
    flushed before a save and their caches reloaded after a load, kept in host memory when the module is moved,
    drawn again kernel by kernel, and no DistributedDataParallel around the data-parallel lookups."""

    _TABLES = ""  # TorchRec's ModuleDict of the tables: "embedding_bags" or "embeddings"
    _TORCHREC_MODULE: Any = None  # the torchrec module whose DistributedDataParallel TorchRec before 1.7 wraps with

    def __init__(self, *args, **kwargs) -> None:
        if hasattr(super(), "init_data_parallel"):
            super().__init__(*args, **kwargs)
            return
        # TorchRec before 1.7 (1.6.1) wraps the data-parallel lookups in DistributedDataParallel inside its
        # __init__, with no init_data_parallel to override: there the lookups get a stand-in that does not
        # reduce, for the reason below.
        ddp = self._TORCHREC_MODULE.DistributedDataParallel
        self._TORCHREC_MODULE.DistributedDataParallel = _NoDdpWrap
        try:
            super().__init__(*args, **kwargs)
        finally:
            self._TORCHREC_MODULE.DistributedDataParallel = ddp

    def init_data_parallel(self) -> None:
        """No DistributedDataParallel around the data-parallel lookups (TorchRec's wrap): embscale's replicated
        tables apply the global batch's update themselves (TableBatchedEmbeddingBags' data_parallel_group), so
        DDP would have nothing to reduce, and it refuses a module without a parameter that requires grad."""

    def _initialize_torch_state(self, skip_registering: bool = False) -> None:
        """TorchRec's module state, and for embscale's tables (which TorchRec leaves to the customized
        kernel) each table's local shards as one ShardedTensor under ``<_TABLES>.<table>.weight``, as
        TorchRec's own kernels give them: ``state_dict()`` then holds every table whole, so
        ``torch.distributed.checkpoint`` saves it and loads it into another plan or world size."""
        if skip_registering:
            super()._initialize_torch_state(skip_registering)
        else:  # (torchrec 1.6.1's sharded EmbeddingCollection takes no argument)
            super()._initialize_torch_state()
        if not hasattr(self, "_embscale_hooks"):  # (TorchRec's lookups are not submodules: no state_dict of theirs)
            self._embscale_hooks = (
                self.register_state_dict_pre_hook(_ShardedCollection._flush_before_save),
                self.register_load_state_dict_post_hook(_ShardedCollection._caches_after_load))
        pg = self._env.process_group
        views = getattr(self, self._TABLES)
        local: Dict[str, List[Tuple[torch.Tensor, ShardMetadata]]] = {}  # (view, the plan's metadata)
        for kernel in self._embscale_kernels():
            if kernel.sharding_type == ShardingType.DATA_PARALLEL:
                continue
            for t, p in zip(kernel.config.embedding_tables, kernel.params):
                # Not a Shard yet: a shard in host memory is placed on the CPU by _sharded (Shard refuses a
                # tensor whose device is not its metadata's).
                local.setdefault(t.name, []).append((p.detach(), t.local_metadata))
        for name, ps in self.module_sharding_plan.items():
            if ps.sharding_type == ShardingType.DATA_PARALLEL.value:
                continue
            rows, cols = self._name_to_table_size[name]
            if not hasattr(views[name], "weight"):  # no shard here: loads an empty tensor
                empty = nn.Parameter(torch.empty(0), requires_grad=False)
                _mark_trained_in_backward([empty], EmptyFusedOptimizer())  # as TorchRec's kernels mark theirs
                views[name].register_parameter("weight", empty)
            dtype = local[name][0][0].dtype if name in local else self._table_name_to_config[name].data_type
            if not isinstance(dtype, torch.dtype):
                dtype = data_type_to_dtype(dtype)
            meta = ps.sharding_spec.build_metadata(tensor_sizes=[rows, cols],
                                                   tensor_properties=TensorProperties(dtype=dtype))
            table = _sharded(local.get(name, []), meta, pg)
            self._model_parallel_name_to_local_shards[name] = table.local_shards()
            self._model_parallel_name_to_shards_wrapper[name] = OrderedDict(local_tensors=[], local_offsets=[])
            self._model_parallel_name_to_sharded_tensor[name] = table

    @staticmethod
    def _flush_before_save(module, prefix, keep_vars):
        """Before state_dict: tables in host memory (on CUDA) made current in the host store, which the
        ShardedTensors view."""
        module.flush()

    def flush(self) -> None:
        """Every shard group's cached rows written to its host store (tables in host memory on CUDA)."""
        for kernel in self._embscale_kernels():
            kernel.flush()

    @staticmethod
    def _caches_after_load(module, incompatible_keys):
        """After load_state_dict wrote the tables through their views of the host store: the caches drop
        their copies (tables in host memory on CUDA; nothing otherwise)."""
        for kernel in module._embscale_kernels():
            kernel.reload_cache()

    def _apply(self, fn, recurse=True):
        """Tables kept in host memory (on CUDA, the shard groups with a "host" or "cached" table) stay there
        when the module is moved, as their TableBatchedEmbeddingBags do: DistributedModelParallel moves the
        whole model to its device when it wraps the dense part in DDP, which would otherwise give
        ``<_TABLES>.<table>.weight`` a device copy in place of its view of the host store."""
        built = getattr(self, "_lookups", None) is not None  # (not while TorchRec's __init__ builds it)
        host = {id(p) for kernel in (self._embscale_kernels() if built else ())
                if kernel.host_tables for p in [*kernel.params, *kernel.tables.values()]}
        held = []
        if self._TABLES in self._modules:
            for view in self._modules[self._TABLES].values():
                w = view._parameters.get("weight")
                if w is not None and id(w) in host:
                    held.append((view, view._parameters.pop("weight")))
        try:
            return super()._apply(fn, recurse)
        finally:
            for view, w in held:
                view._parameters["weight"] = w

    def reset_parameters(self):
        """Each shard group's tables drawn again and its optimizer state zeroed, each local shard drawn by its
        table's init_fn and data-parallel replicas made equal (_ShardKernel.reset_parameters), as TorchRec's
        kernels do; TorchRec's own reset reads tables a process may not hold a shard of."""
        for kernel in self._embscale_kernels():
            kernel.reset_parameters(self._table_name_to_config)

    def _embscale_kernels(self):
        for lookup in self._lookups:
            while isinstance(lookup, nn.parallel.DistributedDataParallel):
                lookup = lookup.module
            for kernel in lookup._emb_modules:
                if isinstance(kernel, _ShardKernel):
                    yield kernel

    def _copy_tables_from(self, module: _TbeCollection) -> None:
        """Every local shard (and replica) filled from the unsharded module's tables; nothing from the meta
        device (the shards were drawn by the configs' init_fn)."""
        if module.device.type == "meta":
            return
        views = module._views()
        full = {n: views[n].weight.detach() for n in views}
        for kernel in self._embscale_kernels():
            kernel.copy_from_full_tables({n: w.to(kernel.tbe.weights.device) for n, w in full.items()})


class ShardedEmbeddingBagCollection(_ShardedCollection, _TorchrecShardedEBC):
    """TorchRec's sharded EmbeddingBagCollection whose shards run embscale's kernels."""

    _TABLES = "embedding_bags"
    _TORCHREC_MODULE = _torchrec_ebc_module

    def input_dist(self, ctx, features):
        """TorchRec's input distribution; a batch size per feature (TorchRec's variable batch) checked first:
        its inverse_indices must be there and fit (ValueError naming ``features``), as TorchRec's output
        distribution expands every feature's bags to the batch by them."""
        if isinstance(features, KeyedJaggedTensor) and features.variable_stride_per_key():
            _check_variable_batch(features, [f for c in self._embedding_bag_configs for f in c.feature_names])
        return super().input_dist(ctx, features)

    @classmethod
    def create_embedding_bag_sharding(cls, sharding_infos, env, device=None, permute_embeddings=False,
                                      qcomm_codecs_registry=None):
        sharding_type = sharding_infos[0].param_sharding.sharding_type
        kw = {"qcomm_codecs_registry": qcomm_codecs_registry}
        if sharding_type == ShardingType.TABLE_WISE.value:
            return _TwSharding(sharding_infos, env, device, **kw)
        if sharding_type == ShardingType.ROW_WISE.value:
            return _RwSharding(sharding_infos, env, device, **kw)
        if sharding_type == ShardingType.COLUMN_WISE.value:
            return _CwSharding(sharding_infos, env, device, permute_embeddings=permute_embeddings, **kw)
        if sharding_type == ShardingType.DATA_PARALLEL.value:
            return _DpSharding(sharding_infos, env, device)
        if sharding_type == ShardingType.TABLE_ROW_WISE.value:
            return _TwRwSharding(sharding_infos, env, device, **kw)
        if sharding_type == ShardingType.GRID_SHARD.value:
            return _GridSharding(sharding_infos, env, device, **kw)
        raise _unsupported_sharding(sharding_type, "EmbeddingBagCollection", _BAG_SHARDING_TYPES)

    def _create_lookups(self) -> None:
        """TorchRec's lookups, whose kernels pool SUM where TorchRec divides by the bags' lengths itself.

        TorchRec cannot pool MEAN inside a row-wise shard (a bag's rows lie on several shards), so where a
        MEAN table is sharded row-wise (or table-row-wise) its kernels pool SUM and, after the output
        distribution, the collection divides the pooled outputs by the bags' lengths plus 1e-6 (its mean-pooling
        callback, ``_create_mean_pooling_divisor`` in torchrec 1.9.2); that division also scales the output
        gradients in the backward. It divides every feature of the collection except those of row-wise SUM
        tables, so with embscale's one pooling for all tables every kernel then pools SUM: a kernel pooling
        MEAN would be divided twice (torchrec 1.9.2's own kernels are, for their table-wise and column-wise
        MEAN tables beside a row-wise one). Without a row-wise MEAN table nothing is divided after, and the
        kernels pool as the tables say.

        A grid-sharded table's rows are cut among a node's processes too, but TorchRec leaves its MEAN features
        out of that callback (its own kernels then add up each row shard's mean); here they join the row-wise
        ones before TorchRec reads the list (its constructor builds the lookups first), so they are pooled SUM
        and divided after as well."""
        mean = PoolingType.MEAN.value
        listed = self._pooling_type_to_rs_features
        for name, ps in self.module_sharding_plan.items():
            config = self._table_name_to_config[name]
            if ps.sharding_type == ShardingType.GRID_SHARD.value and config.pooling.value == mean:
                listed[mean].extend(f for f in config.feature_names if f not in listed[mean])
        super()._create_lookups()
        if mean in listed:  # TorchRec's test for its callback
            for kernel in self._embscale_kernels():
                kernel.pool_sums()


class ShardedEmbeddingCollection(_ShardedCollection, _TorchrecShardedEC):
    """TorchRec's sharded EmbeddingCollection (sequence embeddings) whose shards run embscale's kernels: TorchRec's
    input distribution, sequence output distribution and JaggedTensors per feature, around one
    TableBatchedEmbeddingBags with pooling "none" per shard group. Started from the unsharded module's
    tables (where they are not on the meta device)."""

    _TABLES = "embeddings"
    _TORCHREC_MODULE = _torchrec_ec_module

    def __init__(self, module: EmbeddingCollection, *args, **kwargs) -> None:
        self._embscale_constructing = True
        try:
            super().__init__(module, *args, **kwargs)
        finally:
            self._embscale_constructing = False
        self._copy_tables_from(module)

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        """TorchRec's load, except the one its constructor makes of the unsharded module's whole state_dict
        (strict: embscale's module has its TBE's own entries, ``tbe.*``, beside the tables), which
        ``_copy_tables_from`` does instead: the tables, into every shard and replica."""
        if self._embscale_constructing:
            return _IncompatibleKeys(missing_keys=[], unexpected_keys=[])
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def input_dist(self, ctx, features):
        """TorchRec's input distribution. A batch size per feature (TorchRec's variable batch) TorchRec pads to one
        batch size before it (the kernels see one), and after the output distribution expands each feature's rows
        by the batch's inverse_indices, which must be there and fit (ValueError naming ``features``). On the CPU
        that expansion (fbgemm's permute_1D_sparse_data) has no gradient, so such a batch would train nothing: it
        is refused there while gradients are on (run it under torch.no_grad())."""
        if isinstance(features, KeyedJaggedTensor) and features.variable_stride_per_key():
            _check_variable_batch(features, [f for c in self._embedding_configs for f in c.feature_names])
            if features.device().type == "cpu" and torch.is_grad_enabled():
                raise ValueError("features: a batch size per feature trains nothing in TorchRec's sharded "
                                 "EmbeddingCollection on the CPU (it expands each feature's rows by inverse_indices "
                                 "with fbgemm's permute_1D_sparse_data, which has no gradient there); run such batches "
                                 "under torch.no_grad(), or give every feature one batch size")
        return super().input_dist(ctx, features)

    @classmethod
    def create_embedding_sharding(cls, sharding_type, sharding_infos, env, device=None, qcomm_codecs_registry=None):
        kw = {"qcomm_codecs_registry": qcomm_codecs_registry}
        if sharding_type == ShardingType.TABLE_WISE.value:
            return _TwSequenceSharding(sharding_infos, env, device, **kw)
        if sharding_type == ShardingType.ROW_WISE.value:
            return _RwSequenceSharding(sharding_infos, env, device, **kw)
        if sharding_type == ShardingType.COLUMN_WISE.value:
            return _CwSequenceSharding(sharding_infos, env, device, **kw)
        if sharding_type == ShardingType.DATA_PARALLEL.value:
            return _DpSequenceSharding(sharding_infos, env, device)
        raise _unsupported_sharding(sharding_type, "EmbeddingCollection", _SHARDING_TYPES)


def _check_shards_per_rank(name, ps) -> None:
    """Several shards of one table on one process (column_wise(ranks=[0, 1, 0, 1])) are stacked on their
    rows into one [shards * rows, columns] parameter, as TorchRec stacks them, which needs one width:
    ValueError naming the table and the rank otherwise."""
    if ps.sharding_spec is None:
        return
    widths: Dict[int, List[int]] = {}
    for m in ps.sharding_spec.shards:
        widths.setdefault(m.placement.rank(), []).append(m.shard_sizes[1])
    for rank, ws in widths.items():
        if len(set(ws)) > 1:
            raise ValueError(f"params[{name!r}]: rank {rank} holds {len(ws)} column shards of widths {ws}; the "
                             "shards of one table on one process must have one width (they are stacked on "
                             "their rows, as TorchRec stacks them)")


def _check_shards_have_rows(name, ps) -> None:
    """Every shard of a table needs a row (a TableBatchedEmbeddingBags' tables have at least one): a row-wise
    plan of a table with fewer rows than processes (a table-row-wise or grid one, than the processes of a node,
    or rows that TorchRec's blocks leave none of to the last: 5 rows over 4), which gives some a shard of none,
    is refused by name."""
    if ps.sharding_spec is None:
        return
    sizes = [m.shard_sizes[0] for m in ps.sharding_spec.shards]
    if 0 in sizes:
        raise ValueError(f"params[{name!r}]: shards of {sizes} rows; embscale's shards need at least one row each "
                         "(shard a table of fewer rows than the processes it is cut over table-wise or data-parallel)")


def _node_size(world_size: int) -> int:
    """The processes of a node as TorchRec's table-row-wise and grid shardings read them: the size of its
    intra-node process group where one was made (once a process), else its topology group
    (LOCAL_WORLD_SIZE, or the world where that is unset or does not divide it; torchrec.distributed.comm)."""
    from torchrec.distributed import comm

    made = getattr(comm, "_INTRA_PG", None)
    if made is not None:
        return dist.get_world_size(made)
    return comm.get_topology_group_world_size(world_size)


def _row_blocks(rows: int, node: int) -> List[Tuple[int, int]]:
    """(first row, rows) of each process's shard of a table cut over a node of `node` processes, as TorchRec's
    input distribution bucketizes the lookups (blocks of ceil(rows / node) rows; the last ones shorter or
    empty)."""
    block = -(-rows // node)
    return [(min(i * block, rows), max(0, min(block, rows - i * block))) for i in range(node)]


def _check_node_shards(name, ps, size, world_size: int) -> None:
    """A table-row-wise or grid plan as TorchRec's shardings read it, which they do not check: the rows of a
    table (of each column shard of a grid table) cut over the processes of one node, in TorchRec's blocks
    (_row_blocks), the k-th block on the node's k-th process and listed k-th; the ranks the plan lists are its
    shards' placements (TorchRec places a grid table's shards by the former, a table-row-wise table on the node
    of the first); a grid table's column shards cover its columns side by side. A plan made for another node
    size (a Topology's local_world_size other than LOCAL_WORLD_SIZE) would send lookups to shards that do not
    hold their rows: ValueError naming params[<table>] and the node size."""
    rows, cols = size
    shards = list(ps.sharding_spec.shards) if ps.sharding_spec is not None else []
    node = _node_size(world_size)
    layout = [(list(m.shard_offsets), list(m.shard_sizes)) for m in shards]
    where = f"params[{name!r}]: {ps.sharding_type} shards (offsets, sizes) {layout} on ranks {ps.ranks}"
    placed = [m.placement.rank() if m.placement is not None else None for m in shards]
    if not shards or list(ps.ranks or []) != placed:
        raise ValueError(f"{where}: the ranks must be the shards' placements, in order ({placed})")
    columns: Dict[int, list] = {}  # first column -> the column shard's row shards, in the plan's order
    for m in shards:
        columns.setdefault(m.shard_offsets[1], []).append(m)
    starts = sorted(columns)
    widths = [columns[c0][0].shard_sizes[1] for c0 in starts]
    if ps.sharding_type == ShardingType.TABLE_ROW_WISE.value and any(
            m.shard_offsets[1] != 0 or m.shard_sizes[1] != cols for m in shards):
        raise ValueError(f"{where}: every shard of a table_row_wise table holds all its {cols} columns")
    if (any(m.shard_sizes[1] != w for c0, w in zip(starts, widths) for m in columns[c0])
            or starts != [sum(widths[:k]) for k in range(len(widths))] or sum(widths) != cols):
        raise ValueError(f"{where}: the column shards must cover the table's {cols} columns side by side, each "
                         "cut into row shards of its width")
    for c0 in starts:
        first = columns[c0][0].placement.rank() // node * node  # the node's first rank
        want = [(r0, n, first + k) for k, (r0, n) in enumerate(_row_blocks(rows, node))]
        got = [(m.shard_offsets[0], m.shard_sizes[0], m.placement.rank()) for m in columns[c0]]
        if got != want:
            part = "the table" if len(starts) == 1 else f"the column shard at column {c0}"
            raise ValueError(f"{where}: TorchRec cuts {part} over a node of {node} processes (LOCAL_WORLD_SIZE; "
                             f"world of {world_size}) into (first row, rows, rank) {want}; the plan has {got} "
                             "(made for another node size?)")


def _plan_kernel(ps) -> str:
    """The compute kernel the plan names for a table: shard() replaces it by the customized one and records
    it on the ParameterSharding, so a plan sharded once is read as it was written when it is used again."""
    if ps.compute_kernel == EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value:
        return getattr(ps, _PLAN_KERNEL, ps.compute_kernel)
    return ps.compute_kernel


def _table_placement(name, ps, dtype) -> str:
    """The placement a table's plan gives it (FUSED: "device", FUSED_UVM: "host", FUSED_UVM_CACHING: "cached";
    a data-parallel table, DENSE or FUSED: "device"; embscale's customized kernel named directly: "device"),
    its cache_params checked. ValueError naming params[<table>] for a kernel embscale does not serve."""
    kernel = _plan_kernel(ps)
    if kernel == EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value:
        return "device"
    if ps.sharding_type == ShardingType.DATA_PARALLEL.value:
        if kernel not in _DATA_PARALLEL_KERNELS:
            raise ValueError(f"params[{name!r}]: compute_kernel {kernel} is not served by embscale for a data_parallel "
                             f"table (a replica in device memory); it takes {' or '.join(_DATA_PARALLEL_KERNELS)}")
        return "device"
    if kernel not in _KERNEL_PLACEMENT:
        raise ValueError(f"params[{name!r}]: compute_kernel {kernel} is not served by embscale; it takes fused (the "
                         "table in device memory), fused_uvm (in host memory) and fused_uvm_caching (in host memory, "
                         f"rows cached in device memory) for {ps.sharding_type} tables, and "
                         f"{' or '.join(_DATA_PARALLEL_KERNELS)} for data_parallel ones")
    placement = _KERNEL_PLACEMENT[kernel]
    cache = ps.cache_params
    if placement == "cached" and cache is not None:
        if cache.load_factor is not None and not 0.0 < cache.load_factor <= 1.0:
            raise ValueError(f"params[{name!r}].cache_params.load_factor: {cache.load_factor!r}; expected the share of "
                             "the table's rows its cache holds, in (0, 1]")
        if cache.algorithm is not None:
            try:
                _fbgemm_names.cache_algorithm(cache.algorithm)
            except ValueError:
                raise ValueError(f"params[{name!r}].cache_params.algorithm: {cache.algorithm!r} is not FBGEMM's "
                                 "CacheAlgorithm.LRU or LFU") from None
        if cache.precision is not None and data_type_to_dtype(cache.precision) != dtype:
            raise ValueError(f"params[{name!r}].cache_params.precision: {cache.precision}; embscale's cache holds the "
                             f"table's rows in the table's own precision ({str(dtype).replace('torch.', '')}): leave "
                             "it None or give the table's data_type")
    return placement


def _check_column_widths(params) -> None:
    """TorchRec's sharded EmbeddingCollection reads every column shard's output with one width (its first
    column-wise shard's), so a plan cutting the tables into column shards of several widths would be misread:
    ValueError naming the tables and their widths."""
    widths = {name: sorted({m.shard_sizes[1] for m in ps.sharding_spec.shards}) for name, ps in params.items()
              if ps.sharding_type == ShardingType.COLUMN_WISE.value and ps.sharding_spec is not None}
    if len({w for ws in widths.values() for w in ws}) > 1:
        raise ValueError(f"params: column shards of widths {widths}; the column-wise tables of an EmbeddingCollection "
                         "must be cut into shards of one width (TorchRec's sequence output distribution reads them "
                         "with one)")


class _Sharder:
    """What embscale's sharders share (mixed in before TorchRec's sharder): the plan checked, every table's kernel
    made embscale's (the plan's kernel giving its placement), the kernels offered to TorchRec's planner."""

    def _check_plan(self, params) -> None:
        """Checks of one collection's own (ValueError naming the plan's entry)."""

    _SHARDING_TYPES: Tuple[str, ...] = _SHARDING_TYPES  # those of the collection's TorchRec counterpart

    def _embscale_fused_params(self, module, params, env=None) -> Dict[str, Any]:
        """The fused_params that carry the module's optimizer settings and each table's placement to its shards;
        the plan's compute kernels replaced by the customized one, once the whole plan is checked (a refused plan
        is left as it was). ``env`` (TorchRec's ShardingEnv) gives the world size against which table-row-wise
        and grid plans are checked (else the default process group's, where there is one)."""
        if not isinstance(module, self.module_type):
            raise TypeError(f"module: {type(module).__name__} is not embscale.torchrec.{self.module_type.__name__}")
        dtype = module._optimizer_settings["weights_dtype"]
        sizes = {c.name: (c.num_embeddings, c.embedding_dim) for c in module._configs()}
        world = env.world_size if env is not None else dist.get_world_size() if dist.is_initialized() else None
        placements = {}
        for name, ps in params.items():
            if ps.sharding_type not in self._SHARDING_TYPES:
                raise ValueError(f"params[{name!r}]: sharding_type {ps.sharding_type} is not supported by embscale's "
                                 f"{self.module_type.__name__} (nor by TorchRec's own); expected one of "
                                 f"{', '.join(self._SHARDING_TYPES)}")
            if ps.sharding_type in _NODE_SHARDING_TYPES and world is not None and name in sizes:
                _check_node_shards(name, ps, sizes[name], world)
            _check_shards_per_rank(name, ps)
            _check_shards_have_rows(name, ps)
            placements[name] = _table_placement(name, ps, dtype)
        self._check_plan(params)
        for ps in params.values():
            setattr(ps, _PLAN_KERNEL, _plan_kernel(ps))
            ps.compute_kernel = EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value
        fused = dict(self.fused_params or {})
        fused[_FUSED_KEY] = tuple(sorted(module._optimizer_settings.items()))
        fused[_PLACEMENTS_KEY] = tuple(sorted(placements.items()))
        return fused

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> List[str]:
        """The kernels TorchRec's planner may choose, as TorchRec's own sharder offers them, those embscale
        serves: DENSE for data-parallel tables; FUSED, and on CUDA FUSED_UVM and FUSED_UVM_CACHING, for the
        others."""
        if sharding_type == ShardingType.DATA_PARALLEL.value:
            return [EmbeddingComputeKernel.DENSE.value]
        kernels = [EmbeddingComputeKernel.FUSED.value]
        if compute_device_type == "cuda":
            kernels += [EmbeddingComputeKernel.FUSED_UVM.value, EmbeddingComputeKernel.FUSED_UVM_CACHING.value]
        return kernels

    def sharding_types(self, compute_device_type: str) -> List[str]:
        """The sharding types TorchRec's planner may choose: those of TorchRec's sharder of the same collection
        (on every device: embscale's kernels serve them on the CPU too)."""
        return list(self._SHARDING_TYPES)


class EmbeddingBagCollectionSharder(_Sharder, _TorchrecSharder):
    """Shards embscale.torchrec.EmbeddingBagCollection: table-wise, row-wise, column-wise, table-row-wise, grid
    or data-parallel, each shard group a TableBatchedEmbeddingBags with the module's optimizer settings,
    started from the module's tables (where they are not on the meta device). Table-row-wise and grid plans
    must be made for the node size TorchRec reads (LOCAL_WORLD_SIZE; ``params`` naming it otherwise).

    The plan's compute kernel gives each table its placement: FUSED "device", FUSED_UVM "host" and
    FUSED_UVM_CACHING "cached" (data-parallel tables, DENSE or FUSED, "device"); a cached table's cache
    follows the plan's cache_params (load_factor, algorithm) or the sharder's ``fused_params``
    (``cache_load_factor``, ``cache_algorithm``), as TorchRec passes them to FBGEMM. ``compute_kernels()``
    offers TorchRec's planner the kernels of TorchRec's own sharder that embscale serves, so on a CUDA
    topology whose device memory cannot hold the tables it plans FUSED_UVM_CACHING or FUSED_UVM."""

    _SHARDING_TYPES = _BAG_SHARDING_TYPES

    def shard(self, module: EmbeddingBagCollection, params, env, device=None, module_fqn=None):
        fused = self._embscale_fused_params(module, params, env)
        sharded = ShardedEmbeddingBagCollection(module=module, table_name_to_parameter_sharding=params, env=env,
                                                fused_params=fused, device=device,
                                                qcomm_codecs_registry=self.qcomm_codecs_registry,
                                                module_fqn=module_fqn,
                                                sharded_module_order_overwrite=self._sharded_module_order_overwrite)
        sharded._copy_tables_from(module)
        return sharded

    @property
    def module_type(self):
        return EmbeddingBagCollection

    @property
    def sharded_module_type(self):
        return ShardedEmbeddingBagCollection


class EmbeddingCollectionSharder(_Sharder, _TorchrecECSharder):
    """Shards embscale.torchrec.EmbeddingCollection (sequence embeddings) as EmbeddingBagCollectionSharder shards
    the bag collection: table-wise, row-wise, column-wise or data-parallel, every shard group a
    TableBatchedEmbeddingBags with pooling "none" and the module's optimizer settings, started from the
    module's tables, the plan's kernel giving each table its placement. Column-wise tables are cut into shards
    of one width, as TorchRec's sequence sharding needs (``params`` naming the widths otherwise)."""

    def _check_plan(self, params) -> None:
        _check_column_widths(params)

    def shard(self, module: EmbeddingCollection, params, env, device=None, module_fqn=None):
        fused = self._embscale_fused_params(module, params, env)
        return ShardedEmbeddingCollection(module, params, env, fused, device,
                                          qcomm_codecs_registry=self.qcomm_codecs_registry,
                                          use_index_dedup=self._use_index_dedup, module_fqn=module_fqn)

    @property
    def module_type(self):
        return EmbeddingCollection

    @property
    def sharded_module_type(self):
        return ShardedEmbeddingCollection


# TorchRec's planner with embscale's own estimates (python/embscale/_planner.py; it imports this module's classes).
from ._planner import (EmbscalePerfEstimator, EmbscaleStorageEstimator, embscale_enumerator,  # noqa: E402,F401
                       embscale_estimators)
