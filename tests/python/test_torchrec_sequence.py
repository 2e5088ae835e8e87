"""embscale.torchrec.EmbeddingCollection (sequence embeddings: KeyedJaggedTensor in, a JaggedTensor of rows per
feature out) and its sharder. Unsharded: against a naive float64 reference written from the maths
(tbe_reference.py) on the CPU and CUDA where present, and against torchrec's own EmbeddingCollection given
the same tables. Sharded under DistributedModelParallel (gloo, 2 and 3 processes): table-wise, row-wise,
column-wise, data-parallel and mixed plans train like one process on the global batch, outputs, tables and
row-wise state bit for bit; checkpoints reshard across plans and world sizes. Skipped where torchrec is not
installed (scripts/test_torchrec.sh makes an environment that has it)."""

import pytest
import torch
from torch import nn

torchrec = pytest.importorskip("torchrec", reason="torchrec is not installed (pip install .[torchrec]; "
                                                  "scripts/test_torchrec.sh runs these tests)")

import embscale  # noqa: E402
import multiprocess  # noqa: E402
import torchrec_sharding  # noqa: E402
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
    model = _Model(_collection(optimizer, multiprocess.device(rank)))
    return torchrec_sharding.shard(model, "ec", EmbeddingCollectionSharder(), _per_param(plan, world), rank, world)


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
    return torchrec_sharding.local_shards(dmp.module.ec)


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
            counts = torch.cat([lengths[f] for f, _ in lookups])
            offsets = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
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
    seed = 1000 + world
    print(f"seed={seed}")
    batches, results = multiprocess.run_cases(_worker, world, seed, CASES, lambda gen, _: _batches(gen, world))
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
    """Trains `steps` and saves the model and its fused optimizer (steps given), or loads them (steps None):
    torchrec_sharding.save_or_load's result, the optimizer's state keyed as the model's state_dict keys the
    tables."""
    dmp = _sharded_model(rank, world, plan, "rowwise_adagrad")
    train = None if steps is None else lambda: _train(dmp, rank, steps)
    return torchrec_sharding.save_or_load(dmp, "ec", folder, train, key_prefix="ec.embeddings.")


# (plan, world size) saved -> loaded, as tests/python/test_torchrec.py reshards the bag collection
RESHARDS = torchrec_sharding.reshards(WORLDS)


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
    saved_pieces = _pieces(plan_a)  # the column shards, whose row-wise state is kept apart
    torchrec_sharding.check_loaded(after_save, after_load, dict(zip([n for n, _, _ in TABLES], start_tables)),
                                   lambda _, n: [c0 for m, c0, _ in saved_pieces if m == n], f"{plan_b} x {world_b}")
    sizes = {n: (e, DIM) for n, e, _ in TABLES}
    for results, plan in ((after_save, plan_a), (after_load, plan_b)):
        torchrec_sharding.check_state_positions(results, sizes, lambda n, _: _column_pieces(plan, n))


# ---- the unsharded collection ----------------------------------------------------------------------------------
# A feature of two tables ("a" of t0 and t4: it comes out as a@t0 and a@t4), a table of one row (t3), and the
# features' keys in the batch in another order than the tables'.
SHARED = [("t4", 5, ["a"])]
LOOKUPS = [(f"{f}@{n}" if f == "a" else f, f, t) for t, (n, _, fs) in enumerate(TABLES + SHARED) for f in fs]
BATCH_KEYS = FEATURES[::-1]


def _shared_configs():
    return [EmbeddingConfig(name=n, num_embeddings=e, embedding_dim=DIM, feature_names=list(fs))
            for n, e, fs in TABLES + SHARED]


def _random_batch(gen, empty=()):
    """A KeyedJaggedTensor with keys BATCH_KEYS, the features in `empty` without values."""
    rows = {f: min(e for n, e, fs in TABLES + SHARED if f in fs) for f in FEATURES}  # "a" within both tables
    lengths = torch.randint(0, MAX_LEN + 1, (len(BATCH_KEYS), BATCH), generator=gen)
    for f in empty:
        lengths[BATCH_KEYS.index(f)] = 0
    values = torch.cat([torch.randint(0, rows[f], (int(n),), generator=gen)
                        for f, n in zip(BATCH_KEYS, lengths.sum(1))])
    return KeyedJaggedTensor.from_lengths_sync(keys=BATCH_KEYS, values=values, lengths=lengths.reshape(-1))


