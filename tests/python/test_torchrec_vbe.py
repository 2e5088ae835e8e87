"""embscale.torchrec on TorchRec's variable batch ("VBE"): a KeyedJaggedTensor whose features have batch sizes of
their own (stride_per_key_per_rank) and inverse_indices, which expand each feature's bags to the batch (sample b of
feature f pools bag inverse_indices[f][b]).

Unsharded: the bag collection against torchrec's own EmbeddingBagCollection given the same tables (forward, and
three SGD steps of torch's gradient on torchrec's module) and against a naive float64 reference written from the
maths (SUM and MEAN, with and without per-sample weights, row-wise Adagrad and SGD, three steps); the sequence
collection against torchrec's EmbeddingCollection. Edge cases: features of batch 1 and 0, empty bags, a feature
of empty bags only, an output batch larger than every feature's, the batch's keys and the inverse_indices' keys
in other orders, no inverse_indices, inverse_indices on a batch of one batch size, and bad inverse_indices.

Sharded under DistributedModelParallel (gloo, 2 and 3 processes): table-wise, row-wise, column-wise,
data-parallel and mixed plans, and a table-wise plan with two shard groups on one process, SUM and MEAN, weighted
and not, row-wise Adagrad and SGD, train like one process on the global batch (the processes' batches side by
side in rank order, each feature's bags and inverse_indices joined): forward outputs, tables and optimizer state
after three steps. The sequence collection, sharded, expands each feature's rows by inverse_indices as TorchRec's
does. Skipped where torchrec is not installed (scripts/test_torchrec.sh makes an environment that has it)."""
import copy

import pytest
import torch
from torch import nn

torchrec = pytest.importorskip("torchrec", reason="torchrec is not installed (pip install .[torchrec]; "
                                                  "scripts/test_torchrec.sh runs these tests)")

import multiprocess  # noqa: E402
import tbe_reference as ref  # noqa: E402
import torchrec_sharding  # noqa: E402
from embscale.torchrec import (EmbeddingBagCollection, EmbeddingBagCollectionSharder,  # noqa: E402
                               EmbeddingCollection, EmbeddingCollectionSharder, QuantEmbeddingBagCollection)
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig  # noqa: E402
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor  # noqa: E402

TABLES = torchrec_sharding.BAG_TABLES
FEATURES = [f for _, _, _, fs in TABLES for f in fs]
DIMS = [d for _, _, d, fs in TABLES for _ in fs]
ROWS = {f: e for _, e, _, fs in TABLES for f in fs}
TABLE_ROWS = {n: e for n, e, _, _ in TABLES}
TABLE_FEATURES = {n: fs for n, _, _, fs in TABLES}
TABLE_OF = {f: t for t, (_, _, _, fs) in enumerate(TABLES) for f in fs}
MAX_BAG = 3
STEPS = 3
OPTIMIZERS = {"rowwise_adagrad": {"learning_rate": 0.3, "eps": 0.1}, "sgd": {"learning_rate": 0.3}}
# TorchRec's MEAN where a row-wise table is in the collection: SUM, divided by the bag's length plus this.
TORCHREC_MEAN_EPS = 1e-6


def _configs(pooling="sum"):
    return [EmbeddingBagConfig(name=n, num_embeddings=e, embedding_dim=d, feature_names=list(fs),
                               pooling=getattr(torchrec.PoolingType, pooling.upper())) for n, e, d, fs in TABLES]


def _collection(optimizer, pooling="sum", weighted=False, device=None, **kw):
    torch.manual_seed(7)
    return EmbeddingBagCollection(_configs(pooling), is_weighted=weighted, optimizer=optimizer, device=device,
                                  **OPTIMIZERS[optimizer], **kw)


# ---- a variable batch, held per feature -----------------------------------------------------------------------
def _batch(gen, strides, out_batch, weighted=False, empty=()):
    """Per feature f of FEATURES, strides[f] bags of 0..MAX_BAG ids (none for the features in `empty`), their
    per-sample weights, and inverse indices [features, out_batch], each in [0, strides[f])."""
    lengths = [torch.zeros(s, dtype=torch.int64) if f in empty else torch.randint(0, MAX_BAG + 1, (s,), generator=gen)
               for f, s in zip(FEATURES, strides)]
    values = [torch.randint(0, ROWS[f], (int(n.sum()),), generator=gen) for f, n in zip(FEATURES, lengths)]
    weights = [torch.rand(v.numel(), generator=gen) + 0.5 for v in values] if weighted else None
    assert out_batch == 0 or min(strides) > 0, "a feature of no bags has nothing for a sample to take"
    inverse = torch.stack([torch.randint(0, max(s, 1), (out_batch,), generator=gen) for s in strides])
    return {"strides": list(strides), "lengths": lengths, "values": values, "weights": weights, "inverse": inverse}


