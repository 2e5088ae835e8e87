"""embscale under TorchRec: DistributedModelParallel with embscale's kernels (gloo, 1, 2 and 3 processes
on this machine; NCCL with one GPU a process under EMBSCALE_TEST_DIST_DEVICE=cuda, 1 process on a machine
of one GPU: multiprocess.worlds()) trains like one process with the global batch, for table-wise, row-wise,
column-wise, data-parallel and mixed plans, SUM and MEAN pooling, row-wise Adagrad and SGD: forward
outputs, tables and optimizer state after several steps, bit for bit. Skipped where torchrec is not
installed (scripts/test_torchrec.sh makes an environment that has it)."""
import copy

import pytest
import torch
from torch import nn

torchrec = pytest.importorskip("torchrec", reason="torchrec is not installed (pip install .[torchrec]; "
                                                  "scripts/test_torchrec.sh runs these tests)")

import embscale  # noqa: E402
import multiprocess  # noqa: E402
import torchrec_sharding  # noqa: E402
from embscale.torchrec import EmbeddingBagCollection, EmbeddingBagCollectionSharder  # noqa: E402
from torchrec.modules.embedding_configs import EmbeddingBagConfig  # noqa: E402
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor  # noqa: E402

TABLES = [("t0", 40, 4, ["a", "b"]), ("t1", 30, 8, ["c"]), ("t2", 50, 16, ["d"]), ("t3", 12, 4, ["e"])]
FEATURES = [f for _, _, _, fs in TABLES for f in fs]
FEATURE_DIMS = [d for _, _, d, fs in TABLES for _ in fs]
BATCH = 4
MAX_BAG = 3
STEPS = 3
PLANS = ["table_wise", "row_wise", "column_wise", "data_parallel", "mixed"]
OPTIMIZERS = {"rowwise_adagrad": {"learning_rate": 0.3, "eps": 0.1}, "sgd": {"learning_rate": 0.3}}
# (plan, optimizer, pooling): every plan with both optimizers pooling SUM, and every plan pooling MEAN. Under
# MEAN a plan with a row-wise table (row_wise, mixed) has TorchRec divide the pooled sums after the output
# distribution; the others pool MEAN in the kernels.
CASES = ([(plan, opt, "sum") for plan in PLANS for opt in OPTIMIZERS] +
         [(plan, opt, "mean") for plan, opt in [("table_wise", "sgd"), ("row_wise", "rowwise_adagrad"),
                                               ("column_wise", "sgd"), ("data_parallel", "rowwise_adagrad"),
                                               ("mixed", "rowwise_adagrad")]])
# TorchRec's MEAN where a row-wise table is in the collection: SUM, divided by the bag's length plus this
# (torchrec.distributed.embeddingbag._create_mean_pooling_divisor).
TORCHREC_MEAN_EPS = 1e-6


def _configs(pooling="sum"):
    return [EmbeddingBagConfig(name=n, num_embeddings=e, embedding_dim=d, feature_names=fs,
                               pooling=getattr(torchrec.PoolingType, pooling.upper())) for n, e, d, fs in TABLES]


def _collection(optimizer, device, pooling="sum", **kw):
    torch.manual_seed(7)
    tables = EmbeddingBagCollection(_configs(pooling), optimizer=optimizer, **OPTIMIZERS[optimizer], **kw)
    return tables.to(device)  # drawn on the CPU: the same tables on every device


class _Model(nn.Module):
    def __init__(self, ebc):
        super().__init__()
        self.ebc = ebc

    def forward(self, kjt):
        pooled = self.ebc(kjt).to_dict()  # the sharded module's keys come in the shards' order
        return torch.cat([pooled[f] for f in FEATURES], 1)


