"""Tables in host memory under TorchRec. embscale's sharder maps each table's plan compute kernel to a placement
(FUSED "device", FUSED_UVM "host", FUSED_UVM_CACHING "cached") and the plan's cache parameters (cache_params,
else the sharder's fused_params) to its shard group's TableBatchedEmbeddingBags; TorchRec's planner, given a
CUDA topology whose device memory cannot hold the tables, plans FUSED_UVM_CACHING for embscale's collection;
TorchRec's prefetch hands each batch to embscale's kernels before its forward, whose lookups then reuse the
planned indices and offsets tensors (by which the row cache finds its plan).

On gloo (2 processes) the plans are made by hand and by the planner (for a CUDA topology; its placements are
then moved to the CPU) and the sharded model trains on the CPU, where every placement is host memory: like one
process on the global batch. TorchRec's prefetch is driven as its prefetch pipeline drives it (input
distribution, prefetch, then the forward of that batch). TorchRec's PrefetchTrainPipelineSparseDist itself
prefetches on CUDA streams only (torchrec 1.9.2 skips the prefetch without a data-distribution stream, and its
forward then asserts), so it runs with EMBSCALE_TEST_DIST_DEVICE=cuda (world size 1 on a machine of one GPU),
where the tables train through the row cache; on the CPU its base pipeline (TrainPipelineSparseDist) runs the
same model instead. Skipped where torchrec is not installed."""
import dataclasses

import pytest
import torch
from torch import nn

torchrec = pytest.importorskip("torchrec", reason="torchrec is not installed (pip install .[torchrec]; "
                                                  "scripts/test_torchrec.sh runs these tests)")

import multiprocess  # noqa: E402
import torchrec_sharding  # noqa: E402
from embscale.torchrec import EmbeddingBagCollection, EmbeddingBagCollectionSharder, embscale_enumerator  # noqa: E402
from torchrec.modules.embedding_configs import EmbeddingBagConfig  # noqa: E402
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor  # noqa: E402
from torchrec.streamable import Pipelineable  # noqa: E402

# (name, rows, dim, features)
TABLES = [("t0", 40, 4, ["a", "b"]), ("t1", 30, 8, ["c"]), ("t2", 50, 8, ["d"]), ("t3", 12, 4, ["e"])]
# Tables the planner places: 4000 x 64 and 3000 x 32 fp32 rows do not fit in PLANNER_HBM bytes a device.
PLANNED = [("big", 4000, 64, ["p"]), ("mid", 3000, 32, ["q"]), ("small", 20, 8, ["r"])]
PLANNER_HBM = 500_000
PLANNED_STAGED = 128  # the planned collection's cache_max_lookups: staging rows embscale's estimate fits there
BATCH = 4
MAX_BAG = 3
STEPS = 3
OPT = {"optimizer": "rowwise_adagrad", "learning_rate": 0.3, "eps": 0.1}
SHARDER_LOAD_FACTOR = 0.125  # the sharder's fused_params: tables without cache_params take it
T0_LOAD_FACTOR = 0.25  # t0's cache_params (with LFU)


# [2] on gloo; [1] with EMBSCALE_TEST_DIST_DEVICE=cuda on a machine of one GPU (NCCL), else [2];
# EMBSCALE_TEST_WORLDS (e.g. "1") where set.
WORLDS = multiprocess.worlds(on_cpu=(2,))


def _features(tables):
    return [f for _, _, _, fs in tables for f in fs]


def _configs(tables):
    return [EmbeddingBagConfig(name=n, num_embeddings=e, embedding_dim=d, feature_names=fs) for n, e, d, fs in tables]


def _collection(tables, device, **kw):
    torch.manual_seed(7)
    return EmbeddingBagCollection(_configs(tables), **OPT, **kw).to(device)  # drawn on the CPU: the same anywhere


def _sharder():
    return EmbeddingBagCollectionSharder(fused_params={"cache_load_factor": SHARDER_LOAD_FACTOR})