def _kjt(batch, keys=FEATURES, inverse_keys=FEATURES, inverse=True, variable=True):
    """The batch as a KeyedJaggedTensor with `keys` in that order and inverse_indices keyed `inverse_keys`
    (none without `inverse`); one batch size (stride) where not `variable`."""
    order = [FEATURES.index(k) for k in keys]
    weights = batch["weights"]
    per_key = {"stride_per_key_per_rank": [[batch["strides"][i]] for i in order]} if variable else \
        {"stride": batch["strides"][0]}
    return KeyedJaggedTensor(
        keys=list(keys), values=torch.cat([batch["values"][i] for i in order]),
        lengths=torch.cat([batch["lengths"][i] for i in order]),
        weights=torch.cat([weights[i] for i in order]) if weights is not None else None,
        inverse_indices=(list(inverse_keys), batch["inverse"][[FEATURES.index(k) for k in inverse_keys]])
        if inverse else None, **per_key)


def _bags(batch, f):
    """Feature f's bags: (ids, weights) each."""
    ends = torch.cumsum(batch["lengths"][f], 0).tolist()
    starts = [0] + ends[:-1]
    weights = batch["weights"][f] if batch["weights"] is not None else torch.ones(batch["values"][f].numel())
    return [(batch["values"][f][s:e], weights[s:e]) for s, e in zip(starts, ends)]


# ---- the naive float64 reference, from the maths --------------------------------------------------------------
def _naive_forward(tables, batch, pooling):
    """[batch, sum of the dims]: sample b's columns of feature f pool the rows of its bag inverse[f][b] (weighted
    sum, divided by the bag's size for MEAN; an empty bag pools zeros)."""
    out_batch = batch["inverse"].shape[1]
    columns = []
    for f, name in enumerate(FEATURES):
        table = tables[TABLE_OF[name]]
        pooled = []
        for ids, w in _bags(batch, f):
            p = (table[ids] * w.double()[:, None]).sum(0)
            pooled.append(p / len(ids) if pooling == "mean" and len(ids) else p)
        columns.append(torch.stack([pooled[k] for k in batch["inverse"][f].tolist()]) if out_batch
                       else torch.zeros(0, table.shape[1], dtype=torch.float64))
    return torch.cat(columns, 1)


def _naive_grads(tables, batch, pooling, grad):
    """Per table its gradient (each sample's output gradient through its bag's rows) and the rows looked up."""
    grads = [torch.zeros_like(t) for t in tables]
    touched = [set() for _ in tables]
    g = grad.double()
    col = 0
    for f, name in enumerate(FEATURES):
        t, dim = TABLE_OF[name], DIMS[f]
        bags = _bags(batch, f)
        for ids, _ in bags:
            touched[t].update(ids.tolist())
        for b, k in enumerate(batch["inverse"][f].tolist()):
            ids, w = bags[k]
            go = g[b, col:col + dim] / (len(ids) if pooling == "mean" else 1)
            for r, wi in zip(ids.tolist(), w.tolist()):
                grads[t][r] += wi * go
        col += dim
    return grads, touched


# (strides per feature a..e, output batch, features of empty bags only) per step: features of batch 1, strides of
# every feature its own, an output batch equal to and larger than the largest stride, a feature of empty bags.
UNSHARDED_STEPS = [([3, 1, 2, 5, 1], 5, ()), ([4, 4, 1, 2, 3], 6, ("c",)), ([1, 2, 6, 1, 4], 3, ())]
# the batch's keys and the inverse_indices' keys, each in an order of its own
BATCH_KEYS = ["d", "a", "e", "c", "b"]
INVERSE_KEYS = FEATURES[::-1]


