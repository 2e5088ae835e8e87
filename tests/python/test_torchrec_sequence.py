"""embscale.torchrec.EmbeddingCollection (sequence embeddings: KeyedJaggedTensor in, a JaggedTensor of rows per
feature out) and its sharder. Unsharded: against a naive float64 reference written from the maths
(tbe_reference.py) on the CPU and CUDA where present, and against torchrec's own EmbeddingCollection given
the same tables. Sharded under DistributedModelParallel (gloo, 2 and 3 processes): table-wise, row-wise,
column-wise, data-parallel and mixed plans train like one process on the global batch, outputs, tables and
row-wise state bit for bit; checkpoints reshard across plans and world sizes. Skipped where torchrec is not
installed (scripts/test_torchrec.sh makes an environment that has it)."""
import copy

import pytest
import torch
from torch import nn

torchrec = pytest.importorskip("torchrec", reason="torchrec is not installed (pip install .[torchrec]; "
                                                  "scripts/test_torchrec.sh runs these tests)")

import embscale  # noqa: E402
import multiprocess  # noqa: E402
import tbe_reference as ref  # noqa: E402
from embscale.torchrec import (EmbeddingBagCollection, EmbeddingCollection,  # noqa: E402
                               EmbeddingCollectionSharder)
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig  # noqa: E402
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor  # noqa: E402

DIM = 8
# t3 has one row; feature "c" is empty on rank 0 in the first step (_batches)
TABLES = [("t0", 40, ["a", "b"]), ("t1", 30, ["c"]), ("t2", 50, ["d"]), ("t3", 1, ["e"])]
FEATURES = [f for _, _, fs in TABLES for f in fs]
ROWS = {n: e for n, e, _ in TABLES}
TABLE_OF = {f: n for n, _, fs in TABLES for f in fs}
BATCH = 4
MAX_LEN = 3
STEPS = 3
OPTIMIZERS = {"rowwise_adagrad": {"learning_rate": 0.3, "eps": 0.1}, "sgd": {"learning_rate": 0.3}}
PLANS = ["table_wise", "row_wise", "column_wise", "data_parallel", "mixed"]
CASES = [(plan, "rowwise_adagrad") for plan in PLANS] + [("column_wise", "sgd"), ("mixed", "sgd")]


def _configs():
    return [EmbeddingConfig(name=n, num_embeddings=e, embedding_dim=DIM, feature_names=list(fs)) for n, e, fs in TABLES]


def _collection(optimizer, device=torch.device("cpu"), **kw):
    torch.manual_seed(7)
    return EmbeddingCollection(_configs(), optimizer=optimizer, **OPTIMIZERS[optimizer], **kw).to(device)


class _Model(nn.Module):
    def __init__(self, ec):
        super().__init__()
        self.ec = ec

    def forward(self, kjt):
        """Every feature's rows, in the batch's order of the values, and their lengths."""
        out = self.ec(kjt)
        return torch.cat([out[f].values() for f in FEATURES]), torch.cat([out[f].lengths() for f in FEATURES])


def _per_param(plan, world):
    """A plan per table. Column-wise tables are cut into shards of one width (TorchRec's sequence sharding
    needs it); t2's two shards come in reverse rank order, and with one process both are on rank 0."""
    from torchrec.distributed import sharding_plan as sp

    def on(*ranks):
        return [r % world for r in ranks]

    if plan == "table_wise":
        return {n: sp.table_wise(rank=i % world) for i, (n, _, _) in enumerate(TABLES)}
    if plan == "row_wise":  # (a table of one row cannot be cut into shards of rows)
        return {n: sp.row_wise() if ROWS[n] >= world else sp.table_wise(rank=0) for n, _, _ in TABLES}
    if plan == "column_wise":
        return {"t0": sp.table_wise(rank=world - 1), "t1": sp.column_wise(ranks=on(0, 1)),
                "t2": sp.column_wise(ranks=on(1, 0)), "t3": sp.table_wise(rank=0)}
    if plan == "mixed":
        return {"t0": sp.row_wise(), "t1": sp.table_wise(rank=world - 1), "t2": sp.column_wise(ranks=on(1, 0)),
                "t3": sp.data_parallel()}
    return {n: sp.data_parallel() for n, _, _ in TABLES}


def _column_pieces(plan, name):
    return 2 if (plan, name) in {("column_wise", "t1"), ("column_wise", "t2"), ("mixed", "t2")} else 1