def _hand_plan(model, rank, world):
    """t0 table-wise FUSED_UVM_CACHING (LFU, its own load factor), t1 table-wise FUSED_UVM, t2 row-wise
    FUSED_UVM_CACHING (the sharder's load factor), t3 data-parallel: the collection's plan."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import CacheAlgorithm
    from torchrec.distributed.sharding_plan import data_parallel, row_wise, table_wise
    from torchrec.distributed.types import CacheParams

    per_param = {"t0": table_wise(rank=0, compute_kernel="fused_uvm_caching"),
                 "t1": table_wise(rank=world - 1, compute_kernel="fused_uvm"),
                 "t2": row_wise(compute_kernel="fused_uvm_caching"), "t3": data_parallel()}
    plan = torchrec_sharding.make_plan(model, "ebc", _sharder(), per_param, rank, world)
    plan["t0"].cache_params = CacheParams(load_factor=T0_LOAD_FACTOR, algorithm=CacheAlgorithm.LFU)
    return plan


def _planned(model, world, dev):
    """TorchRec's planner's plan, with embscale's estimators, for a CUDA topology of PLANNER_HBM bytes a device
    (all tables table-wise; "big" with cache_params of load factor 0.1), its placements on `dev`."""
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec
    from torch.distributed._shard.metadata import ShardMetadata
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.types import CacheParams

    constraints = {n: ParameterConstraints(sharding_types=["table_wise"]) for n, _, _, _ in PLANNED}
    constraints["big"].cache_params = CacheParams(load_factor=0.1)
    topology = Topology(world_size=world, compute_device="cuda", hbm_cap=PLANNER_HBM, ddr_cap=1 << 32)
    planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints, batch_size=BATCH,
                                       enumerator=embscale_enumerator(topology, BATCH, constraints))
    plan = planner.plan(model, [_sharder()])  # on every process (collective_plan would broadcast rank 0's)
    if dev.type == "cpu":  # planned for CUDA devices: the same shards on this process's CPU
        for ps in plan.plan["ebc"].values():
            ps.sharding_spec = EnumerableShardingSpec([
                ShardMetadata(m.shard_offsets, m.shard_sizes, f"rank:{m.placement.rank()}/cpu")
                for m in ps.sharding_spec.shards])
    return plan


def _dmp(model, plan, rank):
    """DistributedModelParallel of the model under the collection's plan."""
    return torchrec_sharding.distribute(model, "ebc", _sharder(), plan, rank)


def _kjt(features, lengths, values, dev):
    return KeyedJaggedTensor.from_lengths_sync(keys=features, values=values, lengths=lengths).to(dev)


def _kernels(dmp):
    return list(dmp.module.ebc._embscale_kernels())


def _kernel_facts(dmp):
    """Per shard group: [(table, placement)], cache_load_factor, cache_algorithm of its TBE."""
    return [([(t.name, p) for t, p in zip(k.config.embedding_tables, k.tbe.placements)], k.tbe.cache_load_factor,
             k.tbe.cache_algorithm) for k in _kernels(dmp)]


def _local_shards(dmp):
    """(table, first row, weights, optimizer state) of every local shard."""
    return [(n, r0, w, s) for n, (r0, _), w, s in torchrec_sharding.local_shards(dmp.module.ebc)]


class _Spy:
    """Records, for the shard groups with tables in host memory, the indices and offsets tensors their TBE's
    prefetch and forward are given (the TBE's own prefetch still runs where it has one: CUDA)."""

    def __init__(self, dmp):
        self.events = []
        for i, kernel in enumerate(_kernels(dmp)):
            if all(p == "device" for p in kernel.tbe.placements):
                continue
            tbe = kernel.tbe
            real_prefetch, real_forward = getattr(tbe, "prefetch", None), tbe.forward

            def prefetch(indices, offsets, i=i, real=real_prefetch):
                self.events.append(("prefetch", i, indices, offsets))
                if real is not None:
                    real(indices, offsets)

            def forward(indices, offsets, per_sample_weights=None, i=i, real=real_forward):
                self.events.append(("forward", i, indices, offsets))
                return real(indices, offsets, per_sample_weights)

            tbe.prefetch, tbe.forward = prefetch, forward

    def forwards_found_their_prefetch(self):
        """Per forward, in order: whether it was given the tensors its group's last prefetch was given."""
        last, found = {}, []
        for kind, i, indices, offsets in self.events:
            if kind == "prefetch":
                last[i] = (indices, offsets)
            else:
                planned = last.pop(i, None)
                found.append(planned is not None and planned[0] is indices and planned[1] is offsets)
        return found