@pytest.mark.parametrize("optimizer", ["rowwise_adagrad", "sgd"])
@pytest.mark.parametrize("pooling, weighted", [("sum", False), ("sum", True), ("mean", False)])
def test_collection_matches_the_naive_reference(gen, optimizer, pooling, weighted):
    """Three steps of variable batches against the float64 maths: the outputs, then the tables and row-wise
    state after each step, to fp32 rounding. Under MEAN the padded empty bags must leave every real bag's mean
    (and its gradient) alone. (Per-sample weights are taken under SUM only, by embscale as by FBGEMM.)"""
    ebc = _collection(optimizer, pooling, weighted)
    tables = [w.detach().double() for w in ebc.tbe.split_embedding_weights()]
    state = [{"m1": torch.zeros(t.shape[0], dtype=torch.float64)} for t in tables]
    hp = {"learning_rate": 0.3, "eps": OPTIMIZERS[optimizer].get("eps", 0.0), "beta1": 0.9, "beta2": 0.999,
          "weight_decay": 0.0, "max_norm": 0.0, "gradient_clipping": 0.0, "weight_decay_mode": "none"}
    for step, (strides, out_batch, empty) in enumerate(UNSHARDED_STEPS):
        batch = _batch(gen, strides, out_batch, weighted, empty)
        current = [w.detach().double() for w in ebc.tbe.split_embedding_weights()]
        out = ebc(_kjt(batch, BATCH_KEYS, INVERSE_KEYS))
        assert out.keys() == FEATURES and out.length_per_key() == DIMS
        want = _naive_forward(current, batch, pooling)
        torch.testing.assert_close(out.values().detach().double(), want, rtol=1e-6, atol=1e-7,
                                   msg=lambda m: f"step {step}: forward\n{m}")
        grad = torch.randn(out.values().shape, generator=gen)
        (out.values() * grad).sum().backward()
        grads, touched = _naive_grads(tables, batch, pooling, grad)
        ref.apply_optimizer(optimizer, tables, state, grads, touched, hp, step + 1)
        for t, (w, s) in enumerate(zip(ebc.tbe.split_embedding_weights(), ebc.tbe.optimizer_state())):
            torch.testing.assert_close(w.detach().double(), tables[t], rtol=1e-5, atol=1e-6,
                                       msg=lambda m: f"step {step}: table {TABLES[t][0]}\n{m}")
            if optimizer == "rowwise_adagrad":
                torch.testing.assert_close(s["sum"].double(), state[t]["m1"], rtol=1e-5, atol=1e-6,
                                           msg=lambda m: f"step {step}: table {TABLES[t][0]}'s state\n{m}")
    assert touched[TABLE_OF["c"]], "feature c looked something up in the last step"


@pytest.mark.parametrize("pooling, weighted", [("sum", False), ("sum", True), ("mean", False)])
def test_collection_matches_torchrecs(gen, pooling, weighted):
    """torchrec's own EmbeddingBagCollection given the same tables (its state_dict loaded into embscale's) on the
    same variable batches: the same KeyedTensor, and after each of three steps the same tables, torchrec's trained
    by torch's SGD on its gradient, embscale's by its fused SGD (to fp32 rounding: the rows' gradients are summed
    in other orders). The last step's batch has one batch size and inverse_indices, which torchrec's module
    applies too."""
    theirs = torchrec.EmbeddingBagCollection(tables=_configs(pooling), is_weighted=weighted)
    ours = EmbeddingBagCollection(_configs(pooling), is_weighted=weighted, optimizer="sgd", learning_rate=0.5)
    result = ours.load_state_dict(theirs.state_dict(), strict=False)
    assert result.unexpected_keys == [] and all(k.startswith("tbe.") for k in result.missing_keys)
    sgd = torch.optim.SGD(theirs.parameters(), lr=0.5)
    steps = UNSHARDED_STEPS + [([3, 3, 3, 3, 3], 5, ())]
    for step, (strides, out_batch, empty) in enumerate(steps):
        batch = _batch(gen, strides, out_batch, weighted, empty)
        kjt = _kjt(batch, BATCH_KEYS, INVERSE_KEYS, variable=step < len(UNSHARDED_STEPS))
        assert kjt.variable_stride_per_key() == (step < len(UNSHARDED_STEPS))
        want, got = theirs(kjt), ours(kjt)
        assert got.keys() == want.keys() and got.length_per_key() == want.length_per_key()
        assert got.values().shape == (out_batch, sum(DIMS))
        torch.testing.assert_close(got.values(), want.values(), rtol=1e-6, atol=1e-7,
                                   msg=lambda m: f"step {step}: forward\n{m}")
        grad = torch.randn(want.values().shape, generator=gen)
        sgd.zero_grad()
        (want.values() * grad).sum().backward()
        sgd.step()
        (got.values() * grad).sum().backward()
        for n, _, _, _ in TABLES:
            torch.testing.assert_close(ours.embedding_bags[n].weight, theirs.embedding_bags[n].weight.detach(),
                                       rtol=1e-5, atol=1e-6, msg=lambda m: f"step {step}: table {n}\n{m}")
    assert not torch.equal(ours.embedding_bags["t2"].weight, _collection("sgd").embedding_bags["t2"].weight)


