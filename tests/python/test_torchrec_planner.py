"""TorchRec's planner with embscale's estimators (embscale.torchrec.embscale_enumerator): the sharding options of
embscale's collections take the compute of embscale's cost model (python/embscale/_planner_model.py: bytes over
bandwidths fitted to recorded runs) and the memory embscale allocates, the communication staying TorchRec's
estimate; options of other modules keep TorchRec's estimates; the planner makes plans embscale's sharders take,
for CUDA topologies (planned on this CPU: the planner needs no GPU) and CPU ones, and where device memory cannot
hold the tables it places them in host memory. Skipped where torchrec is not installed."""
import copy
import math

import pytest
import torch
from torch import nn

torchrec = pytest.importorskip("torchrec", reason="torchrec is not installed (pip install .[torchrec]; "
                                                  "scripts/test_torchrec.sh runs these tests)")

from embscale import _planner_model as model  # noqa: E402
from embscale.torchrec import (EmbeddingBagCollection, EmbeddingBagCollectionSharder, EmbeddingCollection,  # noqa: E402
                               EmbeddingCollectionSharder, embscale_enumerator)
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder as TorchrecSharder  # noqa: E402
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology  # noqa: E402
from torchrec.distributed.planner.enumerators import EmbeddingEnumerator  # noqa: E402
from torchrec.distributed.planner.types import PlannerError  # noqa: E402
from torchrec.distributed.types import CacheParams  # noqa: E402
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig  # noqa: E402

WORLD = 2
BATCH = 256  # a process's batch
POOLING = 4.0  # lookups a bag
ROWS, DIM = 4000, 64  # "big"
STAGED = 1024  # cache_max_lookups of the collections that set it
GB = 1e6  # bytes a ms at 1 GB/s


def _bags(tables):
    return [EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=[f"{n}_f"])
            for n, r, d in tables]


class _Model(nn.Module):
    def __init__(self, **modules):
        super().__init__()
        for name, m in modules.items():
            setattr(self, name, m)


def _topology(hbm=1 << 34, device="cuda"):
    return Topology(world_size=WORLD, compute_device=device, hbm_cap=hbm, ddr_cap=1 << 36)


def _constraints(names):
    return {n: ParameterConstraints(pooling_factors=[POOLING]) for n in names}


def _options(enumerator, model_, sharders):
    """{(module path, table, sharding type, kernel): option}."""
    return {(o.path, o.name, o.sharding_type, o.compute_kernel): o for o in enumerator.enumerate(model_, sharders)}


def _ebc(optimizer="rowwise_adagrad", tables=(("big", ROWS, DIM), ("small", 20, 8)), **kw):
    return EmbeddingBagCollection(_bags(tables), optimizer=optimizer, learning_rate=0.1, **kw)


def _enumerate(model_, sharders, names, topology=None, **kw):
    topology = topology or _topology()
    return _options(embscale_enumerator(topology, BATCH, _constraints(names), **kw), model_, sharders)


def _model_ms(lookups, outputs, dim, weights="fp32", indices="uniform", optimizer="rowwise_adagrad", state=4):
    """(forward, backward) ms of the model for fp32 outputs, by the model's formulas written out."""
    e = model.ELEMENT_BYTES[weights]
    f = model.FITTED[("forward", "", weights, indices)]
    b = model.FITTED[("backward", optimizer, weights, indices)]
    fwd = (lookups * (max(dim * e, f.floor) + f.overhead) + outputs * dim * 4) / (f.gbps * GB)
    bwd = (lookups * (max(2 * (dim * e + state), b.floor) + b.overhead) + outputs * dim * 4) / (b.gbps * GB)
    return fwd, bwd