def _train_with_prefetch(dmp, rank, features, steps):
    """Trains as TorchRec's prefetch pipeline drives a sharded module: input distribution, prefetch, then the
    forward of the same distributed batch. Step 1 prefetches another batch first (the second prefetch
    replaces it); step 2 runs its forward on a batch made again from the same data (new tensors: no plan
    is found, and it trains all the same)."""
    dev = multiprocess.device(rank)
    ebc = dmp.module.ebc
    spy = _Spy(dmp)
    outs = []
    for s, step in enumerate(steps):
        lengths, values, target = step[rank]
        ctx = ebc.create_context()
        dist_input = ebc.input_dist(ctx, _kjt(features, lengths, values, dev)).wait().wait()
        if s == 1:
            other_ctx = ebc.create_context()
            other = ebc.input_dist(other_ctx, _kjt(features, lengths, torch.zeros_like(values), dev)).wait().wait()
            ebc.prefetch(dist_input=other, forward_stream=None, ctx=other_ctx)
        ebc.prefetch(dist_input=dist_input, forward_stream=None, ctx=ctx)
        if s == 2:
            ctx = ebc.create_context()
            dist_input = ebc.input_dist(ctx, _kjt(features, lengths, values.clone(), dev)).wait().wait()
        pooled = ebc.compute_and_output_dist(ctx, dist_input).wait().to_dict()
        pooled = torch.cat([pooled[f] for f in features], 1)
        (pooled * target.to(dev)).sum().backward()
        outs.append(pooled.detach())
    return outs, spy.forwards_found_their_prefetch()


# ---- TorchRec's pipelines ---------------------------------------------------------------------------------------
@dataclasses.dataclass
class _Batch(Pipelineable):
    features: KeyedJaggedTensor
    target: torch.Tensor

    def to(self, device, non_blocking=False):
        return _Batch(self.features.to(device, non_blocking=non_blocking),
                      self.target.to(device, non_blocking=non_blocking))

    def record_stream(self, stream):
        self.features.record_stream(stream)
        self.target.record_stream(stream)

    def pin_memory(self):
        return _Batch(self.features.pin_memory(), self.target.pin_memory())


class _DenseModel(nn.Module):
    """A model TorchRec's pipelines take: sparse features through the collection, a dense layer after."""

    def __init__(self, ebc, dim):
        super().__init__()
        self.ebc = ebc
        torch.manual_seed(3)
        self.dense = nn.Linear(dim, 1)

    def forward(self, batch):
        pooled = self.ebc(batch.features).values()
        losses = (self.dense(pooled).squeeze(1) - batch.target) ** 2
        return losses, pooled


def _pipeline_model(rank, world, dev):
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    dim = sum(d for _, _, d, fs in TABLES for _ in fs)
    model = _DenseModel(_collection(TABLES, dev), dim)
    dmp = _dmp(model, _hand_plan(model, rank, world), rank)
    opt = torch.optim.SGD([p for _, p in in_backward_optimizer_filter(dmp.named_parameters())], lr=0.05)
    return dmp, opt


def _pipeline_batches(rank, steps):
    return [_Batch(KeyedJaggedTensor.from_lengths_sync(keys=_features(TABLES), values=step[rank][1],
                                                       lengths=step[rank][0]), step[rank][2][:, 0].contiguous())
            for step in steps]


def _pipelined(rank, world, steps):
    """The same model and batches trained by a plain loop and by TorchRec's pipeline (the prefetch pipeline
    on CUDA, its base on the CPU): (per loop: outputs, local shards, dense weights), and per forward of the
    pipelined run whether it was given its prefetch's tensors (CUDA), with the cached groups' unique lookups."""
    from torchrec.distributed.train_pipeline import PrefetchTrainPipelineSparseDist, TrainPipelineSparseDist

    dev = multiprocess.device(rank)
    runs, found, lookups = [], [], []
    for pipelined in (False, True):
        dmp, opt = _pipeline_model(rank, world, dev)
        batches = _pipeline_batches(rank, steps)
        outs = []
        if not pipelined:
            for batch in batches:
                opt.zero_grad()
                losses, out = dmp(batch.to(dev))
                torch.sum(losses, dim=0).backward()
                opt.step()
                outs.append(out.detach())
        else:
            spy = _Spy(dmp)
            kind = PrefetchTrainPipelineSparseDist if dev.type == "cuda" else TrainPipelineSparseDist
            pipeline = kind(model=dmp, optimizer=opt, device=dev)
            it = iter(batches)
            while True:
                try:
                    outs.append(pipeline.progress(it).detach())
                except StopIteration:
                    break
            found = spy.forwards_found_their_prefetch() if dev.type == "cuda" else []
            lookups = [k.tbe.cache_stats()["unique_lookups"] for k in _kernels(dmp) if "cached" in k.tbe.placements
                       and hasattr(k.tbe, "cache_stats")]
        dense = {n: p.detach().clone() for n, p in dmp.named_parameters() if "dense" in n}
        runs.append((outs, _local_shards(dmp), dense))
    return runs, found, lookups