def _per_param(plan, world):
    """A plan per table; with one process every shard is on rank 0 (the column shards of a table too)."""
    from torchrec.distributed import sharding_plan as sp

    def on(*ranks):
        return [r % world for r in ranks]

    if plan == "table_wise":
        return {n: sp.table_wise(rank=i % world) for i, (n, _, _, _) in enumerate(TABLES)}
    if plan == "row_wise":
        return {n: sp.row_wise() for n, _, _, _ in TABLES}
    if plan == "column_wise":  # t1 (8 columns) in two column shards on ranks 0 and 1, t2 (16) in four, two on each
        return {"t0": sp.table_wise(rank=world - 1), "t1": sp.column_wise(ranks=on(0, 1)),
                "t2": sp.column_wise(ranks=on(0, 1, 0, 1)), "t3": sp.table_wise(rank=0)}
    if plan == "mixed":
        return {"t0": sp.row_wise(), "t1": sp.table_wise(rank=world - 1), "t2": sp.column_wise(ranks=on(0, 1, 0, 1)),
                "t3": sp.data_parallel()}
    return {n: sp.data_parallel() for n, _, _, _ in TABLES}


def _sharded_model(rank, world, plan, optimizer, pooling="sum"):
    model = _Model(_collection(optimizer, multiprocess.device(rank), pooling))
    return torchrec_sharding.shard(model, "ebc", EmbeddingBagCollectionSharder(), _per_param(plan, world), rank, world)


def _train(dmp, rank, steps):
    dev = multiprocess.device(rank)
    outs = []
    for step in steps:
        lengths, values, target = step[rank]
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=FEATURES, values=values, lengths=lengths).to(dev)
        pooled = dmp(kjt)
        (pooled * target.to(dev)).sum().backward()
        outs.append(pooled.detach())
    return outs


def _local_shards(dmp):
    return torchrec_sharding.local_shards(dmp.module.ebc)


def _standard_optimizer(model, fused):
    """TorchRec's usual optimizer setup: the fused optimizer beside a dense one (SGD) over the parameters
    in_backward_optimizer_filter leaves (those not trained in the backward); the dense one's keys."""
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    dense = dict(in_backward_optimizer_filter(model.named_parameters()))
    dense["dense_layer"] = nn.Parameter(torch.zeros(2))  # a model's dense part: torch's SGD wants one parameter
    CombinedOptimizer([fused, KeyedOptimizerWrapper(dense, lambda params: torch.optim.SGD(params, lr=0.1))])
    return sorted(dense)


def _worker(rank, world, cases, batches):
    out = []
    for (plan, optimizer, pooling), steps in zip(cases, batches):
        dmp = _sharded_model(rank, world, plan, optimizer, pooling)
        outs = _train(dmp, rank, steps)
        out.append((outs, _local_shards(dmp), _standard_optimizer(dmp, dmp.fused_optimizer)))
    return out


def _batches(gen, world):
    rows = {f: e for _, e, _, fs in TABLES for f in fs}
    steps = []
    for _ in range(STEPS):
        per_rank = []
        for _ in range(world):
            lengths = torch.randint(0, MAX_BAG + 1, (len(FEATURES) * BATCH,), generator=gen)
            per_feature = lengths.view(len(FEATURES), BATCH).sum(1).tolist()
            values = torch.cat([torch.randint(0, rows[f], (n,), generator=gen) for f, n in zip(FEATURES, per_feature)])
            per_rank.append((lengths, values, torch.randn(BATCH, sum(FEATURE_DIMS), generator=gen)))
        steps.append(per_rank)
    return steps


def _global_batch(parts, features):
    """The processes' batches side by side in rank order, feature-major, for the features numbered
    `features` (a feature may come more than once): indices, offsets."""
    F = len(FEATURES)
    lengths = torch.cat([l.view(F, BATCH)[features] for l, _, _ in parts], 1)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.reshape(-1).cumsum(0)])
    idx = []
    for f in features:
        for l, v, _ in parts:
            o = torch.cat([torch.zeros(1, dtype=torch.int64), l.cumsum(0)])
            idx.append(v[o[f * BATCH]:o[(f + 1) * BATCH]])
    return torch.cat(idx), offsets


def _column_shards(plan, name):
    """How many column shards _per_param's plan cuts table `name` into."""
    return {("column_wise", "t1"): 2, ("column_wise", "t2"): 4, ("mixed", "t2"): 4}.get((plan, name), 1)


