"""TableBatchedEmbeddingBags' state dict: per-table entries that are views of the module's buffers, round
trips, the flat checkpoints of earlier versions, and the clear refusal of a checkpoint written with another
optimizer or other tables."""
import io

import pytest
import torch

import embscale
import tbe_reference as ref

SPECS = [(12, 4), (9, 3)]
HP = dict(learning_rate=0.05, eps=1e-6)


def trained(optimizer, gen, steps=2, **kw):
    m = embscale.TableBatchedEmbeddingBags(SPECS, optimizer=optimizer, **HP, **kw)
    for _ in range(steps):
        indices, offsets, _ = ref.make_lookups(gen, [12, 9], 3, 3)
        m(indices, offsets).backward(torch.randn(3, 7, generator=gen))
    return m


def saved(sd):
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf)


@pytest.mark.parametrize("optimizer, states", [("sgd", []), ("rowwise_adagrad", ["sum"]),
                                               ("adam", ["exp_avg", "exp_avg_sq"]),
                                               ("partial_rowwise_adam", ["exp_avg", "exp_avg_sq"]), ("none", [])])
def test_keys_are_per_table_views(gen, optimizer, states):
    m = trained(optimizer, gen)
    sd = m.state_dict()
    table_keys = [k for k in sd if k.startswith("table_")]
    assert table_keys == [f"table_{t}.{s}" for t in range(2) for s in ["weight"] + states]
    assert set(sd) - set(table_keys) == {"hparams", "num_skipped", "_extra_state"}
    assert sd["_extra_state"]["optimizer"] == optimizer
    for t, (rows, dim) in enumerate(SPECS):
        w = sd[f"table_{t}.weight"]
        assert w.shape == (rows, dim) and torch.equal(w, m.split_embedding_weights()[t])
        assert w.untyped_storage().data_ptr() == m.weights.untyped_storage().data_ptr()  # a view, not a copy
        for s in states:
            assert torch.equal(sd[f"table_{t}.{s}"], m.optimizer_state()[t][s])
    with torch.no_grad():
        sd["table_1.weight"][2, 1] = 42.0
    assert m.split_embedding_weights()[1][2, 1] == 42.0


def test_table_names_name_the_keys_and_are_checked():
    m = embscale.TableBatchedEmbeddingBags(SPECS, table_names=["user", "item"])
    assert [k for k in m.state_dict() if "." in k] == ["user.weight", "user.sum", "item.weight", "item.sum"]
    for bad in (["a"], ["a", "a"], ["a.b", "c"], ["a", ""], "ab"):
        with pytest.raises(ValueError, match="table_names: "):
            embscale.TableBatchedEmbeddingBags(SPECS, table_names=bad)


@pytest.mark.parametrize("optimizer", ["rowwise_adagrad", "adam"])
def test_round_trip_trains_on_identically(gen, optimizer):
    a = trained(optimizer, gen)
    b = embscale.TableBatchedEmbeddingBags(SPECS, optimizer=optimizer, **HP)
    assert b.load_state_dict(saved(a.state_dict())) is not None
    assert torch.equal(a.weights, b.weights) and torch.equal(a.momentum1, b.momentum1)
    assert torch.equal(a.momentum2, b.momentum2) and a.step == b.step == 2
    indices, offsets, _ = ref.make_lookups(gen, [12, 9], 3, 3)
    g = torch.randn(3, 7, generator=gen)
    for m in (a, b):
        m(indices, offsets).backward(g)
    assert torch.equal(a.weights, b.weights) and torch.equal(a.momentum1, b.momentum1)


def test_flat_checkpoint_of_earlier_versions_loads(gen):
    # The format written before per-table keys, spelled out: the flat buffers as the module held them.
    layout = embscale.TableBatchedEmbeddingBags(SPECS)
    weights = torch.randn(layout.weights.numel(), generator=gen)
    momentum1 = torch.rand(sum(r for r, _ in SPECS), generator=gen)
    hparams = torch.tensor([0.25, 1e-6, 0.9, 0.999, 0.0, 0.0, 0.0, 5.0], dtype=torch.float64)
    flat = {"weights": weights, "_grad_anchor": torch.zeros(0), "momentum1": momentum1,
            "momentum2": torch.zeros(0), "hparams": hparams, "num_skipped": torch.zeros(1, dtype=torch.int64)}
    m = embscale.TableBatchedEmbeddingBags(SPECS)
    result = m.load_state_dict(saved(flat))
    assert not result.missing_keys and not result.unexpected_keys
    assert torch.equal(m.weights, weights) and torch.equal(m.momentum1, momentum1)
    assert m.learning_rate == 0.25 and m.step == 4  # hparams holds the next step's number
    for t, (rows, dim) in enumerate(SPECS):
        start = sum(r * d for r, d in SPECS[:t])
        assert torch.equal(m.split_embedding_weights()[t], weights[start:start + rows * dim].view(rows, dim))


