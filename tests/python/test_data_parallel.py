"""TableBatchedEmbeddingBags under DistributedDataParallel (gloo, 2 and 3 processes on this machine; NCCL
with one GPU a process under EMBSCALE_TEST_DIST_DEVICE=cuda, 1 process on a machine of one GPU:
multiprocess.worlds()): the replicas apply the update of the global batch, stay identical, and equal one
process trained on that batch (forward outputs, tables, optimizer state and step, bit for bit)."""
import pytest
import torch
from torch import nn

import embscale
import multiprocess
from tbe_reference import make_lookups

SPECS = [(40, 4), (25, 8), (60, 3)]
FMAP = [0, 1, 2, 0]
DIM = sum(SPECS[t][1] for t in FMAP)


def _module(optimizer, pooling, **kw):
    return embscale.TableBatchedEmbeddingBags(SPECS, feature_table_map=FMAP, optimizer=optimizer, learning_rate=0.3,
                                              eps=0.1, pooling=pooling, **kw)


class _Model(nn.Module):
    """The tables and a dense layer, as a model under DDP would hold them."""

    def __init__(self, tbe):
        super().__init__()
        self.tbe = tbe
        self.dense = nn.Linear(3, 1)

    def forward(self, indices, offsets, psw, x):
        return self.tbe(indices, offsets, psw), self.dense(x)


CASES = [("rowwise_adagrad", "sum", False), ("sgd", "mean", False), ("rowwise_adagrad", "sum", True)]
STEPS = 3


def _train_replicas(rank, optimizer, pooling, batches):
    torch.manual_seed(100 + rank)  # different tables on each process: DDP's start-up broadcast makes them rank 0's
    dev = multiprocess.device(rank)
    model = nn.parallel.DistributedDataParallel(_Model(_module(optimizer, pooling)).to(dev))
    outs = []
    for step in batches:
        indices, offsets, psw, target = (None if t is None else t.to(dev) for t in step[rank])
        pooled, dense = model(indices, offsets, psw, torch.ones(pooled_rows(offsets), 3, device=dev))
        ((pooled * target).sum() + dense.sum()).backward()
        outs.append(pooled.detach())
    tbe = model.module.tbe
    return outs, tbe.weights.detach().clone(), tbe.momentum1.clone(), tbe.step


DENSE_CASE = 1  # the batches (unweighted, mean pooling) the dense-gradient run takes


def _train_dense_gradient(rank, batches):
    """optimizer="none" with sparse=False under DDP, stepped by torch's SGD: DDP averages the tables'
    dense gradient like any parameter's (review of 2026-12-04: with the sparse gradient DDP raised
    NotImplementedError from its reducer)."""
    torch.manual_seed(100 + rank)
    dev = multiprocess.device(rank)
    model = nn.parallel.DistributedDataParallel(_Model(_module("none", "mean", sparse=False)).to(dev))
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    for step in batches:
        indices, offsets, psw, target = (None if t is None else t.to(dev) for t in step[rank])
        opt.zero_grad()
        pooled, dense = model(indices, offsets, psw, torch.ones(pooled_rows(offsets), 3, device=dev))
        ((pooled * target).sum() + dense.sum()).backward()
        opt.step()
    return model.module.tbe.weights.detach().cpu().clone()


def _error(fn):
    try:
        fn()
    except Exception as e:  # the message, for the test to check
        return f"{type(e).__name__}: {e}"
    return None


def _train_local(rank):
    tbe = embscale.TableBatchedEmbeddingBags([(10, 4)], optimizer="sgd", learning_rate=1.0, data_parallel_group=None)
    before = tbe.weights.detach().clone()
    tbe(torch.tensor([rank]), torch.tensor([0, 1])).sum().backward()
    return (before - tbe.weights.detach()).view(10, 4).abs().sum(1).nonzero().flatten().tolist()


