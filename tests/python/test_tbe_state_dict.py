"""TableBatchedEmbeddingBags' state dict: per-table entries that are views of the module's buffers, round
trips, load_state_dict(assign=True), and the clear refusal, changing nothing, of a checkpoint written with
another optimizer or other tables, or with a bad entry (not a tensor, of another shape, a malformed extra state,
hyper-parameters the backward would refuse)."""
import io

import pytest
import torch

import embscale
from embscale import ops
import tbe_reference as ref
from two_tables import make, lookups, snapshot, assert_unchanged, train_step

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
    # The same mode loads; a checkpoint that names no mode is refused.
    same = embscale.TableBatchedEmbeddingBags(SPECS, optimizer="rowwise_adagrad", weight_decay_mode="decoupled")
    same.load_state_dict(sd)
    assert same.hparams[embscale.ops.HPARAM["weight_decay"]] == pytest.approx(0.01)
    del sd["_extra_state"]["weight_decay_mode"]
    with pytest.raises(ValueError, match="does not describe a TableBatchedEmbeddingBags"):
        same.load_state_dict(sd)
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


def test_missing_and_unexpected_keys_are_reported():
    m = embscale.TableBatchedEmbeddingBags(SPECS)
    sd = m.state_dict()
    del sd["table_1.sum"]
    sd["table_9.weight"] = torch.zeros(1)
    with pytest.raises(RuntimeError, match=r"Missing key\(s\).*table_1.sum.*\n?.*Unexpected key\(s\).*table_9.weight"):
        m.load_state_dict(sd)


def test_the_whole_buffers_are_no_entries(gen):
    # weights, momentum1 and momentum2 are in state_dict() per table only: torch's loader, which knows them by
    # name, would copy them in unchecked; they are unexpected keys instead, and a lenient load ignores them.
    m = trained("rowwise_adagrad", gen)
    before = _snapshot(m)
    whole = {name: getattr(m, name).detach() + 1 for name in ("weights", "momentum1", "momentum2")}
    with pytest.raises(RuntimeError, match=r"Unexpected key\(s\).*weights.*momentum1.*momentum2"):
        m.load_state_dict({**m.state_dict(), **whole})
    result = m.load_state_dict(whole, strict=False)
    assert set(result.unexpected_keys) == set(whole)
    assert all(torch.equal(a, b) for a, b in zip(before, _snapshot(m)))


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


def test_assign_of_a_checkpoint_of_other_dtypes_keeps_the_module_usable(gen):
    # A checkpoint of fp16 tables, float64 state and an int32 count, loaded with assign=True: the module keeps
    # its dtypes (installed as given, every later call would fail: "weights: dtype fp16 differs ...").
    a16 = embscale.TableBatchedEmbeddingBags(SPECS, optimizer="rowwise_adagrad").half()
    sd = {k: v.double() if k.endswith(".sum") else v for k, v in a16.state_dict().items()}
    sd["num_skipped"] = torch.zeros(1, dtype=torch.int32)
    b = embscale.TableBatchedEmbeddingBags(SPECS, optimizer="rowwise_adagrad")
    b.load_state_dict(sd, assign=True)
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


def test_a_checkpoint_loaded_between_forward_and_backward_is_what_that_backward_updates(gen):
    # The backward reads the tables, state and hyper-parameters as they are when it runs; with assign=True
    # the loader installs new tensors (hparams), and the backward used to update the forward's old ones: the
    # old learning rate, and the module's step unmoved.
    source = trained("rowwise_adagrad", gen)
    source.set_learning_rate(0.5)
    indices, offsets, _ = ref.make_lookups(gen, [12, 9], 3, 3)
    g = torch.randn(3, 7, generator=gen)
    loaded = []
    for assign in (False, True):
        sd = saved(source.state_dict())
        m = embscale.TableBatchedEmbeddingBags(SPECS, optimizer="rowwise_adagrad", **HP)
        out = m(indices, offsets)
        m.load_state_dict(sd, strict=False, assign=assign)
        out.backward(g)
        loaded.append(m)
    copied, assigned = loaded
    assert assigned.step == copied.step == source.step + 1
    assert assigned.learning_rate == 0.5
    assert not torch.equal(copied.weights, source.weights)  # the backward updated the loaded tables
    assert torch.equal(assigned.weights, copied.weights) and torch.equal(assigned.momentum1, copied.momentum1)


