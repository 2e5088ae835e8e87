"""What the sharded-collection tests share (tests/python/test_torchrec.py, test_torchrec_sequence.py,
test_torchrec_twrw.py, test_torchrec_vbe.py, test_torchrec_placement.py): the bag tables and plans that
test_torchrec.py and test_torchrec_vbe.py train under; a model of one bag collection and its batches; a model
sharded by TorchRec's DistributedModelParallel with a per-table plan, and its training; the local shards of a
collection read back with their optimizer state; the one process that stands for the sharded ones; and
checkpoints of the sharded model saved, loaded and checked."""
import torch
from torch import nn

import embscale
import multiprocess

# The bag collection's tables of test_torchrec.py and test_torchrec_vbe.py: (name, rows, dim, features)
BAG_TABLES = [("t0", 40, 4, ["a", "b"]), ("t1", 30, 8, ["c"]), ("t2", 50, 16, ["d"]), ("t3", 12, 4, ["e"])]


def bag_plan(plan, world):
    """A plan per table of BAG_TABLES ("table_wise", "row_wise", "column_wise", "mixed", else data-parallel);
    with one process every shard is on rank 0 (the column shards of a table too)."""
    from torchrec.distributed import sharding_plan as sp

    def on(*ranks):
        return [r % world for r in ranks]

    if plan == "table_wise":
        return {n: sp.table_wise(rank=i % world) for i, (n, _, _, _) in enumerate(BAG_TABLES)}
    if plan == "row_wise":
        return {n: sp.row_wise() for n, _, _, _ in BAG_TABLES}
    if plan == "column_wise":  # t1 (8 columns) in two column shards on ranks 0 and 1, t2 (16) in four, two on each
        return {"t0": sp.table_wise(rank=world - 1), "t1": sp.column_wise(ranks=on(0, 1)),
                "t2": sp.column_wise(ranks=on(0, 1, 0, 1)), "t3": sp.table_wise(rank=0)}
    if plan == "mixed":
        return {"t0": sp.row_wise(), "t1": sp.table_wise(rank=world - 1), "t2": sp.column_wise(ranks=on(0, 1, 0, 1)),
                "t3": sp.data_parallel()}
    return {n: sp.data_parallel() for n, _, _, _ in BAG_TABLES}


def bag_column_shards(plan, name):
    """How many column shards bag_plan's plan cuts table `name` into."""
    return {("column_wise", "t1"): 2, ("column_wise", "t2"): 4, ("mixed", "t2"): 4}.get((plan, name), 1)