@pytest.mark.parametrize("optimizer", ["rowwise_adagrad", "sgd"])
def test_collection_matches_the_naive_reference(gen, device, optimizer):
    """Forward (each feature's rows, its lengths and, with need_indices, its indices) and two training steps
    against tbe_reference's float64 maths: rows bit for bit (the tables' own rows), tables and row-wise state
    to fp32 rounding."""
    ec = EmbeddingCollection(_shared_configs(), device=device, need_indices=True, optimizer=optimizer,
                             **OPTIMIZERS[optimizer])
    assert list(ec.fused_optimizer.params) == [f"embeddings.{n}.weight" for n, _, _ in TABLES + SHARED]
    tables = [w.detach().cpu().double() for w in ec.tbe.split_embedding_weights()]
    state = [{"m1": torch.zeros(t.shape[0], dtype=torch.float64)} for t in tables]
    hp = {"learning_rate": 0.3, "eps": OPTIMIZERS[optimizer].get("eps", 0.0), "beta1": 0.9, "beta2": 0.999,
          "weight_decay": 0.0, "max_norm": 0.0, "gradient_clipping": 0.0, "weight_decay_mode": "none"}
    for step in range(2):
        kjt = _random_batch(gen, empty=["c"] if step == 0 else [])
        features = kjt.to_dict()
        current = [w.detach().cpu().double() for w in ec.tbe.split_embedding_weights()]  # (the reference's, rounded)
        out = ec(kjt.to(device))
        assert list(out) == [name for name, _, _ in LOOKUPS]
        grads = [torch.zeros_like(t) for t in tables]
        touched = [set() for _ in tables]
        loss = 0
        for name, f, t in LOOKUPS:
            ids, lengths = features[f].values(), features[f].lengths()
            assert torch.equal(out[name].values().cpu().double(), current[t][ids]), f"step {step}: {name}'s rows"
            assert torch.equal(out[name].lengths().cpu(), lengths) and torch.equal(out[name].weights().cpu(), ids)
            g = torch.randn(ids.numel(), DIM, generator=gen)
            loss = loss + (out[name].values() * g.to(device)).sum()
            for i, r in enumerate(ids.tolist()):
                grads[t][r] += g[i].double()
                touched[t].add(r)
        loss.backward()
        ref.apply_optimizer(optimizer, tables, state, grads, touched, hp, step + 1)
        for t, (w, s) in enumerate(zip(ec.tbe.split_embedding_weights(), ec.tbe.optimizer_state())):
            torch.testing.assert_close(w.detach().cpu().double(), tables[t], rtol=1e-5, atol=1e-5)
            if optimizer == "rowwise_adagrad":
                torch.testing.assert_close(s["sum"].cpu().double(), state[t]["m1"], rtol=1e-5, atol=1e-5)
    assert touched[TABLES.index(("t3", 1, ["e"]))] == {0}  # the table of one row trained


def test_collection_matches_torchrecs(gen):
    """torchrec's own EmbeddingCollection given the same tables (its state_dict loaded into embscale's, as a
    torchrec checkpoint loads): the same features, rows, lengths and indices bit for bit, and SGD's update the
    step torch's gradient gives. The output gradients are multiples of 1/2 in [-2, 2], so each row's summed
    gradient is exact in any order of additions and w - lr * g (lr a power of 2) is one rounding either way."""
    theirs = torchrec.EmbeddingCollection(tables=_shared_configs(), need_indices=True)
    ours = EmbeddingCollection(_shared_configs(), need_indices=True, optimizer="sgd", learning_rate=0.5)
    result = ours.load_state_dict(theirs.state_dict(), strict=False)
    assert result.unexpected_keys == [] and all(k.startswith("tbe.") for k in result.missing_keys)
    before = {n: theirs.embeddings[n].weight.detach().clone() for n, _, _ in TABLES + SHARED}
    for n in before:
        assert torch.equal(ours.embeddings[n].weight, before[n])
    kjt = _random_batch(gen, empty=["d"])
    want, got = theirs(kjt), ours(kjt)
    assert list(got) == list(want)
    grads = {}
    for name in want:
        assert torch.equal(got[name].values(), want[name].values()), name
        assert torch.equal(got[name].lengths(), want[name].lengths()), name
        assert torch.equal(got[name].weights(), want[name].weights()), name
        grads[name] = torch.randint(-4, 5, want[name].values().shape, generator=gen) / 2
    sum((want[k].values() * g).sum() for k, g in grads.items()).backward()
    sum((got[k].values() * g).sum() for k, g in grads.items()).backward()
    for n in before:
        step = before[n] - 0.5 * theirs.embeddings[n].weight.grad
        assert torch.equal(ours.embeddings[n].weight, step), f"table {n}"
    assert not torch.equal(ours.embeddings["t0"].weight, before["t0"])