@pytest.mark.parametrize("hp", ["float32", "strided"])
def test_hparams_loaded_with_assign_are_kept_as_the_module_keeps_them(hp):
    m = make("cpu", optimizer="sgd")
    sd = m.state_dict()
    good = sd["hparams"].clone()
    sd["hparams"] = good.float() if hp == "float32" else torch.stack([good, good], 1)[:, 0]
    assert hp == "float32" or not sd["hparams"].is_contiguous()
    m.load_state_dict(sd, assign=True)
    assert m.hparams.dtype == torch.float64 and m.hparams.device.type == "cpu" and m.hparams.is_contiguous()
    assert torch.equal(m.hparams, sd["hparams"].double())  # the checkpoint's values (float32's, for float32)
    i, o = lookups("cpu")
    train_step(m, i, o)
    assert m.step == 1


# ---- a refused checkpoint changes nothing ---------------------------------------------------------------------
def _loadable(m):
    """m's state_dict with every entry changed (so that any entry a refused load wrote would show)."""
    sd = saved(m.state_dict())
    for key, value in sd.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point() and key != "hparams":
            sd[key] = value + 0.5
    sd["hparams"][embscale.ops.HPARAM["learning_rate"]] = 0.25
    sd["hparams"][embscale.ops.HPARAM["step"]] = 9
    sd["num_skipped"] = torch.tensor([5])
    return sd


def _snapshot(m):
    return [t.detach().clone() for t in (m.weights, m.momentum1, m.momentum2, m.hparams, m.num_skipped)]


def _with_hparam(field, value):
    hp = embscale.TableBatchedEmbeddingBags(SPECS, **HP).hparams.clone()
    hp[embscale.ops.HPARAM[field]] = value
    return hp


def _negative_at(shape, at):
    t = torch.ones(shape)
    t[at] = -1.0
    return t


