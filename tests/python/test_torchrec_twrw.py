"""embscale's EmbeddingBagCollection under TorchRec's table-row-wise (TWRW) and grid plans, which cut a table (a
grid table: each of its column shards) over the processes of one node. TorchRec reads a node from
LOCAL_WORLD_SIZE; on gloo on this machine each test's processes set it, so that 2 processes make 2 nodes of 1 or
1 node of 2, and 4 make 2 nodes of 2. Plans made by hand (TorchRec's table_row_wise and grid_shard generators,
and grid shards written out as a ParameterSharding), mixed with row-wise, data-parallel and table-wise tables,
and made by TorchRec's planner train like one process on the global batch (row-wise Adagrad and SGD, SUM and
MEAN): tables and row-wise state bit for bit, forward outputs bit for bit where no bag is pooled over several
shards (else to the rounding of the partial sums' order). The one process takes the global batch in the order
TorchRec lays each shard's lookups out, which for TWRW and grid tables on several nodes of several processes
is not the ranks' order (see _rank_order). Checkpoints move between these plans and table-wise, row-wise and
column-wise ones, across world sizes. Plans embscale cannot serve, or TorchRec would misread, are refused by
name. Skipped where torchrec is not installed (scripts/test_torchrec.sh makes an environment that has it)."""
import copy
import os

import pytest
import torch

torchrec = pytest.importorskip("torchrec", reason="torchrec is not installed (pip install .[torchrec]; "
                                                  "scripts/test_torchrec.sh runs these tests)")

import embscale  # noqa: E402
import multiprocess  # noqa: E402
import torchrec_sharding  # noqa: E402
from embscale.torchrec import (EmbeddingBagCollection, EmbeddingBagCollectionSharder,  # noqa: E402
                               EmbeddingCollection, EmbeddingCollectionSharder)
from torchrec.distributed.types import ShardingType  # noqa: E402
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig  # noqa: E402

# Rows that a node of 2 cuts unevenly (13: 7 and 6; 7: 4 and 3); t3 is wide enough for TorchRec's grid_shard
# generator to cut it into two column shards (of 128: its smallest column shard).
TABLES = [("t0", 20, 8, ["a", "b"]), ("t1", 13, 8, ["c"]), ("t2", 10, 4, ["d"]), ("t3", 7, 256, ["e"])]
FEATURES = [f for _, _, _, fs in TABLES for f in fs]
SIZE = {n: (e, d) for n, e, d, _ in TABLES}
TABLE_OF = {f: n for n, _, _, fs in TABLES for f in fs}
BATCH = 2
MAX_BAG = 3
STEPS = 2
OPTIMIZERS = {"rowwise_adagrad": {"learning_rate": 0.3, "eps": 0.1}, "sgd": {"learning_rate": 0.3}}
# (processes, processes of a node)
TOPOLOGIES = [(2, 1), (2, 2), (4, 2)]
CASES = [("twrw", "sgd", "sum"), ("twrw", "rowwise_adagrad", "mean"), ("grid", "rowwise_adagrad", "sum"),
         ("grid", "sgd", "mean"), ("mixed", "rowwise_adagrad", "sum"), ("mixed", "sgd", "mean"),
         ("planned", "rowwise_adagrad", "sum")]
# TorchRec's MEAN where a table's rows are cut: SUM, divided by the bag's length plus this after the output
# distribution (torchrec.distributed.embeddingbag._create_mean_pooling_divisor).
TORCHREC_MEAN_EPS = 1e-6
NODE_TYPES = (ShardingType.TABLE_ROW_WISE.value, ShardingType.GRID_SHARD.value)


def _configs(pooling="sum"):
    return [EmbeddingBagConfig(name=n, num_embeddings=e, embedding_dim=d, feature_names=fs,
                               pooling=getattr(torchrec.PoolingType, pooling.upper())) for n, e, d, fs in TABLES]


def _collection(optimizer, device, pooling="sum", **kw):
    torch.manual_seed(7)
    return EmbeddingBagCollection(_configs(pooling), optimizer=optimizer, **OPTIMIZERS[optimizer], **kw).to(device)