def test_collection_of_an_empty_batch_and_features_of_no_bags(gen):
    """A variable batch whose output batch is 0 (inverse_indices [features, 0]) with a feature of no bags (stride
    0) among features of several: [0, dims] out and a backward that changes nothing. (torchrec 1.9.2's own module
    fails there: it takes inverse_indices without elements for none and cannot join the features' bags.)"""
    ours = _collection("sgd")
    before = ours.tbe.weights.detach().clone()
    got = ours(_kjt(_batch(gen, [2, 0, 1, 3, 1], 0)))
    assert got.values().shape == (0, sum(DIMS)) and got.keys() == FEATURES
    got.values().sum().backward()
    assert torch.equal(ours.tbe.weights, before)


def test_collection_without_inverse_indices(gen):
    """Without inverse_indices a batch size per feature has nothing to expand its bags by: a batch whose features
    share one batch size (as stride_per_key_per_rank) pools as the same batch with one stride (and as torchrec's
    module); batch sizes that differ are refused naming ``features`` (torchrec's module fails in its concat)."""
    ebc = _collection("sgd")
    batch = _batch(gen, [3] * len(FEATURES), 3)
    variable, one = _kjt(batch, inverse=False), _kjt(batch, inverse=False, variable=False)
    assert variable.variable_stride_per_key() and not one.variable_stride_per_key()
    theirs = torchrec.EmbeddingBagCollection(tables=_configs())
    ebc.load_state_dict(theirs.state_dict(), strict=False)
    got = ebc(variable).values()
    assert torch.equal(got, ebc(one).values())
    torch.testing.assert_close(got, theirs(variable).values(), rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match=r"features: a batch size per feature \(stride_per_key \[2, 1, 3, 1, 1\] "
                                         r"for keys \['a', 'b', 'c', 'd', 'e'\]\) needs inverse_indices"):
        ebc(_kjt(_batch(gen, [2, 1, 3, 1, 1], 2), inverse=False))


def _with_inverse(kjt, keys, table):
    return KeyedJaggedTensor(keys=kjt.keys(), values=kjt.values(), lengths=kjt.lengths(),
                             stride_per_key_per_rank=kjt.stride_per_key_per_rank(), inverse_indices=(keys, table))


def test_collection_refuses_bad_inverse_indices(gen):
    ebc = _collection("sgd")
    kjt = _kjt(_batch(gen, [2, 1, 3, 1, 2], 4))
    good = kjt.inverse_indices()[1]
    cases = [
        (FEATURES, good[0], r"features.inverse_indices\(\): \(4,\) \(torch.int64\) for keys \['a', 'b', 'c', 'd', "
                            r"'e'\]; expected an integer tensor \[5 keys, batch size\]"),
        (FEATURES, good[:4], r"features.inverse_indices\(\): \(4, 4\) .* expected an integer tensor \[5 keys"),
        (FEATURES, good.float(), r"features.inverse_indices\(\): \(5, 4\) \(torch.float32\)"),
        (FEATURES[:4], good[:4], r"features.inverse_indices\(\): keys \['a', 'b', 'c', 'd'\] lack \['e'\]"),
        (FEATURES, torch.where(torch.arange(5)[:, None] == 2, 3, good),  # c has 3 bags: 0..2
         r"features.inverse_indices\(\): feature 'c' has 3 bags, but sample 0 takes bag 3"),
        (FEATURES, torch.where(torch.arange(5)[:, None] == 1, -1, good),
         r"features.inverse_indices\(\): feature 'b' has 1 bags, but sample 0 takes bag -1"),
    ]
    for keys, table, message in cases:
        with pytest.raises(ValueError, match=message):
            ebc(_with_inverse(kjt, keys, table))
    # the quantized collection (inference), as torchrec's, reads one batch size: refused by name
    quant = QuantEmbeddingBagCollection.from_float(ebc)
    with pytest.raises(ValueError, match=r"features: a batch size per feature \(stride_per_key \[2, 1, 3, 1, 2\]\) "
                                         "is not supported"):
        quant(kjt)


def _sequence_configs():
    return [EmbeddingConfig(name=n, num_embeddings=e, embedding_dim=8, feature_names=list(fs))
            for n, e, _, fs in TABLES]