def _reference_pieces(plan, world):
    """The single process's tables: (name, first column, columns); a column-wise table is one table per
    column shard (each keeps its own row-wise state, as TorchRec's column shards do)."""
    pieces = []
    for n, _, d, _ in TABLES:
        k = _column_shards(plan, n)
        pieces += [(n, j * d // k, d // k) for j in range(k)]
    return pieces


# One process too on gloo (cheap: one more group of processes): the world of a machine of one GPU.
WORLDS = multiprocess.worlds(on_cpu=(1, 2, 3))


@pytest.fixture(scope="module", params=WORLDS)
def run(request):
    world = request.param
    multiprocess.skip_unless_enough_devices(world)
    gen = torch.Generator().manual_seed(world)
    batches = [_batches(gen, world) for _ in CASES]
    results = multiprocess.run(_worker, world, CASES, batches, timeout=600)
    return world, CASES, batches, results


@pytest.mark.parametrize("plan, optimizer, pooling", CASES)
def test_sharded_training_matches_one_process(run, plan, optimizer, pooling):
    # MEAN with a row-wise table was divided twice (issue 46): the kernels pooled MEAN and TorchRec divided
    # their outputs by the bags' lengths again.
    world, cases, batches, results = run
    case = cases.index((plan, optimizer, pooling))
    dev = multiprocess.device()
    full = _collection(optimizer, dev, pooling, data_parallel_group=None)
    pieces = _reference_pieces(plan, world)
    rows = {n: e for n, e, _, _ in TABLES}
    table_features = {n: fs for n, _, _, fs in TABLES}
    # A feature of a column-wise table looks up each of its pieces; their columns come out side by side.
    ref_features = [(FEATURES.index(f), i) for f in FEATURES for i, (n, _, _) in enumerate(pieces)
                    if f in table_features[n]]
    divided_after = pooling == "mean" and plan in ("row_wise", "mixed")
    ref = embscale.TableBatchedEmbeddingBags([(rows[n], cols) for n, _, cols in pieces],
                                             feature_table_map=[i for _, i in ref_features], optimizer=optimizer,
                                             pooling="sum" if divided_after else pooling,
                                             data_parallel_group=None, device=dev, **OPTIMIZERS[optimizer])
    ref_dims = [pieces[i][2] for _, i in ref_features]
    tables = dict(zip([c.name for c in full.embedding_bag_configs()], full.tbe.split_embedding_weights()))
    with torch.no_grad():
        for w, (n, c0, cols) in zip(ref.split_embedding_weights(), pieces):
            w.copy_(tables[n][:, c0:c0 + cols])
    for s, parts in enumerate(batches[case]):
        indices, offsets = _global_batch(parts, [f for f, _ in ref_features])
        indices, offsets = indices.to(dev), offsets.to(dev)
        pooled = ref(indices, offsets)
        out, divisor = pooled, 1.0
        if divided_after:  # each output column divided by its bag's length (+ TorchRec's eps)
            lengths = offsets.diff().view(len(ref_features), -1).cpu()
            divisor = torch.repeat_interleave(lengths.T, torch.tensor(ref_dims), dim=1) + TORCHREC_MEAN_EPS
            out = pooled.detach() / divisor.to(dev)
        if plan in ("row_wise", "mixed"):
            # A bag's rows on different shards are pooled per shard and the partial sums added (TorchRec's
            # reduce-scatter): the order of the additions differs from one process's, so each output may
            # differ by the rounding of its additions: at most 2 (L - 1) 2^-24 sum |row| for bags of L rows,
            # then divided (MEAN; the division's own rounding adds at most 2^-23 |output|).
            magnitude = copy.deepcopy(ref)
            with torch.no_grad():
                magnitude.weights.abs_()
            bound = 2 * (MAX_BAG - 1) * 2.0**-24 * magnitude(indices, offsets).detach().cpu() / divisor
            bound += 2.0**-23 * out.detach().abs().cpu()
        for r in range(world):
            got, want = results[r][case][0][s], out[r * BATCH:(r + 1) * BATCH].detach().cpu()
            if plan in ("row_wise", "mixed"):
                assert ((got - want).abs() <= bound[r * BATCH:(r + 1) * BATCH]).all(), f"step {s}, rank {r}: forward"
            else:
                assert torch.equal(got, want), f"step {s}, rank {r}: forward"
        # TorchRec divides the output gradients by the MEAN divisor first (its callback runs after the output
        # distribution), then by the world size (the output distribution's backward): the same order here.
        grad = torch.cat([t for _, _, t in parts]).to(dev)
        if divided_after:
            grad = grad / divisor.to(dev)
        pooled.backward(grad / world)
    ref_state = [{k: v.cpu() for k, v in s.items()} for s in ref.optimizer_state()]
    ref_tables = [w.detach().cpu() for w in ref.split_embedding_weights()]
    covered = {}
    for r in range(world):
        for name, (r0, c0), w, state in results[r][case][1]:
            i = next(i for i, (n, pc0, cols) in enumerate(pieces) if n == name and pc0 <= c0 < pc0 + cols)
            want = ref_tables[i][r0:r0 + w.shape[0], c0 - pieces[i][1]:c0 - pieces[i][1] + w.shape[1]]
            assert torch.equal(w, want), f"rank {r}: table {name} shard at {(r0, c0)}"
            for k, v in state.items():
                assert torch.equal(v, ref_state[i][k][r0:r0 + v.shape[0]]), f"rank {r}: {name} {k} at {(r0, c0)}"
            covered[name] = covered.get(name, 0) + w.numel()
    for n, e, d, _ in TABLES:
        replicas = world if plan == "data_parallel" or (plan == "mixed" and n == "t3") else 1
        assert covered[n] == e * d * replicas, f"table {n}: shards cover it"


@pytest.mark.parametrize("plan", PLANS)
def test_sharded_tables_are_left_out_of_the_dense_optimizer(run, plan):
    # TorchRec's usual CombinedOptimizer([model.fused_optimizer, KeyedOptimizerWrapper(dict(
    # in_backward_optimizer_filter(model.named_parameters())), ...)]) raised "Duplicate param key
    # ebc.embedding_bags.t0.weight" (issue 47): the shards' parameters were not tagged as trained in the
    # backward, so the filter handed them to the dense optimizer too.
    world, cases, _, results = run
    case = next(i for i, c in enumerate(cases) if c[0] == plan)
    for r in range(world):
        assert results[r][case][2] == ["dense_layer"], f"rank {r}: the dense optimizer's parameters"


def test_collection_tables_are_left_out_of_the_dense_optimizer():
    # The unsharded collection under TorchRec's usual setup (issue 47): its fused optimizer holds the tables
    # (keyed as the model's state_dict keys them), the dense one the rest, and a step trains both.
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    torch.manual_seed(2)
    model = nn.ModuleDict({"ebc": EmbeddingBagCollection(_configs(), optimizer="sgd", learning_rate=0.5),
                           "dense": nn.Linear(sum(FEATURE_DIMS), 1)})
    dense = dict(in_backward_optimizer_filter(model.named_parameters()))
    opt = CombinedOptimizer([("ebc", model["ebc"].fused_optimizer),
                             KeyedOptimizerWrapper(dense, lambda params: torch.optim.SGD(params, lr=0.25))])
    tables = {f"ebc.embedding_bags.{n}.weight" for n, _, _, _ in TABLES}
    assert set(opt.params) >= tables and not tables & set(dense) and {"dense.weight", "dense.bias"} <= set(dense)
    assert not any(k.startswith("ebc.") for k in dense), sorted(dense)
    lengths = torch.tensor([1, 2, 0, 1, 1, 1, 2, 0, 1, 1, 0, 2, 1, 0, 1, 1, 2, 1, 1, 1])
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=FEATURES, values=torch.arange(1, 11).repeat(2), lengths=lengths)
    w, b = model["dense"].weight.detach().clone(), model["dense"].bias.detach().clone()
    tables_before = model["ebc"].tbe.weights.detach().clone()
    pooled = model["ebc"](kjt).values()
    model["dense"](pooled).sum().backward()
    opt.step()
    # SGD's rule written out: the gradient of sum(pooled @ w.T + b) is pooled's column sums for w, B for b
    assert torch.allclose(model["dense"].weight, w - 0.25 * pooled.detach().sum(0), rtol=0, atol=1e-6)
    assert torch.equal(model["dense"].bias, b - 0.25 * 4)
    assert not torch.equal(model["ebc"].tbe.weights, tables_before)  # the fused optimizer trained the tables


def test_collection_is_torchrecs_module_on_one_tbe(gen):
    ebc = _collection("rowwise_adagrad", torch.device("cpu"))
    lengths, values, _ = _batches(gen, 1)[0][0]
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=FEATURES, values=values, lengths=lengths)
    pooled = ebc(kjt.permute(list(range(len(FEATURES)))[::-1]))  # keys in any order
    assert pooled.keys() == FEATURES and pooled.length_per_key() == FEATURE_DIMS
    want = ebc.tbe(kjt.values(), kjt.offsets(), None)
    assert torch.equal(pooled.values(), want)
    opt = ebc.fused_optimizer
    # keyed as the module's state_dict and TorchRec's sharded collection key them
    assert list(opt.params) == [f"embedding_bags.{n}.weight" for n, _, _, _ in TABLES]
    assert torch.equal(opt.params["embedding_bags.t1.weight"], ebc.tbe.split_embedding_weights()[1])
    assert list(opt.state[opt.params["embedding_bags.t2.weight"]]) == ["t2.momentum1"]
    assert opt.state[opt.params["embedding_bags.t2.weight"]]["t2.momentum1"].shape == (50,)
    opt.param_groups[0]["lr"] = 0.125
    opt.step()
    assert ebc.tbe.learning_rate == 0.125
    assert {k for k in ebc.state_dict() if k.startswith("embedding_bags.")} == \
        {f"embedding_bags.{n}.weight" for n, _, _, _ in TABLES}