def test_checkpoint_of_another_optimizer_is_refused_by_name(gen):
    sd = saved(trained("adam", gen).state_dict())
    m = embscale.TableBatchedEmbeddingBags(SPECS, optimizer="rowwise_adagrad")
    before = m.weights.clone()
    with pytest.raises(ValueError, match="written with optimizer 'adam'; this module's optimizer is "
                                         "'rowwise_adagrad'"):
        m.load_state_dict(sd)
    assert torch.equal(m.weights, before)
    # The tables alone still load, as the message says.
    tables = {k: v for k, v in sd.items() if k.endswith(".weight")}
    m.load_state_dict(tables, strict=False)
    assert torch.equal(m.split_embedding_weights()[0], sd["table_0.weight"])


def test_flat_checkpoint_of_another_optimizer_is_refused_by_name(gen):
    a = embscale.TableBatchedEmbeddingBags(SPECS, optimizer="adam")
    flat = {"weights": a.weights.detach().clone(), "_grad_anchor": torch.zeros(0), "momentum1": a.momentum1.clone(),
            "momentum2": a.momentum2.clone(), "hparams": a.hparams.clone(), "num_skipped": a.num_skipped.clone()}
    m = embscale.TableBatchedEmbeddingBags(SPECS, optimizer="rowwise_adagrad")
    with pytest.raises(ValueError, match="not that of this module's optimizer 'rowwise_adagrad'.*that of 'adam'"):
        m.load_state_dict(flat)


def test_checkpoint_of_another_weight_decay_mode_is_refused_by_name():
    # The checkpoint's hparams carry its weight decay; loaded into a module of another mode it would be
    # applied another way (or not at all) without a word.
    a = embscale.TableBatchedEmbeddingBags(SPECS, optimizer="rowwise_adagrad", weight_decay=0.01,
                                           weight_decay_mode="decoupled")
    sd = a.state_dict()
    assert sd["_extra_state"]["weight_decay_mode"] == "decoupled"
    m = embscale.TableBatchedEmbeddingBags(SPECS, optimizer="rowwise_adagrad")
    before = [w.clone() for w in m.split_embedding_weights()], m.hparams.clone()
    with pytest.raises(ValueError, match="written with weight_decay_mode 'decoupled'; this module's is 'none'"):
        m.load_state_dict(sd)
    assert all(torch.equal(w, b) for w, b in zip(m.split_embedding_weights(), before[0]))
    assert torch.equal(m.hparams, before[1])
    # The same mode loads; a checkpoint of an earlier version (no mode recorded) still loads.
    same = embscale.TableBatchedEmbeddingBags(SPECS, optimizer="rowwise_adagrad", weight_decay_mode="decoupled")
    same.load_state_dict(sd)
    assert same.hparams[embscale.ops.HPARAM["weight_decay"]] == pytest.approx(0.01)
    del sd["_extra_state"]["weight_decay_mode"]
    m.load_state_dict(sd)
    # The tables alone still load, as the message says.
    m.load_state_dict({k: v for k, v in a.state_dict().items() if k.endswith(".weight")}, strict=False)


def test_checkpoint_of_other_tables_is_refused(gen):
    other = embscale.TableBatchedEmbeddingBags([(12, 4), (9, 5)])
    m = embscale.TableBatchedEmbeddingBags(SPECS)
    with pytest.raises(ValueError, match=r"checkpoint's tables .* are \[\(12, 4\), \(9, 5\)\]; this module's are "
                                         r"\[\(12, 4\), \(9, 3\)\]"):
        m.load_state_dict(other.state_dict())
    sd = other.state_dict()
    del sd["_extra_state"]
    with pytest.raises(ValueError, match=r"table_1.weight has shape \[9, 5\]; this module's is \[9, 3\]"):
        m.load_state_dict(sd, strict=False)
    with pytest.raises(ValueError, match="weights holds 93 elements"):
        m.load_state_dict({"weights": torch.zeros(93)}, strict=False)


def test_missing_and_unexpected_keys_are_reported():
    m = embscale.TableBatchedEmbeddingBags(SPECS)
    sd = m.state_dict()
    del sd["table_1.sum"]
    sd["table_9.weight"] = torch.zeros(1)
    with pytest.raises(RuntimeError, match=r"Missing key\(s\).*table_1.sum.*\n?.*Unexpected key\(s\).*table_9.weight"):
        m.load_state_dict(sd)