def _worker(rank, world, batches_per_case):
    """Every case in one group of processes (starting processes is the slow part)."""
    out = {"replicas": [_train_replicas(rank, optimizer, pooling, batches)
                        for (optimizer, pooling, _), batches in zip(CASES, batches_per_case)]}
    out["local"] = _train_local(rank)
    out["dense_gradient"] = _train_dense_gradient(rank, batches_per_case[DENSE_CASE])
    dev = multiprocess.device(rank)
    mismatch = embscale.TableBatchedEmbeddingBags([(10 + rank, 4)], device=dev)  # not replicas: different tables
    out["mismatch"] = _error(lambda: mismatch(torch.tensor([1], device=dev),
                                              torch.tensor([0, 1], device=dev)).sum().backward())
    # Same sizes in total, other tables; same tables, another learning rate (review of 2026-12-03: both
    # trained on silently and the replicas drifted apart).
    dims = embscale.TableBatchedEmbeddingBags([[(10, 4), (10, 4)], [(10, 2), (10, 6)]][rank % 2], device=dev)
    out["mismatch_dims"] = _error(lambda: dims(torch.tensor([1, 2], device=dev),
                                               torch.tensor([0, 1, 2], device=dev)).sum().backward())
    lr = embscale.TableBatchedEmbeddingBags([(10, 4)], optimizer="sgd", learning_rate=0.1 + rank, device=dev)
    out["mismatch_lr"] = _error(lambda: lr(torch.tensor([1], device=dev),
                                           torch.tensor([0, 1], device=dev)).sum().backward())
    # Lookups before offsets[0] belong to no bag: the global batch is each process's bag [1, 2].
    late = embscale.TableBatchedEmbeddingBags([(10, 4)], optimizer="sgd", learning_rate=1.0, device=dev)
    with torch.no_grad():
        late.weights.zero_()
    late(torch.tensor([7, 1, 2], device=dev), torch.tensor([1, 3], device=dev)).sum().backward()
    out["late_offsets"] = late.weights.detach().clone()
    out["psw_grad"] = _error(lambda: embscale.TableBatchedEmbeddingBags([(10, 4)])(
        torch.tensor([1]), torch.tensor([0, 1]), torch.ones(1, requires_grad=True)))
    return out


@pytest.fixture(scope="module", params=multiprocess.worlds())
def run(request):
    """(world size, the batches of each case, each rank's results)."""
    world = request.param
    multiprocess.skip_unless_enough_devices(world)
    gen = torch.Generator().manual_seed(world)
    batches = [_batches(gen, world, STEPS, weighted) for _, _, weighted in CASES]
    # DDP broadcasts every buffer at its start, the module's hyper-parameters (a CPU buffer) too: on GPUs
    # the group needs a CPU backend beside NCCL.
    return world, batches, multiprocess.run(_worker, world, batches, cuda_backend="cpu:gloo,cuda:nccl")


def pooled_rows(offsets):
    return (offsets.numel() - 1) // len(FMAP)


def _global_batch(parts):
    """One process's view of the processes' batches side by side (rank 0's samples first), table-major."""
    T = len(FMAP)
    Bs = [pooled_rows(o) for _, o, _, _ in parts]
    lengths = torch.cat([(o[1:] - o[:-1]).view(T, B) for (_, o, _, _), B in zip(parts, Bs)], 1)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.reshape(-1).cumsum(0)])
    idx, psw = [], []
    for f in range(T):
        for (i, o, w, _), B in zip(parts, Bs):
            lo, hi = int(o[f * B]), int(o[(f + 1) * B])
            idx.append(i[lo:hi])
            if w is not None:
                psw.append(w[lo:hi])
    return torch.cat(idx), offsets, (torch.cat(psw) if psw else None)


def _batches(gen, world, steps, weighted):
    rows = [SPECS[t][0] for t in FMAP]
    out = []
    for _ in range(steps):
        per_rank = []
        for r in range(world):
            B = 3 + r  # uneven local batches
            indices, offsets, psw = make_lookups(gen, rows, B, 4, weighted=weighted)
            per_rank.append((indices, offsets, psw, torch.randn(B, DIM, generator=gen)))
        out.append(per_rank)
    return out