def test_embscale_options_take_the_model_and_others_keep_torchrecs_estimates():
    names = ["big", "small", "tr0", "tr1"]
    model_ = _Model(ebc=_ebc(), trec=torchrec.EmbeddingBagCollection(
        tables=_bags([("tr0", 300, 16), ("tr1", 50, 8)]), device=torch.device("meta")))
    sharders = [EmbeddingBagCollectionSharder(), TorchrecSharder()]
    topology = _topology()
    ours = _enumerate(model_, sharders, names, topology)
    theirs = _options(EmbeddingEnumerator(topology=topology, batch_size=BATCH, constraints=_constraints(names)),
                      model_, sharders)
    assert ours.keys() == theirs.keys()
    assert {k[0] for k in ours} == {"ebc", "trec"}
    for key, option in ours.items():
        for mine, torchrecs in zip(option.shards, theirs[key].shards):
            if key[0] == "trec":  # not embscale's: TorchRec's estimates as they are
                assert (mine.perf, mine.storage) == (torchrecs.perf, torchrecs.storage), key
                continue
            # embscale's: TorchRec's communication, the model's compute
            assert (mine.perf.fwd_comms, mine.perf.bwd_comms) == (torchrecs.perf.fwd_comms, torchrecs.perf.bwd_comms)
            assert mine.perf.fwd_compute != torchrecs.perf.fwd_compute, key
            assert mine.perf.bwd_compute != torchrecs.perf.bwd_compute, key
            assert mine.perf.prefetch_compute == 0.0

    # a table-wise shard in device memory: the global batch's lookups, a row per bag
    lookups, bags = BATCH * POOLING * WORLD, BATCH * WORLD
    perf = ours[("ebc", "big", "table_wise", "fused")].shards[0].perf
    assert (perf.fwd_compute, perf.bwd_compute) == pytest.approx(_model_ms(lookups, bags, DIM), rel=1e-12)
    # TorchRec's estimate of FBGEMM's FUSED: the backward twice the forward; embscale's is the model's
    torchrecs = theirs[("ebc", "big", "table_wise", "fused")].shards[0].perf
    assert torchrecs.bwd_compute == pytest.approx(2 * torchrecs.fwd_compute)
    assert perf.bwd_compute < torchrecs.bwd_compute and perf.bwd_compute != pytest.approx(2 * perf.fwd_compute)
    # a row-wise shard: its rows' share of the lookups, a partial sum per bag of the global batch
    perf = ours[("ebc", "big", "row_wise", "fused")].shards[0].perf
    assert (perf.fwd_compute, perf.bwd_compute) == pytest.approx(_model_ms(lookups / WORLD, bags, DIM), rel=1e-12)
    # data-parallel: its own batch forward, the global batch's update backward
    perf = ours[("ebc", "big", "data_parallel", "dense")].shards[0].perf
    assert perf.fwd_compute == pytest.approx(_model_ms(lookups / WORLD, bags / WORLD, DIM)[0], rel=1e-12)
    assert perf.bwd_compute == pytest.approx(_model_ms(lookups, bags, DIM)[1], rel=1e-12)

    # memory: the rows and row-wise Adagrad's state (a float a row, which TorchRec leaves out of embscale's
    # tables), the indices and outputs
    row_bytes = DIM * 4 + 4
    io = lookups * 8 + bags * DIM * 4
    storage = ours[("ebc", "big", "table_wise", "fused")].shards[0].storage
    assert (storage.hbm, storage.ddr) == (ROWS * row_bytes + io, 0)
    assert storage.hbm - theirs[("ebc", "big", "table_wise", "fused")].shards[0].storage.hbm == ROWS * 4
    # in host memory: the table there, the staging rows of two batches (the default: 2^16 lookups) and the
    # plans in device memory
    storage = ours[("ebc", "big", "table_wise", "fused_uvm")].shards[0].storage
    staged = 1 << 16
    assert storage.ddr == ROWS * row_bytes
    assert storage.hbm == 2 * staged * (row_bytes + 8) + 2 * staged * (8 * 6 + 4 * 5 + 1) + io


def test_cached_tables_are_estimated_with_their_cache():
    names = ["big", "small"]
    load_factor = 0.25
    ebc = _ebc(cache_max_lookups=STAGED)
    sharder = EmbeddingBagCollectionSharder(fused_params={"cache_load_factor": load_factor})
    options = _enumerate(_Model(ebc=ebc), [sharder], names)
    row_bytes = DIM * 4 + 4
    lookups, bags = BATCH * POOLING * WORLD, BATCH * WORLD
    io = lookups * 8 + bags * DIM * 4
    slots = math.ceil(load_factor * ROWS / 32) * 32
    cached = options[("ebc", "big", "table_wise", "fused_uvm_caching")].shards[0]
    assert cached.storage.ddr == ROWS * row_bytes
    assert cached.storage.hbm == (slots * (row_bytes + 8 + 17) + 2 * STAGED * (row_bytes + 8) +
                                  2 * STAGED * (8 * 6 + 4 * 5 + 1) + io)
    # the row cache's forward moves the misses in and their victims out: 2 rows a missed row touched
    unique = ROWS * -math.expm1(lookups * math.log1p(-1 / ROWS))
    link = model.FITTED[("link", "cached", "", "uniform")].gbps
    fwd, bwd = _model_ms(lookups, bags, DIM)
    assert cached.perf.fwd_compute == pytest.approx(fwd + 2 * unique * (1 - load_factor) * row_bytes / (link * GB))
    assert cached.perf.bwd_compute == pytest.approx(bwd)
    host = options[("ebc", "big", "table_wise", "fused_uvm")].shards[0]
    link = model.FITTED[("link", "host", "", "uniform")].gbps
    assert host.perf.fwd_compute == pytest.approx(fwd + unique * row_bytes / (link * GB))
    assert host.perf.bwd_compute == pytest.approx(bwd + unique * row_bytes / (link * GB))
    device = options[("ebc", "big", "table_wise", "fused")].shards[0]
    assert device.perf.total < cached.perf.total < host.perf.total


