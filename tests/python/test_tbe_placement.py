"""Tables placed in host memory (placement "host", FBGEMM's MANAGED) or cached in device memory ("cached",
MANAGED_CACHING), tables in device memory ("device"), per table.

On the CPU every placement is host memory: a module with placements trains as the same module without them.
On CUDA (skipped without a GPU) a module whose tables live in host memory trains through the library's row cache,
and must give, bit for bit, the outputs, tables and optimizer state of the same module with every table in
device memory: over several steps, for each optimizer kind, under adversarial schedules of the prefetch pipeline
(the next batch planned while the running one trains, the same ids in consecutive batches, caches smaller than
one batch's rows, a prefetch without its forward, two prefetches in a row), and across checkpoints in both
directions."""
import enum

import pytest
import torch

import embscale
import tbe_reference as ref

SPECS = [(60, 8), (45, 12), (30, 8), (20, 5)]
FMAP = [0, 1, 2, 3, 0]


class _Location(enum.Enum):  # FBGEMM's EmbeddingLocation as a FBGEMM script holds it (fbgemm_gpu is not imported)
    DEVICE = 0
    MANAGED = 1
    MANAGED_CACHING = 2


_Location.__module__ = "fbgemm_gpu.split_table_batched_embeddings_ops_common"
_Location.__name__ = "EmbeddingLocation"


def lookups(gen, B=6, hot=0, bad=False):
    rows = [SPECS[t][0] for t in FMAP]
    indices, offsets, _ = ref.make_lookups(gen, rows, B, 5)
    if hot:
        indices[torch.rand(indices.shape, generator=gen) < hot] = 1
    if bad and indices.numel():
        indices[0] = -1
    return indices, offsets


@pytest.mark.parametrize("placement", ["device", "host", "cached", "MANAGED", "MANAGED_CACHING", _Location.MANAGED,
                                       _Location.MANAGED_CACHING, _Location.DEVICE])
def test_on_the_cpu_every_placement_is_host_memory(gen, placement):
    torch.manual_seed(3)
    plain = embscale.TableBatchedEmbeddingBags(SPECS, feature_table_map=FMAP, learning_rate=0.1)
    torch.manual_seed(3)
    placed = embscale.TableBatchedEmbeddingBags([s + (placement,) for s in SPECS], feature_table_map=FMAP,
                                                learning_rate=0.1, cache_load_factor=0.1, cache_algorithm="lfu")
    assert placed.placements == [embscale.tbe._fbgemm_names.placement(0, placement)] * len(SPECS)
    for _ in range(3):
        indices, offsets = lookups(gen)
        grad = torch.randn(6, sum(SPECS[t][1] for t in FMAP), generator=gen)
        a, b = plain(indices, offsets), placed(indices, offsets)
        assert torch.equal(a, b)
        a.backward(grad)
        b.backward(grad)
    assert torch.equal(plain.weights, placed.weights) and torch.equal(plain.momentum1, placed.momentum1)


def test_a_module_with_host_tables_built_on_the_cpu_does_not_move_to_cuda():
    m = embscale.TableBatchedEmbeddingBags([(10, 4, "cached")])
    if not torch.cuda.is_available():
        pytest.skip("moving to CUDA needs a GPU")
    with pytest.raises(ValueError, match=r"^device: a module whose placements are \['cached'\] trains on CUDA"):
        m.cuda()
    assert m.weights.device.type == "cpu"


# ---- CUDA: training through the row cache ---------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="the row cache is a CUDA object")


def _pair(placements, optimizer="rowwise_adagrad", dtype=torch.float32, load_factor=0.05, algorithm="lru", **kw):
    """A module with every table in device memory and the same module placed as given, holding the same tables."""
    hp = dict(optimizer=optimizer, learning_rate=0.05, eps=0.1, weights_dtype=dtype, feature_table_map=FMAP,
              bounds_check="skip", stochastic_rounding=dtype != torch.float32, seed=7, **kw)
    device = embscale.TableBatchedEmbeddingBags(SPECS, device="cuda", **hp)
    placed = embscale.TableBatchedEmbeddingBags([s + (p,) for s, p in zip(SPECS, placements)], device="cuda",
                                                cache_load_factor=load_factor, cache_algorithm=algorithm, **hp)
    placed.load_state_dict(device.state_dict())
    return device, placed


def _same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    for key, value in sa.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value.cpu(), sb[key].cpu()), key


def _train(device, placed, batches, gen, prefetch=False, side_stream=None):
    cols = sum(SPECS[t][1] for t in FMAP)
    batches = [(i.cuda(), o.cuda()) for i, o in batches]
    if prefetch:
        placed.prefetch(*batches[0])
    for s, (indices, offsets) in enumerate(batches):
        B = (offsets.numel() - 1) // len(FMAP)
        grad = torch.randn(B, cols, generator=gen).cuda()
        a, b = device(indices, offsets), placed(indices, offsets)
        assert torch.equal(a, b), f"step {s}: forward differs"
        if prefetch and s + 1 < len(batches):  # the next batch planned while this one trains
            stream = side_stream or torch.cuda.current_stream()
            with torch.cuda.stream(stream):
                placed.prefetch(*batches[s + 1])
        a.backward(grad)
        b.backward(grad)
    torch.cuda.synchronize()
    _same_state(device, placed)