def test_sequence_collection_matches_torchrecs(gen):
    """torchrec's unsharded EmbeddingCollection takes a batch size per feature as it comes: each feature's rows
    with its own lengths (inverse_indices are not applied). embscale's gives the same rows, lengths and indices
    bit for bit, and SGD's step of torch's gradient (output gradients multiples of 1/2 and a learning rate of a
    power of 2: exact in any order of additions); a feature of no bags among them."""
    theirs = torchrec.EmbeddingCollection(tables=_sequence_configs(), need_indices=True)
    ours = EmbeddingCollection(_sequence_configs(), need_indices=True, optimizer="sgd", learning_rate=0.5)
    ours.load_state_dict(theirs.state_dict(), strict=False)
    before = {n: theirs.embeddings[n].weight.detach().clone() for n, _, _, _ in TABLES}
    kjt = _kjt(_batch(gen, [3, 1, 0, 2, 5], 0), BATCH_KEYS, inverse=False)
    want, got = theirs(kjt), ours(kjt)
    assert list(got) == list(want) == FEATURES
    grads = {}
    for f in FEATURES:
        assert torch.equal(got[f].values(), want[f].values()), f
        assert torch.equal(got[f].lengths(), want[f].lengths()), f
        assert torch.equal(got[f].weights(), want[f].weights()), f
        grads[f] = torch.randint(-4, 5, want[f].values().shape, generator=gen) / 2
    assert got["c"].lengths().numel() == 0 and got["e"].lengths().numel() == 5
    sum((want[f].values() * g).sum() for f, g in grads.items()).backward()
    sum((got[f].values() * g).sum() for f, g in grads.items()).backward()
    for n in before:
        assert torch.equal(ours.embeddings[n].weight, before[n] - 0.5 * theirs.embeddings[n].weight.grad), n


# ---- sharded ------------------------------------------------------------------------------------------------
PLANS = ["table_wise", "row_wise", "column_wise", "data_parallel", "mixed", "two_groups"]
# (plan, optimizer, pooling, weighted). MEAN with a row-wise table (row_wise, mixed) has TorchRec divide the pooled
# sums after its output distribution, by the lengths of each sample's bag.
CASES = [("table_wise", "rowwise_adagrad", "sum", True), ("table_wise", "sgd", "mean", False),
         ("row_wise", "rowwise_adagrad", "sum", True), ("row_wise", "sgd", "mean", False),
         ("column_wise", "rowwise_adagrad", "sum", False), ("column_wise", "sgd", "mean", False),
         ("data_parallel", "rowwise_adagrad", "sum", True), ("data_parallel", "sgd", "mean", False),
         ("mixed", "rowwise_adagrad", "mean", False), ("mixed", "sgd", "sum", True),
         ("two_groups", "rowwise_adagrad", "sum", False)]


def _sharded_model(rank, world, plan, optimizer, pooling, weighted):
    """The model sharded under torchrec_sharding.bag_plan's `plan`, or "two_groups": on rank 0 t0 cached (LFU) in
    one shard group, t2 and t3 in another."""
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import CacheAlgorithm
    from torchrec.distributed import sharding_plan as sp
    from torchrec.distributed.types import CacheParams

    model = torchrec_sharding.PooledModel(_collection(optimizer, pooling, weighted, device=multiprocess.device(rank)),
                                          FEATURES)
    sharder = EmbeddingBagCollectionSharder()
    if plan != "two_groups":
        return torchrec_sharding.shard(model, "ebc", sharder, torchrec_sharding.bag_plan(plan, world), rank, world)
    per_param = {"t0": sp.table_wise(rank=0, compute_kernel="fused_uvm_caching"), "t1": sp.table_wise(rank=world - 1),
                 "t2": sp.table_wise(rank=0), "t3": sp.table_wise(rank=0)}
    module_plan = torchrec_sharding.make_plan(model, "ebc", sharder, per_param, rank, world)
    module_plan["t0"].cache_params = CacheParams(load_factor=0.5, algorithm=CacheAlgorithm.LFU)
    return torchrec_sharding.distribute(model, "ebc", sharder, module_plan, rank)