def test_estimates_follow_the_fitted_bandwidths():
    names = ["big"]
    key = ("ebc", "big", "table_wise", "fused")

    def perf(optimizer="rowwise_adagrad", **kw):
        ebc = _ebc(optimizer, tables=[("big", ROWS, DIM)])
        options = _enumerate(_Model(ebc=ebc), [EmbeddingBagCollectionSharder()], names, **kw)
        return options[key].shards[0].perf

    uniform, zipf = perf(), perf(index_distribution={"big": "zipf"})
    assert zipf.fwd_compute < uniform.fwd_compute and zipf.bwd_compute < uniform.bwd_compute
    assert zipf.fwd_compute == pytest.approx(_model_ms(BATCH * POOLING * WORLD, BATCH * WORLD, DIM,
                                                       indices="zipf")[0])
    sgd, adam = perf("sgd"), perf("adam")
    assert sgd.fwd_compute == uniform.fwd_compute
    assert sgd.bwd_compute == pytest.approx(_model_ms(BATCH * POOLING * WORLD, BATCH * WORLD, DIM, optimizer="sgd",
                                                      state=0)[1])
    assert sgd.bwd_compute < uniform.bwd_compute < adam.bwd_compute  # Adam: two rows of state a row
    with pytest.raises(ValueError, match="index_distribution"):
        perf(index_distribution="zipfian")


def _check_plan(sharder, module, params):
    sharder._embscale_fused_params(module, copy.deepcopy(params))  # raises for a plan embscale does not serve


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_planner_plans_embscale_collections(device):
    tables = [("t0", 1000, 32), ("t1", 5000, 32), ("t2", 40, 32)]
    ebc = _ebc(tables=tables)
    ec = EmbeddingCollection([EmbeddingConfig(name=f"s{n}", num_embeddings=r, embedding_dim=d,
                                              feature_names=[f"s{n}_f"]) for n, r, d in tables],
                             optimizer="sgd", learning_rate=0.1)
    model_ = _Model(ebc=ebc, ec=ec)
    names = [n for n, _, _ in tables] + [f"s{n}" for n, _, _ in tables]
    topology = _topology(device=device)
    sharders = [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=BATCH, constraints=_constraints(names),
                                       enumerator=embscale_enumerator(topology, BATCH, _constraints(names)))
    plan = planner.plan(model_, sharders)
    assert set(plan.plan) == {"ebc", "ec"}
    for path, sharder in (("ebc", sharders[0]), ("ec", sharders[1])):
        params = plan.plan[path]
        assert set(params) == {n for n in names if n.startswith("s") == (path == "ec")}
        for ps in params.values():
            assert ps.compute_kernel in ("fused", "dense"), ps  # the tables fit in device memory
        _check_plan(sharder, getattr(model_, path), params)


def test_planner_places_tables_in_host_memory_when_device_memory_is_short():
    tables = [("big", 40_000, 64), ("mid", 30_000, 32), ("small", 100, 8)]
    names = [n for n, _, _ in tables]
    ebc = _ebc(tables=tables, cache_max_lookups=STAGED)
    hbm = 4 << 20
    assert WORLD * hbm < sum(r * (d * 4 + 4) for _, r, d in tables)  # the tables and their state do not fit
    topology = _topology(hbm=hbm)
    constraints = {n: ParameterConstraints(pooling_factors=[POOLING], sharding_types=["table_wise"]) for n in names}
    constraints["big"].cache_params = CacheParams(load_factor=0.1)
    sharder = EmbeddingBagCollectionSharder()
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=BATCH, constraints=constraints,
                                       enumerator=embscale_enumerator(topology, BATCH, constraints))
    plan = planner.plan(_Model(ebc=ebc), [sharder]).plan["ebc"]
    kernels = {n: ps.compute_kernel for n, ps in plan.items()}
    assert kernels["big"] in ("fused_uvm_caching", "fused_uvm"), kernels
    assert any(k == "fused_uvm_caching" for k in kernels.values()), kernels
    _check_plan(sharder, ebc, plan)
    # the staging rows embscale allocates by default (2 x 65,536 lookups) do not fit such a device
    with pytest.raises(PlannerError, match="insufficient storage"):
        EmbeddingShardingPlanner(topology=topology, batch_size=BATCH, constraints=constraints,
                                 enumerator=embscale_enumerator(topology, BATCH, constraints)).plan(
            _Model(ebc=_ebc(tables=tables)), [sharder])