# ---- load_state_dict(assign=True) ---------------------------------------------------------------------------
def test_assign_into_a_meta_module_materialises_it_with_the_checkpoint(gen):
    # torch's way of filling a model built without memory; the tables used to stay on meta (nothing loaded)
    # while hparams and num_skipped were replaced by CPU tensors, with "All keys matched".
    a = trained("adam", gen)
    indices, offsets = torch.tensor([0, 1, 11, 2, 8]), torch.tensor([0, 2, 3, 5, 5])
    m = embscale.TableBatchedEmbeddingBags(SPECS, optimizer="adam", device="meta")
    m.load_state_dict(a.state_dict(), assign=True)
    assert {t.device.type for t in (m.weights, m.momentum1, m.momentum2, m.hparams, m.num_skipped)} == {"cpu"}
    assert torch.equal(m(indices, offsets), a(indices, offsets))
    for mine, theirs in zip(m.optimizer_state(), a.optimizer_state()):
        assert all(torch.equal(mine[k], theirs[k]) for k in theirs)
    assert m.step == a.step
    # Entries the checkpoint lacks hold a fresh module's values (zero state), not uninitialised memory.
    tables_only = {k: v for k, v in a.state_dict().items() if k.endswith(".weight")}
    m2 = embscale.TableBatchedEmbeddingBags(SPECS, optimizer="adam", device="meta")
    m2.load_state_dict(tables_only, strict=False, assign=True)
    assert torch.equal(m2(indices, offsets), a(indices, offsets))
    assert not m2.momentum1.any() and not m2.momentum2.any() and m2.step == 0
    # A refused checkpoint leaves the module on meta.
    m3 = embscale.TableBatchedEmbeddingBags(SPECS, optimizer="adam", device="meta")
    bad = a.state_dict()
    bad["hparams"] = torch.zeros(3, dtype=torch.float64)
    with pytest.raises(ValueError, match="hparams has shape"):
        m3.load_state_dict(bad, assign=True)
    assert m3.weights.is_meta


def test_assign_does_not_share_state_with_the_source_module(gen):
    # The tables are copied; hparams used to be installed as the source's own tensor, so the loaded module's
    # backward advanced the source's step and set_learning_rate changed the source's rate.
    a = trained("rowwise_adagrad", gen)
    b = embscale.TableBatchedEmbeddingBags(SPECS, optimizer="rowwise_adagrad")
    b.load_state_dict(a.state_dict(), assign=True)
    step, lr = a.step, a.learning_rate
    b.set_learning_rate(0.5)
    b(torch.tensor([0, 1]), torch.tensor([0, 1, 2])).sum().backward()
    assert (a.step, a.learning_rate) == (step, lr)
    assert b.step == step + 1


def test_assign_of_a_flat_checkpoint_keeps_the_module_usable(gen):
    # A flat checkpoint of fp16 tables, float64 state and an int32 count, loaded with assign=True, used to be
    # installed as given: every later call failed ("weights: dtype fp16 differs ...").
    a16 = embscale.TableBatchedEmbeddingBags(SPECS, optimizer="rowwise_adagrad").half()
    flat = {"weights": a16.weights.detach().clone(), "momentum1": a16.momentum1.clone().double(),
            "momentum2": a16.momentum2.clone(), "hparams": a16.hparams.clone(),
            "num_skipped": torch.zeros(1, dtype=torch.int32)}
    b = embscale.TableBatchedEmbeddingBags(SPECS, optimizer="rowwise_adagrad")
    b.load_state_dict(flat, strict=False, assign=True)
    assert (b.weights.dtype, b.momentum1.dtype, b.num_skipped.dtype) == (torch.float32, torch.float32, torch.int64)
    indices, offsets = torch.tensor([0, 1, 11, 2, 8]), torch.tensor([0, 2, 3, 5, 5])
    assert torch.equal(b(indices, offsets), a16(indices, offsets).float())
    b(indices, offsets).sum().backward()  # trains
    assert b.step == 1


def test_copying_into_a_meta_module_warns_that_nothing_is_loaded(gen):
    a = trained("sgd", gen)
    m = embscale.TableBatchedEmbeddingBags(SPECS, optimizer="sgd", device="meta")
    with pytest.warns(UserWarning, match="tables: copying a checkpoint's tables into a module on the meta device"):
        m.load_state_dict(a.state_dict())
    assert m.weights.is_meta