def _hand_part(rank, world, steps):
    features = _features(TABLES)
    dev = multiprocess.device(rank)
    model = torchrec_sharding.PooledModel(_collection(TABLES, dev), features)
    dmp = _dmp(model, _hand_plan(model, rank, world), rank)
    result = (torchrec_sharding.train(dmp, rank, features, steps), _local_shards(dmp), _kernel_facts(dmp))
    # Moving the model (DistributedModelParallel does, to wrap its dense part in DDP): the parameters of
    # tables in host memory stay views of the host store. On the CPU every table is in host memory, and
    # the groups with a "host" or "cached" table are told they keep their tables there, as on CUDA.
    ebc = dmp.module.ebc
    for kernel in _kernels(dmp):
        kernel.host_tables = kernel.host_tables or any(p != "device" for p in kernel.tbe.placements)
    held = {n: ebc.embedding_bags[n].weight for n in ebc.embedding_bags if ebc.embedding_bags[n].weight.numel()}
    before = {n: w.data_ptr() for n, w in held.items()}
    ebc._apply(lambda t: t.clone())  # what a move does to a parameter: new storage
    kept = {n: ebc.embedding_bags[n].weight is w and w.data_ptr() == before[n] for n, w in held.items()}
    return result + (kept,)


def _prefetch_part(rank, world, steps):
    features = _features(TABLES)
    dev = multiprocess.device(rank)
    model = torchrec_sharding.PooledModel(_collection(TABLES, dev), features)
    dmp = _dmp(model, _hand_plan(model, rank, world), rank)
    outs, found = _train_with_prefetch(dmp, rank, features, steps)
    return outs, _local_shards(dmp), found


def _planner_part(rank, world, steps):
    features = _features(PLANNED)
    dev = multiprocess.device(rank)
    model = torchrec_sharding.PooledModel(_collection(PLANNED, dev, cache_max_lookups=PLANNED_STAGED), features)
    plan = _planned(model, world, dev)
    kernels = {n: (ps.compute_kernel, ps.cache_params.load_factor if ps.cache_params else None)
               for n, ps in plan.plan["ebc"].items()}
    dmp = _dmp(model, plan.plan["ebc"], rank)
    return torchrec_sharding.train(dmp, rank, features, steps), _local_shards(dmp), _kernel_facts(dmp), kernels


def _host_shard_part(rank, world):
    """A ShardedTensor over this process's shard of a table that the plan places on CUDA but whose rows live
    in host memory (a CPU tensor, as a shard group with a table in host memory keeps them on CUDA): its
    local shard's placement, whether it views the tensor, every shard's placement."""
    import torch.distributed as dist
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import ShardedTensorMetadata, TensorProperties
    from embscale.torchrec import _sharded

    rows = 4
    shards = [ShardMetadata([r * rows, 0], [rows, 2], f"rank:{r}/cuda:{r}") for r in range(world)]
    meta = ShardedTensorMetadata(shards_metadata=shards, size=torch.Size([rows * world, 2]),
                                 tensor_properties=TensorProperties(dtype=torch.float32))
    local = torch.full((rows, 2), float(rank))
    table = _sharded([(local, shards[rank])], meta, dist.group.WORLD)
    shard = table.local_shards()[0]
    return (str(shard.metadata.placement), shard.tensor.data_ptr() == local.data_ptr(),
            [str(m.placement) for m in table.metadata().shards_metadata])


_FAILED = "failed"


def _worker(rank, world, steps, planned_steps):
    """Each part's result, or (_FAILED, its traceback): the tests report each part's failure apart."""
    import traceback

    out = {}
    for key, part, args in (("hand", _hand_part, (steps,)), ("prefetch", _prefetch_part, (steps,)),
                            ("planner", _planner_part, (planned_steps,)), ("pipeline", _pipelined, (steps,)),
                            ("host_shard", _host_shard_part, ())):
        try:
            out[key] = part(rank, world, *args)
        except Exception:
            out[key] = (_FAILED, traceback.format_exc())
    return out