def _sharded_model(rank, world, plan, optimizer):
    import torch.distributed as dist
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan
    from torchrec.distributed.types import ShardingEnv, ShardingPlan

    sharder = EmbeddingCollectionSharder()
    dev = multiprocess.device(rank)
    model = _Model(_collection(optimizer, dev))
    module_plan = construct_module_sharding_plan(model.ec, per_param_sharding=_per_param(plan, world),
                                                 local_size=world, world_size=world, device_type=dev.type,
                                                 sharder=sharder)
    return DistributedModelParallel(model, env=ShardingEnv.from_process_group(dist.group.WORLD), device=dev,
                                    plan=ShardingPlan({"ec": module_plan}), sharders=[sharder])


def _train(dmp, rank, steps):
    dev = multiprocess.device(rank)
    outs = []
    for step in steps:
        lengths, values, target = step[rank]
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=FEATURES, values=values, lengths=lengths).to(dev)
        rows, out_lengths = dmp(kjt)
        (rows * target.to(dev)).sum().backward()
        outs.append((rows.detach(), out_lengths))
    return outs


def _local_shards(dmp):
    """(table, (first row, first column), weights, optimizer state) of every local shard."""
    shards = []
    for kernel in dmp.module.ec._embscale_kernels():
        state = kernel.tbe.optimizer_state()
        for t, w, s in zip(kernel.config.embedding_tables, kernel.tbe.split_embedding_weights(), state):
            md = t.local_metadata
            offset = (0, 0) if md is None else tuple(md.shard_offsets)
            shards.append((t.name, offset, w.detach().clone(), {k: v.clone() for k, v in s.items()}))
    return shards


def _dense_optimizer_keys(model):
    """The parameters TorchRec's usual setup hands the dense optimizer beside the fused one (those not
    trained in the backward): none of the tables'."""
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    return sorted(dict(in_backward_optimizer_filter(model.named_parameters())))


def _worker(rank, world, cases, batches):
    out = []
    for (plan, optimizer), steps in zip(cases, batches):
        dmp = _sharded_model(rank, world, plan, optimizer)
        out.append((_train(dmp, rank, steps), _local_shards(dmp), _dense_optimizer_keys(dmp)))
    return out


def _batches(gen, world):
    """Per step, per rank: (lengths [features * BATCH], values, target [values, DIM]); feature "c" is empty
    on rank 0 in the first step."""
    steps = []
    for s in range(STEPS):
        per_rank = []
        for r in range(world):
            lengths = torch.randint(0, MAX_LEN + 1, (len(FEATURES), BATCH), generator=gen)
            if s == 0 and r == 0:
                lengths[FEATURES.index("c")] = 0
            values = torch.cat([torch.randint(0, ROWS[TABLE_OF[f]], (int(n),), generator=gen)
                                for f, n in zip(FEATURES, lengths.sum(1))])
            per_rank.append((lengths.reshape(-1), values, torch.randn(values.numel(), DIM, generator=gen)))
        steps.append(per_rank)
    return steps


def _split_by_feature(lengths, tensor):
    """A rank's values (or rows) per feature."""
    return dict(zip(FEATURES, tensor.split(lengths.view(len(FEATURES), BATCH).sum(1).tolist())))


def _pieces(plan):
    """The single process's tables: (name, first column, columns); a column-wise table is one table per
    column shard (each keeps its own row-wise state, as TorchRec's column shards do)."""
    return [(n, j * DIM // k, DIM // k) for n, _, _ in TABLES for k in [_column_pieces(plan, n)] for j in range(k)]


def _one_process(plan, optimizer, world, steps):
    """One process trained on the global batch (the processes' batches side by side in rank order), the output
    gradients divided by the world size as TorchRec divides them: one TableBatchedEmbeddingBags with pooling
    "none" per width of the pieces. Returns per step each feature's global rows [lookups, DIM], and per piece
    its table and optimizer state after."""
    pieces = _pieces(plan)
    start = dict(zip([n for n, _, _ in TABLES], _collection(optimizer).tbe.split_embedding_weights()))
    groups = []  # (tbe, [piece], [(feature, piece)])
    for width in sorted({cols for _, _, cols in pieces}):
        members = [i for i, (_, _, cols) in enumerate(pieces) if cols == width]
        lookups = [(f, i) for f in FEATURES for i in members if TABLE_OF[f] == pieces[i][0]]
        tbe = embscale.TableBatchedEmbeddingBags([(ROWS[pieces[i][0]], width) for i in members],
                                                 feature_table_map=[members.index(i) for _, i in lookups],
                                                 optimizer=optimizer, pooling="none", data_parallel_group=None,
                                                 **OPTIMIZERS[optimizer])
        with torch.no_grad():
            for w, i in zip(tbe.split_embedding_weights(), members):
                name, c0, cols = pieces[i]
                w.copy_(start[name][:, c0:c0 + cols])
        groups.append((tbe, members, lookups))
    outputs = []
    for parts in steps:
        ids = {f: torch.cat([_split_by_feature(l, v)[f] for l, v, _ in parts]) for f in FEATURES}
        lengths = {f: torch.cat([l.view(len(FEATURES), BATCH)[FEATURES.index(f)] for l, _, _ in parts])
                   for f in FEATURES}
        grads = {f: torch.cat([_split_by_feature(l, t)[f] for l, _, t in parts]) / world for f in FEATURES}
        rows = {f: torch.full((ids[f].numel(), DIM), float("nan")) for f in FEATURES}
        for tbe, _, lookups in groups:
            indices = torch.cat([ids[f] for f, _ in lookups])
            offsets = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cat([lengths[f] for f, _ in lookups]).cumsum(0)])
            out = tbe(indices, offsets)
            for (f, i), r in zip(lookups, out.detach().split([ids[f].numel() for f, _ in lookups])):
                rows[f][:, pieces[i][1]:pieces[i][1] + pieces[i][2]] = r
            out.backward(torch.cat([grads[f][:, pieces[i][1]:pieces[i][1] + pieces[i][2]] for f, i in lookups]))
        outputs.append(rows)
    after = {}
    for tbe, members, _ in groups:
        for i, w, s in zip(members, tbe.split_embedding_weights(), tbe.optimizer_state()):
            after[i] = (w.detach(), s)
    return outputs, pieces, after


