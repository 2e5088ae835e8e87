"""embscale's kernels under TorchRec: an EmbeddingBagCollection trained by embscale's fused optimizer, and
a sharder that plugs embscale in as TorchRec's customized compute kernel.

    from embscale.torchrec import EmbeddingBagCollection, EmbeddingBagCollectionSharder
    ebc = EmbeddingBagCollection(tables, optimizer="rowwise_adagrad", learning_rate=0.05)  # the one changed line
    model = DistributedModelParallel(Dlrm(ebc), sharders=[EmbeddingBagCollectionSharder()], plan=plan)
    opt = CombinedOptimizer([model.fused_optimizer, KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(model.named_parameters())), lambda p: torch.optim.Adam(p))])

The module takes a KeyedJaggedTensor and returns a KeyedTensor like torchrec's EmbeddingBagCollection,
from one TableBatchedEmbeddingBags over all its tables. Sharded (table-wise, row-wise, column-wise or
data-parallel), every shard group on a process is one TableBatchedEmbeddingBags over the local shards;
TorchRec's planner, input and output distributions and all-to-alls are used as they are. The plan may
name the FUSED kernel (TorchRec's planner does not estimate a customized one) or DENSE for data-parallel
tables: the sharder makes every table's kernel the customized one, embscale's. A process may hold several
column shards of one table (column_wise(ranks=[0, 1, 0, 1])), of one width.

Training matches one process with the global batch (the processes' batches side by side in rank order):
TorchRec lays each shard's lookups out in that order, so each row's gradient is summed as there; the
output gradients come back divided by the world size (TorchRec's gradient division, as DDP averages the
dense gradients). A column-wise shard keeps its own row-wise optimizer state (of its columns), as
TorchRec's kernels do. Data-parallel tables are replicas: each backward applies the global batch's update
(TableBatchedEmbeddingBags' data_parallel_group). MEAN pooling is TorchRec's: where a row-wise table is in
the collection, the kernels pool SUM and TorchRec divides the outputs by the bags' lengths (plus 1e-6)
after its output distribution, as for its own kernels (ShardedEmbeddingBagCollection._create_lookups).

State is laid out as TorchRec's FUSED kernels lay theirs, so a checkpoint moves between them: sharded tables
and their optimizer state appear in ``state_dict()`` and ``fused_optimizer.state_dict()`` as ShardedTensors
over the local shards, the state under ``<table>.momentum1`` (row-wise Adagrad's sum, Adam's exp_avg; a
second buffer under its FBGEMM name), a column-wise table's row-wise state [column shards * rows]. So
torch.distributed.checkpoint saves them and loads them into another plan, world size, or TorchRec's own
kernels, and back. The tables are tagged as trained in the backward (``_in_backward_optimizers``), so
TorchRec's usual CombinedOptimizer setup above leaves them to the fused optimizer.

Needs torchrec (with fbgemm_gpu): ``pip install .[torchrec]``.
"""

import copy
from collections import OrderedDict
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed._shard.metadata import ShardMetadata
from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor, ShardedTensorMetadata, TensorProperties
from torchrec.distributed.embedding_lookup import GroupedPooledEmbeddingsLookup
from torchrec.distributed.embedding_kernel import BaseEmbedding
from torchrec.distributed.embedding_types import EmbeddingComputeKernel, GroupedEmbeddingConfig
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder as _TorchrecSharder
from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection as _TorchrecShardedEBC
from torchrec.distributed.sharding.cw_sharding import CwPooledEmbeddingSharding
from torchrec.distributed.sharding.dp_sharding import DpPooledEmbeddingSharding
from torchrec.distributed.sharding.rw_sharding import RwPooledEmbeddingSharding
from torchrec.distributed.sharding.tw_sharding import TwPooledEmbeddingSharding
from torchrec.distributed.types import ShardingType
from torchrec.modules.embedding_configs import data_type_to_dtype
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.optim.fused import EmptyFusedOptimizer, FusedOptimizer, FusedOptimizerModule
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from . import tbe as _tbe