def test_collection_errors():
    with pytest.raises(ValueError, match="tables: pooling"):
        EmbeddingBagCollection([EmbeddingBagConfig(name="a", num_embeddings=4, embedding_dim=4, feature_names=["x"],
                                                   pooling=torchrec.PoolingType.MEAN),
                                EmbeddingBagConfig(name="b", num_embeddings=4, embedding_dim=4, feature_names=["y"])])
    with pytest.raises(ValueError, match="tables: names"):
        EmbeddingBagCollection([EmbeddingBagConfig(name="a", num_embeddings=4, embedding_dim=4, feature_names=["x"]),
                                EmbeddingBagConfig(name="a", num_embeddings=4, embedding_dim=4, feature_names=["y"])])
    ebc = EmbeddingBagCollection(_configs())
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=["a"], values=torch.tensor([1]), lengths=torch.tensor([1]))
    with pytest.raises(ValueError, match=r"features: keys \['a'\] lack \['b', 'c', 'd', 'e'\]"):
        ebc(kjt)
    # A batch size per feature (torchrec's variable batch) was misread (review of 2026-12-03): refused without
    # inverse_indices (tests/python/test_torchrec_vbe.py tests such batches with them).
    vbe = KeyedJaggedTensor(keys=FEATURES, values=torch.tensor([1, 2, 3, 4, 5]), lengths=torch.tensor([1, 1, 2, 1, 0]),
                            stride_per_key_per_rank=[[3], [1], [1], [0], [0]])
    with pytest.raises(ValueError, match="features: a batch size per feature"):
        ebc(vbe)