# (optimizer, key, bad value, error, message); each key comes after entries the load would write first.
BAD_ENTRIES = [
    ("rowwise_adagrad", "table_1.weight", torch.zeros(9, 3, device="meta"), ValueError,
     r"^state_dict: table_1.weight is on the meta device"),
    ("rowwise_adagrad", "table_1.weight", torch.zeros(9, 3).to_sparse(), ValueError,
     r"^state_dict: table_1.weight is a torch.sparse_coo tensor; expected a dense"),
    ("rowwise_adagrad", "table_1.weight", torch.zeros(9, 3, dtype=torch.complex64), TypeError,
     r"^state_dict: table_1.weight has dtype torch.complex64; expected a floating-point dtype"),
    ("rowwise_adagrad", "table_1.weight", torch.zeros(9, 3, dtype=torch.bool), TypeError,
     r"^state_dict: table_1.weight has dtype torch.bool"),
    ("rowwise_adagrad", "table_1.weight", torch.zeros(9, 3, dtype=torch.int64), TypeError,
     r"^state_dict: table_1.weight has dtype torch.int64"),
    ("rowwise_adagrad", "table_1.weight", torch.zeros(9, 4), ValueError,
     r"^state_dict: table_1.weight has shape \[9, 4\]; this module's is \[9, 3\]"),
    ("rowwise_adagrad", "table_1.sum", _negative_at(9, 4), ValueError,
     r"^state_dict: table_1.sum\[4\] is -1.0; the optimizer state 'sum' must be finite and >= 0"),
    ("rowwise_adagrad", "table_1.sum", torch.full((9,), float("nan")), ValueError,
     r"^state_dict: table_1.sum\[0\] is nan; the optimizer state 'sum' must be finite"),
    ("rowwise_adagrad", "table_1.sum", torch.full((9,), 1e300, dtype=torch.float64), ValueError,
     r"^state_dict: table_1.sum\[0\] is inf"),  # (finite in float64, not in the module's float32)
    ("rowwise_adagrad", "table_1.sum", torch.zeros(9, device="meta"), ValueError,
     r"^state_dict: table_1.sum is on the meta device"),
    ("adam", "table_1.exp_avg", _negative_at((9, 3), (2, 1)) * float("inf"), ValueError,
     r"^state_dict: table_1.exp_avg\[0, 0\] is inf; the optimizer state 'exp_avg' must be finite$"),
    ("adam", "table_1.exp_avg_sq", _negative_at((9, 3), (2, 1)), ValueError,
     r"^state_dict: table_1.exp_avg_sq\[2, 1\] is -1.0; .* must be finite and >= 0"),
    ("partial_rowwise_adam", "table_1.exp_avg_sq", _negative_at(9, 8), ValueError,
     r"^state_dict: table_1.exp_avg_sq\[8\] is -1.0"),
    ("rowwise_adagrad", "hparams", torch.zeros(8, dtype=torch.float64, device="meta"), ValueError,
     r"^state_dict: hparams is on the meta device"),
    ("rowwise_adagrad", "hparams", torch.ones(8, dtype=torch.int64), TypeError,
     r"^state_dict: hparams has dtype torch.int64; expected a floating-point dtype"),
    ("rowwise_adagrad", "hparams", _with_hparam("learning_rate", float("nan")), ValueError,
     r"^state_dict: hparams: learning_rate: nan"),
    ("rowwise_adagrad", "hparams", _with_hparam("step", float("inf")), ValueError,
     r"^state_dict: hparams: step: inf"),
    ("rowwise_adagrad", "hparams", torch.zeros(3, dtype=torch.float64), ValueError,
     r"^state_dict: hparams has shape \[3\]; this module's is \[10\]$"),
    ("rowwise_adagrad", "num_skipped", torch.tensor([1.5]), TypeError,
     r"^state_dict: num_skipped has dtype torch.float32; expected an integer dtype"),
    ("rowwise_adagrad", "num_skipped", torch.zeros(1, dtype=torch.int64, device="meta"), ValueError,
     r"^state_dict: num_skipped is on the meta device"),
    ("rowwise_adagrad", "num_skipped", torch.zeros(1, dtype=torch.int64).to_sparse(), ValueError,
     r"^state_dict: num_skipped is a torch.sparse_coo tensor"),
]


@pytest.mark.parametrize("assign", [False, True], ids=["copy", "assign"])
@pytest.mark.parametrize("optimizer, key, bad, error, message", BAD_ENTRIES,
                         ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(BAD_ENTRIES)])
def test_a_refused_checkpoint_names_its_bad_entry_and_changes_nothing(gen, assign, optimizer, key, bad, error,
                                                                       message):
    # Only shapes used to be checked before copying: a later entry on meta, sparse or of another dtype
    # failed inside copy_ (naming no entry) after the tables before it were written, and a negative
    # Adagrad accumulator was taken (its updates were ~1e6).
    m = trained(optimizer, gen)
    sd = _loadable(m)
    sd[key] = bad
    before = _snapshot(m)
    with pytest.raises(error, match=message):
        m.load_state_dict(sd, assign=assign)
    assert all(torch.equal(a, b) for a, b in zip(before, _snapshot(m)))
    del sd[key]
    m.load_state_dict(sd, strict=False, assign=assign)  # the other entries load
    assert torch.equal(m.split_embedding_weights()[0], sd["table_0.weight"]) and m.step == (8 if "hparams" in sd else 2)  # (hparams holds the next step)