def _part(results, rank, key):
    got = results[rank][key]
    if isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], str) and got[0] == _FAILED:
        pytest.fail(f"rank {rank}, {key}: {got[1]}")
    return got


def _batches(gen, tables, world):
    return torchrec_sharding.pooled_batches(gen, tables, world, STEPS, BATCH, MAX_BAG)


@pytest.fixture(scope="module", params=WORLDS)
def run(request):
    world = request.param
    multiprocess.skip_unless_enough_devices(world)
    gen = torch.Generator().manual_seed(world)
    steps, planned_steps = _batches(gen, TABLES, world), _batches(gen, PLANNED, world)
    results = multiprocess.run(_worker, world, steps, planned_steps, timeout=300)
    return world, steps, planned_steps, results


def _reference(tables, steps, world):
    """One process on the global batch (the processes' batches side by side in rank order), its tables in
    device memory on the processes' device: its outputs per step, and per table its weights and optimizer
    state after the steps (on the CPU)."""
    dev = multiprocess.device()
    full = _collection(tables, dev)
    names = [n for n, _, _, _ in tables]
    lookups = [(None, i) for i, t in enumerate(tables) for _ in t[3]]  # each feature its table's
    ref = torchrec_sharding.one_process([(n, 0, d) for n, _, d, _ in tables], {n: e for n, e, _, _ in tables}, lookups,
                                        dict(zip(names, full.tbe.split_embedding_weights())), device=dev, **OPT)
    outs = []
    for parts in steps:
        indices, offsets = torchrec_sharding.global_batch(parts, range(len(lookups)), BATCH)
        pooled = ref(indices.to(dev), offsets.to(dev))
        outs.append(pooled.detach().cpu())
        pooled.backward(torch.cat([t for _, _, t in parts]).to(dev) / world)
    weights = [w.detach().cpu() for w in ref.split_embedding_weights()]
    state = [{k: v.cpu() for k, v in s.items()} for s in ref.optimizer_state()]
    return outs, dict(zip(names, weights)), dict(zip(names, state))


def _check_trained_as_one_process(tables, steps, world, per_rank, what):
    """per_rank: [(outputs per step, local shards)] of every rank."""
    outs, weights, state = _reference(tables, steps, world)
    for r, (got_outs, shards) in enumerate(per_rank):
        for s, got in enumerate(got_outs):
            # (a row-wise table's bags are pooled per shard and the partial sums added: fp32 rounding)
            assert torch.allclose(got, outs[s][r * BATCH:(r + 1) * BATCH], rtol=1e-6, atol=1e-6), \
                f"{what}: rank {r}, step {s}: forward"
        for name, r0, w, st in shards:
            assert torch.equal(w, weights[name][r0:r0 + w.shape[0]]), f"{what}: rank {r}: table {name} at {r0}"
            for k, v in st.items():
                assert torch.equal(v, state[name][k][r0:r0 + v.shape[0]]), f"{what}: rank {r}: {name}'s {k} at {r0}"
    covered = {}
    for _, shards in per_rank:
        for name, _, w, _ in shards:
            covered[name] = covered.get(name, 0) + w.shape[0]
    return covered


def test_plan_kernels_and_cache_params_become_placements(run):
    # The sharder made every table's kernel the customized one and dropped the plan's: a FUSED_UVM_CACHING
    # plan trained its table in device memory, with no cache settings (issue 48).
    world, _, _, results = run
    want = {"t0": "cached", "t1": "host", "t2": "cached", "t3": "device"}
    seen = set()
    for r in range(world):
        for tables, load_factor, algorithm in _part(results, r, "hand")[2]:
            for name, placement in tables:
                assert placement == want[name], f"rank {r}: table {name}"
                seen.add(name)
            cached = {n for n, p in tables if p == "cached"}
            if "t0" in cached:  # its cache_params: load factor and LFU
                assert (load_factor, algorithm) == (T0_LOAD_FACTOR, "lfu"), f"rank {r}: t0's group"
            elif cached:  # the sharder's fused_params' load factor, FBGEMM's LRU
                assert (load_factor, algorithm) == (SHARDER_LOAD_FACTOR, "lru"), f"rank {r}: {sorted(cached)}'s group"
    assert seen == set(want)