def _rank_strides(rank, step):
    """A rank's batch size per feature: every feature its own, features of batch 1, and a and b (of one table and
    width) swapping theirs from rank to rank and step to step. Each rank's pooled values (its bags times their
    widths) are as many as every other rank's, which row-wise sharding needs on gloo: TorchRec's backward of its
    variable-batch reduce-scatter gathers parts of different sizes otherwise (all_gather of unequal tensors),
    which gloo lacks."""
    a, b = (3, 1) if (rank + step) % 2 == 0 else (1, 3)
    return [a, b, 2, 1, 3]


def _sharded_batches(gen, world, weighted):
    """Per step, per rank: (batch, output gradient [out batch, sum of the dims]); output batches of 4 and 5."""
    steps = []
    for step in range(STEPS):
        parts = []
        for r in range(world):
            out_batch = 4 + (r + step) % 2
            parts.append((_batch(gen, _rank_strides(r, step), out_batch, weighted),
                          torch.randn(out_batch, sum(DIMS), generator=gen)))
        steps.append(parts)
    return steps


def _global_batch(batches):
    """The processes' batches side by side in rank order: each feature's bags of rank 0, then rank 1's, ...; its
    inverse indices moved past the earlier ranks' bags of the feature; the samples in rank order."""
    F = len(FEATURES)
    first = [[sum(b["strides"][f] for b in batches[:r]) for f in range(F)] for r in range(len(batches))]
    weighted = batches[0]["weights"] is not None
    return {"strides": [sum(b["strides"][f] for b in batches) for f in range(F)],
            "lengths": [torch.cat([b["lengths"][f] for b in batches]) for f in range(F)],
            "values": [torch.cat([b["values"][f] for b in batches]) for f in range(F)],
            "weights": [torch.cat([b["weights"][f] for b in batches]) for f in range(F)] if weighted else None,
            "inverse": torch.cat([b["inverse"] + torch.tensor(o)[:, None] for b, o in zip(batches, first)], 1)}


def _one_process_lookup(tbe, batch, lookups):
    """One process's pooled output for a variable batch, written independently of the module: every feature
    looked up padded with empty bags to the largest feature's batch size (the TBE reads one), then each sample
    takes its bag's row (inverse indices). lookups: per TBE feature, its feature's number in FEATURES."""
    B = max(batch["strides"][f] for f in lookups)
    lengths = torch.cat([torch.cat([batch["lengths"][f], torch.zeros(B - batch["strides"][f], dtype=torch.int64)])
                         for f in lookups])
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    weights = torch.cat([batch["weights"][f] for f in lookups]) if batch["weights"] is not None else None
    pooled = tbe(torch.cat([batch["values"][f] for f in lookups]), offsets, weights)
    columns = pooled.split(tbe.feature_dims, 1)
    return torch.cat([c.index_select(0, batch["inverse"][f]) for c, f in zip(columns, lookups)], 1)


def _worker(rank, world, cases, batches):
    out = []
    for (plan, optimizer, pooling, weighted), steps in zip(cases, batches):
        dmp = _sharded_model(rank, world, plan, optimizer, pooling, weighted)
        # torchrec 1.9.2's MEAN divisor (row-wise MEAN) reads the inverse_indices' rows in their own order
        # wherever they have as many keys as the batch, not by name: there they come in the batch's order.
        inverse_keys = FEATURES if pooling == "mean" and plan in ("row_wise", "mixed") else INVERSE_KEYS
        outs = []
        for step in steps:
            batch, target = step[rank]
            pooled = dmp(_kjt(batch, inverse_keys=inverse_keys).to(multiprocess.device(rank)))
            (pooled * target.to(pooled.device)).sum().backward()
            outs.append(pooled.detach())
        groups = [len(getattr(lookup, "module", lookup)._emb_modules) for lookup in dmp.module.ebc._lookups]
        out.append((outs, torchrec_sharding.local_shards(dmp.module.ebc), groups))
    # A variable batch without inverse_indices, and with inverse_indices that lack a feature: refused by name
    # (before anything is sent), on every process alike.
    batch = batches[0][0][rank][0]
    errors = []
    for kjt in (_kjt(batch, inverse=False), _kjt(batch, inverse_keys=FEATURES[1:])):
        try:
            dmp(kjt)
            errors.append(None)
        except ValueError as e:
            errors.append(str(e))
    return out, errors


class _SequenceModel(nn.Module):
    def __init__(self, ec):
        super().__init__()
        self.ec = ec

    def forward(self, kjt):
        return self.ec(kjt)