WORLDS = multiprocess.worlds(on_cpu=(2, 3))


@pytest.fixture(scope="module", params=WORLDS)
def run(request):
    world = request.param
    multiprocess.skip_unless_enough_devices(world)
    seed = 1000 + world
    print(f"seed={seed}")
    gen = torch.Generator().manual_seed(seed)
    batches = [_batches(gen, world) for _ in CASES]
    results = multiprocess.run(_worker, world, CASES, batches, timeout=600)
    return world, batches, results


@pytest.mark.parametrize("plan, optimizer", CASES)
def test_sharded_training_matches_one_process(run, plan, optimizer):
    world, batches, results = run
    case = CASES.index((plan, optimizer))
    outputs, pieces, after = _one_process(plan, optimizer, world, batches[case])
    for s, parts in enumerate(batches[case]):
        for r in range(world):
            got_rows, got_lengths = results[r][case][0][s]
            lengths = parts[r][0]
            want_lengths = lengths.view(len(FEATURES), BATCH)
            assert torch.equal(got_lengths, want_lengths.reshape(-1)), f"step {s}, rank {r}: lengths"
            # this rank's rows of each feature: after the lower ranks' in the global batch
            counts = want_lengths.sum(1)
            before = sum((p[0].view(len(FEATURES), BATCH).sum(1) for p in parts[:r]), torch.zeros_like(counts))
            want = torch.cat([outputs[s][f][before[i]:before[i] + counts[i]] for i, f in enumerate(FEATURES)])
            assert torch.equal(got_rows.cpu(), want), f"step {s}, rank {r}: rows"
    covered = {}
    for r in range(world):
        for name, (r0, c0), w, state in results[r][case][1]:
            i = next(i for i, (n, pc0, cols) in enumerate(pieces) if n == name and pc0 <= c0 < pc0 + cols)
            table, ref_state = after[i]
            c = c0 - pieces[i][1]
            assert torch.equal(w, table[r0:r0 + w.shape[0], c:c + w.shape[1]]), f"rank {r}: table {name} at {(r0, c0)}"
            assert state.keys() == ref_state.keys()
            for k, v in state.items():
                assert torch.equal(v, ref_state[k][r0:r0 + v.shape[0]]), f"rank {r}: {name} {k} at {(r0, c0)}"
            covered[name] = covered.get(name, 0) + w.numel()
    for n, e, _ in TABLES:
        replicas = world if plan == "data_parallel" or (plan == "mixed" and n == "t3") else 1
        assert covered[n] == e * DIM * replicas, f"table {n}: shards cover it"
    start = _collection(optimizer).tbe.split_embedding_weights()
    assert any(not torch.equal(after[i][0], start[[n for n, _, _ in TABLES].index(pieces[i][0])][
        :, pieces[i][1]:pieces[i][1] + pieces[i][2]]) for i in after), "training changed the tables"
    for r in range(world):
        assert results[r][case][2] == [], f"rank {r}: tables handed to the dense optimizer"