def test_tables_in_host_memory_stay_there_when_the_model_moves(run):
    # DistributedModelParallel's move of the model gave embedding_bags.<table>.weight of a table in host
    # memory a device copy: no longer the host store's view, it went stale as the table trained.
    world, _, _, results = run
    for r in range(world):
        kept = _part(results, r, "hand")[3]
        assert kept and kept == {n: n != "t3" for n in kept}, f"rank {r}"  # t3: data-parallel, in device memory


def test_shards_in_host_memory_are_placed_on_the_cpu(run):
    # On CUDA a shard group with a table in host memory keeps its shards in the host store; their
    # ShardedTensor, placed on CUDA as the plan says, was refused ("Local shards' tensor device property is
    # incompatible"), so sharding failed.
    world, _, _, results = run
    for r in range(world):
        local, views, placements = _part(results, r, "host_shard")
        assert local == f"rank:{r}/cpu" and views, f"rank {r}"
        assert placements == [f"rank:{q}/cpu" if q == r else f"rank:{q}/cuda:{q}" for q in range(world)]


def test_hand_plan_trains_as_one_process(run):
    world, steps, _, results = run
    covered = _check_trained_as_one_process(TABLES, steps, world, [_part(results, r, "hand")[:2] for r in range(world)],
                                            "hand-made plan")
    assert covered == {n: e * (world if n == "t3" else 1) for n, e, _, _ in TABLES}


def test_planner_plans_host_memory_for_tables_device_memory_cannot_hold(run):
    # Offered FUSED only, the planner could not place tables larger than a device's memory.
    world, _, planned_steps, results = run
    assert world * PLANNER_HBM < 4 * sum(e * d for _, e, d, _ in PLANNED)  # the tables do not fit
    kernels = _part(results, 0, "planner")[3]
    assert all(_part(results, r, "planner")[3] == kernels for r in range(world))  # the same plan on every process
    assert set(kernels) == {n for n, _, _, _ in PLANNED}
    assert {k for k, _ in kernels.values()} <= {"fused", "fused_uvm", "fused_uvm_caching"}
    assert any(k == "fused_uvm_caching" for k, _ in kernels.values()), kernels
    placement = {"fused": "device", "fused_uvm": "host", "fused_uvm_caching": "cached"}
    for r in range(world):
        for tables, load_factor, _ in _part(results, r, "planner")[2]:
            for name, p in tables:
                assert p == placement[kernels[name][0]], f"rank {r}: table {name} ({kernels[name][0]})"
            cached = [n for n, p in tables if p == "cached"]
            if cached:  # the plan's load factor (constraints' cache_params), else the sharder's, row-weighted
                rows = {n: e for n, e, _, _ in PLANNED}
                given = {n: kernels[n][1] if kernels[n][1] is not None else SHARDER_LOAD_FACTOR for n in cached}
                want = sum(given[n] * rows[n] for n in cached) / sum(rows[n] for n in cached)
                assert load_factor == pytest.approx(want), f"rank {r}: group {cached}"
    assert kernels["big"][1] == 0.1
    covered = _check_trained_as_one_process(PLANNED, planned_steps, world,
                                            [_part(results, r, "planner")[:2] for r in range(world)], "planner's plan")
    assert covered == {n: e for n, e, _, _ in PLANNED}


def test_prefetched_batches_reach_the_kernels_and_their_forward(run):
    # TorchRec's lookup asks each table's compute kernel whether to prefetch and saw the customized one: the
    # prefetch never reached embscale's kernels, so the row cache planned every batch in its forward.
    world, steps, _, results = run
    _check_trained_as_one_process(TABLES, steps, world, [_part(results, r, "prefetch")[:2] for r in range(world)],
                                  "prefetched")
    for r in range(world):
        found = _part(results, r, "prefetch")[2]
        groups = len(found) // STEPS
        assert groups >= 1 and len(found) == groups * STEPS, f"rank {r}: {found}"
        # steps 0 and 1 (the second of two prefetches) find their plan; step 2's new tensors do not
        assert found == [True] * 2 * groups + [False] * groups, f"rank {r}"