@cuda
@pytest.mark.parametrize("optimizer, dtype", [("rowwise_adagrad", torch.float32), ("sgd", torch.float16),
                                              ("adam", torch.float32), ("partial_rowwise_adam", torch.bfloat16)])
@pytest.mark.parametrize("algorithm", ["lru", "lfu"])
def test_cached_tables_train_as_device_tables(gen, optimizer, dtype, algorithm):
    placements = ["cached", "cached", "host", "device"]
    device, placed = _pair(placements, optimizer, dtype, algorithm=algorithm)
    batches = [lookups(gen, B=16, hot=0.3, bad=s % 2 == 1) for s in range(6)]
    _train(device, placed, batches, gen)
    # The statistics, exactly: each cached table's cache is one set of 32 ways (load factor 0.05), and without a
    # batch planned ahead only the running batch's rows are locked, so a batch with u > 32 unique rows of a table
    # stages u - 32 of them (conflict misses) and none otherwise.
    slots = placed._cache.cache_slots
    lookups_want = conflicts_want = 0
    for indices, offsets in batches:
        B = (offsets.numel() - 1) // len(FMAP)
        for t, p in enumerate(placements):
            if p != "cached":
                continue
            rows = set()
            for f, table in enumerate(FMAP):
                if table == t:
                    bag = indices[offsets[f * B]:offsets[(f + 1) * B]]
                    rows |= {int(i) for i in bag if 0 <= int(i) < SPECS[t][0]}
            lookups_want += len(rows)
            conflicts_want += max(0, len(rows) - slots[t])
    stats = placed.cache_stats()
    assert stats["unique_lookups"] == lookups_want and stats["hits"] + stats["misses"] == lookups_want
    assert stats["conflict_misses"] == conflicts_want > 0, (stats, conflicts_want)


@cuda
@pytest.mark.parametrize("schedule", ["pipelined", "side_stream", "same_ids", "prefetch_dropped", "two_prefetches"])
def test_the_prefetch_pipeline_never_changes_what_trains(gen, schedule):
    device, placed = _pair(["cached", "cached", "cached", "host"], "rowwise_adagrad", torch.float16, load_factor=0.02)
    batches = [lookups(gen, B=8, hot=0.5) for _ in range(6)]
    if schedule == "same_ids":
        batches = [batches[0]] * 3 + [batches[1]] * 3
        _train(device, placed, batches, gen, prefetch=True)
    elif schedule == "pipelined":
        _train(device, placed, batches, gen, prefetch=True)
    elif schedule == "side_stream":
        _train(device, placed, batches, gen, prefetch=True, side_stream=torch.cuda.Stream())
    elif schedule == "prefetch_dropped":
        for s, (i, o) in enumerate(batches):
            other = tuple(t.cuda() for t in lookups(gen, B=8))
            placed.prefetch(*(other if s % 2 else (i.cuda(), o.cuda())))  # half the plans go unused
            _train_one(device, placed, i, o, gen)
        _same_state(device, placed)
    else:
        for s, (i, o) in enumerate(batches):
            placed.prefetch(i.cuda(), o.cuda())
            placed.prefetch(i.cuda(), o.cuda())  # a second plan replaces the first
            _train_one(device, placed, i, o, gen)
        _same_state(device, placed)


def _train_one(device, placed, indices, offsets, gen):
    indices, offsets = indices.cuda(), offsets.cuda()
    cols = sum(SPECS[t][1] for t in FMAP)
    grad = torch.randn((offsets.numel() - 1) // len(FMAP), cols, generator=gen).cuda()
    a, b = device(indices, offsets), placed(indices, offsets)
    assert torch.equal(a, b)
    a.backward(grad)
    b.backward(grad)


@cuda
def test_checkpoints_move_between_placements(gen):
    device, placed = _pair(["cached", "host", "cached", "device"])
    _train(device, placed, [lookups(gen) for _ in range(3)], gen)
    # From the cached module to a fresh device module, and back into a fresh cached module.
    fresh_device, fresh_placed = _pair(["cached", "host", "cached", "device"])
    fresh_device.load_state_dict(placed.state_dict())
    fresh_placed.load_state_dict(device.state_dict())
    _same_state(device, fresh_device)
    _same_state(device, fresh_placed)
    _train(fresh_device, fresh_placed, [lookups(gen) for _ in range(3)], gen)
    assert [w.device.type for w in placed.split_embedding_weights()] == ["cpu"] * len(SPECS)


@cuda
def test_cached_modules_refuse_what_they_cannot_do(gen):
    _, placed = _pair(["cached", "host", "cached", "device"])
    indices, offsets = lookups(gen)
    with pytest.raises(ValueError, match=r"^indices: expected a tensor on cuda"):
        placed(indices, offsets)
    with pytest.raises(ValueError, match=r"^optimizer: 'none'"):
        embscale.TableBatchedEmbeddingBags([(10, 4, "host")], optimizer="none", device="cuda")
    with pytest.raises(ValueError, match=r"^device: a module whose tables live in host memory"):
        placed.half()


def test_the_docs_example_runs():
    """docs/tbe_cache.md's example of tables larger than GPU memory runs as written (on CUDA in the GPU suite)."""
    import pathlib

    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "tbe_cache.md").read_text()
    section = text[text.index("## Placement per table"):]
    code = section[section.index("```python") + len("```python"):]
    exec(compile(code[:code.index("```")], "docs/tbe_cache.md", "exec"), {})