def _checkpoint_worker(rank, world, plan, optimizer, folder, steps):
    """Trains `steps` and saves the model and its fused optimizer with torch.distributed.checkpoint (steps
    given), or loads them (steps None; the model starts from the same tables as the saved one did, so the
    loaded values must come from the checkpoint); the local shards after, and per table the local shards
    of its row-wise state in the fused optimizer's state_dict: (global size, [(offset, values)])."""
    import torch.distributed.checkpoint as dcp

    dmp = _sharded_model(rank, world, plan, optimizer)
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
        name = key.split(".")[-2]
        st = entries[f"{name}.momentum1"]
        saved_state[name] = (tuple(st.size()), [(s.metadata.shard_offsets[0], s.tensor.clone())
                                                for s in st.local_shards()])
    return _local_shards(dmp), saved_state


def _whole(results, name, rows, cols, column_pieces):
    """Table `name` and its row-wise state assembled from every rank's shards ([rows, cols] and [rows,
    column pieces]: a column-wise table keeps one row-wise state per column shard)."""
    table = torch.full((rows, cols), float("nan"))
    state = torch.full((rows, column_pieces), float("nan"))
    for shards, _ in results:
        for n, (r0, c0), w, s in shards:
            if n != name:
                continue
            table[r0:r0 + w.shape[0], c0:c0 + w.shape[1]] = w
            if "sum" in s:
                state[r0:r0 + w.shape[0], c0 * column_pieces // cols] = s["sum"]
    return table, state


def _check_state_positions(results, plan):
    """The fused optimizer's row-wise state as TorchRec's FUSED kernels lay it out: [rows] sharded as the
    rows, or for a table of k column shards [k * rows] with the shard of columns [j * d/k, (j+1) * d/k) at
    [j * rows, (j+1) * rows), whichever process holds it."""
    for r, (shards, saved) in enumerate(results):
        for n, (r0, c0), w, s in shards:
            e, d = next((e, d) for name, e, d, _ in TABLES if name == n)
            k = _column_shards(plan, n)
            size, local = saved[n]
            at = c0 // (d // k) * e if k > 1 else r0
            assert size == (e * k,), f"rank {r}: table {n} state size"
            assert [torch.equal(v, s["sum"]) for o, v in local if o == at] == [True], \
                f"rank {r}: table {n}, shard of column {c0}: its state at {at}"


# (plan, world size) saved -> loaded: across world sizes where the processes allow it, else (one GPU) across
# plans in one process.
RESHARDS = ([(("table_wise", 2), ("row_wise", 3)), (("row_wise", 3), ("table_wise", 2)),
             (("column_wise", 2), ("column_wise", 3))] if max(WORLDS) > 1 else
            [(("table_wise", 1), ("row_wise", 1)), (("column_wise", 1), ("column_wise", 1))])


@pytest.mark.parametrize("saved, loaded", RESHARDS)
def test_checkpoint_reshards(tmp_path, saved, loaded):
    """A checkpoint of the sharded model and its fused optimizer (torch.distributed.checkpoint) taken under
    one plan and world size loads into another: every table and its row-wise Adagrad state equal the
    saved ones bit for bit, and differ from the untrained start. The state is checked against the column
    positions too: saving and loading with the same code, a mistake made both ways (say columns numbered
    from the right) would round-trip."""
    (plan_a, world_a), (plan_b, world_b) = saved, loaded
    multiprocess.skip_unless_enough_devices(max(world_a, world_b))
    gen = torch.Generator().manual_seed(11)
    steps = _batches(gen, world_a)
    folder = str(tmp_path / "checkpoint")
    after_save = multiprocess.run(_checkpoint_worker, world_a, plan_a, "rowwise_adagrad", folder, steps, timeout=300)
    after_load = multiprocess.run(_checkpoint_worker, world_b, plan_b, "rowwise_adagrad", folder, None, timeout=300)
    start_tables = _collection("rowwise_adagrad", torch.device("cpu")).tbe.split_embedding_weights()
    for (n, e, d, _), start in zip(TABLES, start_tables):
        pieces = _column_shards(plan_a, n)
        want, want_state = _whole(after_save, n, e, d, pieces)
        got, got_state = _whole(after_load, n, e, d, pieces)
        assert not want.isnan().any() and not got.isnan().any(), f"table {n}: shards cover it"
        assert torch.equal(got, want), f"table {n}: loaded under {plan_b} x {world_b}"
        assert torch.equal(got_state, want_state), f"table {n}: row-wise state loaded under {plan_b} x {world_b}"
        assert not torch.equal(want, start), f"table {n}: training changed it"
    _check_state_positions(after_save, plan_a)
    _check_state_positions(after_load, plan_b)


def test_sharder_refuses_shards_of_one_table_on_one_process_of_different_widths():
    # Several column shards of one table on one process are stacked on their rows (as TorchRec stacks
    # them), which needs one width: a plan otherwise is refused by name, before anything is changed.
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec
    from torchrec.distributed.sharding_plan import column_wise, construct_module_sharding_plan, table_wise

    ebc = EmbeddingBagCollection(_configs())
    sharder = EmbeddingBagCollectionSharder()
    per_param = {"t0": table_wise(rank=0), "t1": table_wise(rank=1), "t2": column_wise(ranks=[0, 1, 0, 1]),
                 "t3": table_wise(rank=0)}
    plan = construct_module_sharding_plan(ebc, per_param_sharding=per_param,
                                          local_size=2, world_size=2, device_type="cpu", sharder=sharder)
    spec = plan["t2"].sharding_spec.shards
    widths = [2, 4, 6, 4]  # rank 0 holds 2 and 6 columns
    plan["t2"].sharding_spec = EnumerableShardingSpec([
        ShardMetadata([0, sum(widths[:i])], [50, w], m.placement) for i, (w, m) in enumerate(zip(widths, spec))])
    kernels = {n: ps.compute_kernel for n, ps in plan.items()}
    with pytest.raises(ValueError, match=r"params\['t2'\]: rank 0 holds 2 column shards of widths \[2, 6\]"):
        sharder.shard(ebc, dict(plan), env=None)
    assert {n: ps.compute_kernel for n, ps in plan.items()} == kernels  # refused before anything was changed


# ---- the configs' data_type and init (review of 2026-12-03: both were ignored) ----------------------------------
def _config(name="t0", feature="a", **kw):
    return EmbeddingBagConfig(name=name, num_embeddings=10, embedding_dim=4, feature_names=[feature], **kw)


@pytest.mark.parametrize("data_type, dtype", [("FP32", torch.float32), ("FP16", torch.float16),
                                              ("BF16", torch.bfloat16)])
def test_collection_tables_take_the_configs_data_type(data_type, dtype):
    # A config of FP16 tables trained fp32 tables without a word.
    ebc = EmbeddingBagCollection([_config(data_type=getattr(torchrec.DataType, data_type))])
    assert ebc.tbe.weights.dtype == dtype and ebc.embedding_bags["t0"].weight.dtype == dtype


def test_collection_refuses_data_types_it_cannot_hold():
    with pytest.raises(ValueError, match=r"tables\[0\].data_type: INT8 is not supported"):
        EmbeddingBagCollection([_config(data_type=torchrec.DataType.INT8)])
    with pytest.raises(ValueError, match="tables: data types .* differ"):
        EmbeddingBagCollection([_config(data_type=torchrec.DataType.FP16), _config("t1", "b")])
    with pytest.raises(ValueError, match="weights_dtype: torch.float16 differs from the tables' data_type"):
        EmbeddingBagCollection([_config()], weights_dtype=torch.float16)


def test_collection_tables_are_drawn_by_the_configs_init():
    # weight_init_min / weight_init_max and init_fn, as torchrec's EmbeddingBagCollection draws its tables.
    ebc = EmbeddingBagCollection([_config(weight_init_min=0.5, weight_init_max=0.625),
                                  _config("t1", "b", init_fn=lambda w: torch.nn.init.constant_(w, 3.0))])
    w0, w1 = ebc.tbe.split_embedding_weights()
    assert 0.5 <= w0.min() and w0.max() <= 0.625 and w0.unique().numel() > 1
    assert torch.equal(w1, torch.full_like(w1, 3.0))
    bound = (1 / 10) ** 0.5  # the default: torchrec's +-sqrt(1/num_embeddings)
    w = EmbeddingBagCollection([_config()]).tbe.split_embedding_weights()[0]
    assert -bound <= w.min() and w.max() <= bound


def _meta_data_parallel_worker(rank, world):
    """A collection built on the meta device under a data-parallel plan, each process drawing from its own
    seed: the replicas' tables after sharding."""
    torch.manual_seed(100 + rank)
    import torch.distributed as dist
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan
    from torchrec.distributed.types import ShardingEnv, ShardingPlan

    sharder = EmbeddingBagCollectionSharder()
    dev = multiprocess.device(rank)
    model = _Model(EmbeddingBagCollection(_configs(), optimizer="sgd", learning_rate=0.1, device="meta"))
    module_plan = construct_module_sharding_plan(model.ebc, per_param_sharding=_per_param("data_parallel", world),
                                                 local_size=world, world_size=world, device_type=dev.type,
                                                 sharder=sharder)
    dmp = DistributedModelParallel(model, env=ShardingEnv.from_process_group(dist.group.WORLD), device=dev,
                                   plan=ShardingPlan({"ebc": module_plan}), sharders=[sharder])
    return [w for _, _, w, _ in _local_shards(dmp)]


def test_data_parallel_replicas_of_a_meta_collection_start_equal():
    # Each process draws its own tables; the replicas must then take one process's, or they train apart.
    multiprocess.skip_unless_enough_devices(2)
    first, second = multiprocess.run(_meta_data_parallel_worker, 2, timeout=300)
    assert len(first) == len(TABLES) and all(torch.equal(a, b) for a, b in zip(first, second))


@pytest.mark.parametrize("device", ["meta", "cpu"])
def test_collection_loaded_with_assign_keeps_its_tables_views(device):
    # (review of 2026-12-03) With assign=True torch installed the checkpoint's own tensors as
    # embedding_bags.<table>.weight: no longer views of the module's tables, they went stale as it trained,
    # were saved stale, and the fused optimizer kept the old (meta) views.
    torch.manual_seed(3)
    source = EmbeddingBagCollection(_configs(), optimizer="sgd", learning_rate=0.5)
    m = EmbeddingBagCollection(_configs(), optimizer="sgd", learning_rate=0.5, device=device)
    m.load_state_dict(source.state_dict(), assign=True)
    for t, w in zip(m.embedding_bags, source.tbe.split_embedding_weights()):
        assert torch.equal(m.embedding_bags[t].weight, w)
    lengths = torch.tensor([1, 2, 0, 1, 1, 1, 2, 0, 1, 1, 0, 2, 1, 0, 1, 1, 2, 1, 1, 1])
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=FEATURES, values=torch.arange(1, 11).repeat(2), lengths=lengths)
    m(kjt).values().sum().backward()
    trained = [w.clone() for w in m.tbe.split_embedding_weights()]
    assert not torch.equal(trained[0], source.tbe.split_embedding_weights()[0])  # it did train
    sd = m.state_dict()
    for t, w in zip(m.embedding_bags, trained):
        assert torch.equal(m.embedding_bags[t].weight, w) and torch.equal(sd[f"embedding_bags.{t}.weight"], w)
        assert torch.equal(m.fused_optimizer.params[f"embedding_bags.{t}.weight"], w)
    # A torchrec-style checkpoint (tables only, torchrec's keys) loaded with assign into a meta collection.
    tables_only = {k: v for k, v in sd.items() if k.startswith("embedding_bags.")}
    fresh = EmbeddingBagCollection(_configs(), optimizer="sgd", learning_rate=0.5, device="meta")
    fresh.load_state_dict(tables_only, strict=False, assign=True)
    assert all(torch.equal(a, b) for a, b in zip(fresh.tbe.split_embedding_weights(), trained))


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "torch.save"])
def test_collection_copies_keep_their_tables_views(how, tmp_path):
    # (review of 2026-12-04) copy.deepcopy and pickle gave a collection whose embedding_bags.<table>.weight
    # and fused optimizer held copies of the tables, not views: the copy trained its tables while its
    # state_dict and optimizer kept the values of the moment it was copied.
    import pickle
    torch.manual_seed(5)
    ebc = EmbeddingBagCollection(_configs(), optimizer="sgd", learning_rate=0.5)
    if how == "deepcopy":
        m = copy.deepcopy(ebc)
    elif how == "pickle":
        m = pickle.loads(pickle.dumps(ebc))
    else:
        torch.save(ebc, tmp_path / "ebc.pt")
        m = torch.load(tmp_path / "ebc.pt", weights_only=False)
    for t, (mine, theirs) in enumerate(zip(m.tbe.split_embedding_weights(), ebc.tbe.split_embedding_weights())):
        assert torch.equal(mine, theirs) and mine.data_ptr() != theirs.data_ptr()
    lengths = torch.tensor([1, 2, 0, 1, 1, 1, 2, 0, 1, 1, 0, 2, 1, 0, 1, 1, 2, 1, 1, 1])
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=FEATURES, values=torch.arange(1, 11).repeat(2), lengths=lengths)
    before = [w.clone() for w in ebc.tbe.split_embedding_weights()]
    m(kjt).values().sum().backward()
    trained = m.tbe.split_embedding_weights()
    assert not torch.equal(trained[0], before[0])  # the copy trained
    assert all(torch.equal(a, b) for a, b in zip(ebc.tbe.split_embedding_weights(), before))  # the original did not
    sd = m.state_dict()
    for t, w in zip(m.embedding_bags, trained):
        assert torch.equal(m.embedding_bags[t].weight, w) and torch.equal(sd[f"embedding_bags.{t}.weight"], w)
        assert torch.equal(m.fused_optimizer.params[f"embedding_bags.{t}.weight"], w)