_POOLING = {PoolingType.SUM: "sum", PoolingType.MEAN: "mean"}
_FUSED_KEY = "embscale"  # the fused_params entry that carries the module's optimizer settings to its shards
_SHARDING_TYPES = (ShardingType.TABLE_WISE.value, ShardingType.ROW_WISE.value, ShardingType.COLUMN_WISE.value,
                   ShardingType.DATA_PARALLEL.value)


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
    over them where the table is sharded), updated in the backward. ``step()`` applies a learning rate set in
    ``param_groups`` to the module; the update itself happens in the backward."""

    def __init__(self, tbe: _tbe.TableBatchedEmbeddingBags, params: Dict[str, torch.Tensor],
                 state: Dict[torch.Tensor, Dict[str, torch.Tensor]]):
        self._tbe = tbe
        group = {"params": list(params.values()), "lr": tbe.learning_rate, "optimizer": tbe.optimizer}
        super().__init__(params, state, [group])

    def step(self, closure: Any = None) -> None:
        self._tbe.set_learning_rate(self.param_groups[0]["lr"])

    def zero_grad(self, set_to_none: bool = False) -> None:
        pass


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
    table's rows, except in a table cut into column shards, each of which keeps its own row-wise state (of
    its columns): then it is [shards * rows], the k-th column shard from the left at [k * rows, (k+1) * rows).
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
        by_column = sorted(shards, key=lambda m: m.shard_offsets[1])
        placed = [(m, ShardMetadata([k * rows], [rows], m.placement)) for k, m in enumerate(by_column)]
        size = rows * len(shards)
    place = {(tuple(m.shard_offsets), tuple(m.shard_sizes)): sm for m, sm in placed}
    meta = ShardedTensorMetadata(shards_metadata=[sm for _, sm in placed], size=torch.Size([size]),
                                 tensor_properties=props)
    return meta, place


def _sharded(locals_, metadata: ShardedTensorMetadata, pg) -> ShardedTensor:
    """A ShardedTensor over this process's shards (tensor, ShardMetadata); the tensors are views, so reads
    and writes go to the module's buffers."""
    return ShardedTensor._init_from_local_shards_and_global_metadata(
        local_shards=[Shard(tensor=t, metadata=m) for t, m in locals_], sharded_tensor_metadata=metadata,
        process_group=pg)