def _sequence_worker(rank, world, batches):
    """The sequence collection sharded (a mixed plan): each batch's rows and lengths per feature (gradients off),
    and the refusal of a variable batch while gradients are on, with the tables untouched by it."""
    from torchrec.distributed import sharding_plan as sp

    torch.manual_seed(7)
    model = _SequenceModel(EmbeddingCollection(_sequence_configs(), optimizer="sgd", learning_rate=0.5))
    per_param = {"t0": sp.row_wise(), "t1": sp.table_wise(rank=world - 1), "t2": sp.column_wise(ranks=[0, 1]),
                 "t3": sp.data_parallel()}
    dmp = torchrec_sharding.shard(model, "ec", EmbeddingCollectionSharder(), per_param, rank, world)
    outs = []
    with torch.no_grad():
        for batch in batches:
            out = dmp(_kjt(batch[rank], BATCH_KEYS, INVERSE_KEYS).to(multiprocess.device(rank)))
            outs.append({f: (out[f].values(), out[f].lengths()) for f in FEATURES})
    try:
        dmp(_kjt(batches[0][rank], BATCH_KEYS, INVERSE_KEYS).to(multiprocess.device(rank)))
        refused = None
    except ValueError as e:
        refused = str(e)
    return outs, refused, torchrec_sharding.local_shards(dmp.module.ec)


WORLDS = multiprocess.worlds(on_cpu=(2, 3))


@pytest.fixture(scope="module", params=WORLDS)
def run(request):
    world = request.param
    multiprocess.skip_unless_enough_devices(world)
    seed = 2000 + world
    print(f"seed={seed}")
    batches, results = multiprocess.run_cases(_worker, world, seed, CASES,
                                              lambda gen, case: _sharded_batches(gen, world, case[3]), timeout=900)
    return world, batches, results


@pytest.mark.parametrize("plan, optimizer, pooling, weighted", CASES)
def test_sharded_training_matches_one_process(run, plan, optimizer, pooling, weighted):
    """Each rank's outputs are its samples' rows of one process's output on the global batch: bit for bit in the
    first step (row-wise within the rounding of the partial sums' additions), and after three steps every shard
    equals one process's table and optimizer state. Those only to fp32 rounding (a few ulps), and so the later
    steps' outputs: a bag that several samples take gets their output gradients summed, and TorchRec divides that
    sum by the world size (its output distribution) where one process divides each sample's first, which rounds
    alike only where the division is exact."""
    world, batches, results = run
    case = CASES.index((plan, optimizer, pooling, weighted))
    pieces = torchrec_sharding.bag_pieces(plan)
    lookups = [(FEATURES.index(f), i) for f in FEATURES for i, (n, _, _) in enumerate(pieces)
               if f in TABLE_FEATURES[n]]
    divided_after = pooling == "mean" and plan in ("row_wise", "mixed")
    start = dict(zip([n for n, _, _, _ in TABLES], _collection(optimizer, pooling).tbe.split_embedding_weights()))
    one = torchrec_sharding.one_process(pieces, TABLE_ROWS, lookups, start, optimizer=optimizer,
                                        pooling="sum" if divided_after else pooling, **OPTIMIZERS[optimizer])
    features = [f for f, _ in lookups]
    for s, parts in enumerate(batches[case]):
        batch = _global_batch([b for b, _ in parts])
        pooled = _one_process_lookup(one, batch, features)
        out, divisor = pooled.detach(), 1.0
        if divided_after:  # each sample's columns divided by its bag's length (+ TorchRec's eps)
            lengths = torch.stack([batch["lengths"][f][batch["inverse"][f]] for f in features], 1)
            divisor = torch.repeat_interleave(lengths, torch.tensor(one.feature_dims), dim=1) + TORCHREC_MEAN_EPS
            out = out / divisor
        if plan in ("row_wise", "mixed"):
            # A bag's rows on different shards are pooled per shard and the partial sums added: each output may
            # differ from one process's by the rounding of those additions (test_torchrec.py's bound).
            magnitude = copy.deepcopy(one)
            with torch.no_grad():
                magnitude.weights.abs_()
            bound = 2 * (MAX_BAG - 1) * 2.0**-24 * _one_process_lookup(magnitude, batch, features).detach() / divisor
            bound += 2.0**-23 * out.abs()
        first = 0
        for r in range(world):
            got = results[r][0][case][0][s]
            want = out[first:first + got.shape[0]]
            assert got.shape == (parts[r][1].shape[0], sum(DIMS)), f"step {s}, rank {r}: output shape"
            if s > 0:  # the tables may differ by the rounding of the earlier steps' gradients (below)
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6,
                                           msg=lambda m: f"step {s}, rank {r}: forward\n{m}")
            elif plan in ("row_wise", "mixed"):
                assert ((got - want).abs() <= bound[first:first + got.shape[0]]).all(), f"step {s}, rank {r}: forward"
            else:
                assert torch.equal(got, want), f"step {s}, rank {r}: forward"
            first += got.shape[0]
        grad = torch.cat([t for _, t in parts])
        if divided_after:
            grad = grad / divisor
        pooled.backward(grad / world)
    want_tables = [w.detach() for w in one.split_embedding_weights()]
    want_state = one.optimizer_state()
    covered = {}
    for r in range(world):
        for name, (r0, c0), w, state in results[r][0][case][1]:
            i = next(i for i, (n, pc0, cols) in enumerate(pieces) if n == name and pc0 <= c0 < pc0 + cols)
            want = want_tables[i][r0:r0 + w.shape[0], c0 - pieces[i][1]:c0 - pieces[i][1] + w.shape[1]]
            torch.testing.assert_close(w, want, rtol=1e-6, atol=1e-7,
                                       msg=lambda m: f"rank {r}: table {name} shard at {(r0, c0)}\n{m}")
            assert not torch.equal(w, start[name][r0:r0 + w.shape[0], c0:c0 + w.shape[1]]), f"{name} trained"
            for k, v in state.items():
                torch.testing.assert_close(v, want_state[i][k][r0:r0 + v.shape[0]], rtol=1e-6, atol=1e-7,
                                           msg=lambda m: f"rank {r}: {name} {k} at {(r0, c0)}\n{m}")
            covered[name] = covered.get(name, 0) + w.numel()
    for n, e, d, _ in TABLES:
        replicas = world if plan == "data_parallel" or (plan == "mixed" and n == "t3") else 1
        assert covered[n] == e * d * replicas, f"table {n}: shards cover it"
    if plan == "two_groups":
        assert 2 in results[0][0][case][2], f"rank 0's lookups' shard groups: {results[0][0][case][2]}"