def _grid(name, width, nodes, local_size, sharder, device_type="cpu"):
    """A grid ParameterSharding written out: table `name` cut into column shards of `width`, the k-th on node
    nodes[k], each cut over that node's processes into TorchRec's row blocks (the table_row_wise generator's)."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec
    from torchrec.distributed.sharding_plan import table_row_wise

    rows, cols = SIZE[name]
    rw = table_row_wise(host_index=0)(torch.empty(rows, width), local_size, local_size, device_type, sharder)
    shards, ranks = [], []
    for k, node in enumerate(nodes):
        for i, m in enumerate(rw.sharding_spec.shards):
            rank = node * local_size + i
            shards.append(ShardMetadata([m.shard_offsets[0], k * width], [m.shard_sizes[0], width],
                                        f"rank:{rank}/{device_type}"))
            ranks.append(rank)
    assert sum(width for _ in nodes) == cols
    return torchrec.distributed.types.ParameterSharding(
        sharding_type=ShardingType.GRID_SHARD.value, compute_kernel="fused", ranks=ranks,
        sharding_spec=EnumerableShardingSpec(shards))


def _per_param(plan, world, local_size, sharder):
    from torchrec.distributed import sharding_plan as sp

    nodes = world // local_size
    last = nodes - 1
    if plan == "twrw":
        return {n: sp.table_row_wise(host_index=i % nodes) for i, (n, _, _, _) in enumerate(TABLES)}
    if plan == "grid":  # t0 and t1 written out (t1's 4 column shards on nodes 1, 0, 1, 0); t3 by the generator
        return {"t0": _grid("t0", 4, [0, last], local_size, sharder),
                "t1": _grid("t1", 2, [last, 0, last, 0], local_size, sharder),
                "t2": sp.table_wise(rank=world - 1), "t3": sp.grid_shard(host_indexes=[last, 0])}
    assert plan == "mixed"
    return {"t0": sp.table_row_wise(host_index=last), "t1": sp.row_wise(), "t2": sp.data_parallel(),
            "t3": sp.grid_shard(host_indexes=[0, last])}


def _planned(model, world, local_size, dev):
    """TorchRec's planner's plan for the model's collection on a topology of nodes of `local_size` processes,
    told the sharding type of each table: TWRW, grid (t1 too narrow to cut into columns: one column shard) and
    table-wise."""
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology

    types = {"t0": "table_row_wise", "t1": "grid_shard", "t2": "table_wise", "t3": "grid_shard"}
    topology = Topology(world_size=world, local_world_size=local_size, compute_device=dev.type)
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=BATCH, constraints={
        n: ParameterConstraints(sharding_types=[t]) for n, t in types.items()})
    return planner.plan(model, [EmbeddingBagCollectionSharder()]).plan["ebc"]


def _sharded_model(rank, world, local_size, plan, optimizer, pooling="sum"):
    """The model sharded under `plan` (a name of _per_param's, or "planned") on nodes of `local_size`
    processes, which TorchRec reads from LOCAL_WORLD_SIZE (set for this process), and the plan: per table its
    sharding type and its shards' (first row, first column, rank)."""
    os.environ["LOCAL_WORLD_SIZE"] = str(local_size)
    os.environ["LOCAL_RANK"] = str(rank % local_size)
    dev = multiprocess.device(rank)
    sharder = EmbeddingBagCollectionSharder()
    model = torchrec_sharding.PooledModel(_collection(optimizer, dev, pooling), FEATURES)
    if plan == "planned":
        module_plan = _planned(model, world, local_size, dev)
        dmp = torchrec_sharding.distribute(model, "ebc", sharder, module_plan, rank)
    else:
        dmp = torchrec_sharding.shard(model, "ebc", sharder, _per_param(plan, world, local_size, sharder), rank,
                                      world, local_size)
        module_plan = dmp.plan.plan["ebc"]
    summary = {n: (ps.sharding_type, [(m.shard_offsets[0], m.shard_offsets[1], m.placement.rank())
                                      for m in ps.sharding_spec.shards] if ps.sharding_spec is not None else None)
               for n, ps in module_plan.items()}
    return dmp, summary


def _worker(rank, world, local_size, cases, batches):
    out = []
    for (plan, optimizer, pooling), steps in zip(cases, batches):
        dmp, summary = _sharded_model(rank, world, local_size, plan, optimizer, pooling)
        outs = torchrec_sharding.train(dmp, rank, FEATURES, steps)
        out.append((outs, torchrec_sharding.local_shards(dmp.module.ebc), summary))
    return out


def _batches(gen, world):
    """Per step, per rank: lengths, values and the outputs' gradient; half the values rows 0 and 1
    (torchrec_sharding.pooled_batches' hot rows)."""
    return torchrec_sharding.pooled_batches(gen, TABLES, world, STEPS, BATCH, MAX_BAG, hot=True)


def _rank_order(sharding_type, world, local_size):
    """The order of the processes' batches in a shard's lookups. TorchRec's TWRW and grid input distribution
    sends each node the lookups of the whole batch, staggered by local rank (its KJTAllToAll with stagger =
    nodes: the batches of the local rank 0 of every node, node by node, then of the local rank 1, ...), which
    the reduce-scatter over the node and the all-to-all between nodes undo for the outputs; every other
    sharding keeps the ranks' order. Each row's gradient is summed in this order."""
    if sharding_type not in NODE_TYPES:
        return list(range(world))
    nodes = world // local_size
    return [lr + node * local_size for lr in range(local_size) for node in range(nodes)]


def _pieces(summary):
    """The one process's tables: (name, first column, columns); a table cut into column shards (column-wise,
    grid) is one table per column shard, each keeping its own row-wise state as TorchRec's column shards do."""
    pieces = []
    for n, _, d, _ in TABLES:
        sharding_type, shards = summary[n]
        starts = sorted({c0 for _, c0, _ in shards}) if shards is not None else [0]
        pieces += [(n, c0, end - c0) for c0, end in zip(starts, starts[1:] + [d])]
    return pieces


def _one_process(world, local_size, summary, optimizer, pooling, steps):
    """The one process on the global batch, the shards' lookups in their order (_rank_order): per step the
    outputs of every rank ([world * BATCH, columns], in rank order), then the tables and row-wise state per
    piece (_pieces), and the pieces."""
    dev = torch.device("cpu")
    pieces = _pieces(summary)
    ref_features = [(FEATURES.index(f), i) for f in FEATURES for i, (n, _, _) in enumerate(pieces)
                    if TABLE_OF[f] == n]
    types = {n: t for n, (t, _) in summary.items()}
    divided_after = pooling == "mean" and any(t in NODE_TYPES + ("row_wise",) for t in types.values())
    full = _collection(optimizer, dev, pooling, data_parallel_group=None)
    tables = dict(zip([n for n, _, _, _ in TABLES], full.tbe.split_embedding_weights()))
    ref = torchrec_sharding.one_process(pieces, {n: e for n, (e, _) in SIZE.items()}, ref_features, tables,
                                        optimizer=optimizer, pooling="sum" if divided_after else pooling, device=dev,
                                        **OPTIMIZERS[optimizer])
    widths = [pieces[i][2] for _, i in ref_features]
    column = [sum(widths[:k]) for k in range(len(widths))]
    # Per reference feature, the order of the ranks' batches and where rank r's samples land
    orders = [_rank_order(types[pieces[i][0]], world, local_size) for _, i in ref_features]
    rows_of = [torch.cat([torch.arange(BATCH) + order.index(r) * BATCH for r in range(world)]) for order in orders]
    # A bag is pooled over several shards where the table's rows are cut: row-wise, and TWRW and grid over
    # nodes of several processes. There the output may differ by the rounding of the partial sums' order.
    cut = [types[pieces[i][0]] == "row_wise" or (types[pieces[i][0]] in NODE_TYPES and local_size > 1)
           for _, i in ref_features]
    outs = []
    for parts in steps:
        indices, offsets = torchrec_sharding.global_batch(parts, [f for f, _ in ref_features], BATCH, orders)
        pooled = ref(indices, offsets)

        def rank_order(t):  # [world * BATCH, columns] of the reference's layout -> the ranks' order
            return torch.cat([t[rows_of[k], column[k]:column[k] + widths[k]] for k in range(len(widths))], 1)

        def reference_order(t):
            out = torch.empty_like(t)
            for k in range(len(widths)):
                out[rows_of[k], column[k]:column[k] + widths[k]] = t[:, column[k]:column[k] + widths[k]]
            return out

        bag_lengths = rank_order(torch.repeat_interleave(offsets.diff().view(len(ref_features), -1).T,
                                                         torch.tensor(widths), dim=1))
        out, divisor = rank_order(pooled.detach()), torch.ones(())
        if divided_after:
            divisor = bag_lengths + TORCHREC_MEAN_EPS
            out = out / divisor
        magnitude = embscale.TableBatchedEmbeddingBags([(SIZE[n][0], cols) for n, _, cols in pieces],
                                                       feature_table_map=[i for _, i in ref_features],
                                                       pooling="sum", data_parallel_group=None, optimizer="sgd")
        with torch.no_grad():
            for w, r in zip(magnitude.split_embedding_weights(), ref.split_embedding_weights()):
                w.copy_(r.abs())
        bound = 2 * (MAX_BAG - 1) * 2.0**-24 * rank_order(magnitude(indices, offsets).detach()) / divisor
        bound += 2.0**-23 * out.abs()
        cut_columns = torch.repeat_interleave(torch.tensor(cut), torch.tensor(widths))
        bound[:, ~cut_columns] = 0  # bit for bit
        outs.append((out, bound))
        grad = torch.cat([t for _, _, t in parts])
        if divided_after:
            grad = grad / divisor
        pooled.backward(reference_order(grad / world))
    state = [dict(s) for s in ref.optimizer_state()]
    return outs, [w.detach() for w in ref.split_embedding_weights()], state, pieces


def _seed(world, local_size):
    seed = int(os.environ.get("EMBSCALE_TEST_SEED", 100 * world + local_size))
    print(f"seed={seed} (replay with EMBSCALE_TEST_SEED={seed})")
    return seed


@pytest.fixture(scope="module", params=TOPOLOGIES, ids=[f"{w}procs-nodes_of_{l}" for w, l in TOPOLOGIES])
def run(request):
    world, local_size = request.param
    seed = _seed(world, local_size)
    batches, results = multiprocess.run_cases(_worker, world, seed, CASES, lambda gen, _: _batches(gen, world),
                                              local_size)
    return world, local_size, seed, batches, results


@pytest.mark.parametrize("plan, optimizer, pooling", CASES)
def test_node_sharded_training_matches_one_process(run, plan, optimizer, pooling):
    world, local_size, seed, batches, results = run
    print(f"seed={seed} (replay with EMBSCALE_TEST_SEED={seed})")
    case = CASES.index((plan, optimizer, pooling))
    summary = results[0][case][2]
    if plan == "planned":  # the planner made the plan asked of it
        assert {n: t for n, (t, _) in summary.items()} == {
            "t0": "table_row_wise", "t1": "grid_shard", "t2": "table_wise", "t3": "grid_shard"}
        assert len({c0 for _, c0, _ in summary["t3"][1]}) == 2  # t3 in two column shards
    outs, ref_tables, ref_state, pieces = _one_process(world, local_size, summary, optimizer, pooling, batches[case])
    for s, (want, bound) in enumerate(outs):
        for r in range(world):
            got = results[r][case][0][s]
            lo, hi = r * BATCH, (r + 1) * BATCH
            assert ((got - want[lo:hi]).abs() <= bound[lo:hi]).all(), f"step {s}, rank {r}: forward"
    covered = torchrec_sharding.check_shards([results[r][case][1] for r in range(world)], pieces, ref_tables,
                                             ref_state)
    for n, e, d, _ in TABLES:
        replicas = world if summary[n][0] == "data_parallel" else 1
        assert covered[n] == e * d * replicas, f"table {n}: shards cover it"
    start = _collection(optimizer, torch.device("cpu"), pooling).tbe.split_embedding_weights()[0]
    assert not torch.equal(ref_tables[0], start[:, :ref_tables[0].shape[1]])  # it trained


# ---- checkpoints ----------------------------------------------------------------------------------------------
CHECKPOINT_PLANS = {
    # every table cut over a node: t0 and t2 TWRW, t1 and t3 grid (column shards of 4 and of 128)
    "node": lambda world, local_size, sharder: {
        "t0": _sp().table_row_wise(host_index=world // local_size - 1), "t1": _grid("t1", 4, [0] * 2, local_size,
                                                                                  sharder),
        "t2": _sp().table_row_wise(host_index=0), "t3": _sp().grid_shard(host_indexes=[0, world // local_size - 1])},
    # the same tables table-wise, row-wise and column-wise (the same column shards: row-wise state is kept per
    # column shard, so it loads only into the same column split)
    "flat": lambda world, local_size, sharder: {
        "t0": _sp().table_wise(rank=world - 1), "t1": _sp().column_wise(ranks=[0, 1]), "t2": _sp().row_wise(),
        "t3": _sp().column_wise(ranks=[1, 0])},
}


def _sp():
    from torchrec.distributed import sharding_plan

    return sharding_plan


def _checkpoint_worker(rank, world, local_size, plan, folder, steps):
    """Trains `steps` and saves the model and its fused optimizer (steps given), or loads them (steps None):
    torchrec_sharding.save_or_load's result."""
    os.environ["LOCAL_WORLD_SIZE"] = str(local_size)
    sharder = EmbeddingBagCollectionSharder()
    model = torchrec_sharding.PooledModel(_collection("rowwise_adagrad", multiprocess.device(rank)), FEATURES)
    dmp = torchrec_sharding.shard(model, "ebc", sharder, CHECKPOINT_PLANS[plan](world, local_size, sharder), rank,
                                  world, local_size)
    train = None if steps is None else lambda: torchrec_sharding.train(dmp, rank, FEATURES, steps)
    return torchrec_sharding.save_or_load(dmp, "ebc", folder, train)


def _column_starts(results, name):
    """The first columns of table `name`'s column shards among every rank's shards."""
    return sorted({c0 for shards, _ in results for n, (_, c0), _, _ in shards if n == name})


# (plan, processes, processes of a node) saved -> loaded
RESHARDS = [(("node", 2, 2), ("flat", 2, 2)), (("flat", 2, 2), ("node", 4, 2))]


@pytest.mark.parametrize("saved, loaded", RESHARDS, ids=["node-1x2-to-flat", "flat-to-node-2x2"])
def test_checkpoint_reshards_between_node_and_flat_plans(tmp_path, saved, loaded):
    """A checkpoint of TWRW and grid tables loads into table-wise, row-wise and column-wise plans, and one of
    those into TWRW and grid plans on another world size: every table and its row-wise Adagrad state equal
    the saved ones bit for bit, and differ from the untrained start; the state sits where TorchRec's kernels
    put it."""
    (plan_a, world_a, node_a), (plan_b, world_b, node_b) = saved, loaded
    multiprocess.skip_unless_enough_devices(max(world_a, world_b))
    seed = int(os.environ.get("EMBSCALE_TEST_SEED", 11))
    print(f"seed={seed} (replay with EMBSCALE_TEST_SEED={seed})")
    steps = _batches(torch.Generator().manual_seed(seed), world_a)
    folder = str(tmp_path / "checkpoint")
    after_save = multiprocess.run(_checkpoint_worker, world_a, node_a, plan_a, folder, steps, timeout=300)
    after_load = multiprocess.run(_checkpoint_worker, world_b, node_b, plan_b, folder, None, timeout=300)
    start = _collection("rowwise_adagrad", torch.device("cpu")).tbe.split_embedding_weights()
    torchrec_sharding.check_loaded(after_save, after_load, dict(zip([n for n, _, _, _ in TABLES], start)),
                                   _column_starts, f"{plan_b} x {world_b}")
    for results in (after_save, after_load):  # a table's column shards: as many as the shard's width goes into it
        torchrec_sharding.check_state_positions(results, SIZE, lambda n, width: SIZE[n][1] // width)


# ---- what is refused ------------------------------------------------------------------------------------------
def _plan(module, per_param, world, local_size, sharder):
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan

    return dict(construct_module_sharding_plan(module, per_param_sharding=per_param, local_size=local_size,
                                               world_size=world, device_type="cpu", sharder=sharder))


def test_sharders_offer_the_sharding_types_of_torchrecs_own():
    from torchrec.distributed.embedding import EmbeddingCollectionSharder as TorchrecECSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder as TorchrecEBCSharder

    bags = set(EmbeddingBagCollectionSharder().sharding_types("cpu"))
    assert bags >= {"table_row_wise", "grid_shard", "table_wise", "row_wise", "column_wise", "data_parallel"}
    # TorchRec's bag sharder offers the rest on CUDA; table_column_wise is not served by embscale
    assert bags == set(TorchrecEBCSharder().sharding_types("cuda")) - {"table_column_wise"}
    assert set(EmbeddingCollectionSharder().sharding_types("cpu")) == set(TorchrecECSharder().sharding_types("cuda"))


def test_sharders_refuse_what_they_cannot_serve(monkeypatch):
    """Sharding types a collection's TorchRec counterpart does not take, and TWRW and grid plans TorchRec would
    misread, are refused by name, before anything is changed."""
    from torchrec.distributed import sharding_plan as sp
    from torchrec.distributed.types import ShardingEnv

    sharder = EmbeddingBagCollectionSharder()
    ebc = EmbeddingBagCollection(_configs())
    tw = {n: sp.table_wise(rank=0) for n, _, _, _ in TABLES}
    env4 = ShardingEnv(world_size=4, rank=0)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")

    def refused(plan, match, module=ebc, by=sharder, env=env4):
        kernels = {n: ps.compute_kernel for n, ps in plan.items()}
        with pytest.raises(ValueError, match=match):
            by.shard(module, plan, env=env)
        assert {n: ps.compute_kernel for n, ps in plan.items()} == kernels  # nothing changed

    plan = _plan(ebc, tw, 4, 2, sharder)
    plan["t0"].sharding_type = "table_column_wise"
    refused(plan, r"params\['t0'\]: sharding_type table_column_wise is not supported by embscale's "
                  "EmbeddingBagCollection")
    # TorchRec's sharded EmbeddingCollection takes neither TWRW nor grid plans: nor does embscale's
    ec_sharder = EmbeddingCollectionSharder()
    ec = EmbeddingCollection([EmbeddingConfig(name=n, num_embeddings=e, embedding_dim=8, feature_names=fs)
                              for n, e, _, fs in TABLES])
    for kind in ("table_row_wise", "grid_shard"):
        plan = _plan(ec, {n: sp.table_wise(rank=0) for n, _, _, _ in TABLES}, 4, 2, ec_sharder)
        plan["t1"].sharding_type = kind
        refused(plan, rf"params\['t1'\]: sharding_type {kind} is not supported by embscale's EmbeddingCollection",
                module=ec, by=ec_sharder)
    # A TWRW plan made for nodes of 4 processes (a Topology's local_world_size) where TorchRec cuts over 2
    plan = _plan(ebc, {**tw, "t1": sp.table_row_wise(host_index=0)}, 4, 4, sharder)
    refused(plan, r"params\['t1'\]: table_row_wise .* TorchRec cuts the table over a node of 2 processes .* "
                  r"\[\(0, 7, 0\), \(7, 6, 1\)\]; the plan has \[\(0, 4, 0\), \(4, 4, 1\), \(8, 4, 2\), \(12, 1, 3\)\]")
    # ... and a grid plan made for nodes of 1
    plan = _plan(ebc, {**tw, "t3": sp.grid_shard(host_indexes=[0, 1])}, 4, 1, sharder)
    refused(plan, r"params\['t3'\]: grid_shard .* TorchRec cuts the column shard at column 0 over a node of 2")
    # Rows in blocks other than TorchRec's, a shard on the wrong process, ranks that are not the placements
    good = _grid("t1", 4, [0, 1], 2, sharder)
    for change, match in [
            (lambda m, ranks: (m[0].shard_sizes.__setitem__(0, 6), m[1].shard_offsets.__setitem__(0, 6),
                               m[1].shard_sizes.__setitem__(0, 7)), r"\[\(0, 6, 0\), \(6, 7, 1\)\]"),
            (lambda m, ranks: ranks.reverse(), "the ranks must be the shards' placements"),
            (lambda m, ranks: m[2].shard_offsets.__setitem__(1, 2), "column shards must cover the table's 8 columns")]:
        ps = copy.deepcopy(good)
        change(ps.sharding_spec.shards, ps.ranks)
        refused({**_plan(ebc, tw, 4, 2, sharder), "t1": ps}, match)
    plan = _plan(ebc, {**tw, "t1": sp.table_row_wise(host_index=1)}, 4, 2, sharder)
    plan["t1"].sharding_spec.shards[1].shard_sizes[1] = 4  # a TWRW shard of half the columns
    refused(plan, r"params\['t1'\]: .* every shard of a table_row_wise table holds all its 8 columns")
    # A table of one row cut over a node of 2 gives a process no row
    one = EmbeddingBagCollection([EmbeddingBagConfig(name="t0", num_embeddings=1, embedding_dim=4,
                                                     feature_names=["a"])])
    refused(_plan(one, {"t0": sp.table_row_wise(host_index=0)}, 4, 2, sharder),
            r"params\['t0'\]: shards of \[1, 0\] rows", module=one)