class EmbeddingBagCollection(nn.Module, FusedOptimizerModule):
    """torchrec's EmbeddingBagCollection on embscale's kernels: ``tables`` (EmbeddingBagConfig, all of one
    pooling, SUM or MEAN), KeyedJaggedTensor in, KeyedTensor (the features' pooled rows side by side, in
    the tables' order) out; the tables are trained in the backward by the fused optimizer (``optimizer``
    and its hyper-parameters as TableBatchedEmbeddingBags takes them), exposed as TorchRec's FusedOptimizer.

    ``state_dict()`` has ``embedding_bags.<table>.weight`` (torchrec's keys) and the TableBatchedEmbeddingBags'
    own entries (``tbe.*``: per table its weights and optimizer state, hyper-parameters and step)."""

    def __init__(self, tables: List[EmbeddingBagConfig], is_weighted: bool = False, device=None,
                 optimizer: str = "rowwise_adagrad", **optimizer_kwargs):
        super().__init__()
        if not tables:
            raise ValueError("tables: at least one EmbeddingBagConfig is needed")
        names = [t.name for t in tables]
        if len(set(names)) != len(names):
            raise ValueError(f"tables: names {names} are not unique")
        self._embedding_bag_configs = list(tables)
        self._is_weighted = bool(is_weighted)
        self._feature_names = [f for t in tables for f in t.feature_names]
        if len(set(self._feature_names)) != len(self._feature_names):
            raise ValueError(f"tables: feature names {self._feature_names} are not unique")
        self._optimizer_settings = {"optimizer": optimizer, **optimizer_kwargs,
                                    "weights_dtype": _weights_dtype(tables, optimizer_kwargs)}
        fmap = [i for i, t in enumerate(tables) for _ in t.feature_names]
        # the tables' own names key the TableBatchedEmbeddingBags' state too (tbe.<table>.weight, ...) where
        # they can (a state_dict key part has no ".")
        self.tbe = _tbe.TableBatchedEmbeddingBags([(t.num_embeddings, t.embedding_dim) for t in tables],
                                                  feature_table_map=fmap, pooling=_pooling(tables), device=device,
                                                  table_names=None if any("." in n for n in names) else names,
                                                  **self._optimizer_settings)
        self._lengths_per_key = [t.embedding_dim for t in tables for _ in t.feature_names]
        self.embedding_bags = nn.ModuleDict({n: nn.Module() for n in names})
        self._register_table_views()
        self.reset_parameters()
        self.register_load_state_dict_post_hook(EmbeddingBagCollection._tables_after_load)

    @staticmethod
    def _tables_after_load(module, incompatible_keys):
        """After load_state_dict: with assign=True torch installs the checkpoint's own tensors as
        ``embedding_bags.<table>.weight``, which are then no views of the module's tables (training would
        leave them stale, and the fused optimizer would keep the old views). Their values are copied into
        the tables (a module on the meta device is made on their device first) and the views are made
        again. Without assign the views were written through and stay."""
        self = module
        replaced = False
        for t, (name, view) in enumerate(zip(self.embedding_bags, self.tbe.split_embedding_weights())):
            loaded = self.embedding_bags[name].weight
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
        with torch.no_grad():
            for config in self._embedding_bag_configs:
                if config.init_fn is not None:
                    config.init_fn(self.embedding_bags[config.name].weight)

    def _register_table_views(self):
        """``embedding_bags.<table>.weight`` as views of the module's tables, and the fused optimizer over
        them, keyed as the module's state_dict keys them (as TorchRec's sharded collection keys its fused
        optimizer); the views and the module's tables tagged as trained in the backward."""
        params = _table_params(self.tbe)
        for name, p in zip(self.embedding_bags, params):
            self.embedding_bags[name].weight = p
        keyed = {f"embedding_bags.{name}.weight": p for name, p in zip(self.embedding_bags, params)}
        state = {p: _state_entries(name, s) for name, p, s in zip(self.embedding_bags, params,
                                                                   self.tbe.optimizer_state())}
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

    def embedding_bag_configs(self) -> List[EmbeddingBagConfig]:
        return self._embedding_bag_configs

    def is_weighted(self) -> bool:
        return self._is_weighted

    @property
    def device(self) -> torch.device:
        return self.tbe.weights.device

    @property
    def fused_optimizer(self) -> FusedOptimizer:
        return self._optim

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        _check_one_batch_size(features)
        missing = [f for f in self._feature_names if f not in features.keys()]
        if missing:
            raise ValueError(f"features: keys {features.keys()} lack {missing}")
        if features.keys() != self._feature_names:
            features = features.permute([features.keys().index(f) for f in self._feature_names])
        values = features.values()
        weights = features.weights_or_none() if self._is_weighted else None
        pooled = self.tbe(values, features.offsets().to(values.dtype), weights)
        return KeyedTensor(keys=self._feature_names, length_per_key=self._lengths_per_key, values=pooled)


def _check_one_batch_size(features: KeyedJaggedTensor):
    """The TBE reads one batch size for every feature (offsets [T*B+1]); a KeyedJaggedTensor with a batch
    size per feature (torchrec's variable batch) would be misread, so it is refused."""
    if features.variable_stride_per_key():
        raise ValueError(f"features: a batch size per feature (stride_per_key {features.stride_per_key()}) is not "
                         "supported; every feature needs the same batch size")