def test_collection_batches_without_values():
    # Every feature empty: rows [0, DIM] per feature, and a backward that changes nothing.
    ec = _collection("sgd")
    before = ec.tbe.weights.detach().clone()
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=FEATURES, values=torch.zeros(0, dtype=torch.int64),
                                              lengths=torch.zeros(len(FEATURES) * BATCH, dtype=torch.int64))
    out = ec(kjt)
    assert list(out) == FEATURES and all(jt.values().shape == (0, DIM) for jt in out.values())
    assert all(torch.equal(jt.lengths(), torch.zeros(BATCH, dtype=torch.int64)) for jt in out.values())
    assert all(jt.weights_or_none() is None for jt in out.values())  # need_indices off
    sum(jt.values().sum() for jt in out.values()).backward()
    assert torch.equal(ec.tbe.weights, before)


def test_collection_errors():
    def config(name, dim=DIM, feature="x", **kw):
        return EmbeddingConfig(name=name, num_embeddings=4, embedding_dim=dim, feature_names=[feature], **kw)

    with pytest.raises(ValueError, match=r"tables: embedding_dim \[8, 4\] differ"):
        EmbeddingCollection([config("a"), config("b", 4, "y")])
    with pytest.raises(ValueError, match="tables: names"):
        EmbeddingCollection([config("a"), config("a", feature="y")])
    with pytest.raises(ValueError, match="tables: at least one"):
        EmbeddingCollection([])
    with pytest.raises(ValueError, match=r"tables\[0\].data_type: INT8 is not supported"):
        EmbeddingCollection([config("a", data_type=torchrec.DataType.INT8)])
    ec = _collection("sgd")
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["a"], values=torch.tensor([1]), lengths=torch.tensor([1]))
    with pytest.raises(ValueError, match=r"features: keys \['a'\] lack \['b', 'c', 'd', 'e'\]"):
        ec(kjt)


def _plan(ec, per_param, world=2):
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan

    return dict(construct_module_sharding_plan(ec, per_param_sharding=per_param, local_size=world, world_size=world,
                                               device_type="cpu", sharder=EmbeddingCollectionSharder()))


def test_sharder_errors():
    """Plans and modules the sharder cannot serve are refused by name, before anything is changed."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec
    from torchrec.distributed import sharding_plan as sp

    ec = _collection("sgd")
    sharder = EmbeddingCollectionSharder()
    tw = {n: sp.table_wise(rank=0) for n, _, _ in TABLES}
    # TorchRec's sequence sharding reads every column shard with one width: t1 in shards of 4, t2 of 2 and 6
    plan = _plan(ec, {**tw, "t1": sp.column_wise(ranks=[0, 1]), "t2": sp.column_wise(ranks=[0, 1])})
    placements = [m.placement for m in plan["t2"].sharding_spec.shards]
    plan["t2"].sharding_spec = EnumerableShardingSpec([ShardMetadata([0, 0], [50, 2], placements[0]),
                                                       ShardMetadata([0, 2], [50, 6], placements[1])])
    kernels = {n: ps.compute_kernel for n, ps in plan.items()}
    with pytest.raises(ValueError, match=r"params: column shards of widths \{'t1': \[4\], 't2': \[2, 6\]\}"):
        sharder.shard(ec, plan, env=None)
    assert {n: ps.compute_kernel for n, ps in plan.items()} == kernels
    plan = _plan(ec, {**tw, "t3": sp.row_wise()})  # a table of one row over two processes
    with pytest.raises(ValueError, match=r"params\['t3'\]: shards of \[1, 0\] rows"):
        sharder.shard(ec, plan, env=None)
    plan = _plan(ec, tw)
    plan["t0"].sharding_type = "table_row_wise"
    with pytest.raises(ValueError, match=r"params\['t0'\]: sharding_type table_row_wise is not supported"):
        sharder.shard(ec, plan, env=None)
    bags = EmbeddingBagCollection([EmbeddingBagConfig(name="t0", num_embeddings=4, embedding_dim=DIM,
                                                      feature_names=["a"])])
    with pytest.raises(TypeError, match="module: EmbeddingBagCollection is not embscale.torchrec.EmbeddingCollection"):
        sharder.shard(bags, _plan(ec, tw), env=None)