@pytest.mark.parametrize("case", range(len(CASES)), ids=["-".join(map(str, c)) for c in CASES])
def test_ddp_trains_like_one_process_on_the_global_batch(run, case):
    world, batches, results = run
    optimizer, pooling, _ = CASES[case]
    torch.manual_seed(100)  # rank 0's tables
    dev = multiprocess.device()
    ref = _module(optimizer, pooling, data_parallel_group=None).to(dev)
    for s, parts in enumerate(batches[case]):
        indices, offsets, psw = (None if t is None else t.to(dev) for t in _global_batch(parts))
        out = ref(indices, offsets, psw).cpu()
        start = 0
        for r, (_, o, _, target) in enumerate(parts):
            B = pooled_rows(o)
            assert torch.equal(results[r]["replicas"][case][0][s], out[start:start + B].detach()), \
                f"step {s}, rank {r}: forward"
            start += B
        out.backward(torch.cat([target for _, _, _, target in parts]) / world)
    for r in range(world):
        _, weights, state, step = results[r]["replicas"][case]
        assert torch.equal(weights, ref.weights.detach().cpu()), f"rank {r}: tables"
        assert torch.equal(state, ref.momentum1.cpu()), f"rank {r}: optimizer state"
        assert step == ref.step == STEPS


def test_ddp_reduces_the_dense_gradient_of_optimizer_none(run):
    """The replicas stay identical (DDP's average), and equal one process stepping the gradient of the global
    batch (to fp32 rounding: DDP sums the processes' gradients, one process the global batch's rows)."""
    world, batches, results = run
    torch.manual_seed(100)
    dev = multiprocess.device()
    ref = _module("none", "mean", sparse=False, data_parallel_group=None).to(dev)
    initial = ref.weights.detach().cpu().clone()
    opt = torch.optim.SGD(ref.parameters(), lr=0.3)
    for parts in batches[DENSE_CASE]:
        indices, offsets, _ = (None if t is None else t.to(dev) for t in _global_batch(parts))
        opt.zero_grad()
        ref(indices, offsets).backward(torch.cat([target for _, _, _, target in parts]).to(dev) / world)
        assert ref.weights.grad.layout == torch.strided
        opt.step()
    first = results[0]["dense_gradient"]
    assert not torch.equal(first, initial)  # it trained
    for r in range(world):
        assert torch.equal(results[r]["dense_gradient"], first), f"rank {r}: replicas differ"
    torch.testing.assert_close(first, ref.weights.detach().cpu(), rtol=1e-5, atol=1e-6)


def _skip_alone(run):
    """Skips a test of replicas where one process trains: its tables are no replicas (data_parallel_group
    "auto" takes them for its own)."""
    if run[0] < 2:
        pytest.skip("one process: its tables are no replicas")


def test_replicas_that_differ_are_an_error(run):
    _skip_alone(run)
    for r in run[2]:
        assert r["mismatch"].startswith("RuntimeError: data_parallel_group: the processes' lookups disagree on "
                                        "total_rows")


def test_replicas_with_other_tables_or_settings_are_an_error(run):
    _skip_alone(run)
    for r in run[2]:
        assert r["mismatch_dims"].startswith("RuntimeError: data_parallel_group: the processes' lookups disagree "
                                             "on tables (each table's num_embeddings and embedding_dim")
        assert r["mismatch_lr"].startswith("RuntimeError: data_parallel_group: the processes' lookups disagree "
                                           "on optimizer and its settings")


def test_lookups_before_the_first_offset_are_left_out_as_in_one_process(run):
    """Each process's bag holds rows 1 and 2 (index 7 lies before offsets[0]); the summed pooled output's
    gradient is 1 / world per process, so the global batch moves rows 1 and 2 by -1 and nothing else."""
    want = torch.zeros(10, 4)
    want[1:3] = -1.0
    for r in run[2]:
        torch.testing.assert_close(r["late_offsets"].view(10, 4), want, rtol=0, atol=1e-6)


def test_tables_of_one_process_alone_train_on_its_batch_only(run):
    assert [r["local"] for r in run[2]] == [[r] for r in range(run[0])]


def test_per_sample_weight_gradients_of_replicas_are_refused(run):
    _skip_alone(run)
    for r in run[2]:
        assert r["psw_grad"].startswith("NotImplementedError: per_sample_weights: their gradient is not computed")


def test_data_parallel_group_is_checked():
    with pytest.raises(ValueError, match="data_parallel_group: 'world'"):
        embscale.TableBatchedEmbeddingBags([(10, 4)], data_parallel_group="world")