def test_a_non_tensor_entry_is_refused_by_name():
    m = make("cpu")
    snap = snapshot(m)
    with pytest.raises(ValueError, match=r"state_dict: table_0.weight is a float, not a tensor"):
        m.load_state_dict({"table_0.weight": 3.0}, strict=False)
    assert_unchanged(m, snap)


def test_a_checkpoint_whose_hparams_do_not_fit_changes_no_table():
    """A checkpoint whose tables fit but whose own buffers (hparams) do not is refused before any table is
    written."""
    m = make("cpu", optimizer="rowwise_adagrad")
    sd = {k: v.clone() + 1 if isinstance(v, torch.Tensor) and v.is_floating_point() else v
          for k, v in m.state_dict().items()}
    sd["hparams"] = torch.zeros(7, dtype=m.hparams.dtype)
    snap = snapshot(m)
    with pytest.raises(ValueError, match=r"state_dict: hparams has shape \[7\]; this module's is"):
        m.load_state_dict(sd)
    assert_unchanged(m, snap)


def test_a_malformed_extra_state_is_refused_by_name():
    m = make("cpu")
    sd = m.state_dict()
    sd["_extra_state"] = {"optimizer": m.optimizer, "weight_decay_mode": m.weight_decay_mode, "embedding_specs": 5}
    snap = snapshot(m)
    with pytest.raises(ValueError, match=r"_extra_state's embedding_specs 5 is not a list"):
        m.load_state_dict(sd)
    assert_unchanged(m, snap)


def test_a_checkpoint_with_bad_hyper_parameters_is_refused_before_any_table_is_written():
    m = make("cpu", optimizer="rowwise_adagrad")
    sd = {k: v.clone() + 1 if isinstance(v, torch.Tensor) and v.is_floating_point() else v
          for k, v in m.state_dict().items()}
    sd["hparams"][ops.HPARAM["eps"]] = -1.0
    snap = snapshot(m)
    with pytest.raises(ValueError, match=r"^state_dict: hparams: eps: -1; rowwise_adagrad needs a finite eps > 0$"):
        m.load_state_dict(sd)
    assert_unchanged(m, snap)


def test_negative_first_moments_load(gen):
    # Only sums of squares must be >= 0: Adam's first moments take any finite sign.
    m = trained("adam", gen)
    sd = m.state_dict()
    sd["table_1.exp_avg"] = -torch.ones(9, 3)
    m.load_state_dict(sd)
    assert torch.equal(m.optimizer_state()[1]["exp_avg"], -torch.ones(9, 3))


def test_assign_into_a_meta_module_refuses_a_meta_entry_among_real_ones(gen):
    # The module used to be made real for the first table, then the copy of the meta one failed.
    sd = trained("adam", gen).state_dict()
    sd["table_1.exp_avg"] = torch.zeros(9, 3, device="meta")
    m = embscale.TableBatchedEmbeddingBags(SPECS, optimizer="adam", device="meta")
    with pytest.raises(ValueError, match=r"^state_dict: table_1.exp_avg is on the meta device"):
        m.load_state_dict(sd, assign=True)
    assert m.weights.is_meta and m.momentum1.is_meta


def test_a_module_inside_a_model_checks_and_loads_its_prefixed_entries(gen):
    model = torch.nn.Sequential(trained("rowwise_adagrad", gen))
    sd = _loadable(model[0])
    sd = {f"0.{k}": v for k, v in sd.items()}
    sd["0.table_1.sum"] = _negative_at(9, 3)
    before = _snapshot(model[0])
    with pytest.raises(ValueError, match=r"^state_dict: 0.table_1.sum\[3\] is -1.0"):
        model.load_state_dict(sd)
    assert all(torch.equal(a, b) for a, b in zip(before, _snapshot(model[0])))
    sd["0.table_1.sum"] = torch.ones(9)
    model.load_state_dict(sd)
    assert model[0].step == 8 and torch.equal(model[0].optimizer_state()[1]["sum"], torch.ones(9))