def _checkpoint_worker(rank, world, plan, folder, steps):
    """Trains `steps` and saves the model and its fused optimizer with torch.distributed.checkpoint (steps
    given), or loads them (steps None; the model starts from the same tables as the saved one did, so the
    loaded values must come from the checkpoint); the local shards after, and per table the local shards of
    its row-wise state in the fused optimizer's state_dict: (global size, [(offset, values)])."""
    import torch.distributed.checkpoint as dcp

    dmp = _sharded_model(rank, world, plan, "rowwise_adagrad")
    if steps is not None:
        _train(dmp, rank, steps)
        dcp.save({"model": dmp.state_dict(), "optim": dmp.fused_optimizer.state_dict()}, checkpoint_id=folder)
    else:
        state = {"model": dmp.state_dict(), "optim": dmp.fused_optimizer.state_dict()}
        dcp.load(state, checkpoint_id=folder)
        dmp.load_state_dict(state["model"])
        dmp.fused_optimizer.load_state_dict(state["optim"])
    saved_state = {}
    for key, entries in dmp.fused_optimizer.state_dict()["state"].items():
        assert key.startswith("ec.embeddings."), key  # keyed as the model's state_dict keys the tables
        name = key.split(".")[-2]
        st = entries[f"{name}.momentum1"]
        saved_state[name] = (tuple(st.size()), [(s.metadata.shard_offsets[0], s.tensor.clone())
                                                for s in st.local_shards()])
    return _local_shards(dmp), saved_state


def _whole(results, name, plan):
    """Table `name` and its row-wise state ([rows, column pieces]: one per column shard) from every rank's
    shards."""
    rows, pieces = ROWS[name], _column_pieces(plan, name)
    table = torch.full((rows, DIM), float("nan"))
    state = torch.full((rows, pieces), float("nan"))
    for shards, _ in results:
        for n, (r0, c0), w, s in shards:
            if n == name:
                table[r0:r0 + w.shape[0], c0:c0 + w.shape[1]] = w
                state[r0:r0 + w.shape[0], c0 * pieces // DIM] = s["sum"]
    return table, state


def _check_state_positions(results, plan):
    """The fused optimizer's row-wise state as TorchRec's FUSED kernels lay it out: [rows] sharded as the
    rows, or for a table of k column shards [k * rows] with the j-th shard from the left at j * rows."""
    for r, (shards, saved) in enumerate(results):
        for n, (r0, c0), _, s in shards:
            k = _column_pieces(plan, n)
            size, local = saved[n]
            at = c0 // (DIM // k) * ROWS[n] if k > 1 else r0
            assert size == (ROWS[n] * k,), f"rank {r}: table {n} state size"
            assert [torch.equal(v, s["sum"]) for o, v in local if o == at] == [True], \
                f"rank {r}: table {n}, shard of column {c0}: its state at {at}"


# (plan, world size) saved -> loaded, as tests/python/test_torchrec.py reshards the bag collection
RESHARDS = ([(("table_wise", 2), ("row_wise", 3)), (("row_wise", 3), ("table_wise", 2)),
             (("column_wise", 2), ("column_wise", 3))] if max(WORLDS) > 1 else
            [(("table_wise", 1), ("row_wise", 1)), (("column_wise", 1), ("column_wise", 1))])


@pytest.mark.parametrize("saved, loaded", RESHARDS)
def test_checkpoint_reshards(tmp_path, saved, loaded):
    """A checkpoint of the sharded model and its fused optimizer (torch.distributed.checkpoint) taken under
    one plan and world size loads into another: every table and its row-wise Adagrad state equal the saved
    ones bit for bit, and differ from the untrained start; the state sits where TorchRec's kernels put it."""
    (plan_a, world_a), (plan_b, world_b) = saved, loaded
    multiprocess.skip_unless_enough_devices(max(world_a, world_b))
    seed = 11
    print(f"seed={seed}")
    steps = _batches(torch.Generator().manual_seed(seed), world_a)
    folder = str(tmp_path / "checkpoint")
    after_save = multiprocess.run(_checkpoint_worker, world_a, plan_a, folder, steps, timeout=300)
    after_load = multiprocess.run(_checkpoint_worker, world_b, plan_b, folder, None, timeout=300)
    start_tables = _collection("rowwise_adagrad").tbe.split_embedding_weights()
    trained = 0
    for (n, _, _), start in zip(TABLES, start_tables):
        want, want_state = _whole(after_save, n, plan_a)
        got, got_state = _whole(after_load, n, plan_a)
        assert not want.isnan().any() and not got.isnan().any(), f"table {n}: shards cover it"
        assert torch.equal(got, want), f"table {n}: loaded under {plan_b} x {world_b}"
        assert torch.equal(got_state, want_state), f"table {n}: row-wise state loaded under {plan_b} x {world_b}"
        trained += not torch.equal(want, start)
    assert trained == len(TABLES), "training changed every table"
    _check_state_positions(after_save, plan_a)
    _check_state_positions(after_load, plan_b)