def test_sharded_collection_refuses_a_variable_batch_without_fitting_inverse_indices(run):
    world, _, results = run
    for r in range(world):
        missing, lacking = results[r][1]
        assert missing is not None and missing.startswith("features: a batch size per feature") and \
            "needs inverse_indices" in missing, missing
        assert lacking is not None and "features.inverse_indices(): keys ['b', 'c', 'd', 'e'] lack ['a']" in lacking, \
            lacking


def test_sharded_sequence_collection_expands_rows_by_inverse_indices(gen):
    """The sharded sequence collection on a variable batch: TorchRec pads it to one batch size before its input
    distribution and expands each feature's rows by inverse_indices after, so each sample gets its bag's rows
    (and the bag's length), as from TorchRec's own sharded EmbeddingCollection. On the CPU TorchRec's expansion
    has no gradient (fbgemm's permute_1D_sparse_data): a variable batch with gradients on is refused by name there
    rather than train nothing."""
    world = 2
    multiprocess.skip_unless_enough_devices(world)
    batches = [[_batch(gen, _rank_strides(r, step), 4 + r) for r in range(world)] for step in range(2)]
    results = multiprocess.run(_sequence_worker, world, batches, timeout=600)
    torch.manual_seed(7)
    tables = EmbeddingCollection(_sequence_configs(), optimizer="sgd", learning_rate=0.5).tbe.split_embedding_weights()
    for s, parts in enumerate(batches):
        for r, batch in enumerate(parts):
            for i, f in enumerate(FEATURES):
                bags = _bags(batch, i)
                want = [bags[k][0] for k in batch["inverse"][i].tolist()]
                rows, lengths = results[r][0][s][f]
                assert torch.equal(lengths, torch.tensor([len(ids) for ids in want])), f"batch {s}, rank {r}: {f}"
                assert torch.equal(rows, tables[TABLE_OF[f]][torch.cat(want)]), f"batch {s}, rank {r}: {f}'s rows"
    if multiprocess.device().type == "cpu":
        for r in range(world):
            refused = results[r][1]
            assert refused is not None and refused.startswith("features: a batch size per feature trains nothing"), \
                refused
    names = [n for n, _, _, _ in TABLES]
    for r in range(world):
        for name, (r0, c0), w, _ in results[r][2]:
            t = tables[names.index(name)]
            assert torch.equal(w, t[r0:r0 + w.shape[0], c0:c0 + w.shape[1]]), f"rank {r}: {name} untouched"