def bag_pieces(plan):
    """The single process's tables for BAG_TABLES under bag_plan's plan: (name, first column, columns); a
    column-wise table is one table per column shard (each keeps its own row-wise state, as TorchRec's column
    shards do)."""
    return [(n, j * d // k, d // k) for n, _, d, _ in BAG_TABLES for k in [bag_column_shards(plan, n)]
            for j in range(k)]


class PooledModel(nn.Module):
    """A model of one bag collection (`ebc`): its pooled features `features` side by side, in that order."""

    def __init__(self, ebc, features):
        super().__init__()
        self.ebc = ebc
        self.features = features

    def forward(self, kjt):
        pooled = self.ebc(kjt).to_dict()  # the sharded module's keys come in the shards' order
        return torch.cat([pooled[f] for f in self.features], 1)


def pooled_batches(gen, tables, world, steps, batch, max_bag, hot=False):
    """Per step, per rank: lengths [features * batch] of 0 to max_bag, values (each feature's within its table's
    rows) and the outputs' gradient [batch, the features' dims]. With `hot`, half the values are rows 0 and 1, so
    that these rows' gradients add up many lookups, whose order then shows in the sums' rounding."""
    features = [f for _, _, _, fs in tables for f in fs]
    rows = {f: e for _, e, _, fs in tables for f in fs}
    dim = sum(d for _, _, d, fs in tables for _ in fs)
    out = []
    for _ in range(steps):
        per_rank = []
        for _ in range(world):
            lengths = torch.randint(0, max_bag + 1, (len(features) * batch,), generator=gen)
            per_feature = lengths.view(len(features), batch).sum(1).tolist()
            values = torch.cat([torch.randint(0, rows[f], (n,), generator=gen) for f, n in zip(features, per_feature)])
            if hot:
                values[torch.rand(values.shape, generator=gen) < 0.5] %= 2
            per_rank.append((lengths, values, torch.randn(batch, dim, generator=gen)))
        out.append(per_rank)
    return out


def global_batch(parts, features, batch, orders=None):
    """One process's batch for the processes' pooled_batches `parts` (one step's, per rank), feature-major: for
    each feature numbered in `features` (a feature may come more than once) the ranks' bags, in the order
    orders[k] for the k-th (rank order where None). Indices, offsets."""
    lengths, idx = [], []
    for k, f in enumerate(features):
        for r in range(len(parts)) if orders is None else orders[k]:
            l, v = parts[r][0], parts[r][1]
            o = torch.cat([torch.zeros(1, dtype=torch.int64), l.cumsum(0)])
            lengths.append(l.view(-1, batch)[f])
            idx.append(v[o[f * batch]:o[(f + 1) * batch]])
    return torch.cat(idx), torch.cat([torch.zeros(1, dtype=torch.int64), torch.cat(lengths).cumsum(0)])


def make_plan(model, attr, sharder, per_param, rank, world, local_size=None):
    """The plan of the collection `model.<attr>` sharded by `sharder` with `per_param` (table name -> a
    torchrec.distributed.sharding_plan entry, or a ParameterSharding made by hand), on this rank's device;
    `local_size`: the processes of a node the plan is made for (the world where None: one node)."""
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan
    from torchrec.distributed.types import ParameterSharding

    generators = {n: (lambda *_, made=p: made) if isinstance(p, ParameterSharding) else p for n, p in per_param.items()}
    return construct_module_sharding_plan(getattr(model, attr), per_param_sharding=generators,
                                          local_size=world if local_size is None else local_size,
                                          world_size=world, device_type=multiprocess.device(rank).type, sharder=sharder)


def distribute(model, attr, sharder, module_plan, rank):
    """DistributedModelParallel of `model` whose collection `model.<attr>` is sharded by `sharder` under
    `module_plan`, on this rank's device."""
    import torch.distributed as dist
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.types import ShardingEnv, ShardingPlan

    return DistributedModelParallel(model, env=ShardingEnv.from_process_group(dist.group.WORLD),
                                    device=multiprocess.device(rank), plan=ShardingPlan({attr: module_plan}),
                                    sharders=[sharder])


def shard(model, attr, sharder, per_param, rank, world, local_size=None):
    """DistributedModelParallel of `model` under make_plan's plan."""
    return distribute(model, attr, sharder, make_plan(model, attr, sharder, per_param, rank, world, local_size), rank)


def train(dmp, rank, features, steps):
    """Trains a sharded PooledModel on this rank's part of each of pooled_batches' steps: its outputs per step."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    dev = multiprocess.device(rank)
    outs = []
    for step in steps:
        lengths, values, target = step[rank]
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=features, values=values, lengths=lengths).to(dev)
        pooled = dmp(kjt)
        (pooled * target.to(dev)).sum().backward()
        outs.append(pooled.detach())
    return outs


def local_shards(collection):
    """(table, (first row, first column), weights, optimizer state) of every local shard of a sharded
    collection."""
    shards = []
    for kernel in collection._embscale_kernels():
        state = kernel.tbe.optimizer_state()
        for t, w, s in zip(kernel.config.embedding_tables, kernel.tbe.split_embedding_weights(), state):
            md = t.local_metadata
            offset = (0, 0) if md is None else tuple(md.shard_offsets)
            shards.append((t.name, offset, w.detach().clone(), {k: v.clone() for k, v in s.items()}))
    return shards


def one_process(pieces, rows, lookups, start, **kw):
    """The TableBatchedEmbeddingBags of the one process that stands for the sharded ones: a table per piece
    (name, first column, columns) of rows[name] rows and start[name]'s columns, each of `lookups` ((feature,
    piece)) looking up its piece; kw: its other arguments (the optimizer's among them)."""
    tbe = embscale.TableBatchedEmbeddingBags([(rows[n], cols) for n, _, cols in pieces],
                                             feature_table_map=[i for _, i in lookups], data_parallel_group=None, **kw)
    with torch.no_grad():
        for w, (n, c0, cols) in zip(tbe.split_embedding_weights(), pieces):
            w.copy_(start[n][:, c0:c0 + cols])
    return tbe


def check_shards(per_rank, pieces, tables, state):
    """Every rank's local shards (per_rank: local_shards' of each rank) against the one process's tables and
    optimizer state per piece, bit for bit; how many elements of each table the shards hold."""
    covered = {}
    for r, shards in enumerate(per_rank):
        for name, (r0, c0), w, st in shards:
            i = next(i for i, (n, pc0, cols) in enumerate(pieces) if n == name and pc0 <= c0 < pc0 + cols)
            want = tables[i][r0:r0 + w.shape[0], c0 - pieces[i][1]:c0 - pieces[i][1] + w.shape[1]]
            assert torch.equal(w, want), f"rank {r}: table {name} shard at {(r0, c0)}"
            for k, v in st.items():
                assert torch.equal(v, state[i][k][r0:r0 + v.shape[0]]), f"rank {r}: {name} {k} at {(r0, c0)}"
            covered[name] = covered.get(name, 0) + w.numel()
    return covered


# ---- checkpoints ------------------------------------------------------------------------------------------------
def save_or_load(dmp, attr, folder, train_steps=None, key_prefix=None):
    """With `train_steps` (a function of no arguments) given: trains by it, then saves the model and its fused
    optimizer with torch.distributed.checkpoint into `folder`; else loads them from there (the model starts from
    the same tables as the saved one did, so the loaded values must come from the checkpoint). Returns the local
    shards of the collection `dmp.module.<attr>` after, and per table the local shards of its row-wise state in
    the fused optimizer's state_dict: (global size, [(offset, values)]); `key_prefix`, where given: what that
    state_dict's every key starts with."""
    import torch.distributed.checkpoint as dcp

    if train_steps is not None:
        train_steps()
        dcp.save({"model": dmp.state_dict(), "optim": dmp.fused_optimizer.state_dict()}, checkpoint_id=folder)
    else:
        state = {"model": dmp.state_dict(), "optim": dmp.fused_optimizer.state_dict()}
        dcp.load(state, checkpoint_id=folder)
        dmp.load_state_dict(state["model"])
        dmp.fused_optimizer.load_state_dict(state["optim"])
    saved_state = {}
    for key, entries in dmp.fused_optimizer.state_dict()["state"].items():
        if key_prefix is not None:
            assert key.startswith(key_prefix), key  # keyed as the model's state_dict keys the tables
        name = key.split(".")[-2]
        st = entries[f"{name}.momentum1"]
        saved_state[name] = (tuple(st.size()), [(s.metadata.shard_offsets[0], s.tensor.clone())
                                                for s in st.local_shards()])
    return local_shards(getattr(dmp.module, attr)), saved_state


def whole(results, name, rows, cols, column_starts):
    """Table `name` ([rows, cols]) and its row-wise state ([rows, column shards]: one per column shard, whose
    first columns are `column_starts`) from every rank's shards (results: save_or_load's of every rank); NaN
    where no shard is."""
    table = torch.full((rows, cols), float("nan"))
    state = torch.full((rows, len(column_starts)), float("nan"))
    for shards, _ in results:
        for n, (r0, c0), w, s in shards:
            if n == name:
                table[r0:r0 + w.shape[0], c0:c0 + w.shape[1]] = w
                state[r0:r0 + w.shape[0], column_starts.index(c0)] = s["sum"]
    return table, state


def check_loaded(after_save, after_load, start, column_starts, loaded_under):
    """A checkpoint saved by one set of processes and loaded by another (save_or_load's of every rank): every
    table and its row-wise state loaded equal the saved ones bit for bit, and the saved tables differ from the
    untrained start (table name -> its tensor). column_starts(results, name): the first columns of the table's
    column shards."""
    for n, w0 in start.items():
        rows, cols = w0.shape
        want, want_state = whole(after_save, n, rows, cols, column_starts(after_save, n))
        got, got_state = whole(after_load, n, rows, cols, column_starts(after_load, n))
        assert not want.isnan().any() and not got.isnan().any(), f"table {n}: shards cover it"
        assert torch.equal(got, want), f"table {n}: loaded under {loaded_under}"
        assert torch.equal(got_state, want_state), f"table {n}: row-wise state loaded under {loaded_under}"
        assert not torch.equal(want, w0), f"table {n}: training changed it"


def check_state_positions(results, sizes, column_shards):
    """The fused optimizer's row-wise state as TorchRec's FUSED kernels lay it out: [rows] at the shards' rows,
    or for a table of k column shards [k * rows], the j-th column shard from the left at [j * rows, (j+1) *
    rows), its row shards (grid) at their rows there. results: save_or_load's of every rank; sizes: table ->
    (rows, columns); column_shards(table, its shard's columns): how many column shards the table is cut into."""
    for r, (shards, saved) in enumerate(results):
        for n, (r0, c0), w, s in shards:
            rows, cols = sizes[n]
            k = column_shards(n, w.shape[1])
            size, local = saved[n]
            at = c0 // (cols // k) * rows + r0
            assert size == (rows * k,), f"rank {r}: table {n} state size"
            assert [torch.equal(v, s["sum"]) for o, v in local if o == at] == [True], \
                f"rank {r}: table {n}, shard at {(r0, c0)}: its state at {at}"


def reshards(worlds):
    """(plan, world size) saved -> loaded of the bag and sequence collections' checkpoint tests: across world
    sizes where the processes allow it, else (one GPU) across plans in one process."""
    if max(worlds) > 1:
        return [(("table_wise", 2), ("row_wise", 3)), (("row_wise", 3), ("table_wise", 2)),
                (("column_wise", 2), ("column_wise", 3))]
    return [(("table_wise", 1), ("row_wise", 1)), (("column_wise", 1), ("column_wise", 1))]