def test_torchrec_pipeline_trains_as_a_plain_loop(run):
    # On CUDA TorchRec's PrefetchTrainPipelineSparseDist (its prefetch on its own stream, a batch ahead), on
    # the CPU its base TrainPipelineSparseDist: the same outputs, tables and dense weights as a plain loop.
    world, _, _, results = run
    for r in range(world):
        (plain, pipelined), found, lookups = _part(results, r, "pipeline")
        assert len(pipelined[0]) == len(plain[0]) == STEPS
        for s, (a, b) in enumerate(zip(plain[0], pipelined[0])):
            assert torch.equal(a, b), f"rank {r}, step {s}: output"
        for (n, r0, a, sa), (_, _, b, sb) in zip(plain[1], pipelined[1]):
            assert torch.equal(a, b) and all(torch.equal(sa[k], sb[k]) for k in sa), f"rank {r}: table {n} at {r0}"
        assert plain[2] and all(torch.equal(plain[2][k], pipelined[2][k]) for k in plain[2]), f"rank {r}: dense"


def test_prefetch_pipeline_plans_every_batch_ahead(run):
    # TorchRec's prefetch pipeline: every forward of a shard group with tables in host memory is given the
    # indices and offsets its prefetch planned, and the row cache saw the lookups.
    if multiprocess.device().type != "cuda":
        pytest.skip("TorchRec's PrefetchTrainPipelineSparseDist prefetches on CUDA streams only (torchrec 1.9.2 skips "
                    "the prefetch without a data-distribution stream, and its forward then asserts); run with "
                    "EMBSCALE_TEST_DIST_DEVICE=cuda")
    world, _, _, results = run
    for r in range(world):
        _, found, lookups = _part(results, r, "pipeline")
        assert found and all(found), f"rank {r}: {found}"
        assert lookups and all(n > 0 for n in lookups), f"rank {r}: {lookups}"


# ---- the sharder's checks (one process, no group) ---------------------------------------------------------------
def _plan_for(kernel, sharding="table_wise"):
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, data_parallel, table_wise

    ebc = EmbeddingBagCollection(_configs(TABLES), **OPT)
    gen = data_parallel() if sharding == "data_parallel" else table_wise(rank=0, compute_kernel=kernel)
    per_param = {n: table_wise(rank=0) for n, _, _, _ in TABLES}
    per_param["t1"] = gen
    plan = construct_module_sharding_plan(ebc, per_param_sharding=per_param, local_size=1, world_size=1,
                                          device_type="cpu", sharder=_sharder())
    if sharding == "data_parallel":
        plan["t1"].compute_kernel = kernel
    return ebc, plan


@pytest.mark.parametrize("kernel, sharding", [("key_value", "table_wise"), ("dense", "table_wise"),
                                              ("fused_uvm_caching", "data_parallel")])
def test_sharder_refuses_kernels_it_does_not_serve(kernel, sharding):
    ebc, plan = _plan_for(kernel, sharding)
    kernels = {n: ps.compute_kernel for n, ps in plan.items()}
    takes = "dense or fused" if sharding == "data_parallel" else "fused .*, fused_uvm .* and fused_uvm_caching"
    refused = rf"^params\['t1'\]: compute_kernel {kernel} is not served by embscale.*{takes}"
    with pytest.raises(ValueError, match=refused):
        _sharder().shard(ebc, dict(plan), env=None)
    assert {n: ps.compute_kernel for n, ps in plan.items()} == kernels  # refused before anything was changed


@pytest.mark.parametrize("field, value, message", [
    ("load_factor", 1.5, r"cache_params.load_factor: 1.5; expected the share"),
    ("algorithm", "fifo", r"cache_params.algorithm: 'fifo' is not FBGEMM's CacheAlgorithm"),
    ("precision", "FP16", r"cache_params.precision: FP16; embscale's cache holds the table's rows in the "
                          r"table's own precision \(float32\)")])
def test_sharder_refuses_cache_params_it_cannot_honour(field, value, message):
    from torchrec.distributed.types import CacheParams

    ebc, plan = _plan_for("fused_uvm_caching")
    if field == "precision":
        value = torchrec.DataType.FP16
    plan["t1"].cache_params = CacheParams(**{field: value})
    with pytest.raises(ValueError, match=rf"^params\['t1'\]\.{message}"):
        _sharder().shard(ebc, dict(plan), env=None)


def test_sharder_offers_torchrecs_kernels_that_embscale_serves():
    sharder = _sharder()
    assert sharder.compute_kernels("table_wise", "cuda") == ["fused", "fused_uvm", "fused_uvm_caching"]
    assert sharder.compute_kernels("row_wise", "cpu") == ["fused"]
    assert sharder.compute_kernels("data_parallel", "cuda") == ["dense"]