class _ShardKernel(BaseEmbedding, FusedOptimizerModule):
    """One TableBatchedEmbeddingBags over a group of local shards: forward(KeyedJaggedTensor of the
    group's features, feature-major) -> [batch, sum of the shards' columns]. A process may hold several
    column shards of one table (column_wise(ranks=[0, 1, 0, 1])): each is a table of the TBE, and the
    table's parameter, state_dict entry and fused optimizer entry cover them all, as TorchRec's kernels'."""

    def __init__(self, config: GroupedEmbeddingConfig, pg, device, sharding_type):
        super().__init__()
        self._config = config
        tables = config.embedding_tables
        settings = dict((config.fused_params or {}).get(_FUSED_KEY, ()))
        if not settings:
            raise ValueError("fused_params: no embscale optimizer settings; shard embscale.torchrec's "
                             "EmbeddingBagCollection with embscale.torchrec.EmbeddingBagCollectionSharder")
        fmap = [i for i, t in enumerate(tables) for _ in range(t.num_features())]
        self._sharding_type = sharding_type
        self._pg = pg
        group = pg if sharding_type == ShardingType.DATA_PARALLEL else None
        self.tbe = _tbe.TableBatchedEmbeddingBags([(t.local_rows, t.local_cols) for t in tables],
                                                  feature_table_map=fmap, pooling=_POOLING[config.pooling],
                                                  device=device, data_parallel_group=group, **settings)
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

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        _check_one_batch_size(features)
        values = features.values()
        weights = features.weights_or_none() if self._config.is_weighted else None
        return self.tbe(values, features.offsets().to(values.dtype), weights)

    def copy_from_full_tables(self, full: Dict[str, torch.Tensor]):
        """Fills each local shard from the whole table it is a part of (name -> [rows, dim])."""
        with torch.no_grad():
            for t, w in zip(self._config.embedding_tables, self.tbe.split_embedding_weights()):
                md = t.local_metadata
                r0, c0 = (md.shard_offsets[0], md.shard_offsets[1]) if md is not None else (0, 0)
                w.copy_(full[t.name][r0:r0 + t.local_rows, c0:c0 + t.local_cols])

    def named_parameters_by_table(self):
        """(table, its parameter over the local shards), which TorchRec registers as the collection's
        ``embedding_bags.<table>.weight``."""
        yield from self._tables.items()

    def state_dict(self, destination=None, prefix: str = "", keep_vars: bool = False):
        destination = {} if destination is None else destination
        for name, p in self._tables.items():
            destination[f"{prefix}{name}.weight"] = p if keep_vars else p.detach()
        return destination

    def named_split_embedding_weights(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        for name, p in self._tables.items():
            yield f"{prefix}{name}.weight", p

    def flush(self) -> None:
        pass  # the tables are updated in place at every backward: nothing is held back

    def purge(self) -> None:
        pass  # no cache


class _Lookup(GroupedPooledEmbeddingsLookup):
    """TorchRec's grouped lookup with embscale's kernel for the customized compute kernel."""

    def _create_embedding_kernel(self, config, device, pg, sharding_type, env):
        if config.compute_kernel != EmbeddingComputeKernel.CUSTOMIZED_KERNEL:
            return super()._create_embedding_kernel(config, device, pg, sharding_type, env)
        return _ShardKernel(config, pg, device, sharding_type)


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


class ShardedEmbeddingBagCollection(_TorchrecShardedEBC):
    """TorchRec's sharded EmbeddingBagCollection whose shards run embscale's kernels."""

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
        raise ValueError(f"sharding_type: {sharding_type} is not supported by embscale; expected one of "
                         f"{', '.join(_SHARDING_TYPES)}")

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
        kernels pool as the tables say."""
        super()._create_lookups()
        if PoolingType.MEAN.value in self._pooling_type_to_rs_features:  # TorchRec's test for its callback
            for kernel in self._embscale_kernels():
                kernel.pool_sums()

    def init_data_parallel(self) -> None:
        """No DistributedDataParallel around the data-parallel lookups (TorchRec's wrap): embscale's replicated
        tables apply the global batch's update themselves (TableBatchedEmbeddingBags' data_parallel_group), so
        DDP would have nothing to reduce, and it refuses a module without a parameter that requires grad."""

    def _initialize_torch_state(self, skip_registering: bool = False) -> None:
        """TorchRec's module state, and for embscale's tables (which TorchRec leaves to the customized
        kernel) each table's local shards as one ShardedTensor under ``embedding_bags.<table>.weight``, as
        TorchRec's own kernels give them: ``state_dict()`` then holds every table whole, so
        ``torch.distributed.checkpoint`` saves it and loads it into another plan or world size."""
        super()._initialize_torch_state(skip_registering)
        pg = self._env.process_group
        local: Dict[str, List[Shard]] = {}
        for kernel in self._embscale_kernels():
            if kernel.sharding_type == ShardingType.DATA_PARALLEL:
                continue
            for t, p in zip(kernel.config.embedding_tables, kernel.params):
                local.setdefault(t.name, []).append(Shard(tensor=p.detach(), metadata=t.local_metadata))
        for name, ps in self.module_sharding_plan.items():
            if ps.sharding_type == ShardingType.DATA_PARALLEL.value:
                continue
            rows, cols = self._name_to_table_size[name]
            if not hasattr(self.embedding_bags[name], "weight"):  # no shard here: loads an empty tensor
                empty = nn.Parameter(torch.empty(0), requires_grad=False)
                _mark_trained_in_backward([empty], EmptyFusedOptimizer())  # as TorchRec's kernels mark theirs
                self.embedding_bags[name].register_parameter("weight", empty)
            dtype = local[name][0].tensor.dtype if name in local else self._table_name_to_config[name].data_type
            if not isinstance(dtype, torch.dtype):
                dtype = data_type_to_dtype(dtype)
            meta = ps.sharding_spec.build_metadata(tensor_sizes=[rows, cols],
                                                   tensor_properties=TensorProperties(dtype=dtype))
            self._model_parallel_name_to_local_shards[name] = local.get(name, [])
            self._model_parallel_name_to_shards_wrapper[name] = OrderedDict(local_tensors=[], local_offsets=[])
            self._model_parallel_name_to_sharded_tensor[name] = ShardedTensor._init_from_local_shards_and_global_metadata(
                local_shards=local.get(name, []), sharded_tensor_metadata=meta, process_group=pg)

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


class EmbeddingBagCollectionSharder(_TorchrecSharder):
    """Shards embscale.torchrec.EmbeddingBagCollection: table-wise, row-wise, column-wise or data-parallel,
    each shard group a TableBatchedEmbeddingBags with the module's optimizer settings, started from the
    module's tables (where they are not on the meta device)."""

    def shard(self, module: EmbeddingBagCollection, params, env, device=None, module_fqn=None):
        if not isinstance(module, EmbeddingBagCollection):
            raise TypeError(f"module: {type(module).__name__} is not embscale.torchrec.EmbeddingBagCollection")
        for name, ps in params.items():
            if ps.sharding_type not in _SHARDING_TYPES:
                raise ValueError(f"params[{name!r}]: sharding_type {ps.sharding_type} is not supported by embscale; "
                                 f"expected one of {', '.join(_SHARDING_TYPES)}")
            _check_shards_per_rank(name, ps)
        for ps in params.values():  # checked first: a refused plan is left as it was
            ps.compute_kernel = EmbeddingComputeKernel.CUSTOMIZED_KERNEL.value
        fused = dict(self.fused_params or {})
        fused[_FUSED_KEY] = tuple(sorted(module._optimizer_settings.items()))
        sharded = ShardedEmbeddingBagCollection(module=module, table_name_to_parameter_sharding=params, env=env,
                                                fused_params=fused, device=device,
                                                qcomm_codecs_registry=self.qcomm_codecs_registry,
                                                module_fqn=module_fqn,
                                                sharded_module_order_overwrite=self._sharded_module_order_overwrite)
        if module.device.type != "meta":
            full = {n: module.embedding_bags[n].weight.detach() for n in module.embedding_bags}
            for kernel in sharded._embscale_kernels():
                kernel.copy_from_full_tables({n: w.to(kernel.tbe.weights.device) for n, w in full.items()})
        return sharded

    def compute_kernels(self, sharding_type: str, compute_device_type: str) -> List[str]:
        if sharding_type == ShardingType.DATA_PARALLEL.value:
            return [EmbeddingComputeKernel.DENSE.value]
        return [EmbeddingComputeKernel.FUSED.value]

    def sharding_types(self, compute_device_type: str) -> List[str]:
        return list(_SHARDING_TYPES)

    @property
    def module_type(self):
        return EmbeddingBagCollection

    @property
    def sharded_module_type(self):
        return ShardedEmbeddingBagCollection
