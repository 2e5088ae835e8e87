"""embscale's kernels under TorchRec: an EmbeddingBagCollection trained by embscale's fused optimizer, and
a sharder that plugs embscale in as TorchRec's customized compute kernel.

    from embscale.torchrec import EmbeddingBagCollection, EmbeddingBagCollectionSharder
    ebc = EmbeddingBagCollection(tables, optimizer="rowwise_adagrad", learning_rate=0.05)  # the one changed line
    model = DistributedModelParallel(Dlrm(ebc), sharders=[EmbeddingBagCollectionSharder()], plan=plan)

The module takes a KeyedJaggedTensor and returns a KeyedTensor like torchrec's EmbeddingBagCollection,
from one TableBatchedEmbeddingBags over all its tables. Sharded (table-wise, row-wise, column-wise or
data-parallel), every shard group on a process is one TableBatchedEmbeddingBags over the local shards;
TorchRec's planner, input and output distributions and all-to-alls are used as they are. The plan may
name the FUSED kernel (TorchRec's planner does not estimate a customized one) or DENSE for data-parallel
tables: the sharder makes every table's kernel the customized one, embscale's.

Training matches one process with the global batch (the processes' batches side by side in rank order):
TorchRec lays each shard's lookups out in that order, so each row's gradient is summed as there; the
output gradients come back divided by the world size (TorchRec's gradient division, as DDP averages the
dense gradients). A column-wise shard keeps its own row-wise optimizer state (of its columns), as
TorchRec's kernels do. Data-parallel tables are replicas: each backward applies the global batch's update
(TableBatchedEmbeddingBags' data_parallel_group). Sharded tables and their optimizer state appear in
``state_dict()`` and ``fused_optimizer.state_dict()`` as ShardedTensors over the local shards, so
torch.distributed.checkpoint saves them and loads them into another plan or world size.

Needs torchrec (with fbgemm_gpu): ``pip install .[torchrec]``.
"""

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
from torchrec.optim.fused import FusedOptimizer, FusedOptimizerModule
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
    """TorchRec's view of a TableBatchedEmbeddingBags' fused optimizer: per table ``<name>.weight`` the
    weights and the optimizer state (views; updated in the backward). ``step()`` applies a learning rate set
    in ``param_groups`` to the module (the update itself happens in the backward)."""

    def __init__(self, tbe: _tbe.TableBatchedEmbeddingBags, names: List[str], params: List[torch.Tensor],
                 states: Optional[List[Dict[str, torch.Tensor]]] = None):
        self._tbe = tbe
        keyed = {f"{n}.weight": p for n, p in zip(names, params)}
        states = tbe.optimizer_state() if states is None else states
        state = {p: dict(s) for p, s in zip(params, states)}
        group = {"params": list(keyed.values()), "lr": tbe.learning_rate, "optimizer": tbe.optimizer}
        super().__init__(keyed, state, [group])

    def step(self, closure: Any = None) -> None:
        self._tbe.set_learning_rate(self.param_groups[0]["lr"])

    def zero_grad(self, set_to_none: bool = False) -> None:
        pass


def _table_params(tbe):
    """Per table, a Parameter viewing its rows in the module's tables (writes through, no grad)."""
    return [nn.Parameter(w, requires_grad=False) for w in tbe.split_embedding_weights()]


def _sharded(local: torch.Tensor, shard: ShardMetadata, whole: ShardedTensorMetadata, pg) -> ShardedTensor:
    """A ShardedTensor whose local shard is `local` (a view: reads and writes go to the module's buffers)."""
    return ShardedTensor._init_from_local_shards_and_global_metadata(
        local_shards=[Shard(tensor=local, metadata=shard)], sharded_tensor_metadata=whole, process_group=pg)


def _sharded_state(values: torch.Tensor, table, pg) -> ShardedTensor:
    """A shard's optimizer state buffer as a slice of the whole table's: element-wise state is laid out
    as the table ([rows, columns], sharded as its weights); row-wise state is one value per row, [rows]
    for table-wise and row-wise shards, and [rows, column shards] for column-wise ones, where each column
    shard keeps its own row-wise state (column k: the k-th shard from the left)."""
    whole, mine = table.global_metadata, table.local_metadata
    props = TensorProperties(dtype=values.dtype)
    if values.dim() == 2:
        meta = ShardedTensorMetadata(shards_metadata=whole.shards_metadata, size=whole.size, tensor_properties=props)
        return _sharded(values, mine, meta, pg)
    column_starts = sorted({m.shard_offsets[1] for m in whole.shards_metadata})
    rows = whole.size[0]
    if len(column_starts) == 1:
        shards = [ShardMetadata([m.shard_offsets[0]], [m.shard_sizes[0]], m.placement) for m in whole.shards_metadata]
        meta = ShardedTensorMetadata(shards_metadata=shards, size=torch.Size([rows]), tensor_properties=props)
        local = ShardMetadata([mine.shard_offsets[0]], [mine.shard_sizes[0]], mine.placement)
        return _sharded(values, local, meta, pg)
    col = {c: k for k, c in enumerate(column_starts)}
    shards = [ShardMetadata([m.shard_offsets[0], col[m.shard_offsets[1]]], [m.shard_sizes[0], 1], m.placement)
              for m in whole.shards_metadata]
    meta = ShardedTensorMetadata(shards_metadata=shards, size=torch.Size([rows, len(column_starts)]),
                                 tensor_properties=props)
    local = ShardMetadata([mine.shard_offsets[0], col[mine.shard_offsets[1]]], [mine.shard_sizes[0], 1],
                          mine.placement)
    return _sharded(values.view(-1, 1), local, meta, pg)


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
        params = _table_params(self.tbe)
        for name, p in zip(self.embedding_bags, params):
            self.embedding_bags[name].weight = p
        self._optim = EmbscaleFusedOptimizer(self.tbe, list(self.embedding_bags), params)

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
    group's features, feature-major) -> [batch, sum of the shards' columns]."""

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
        self._names = [t.name for t in tables]
        self._params = _table_params(self.tbe)
        states = self.tbe.optimizer_state()
        if sharding_type != ShardingType.DATA_PARALLEL and all(t.global_metadata is not None for t in tables):
            # as slices of the whole tables' state, so that a checkpoint reshards (torch.distributed.checkpoint)
            states = [{n: _sharded_state(v, t, pg) for n, v in s.items()} for s, t in zip(states, tables)]
        self._optim = EmbscaleFusedOptimizer(self.tbe, self._names, self._params, states)

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
        yield from zip(self._names, self._params)

    def state_dict(self, destination=None, prefix: str = "", keep_vars: bool = False):
        destination = {} if destination is None else destination
        for name, p in zip(self._names, self._params):
            destination[f"{prefix}{name}.weight"] = p if keep_vars else p.detach()
        return destination

    def named_split_embedding_weights(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        for name, p in zip(self._names, self._params):
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
                self.embedding_bags[name].register_parameter("weight", nn.Parameter(torch.empty(0), requires_grad=False))
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
