"""Property-based fuzz tests (hypothesis) of embscale.TableBatchedEmbeddingBags and the TBE raw operators,
on the CPU.

Valid configurations and lookups drawn at random are compared with naive references (tbe_reference.py);
hostile inputs (wrong dtypes, devices, lengths, values, handles, hyper-parameters) must raise the documented
exception type (TypeError for a dtype, ValueError for a shape, device or value, IndexError for an index or
offset outside its range) with a message naming the argument, and leave the inputs, the tables, the
optimizer state and the step counter bit for bit as they were. The profile, crash isolation and shared
checks are in fuzz_support.py.
"""
import copy
import math
import pickle

import torch

# fuzz_support skips this file when hypothesis is not installed, so it is imported first.
from fuzz_support import PROFILE, OPS, crumb, isolated, bits, same_bits, expect_error
from hypothesis import given
from hypothesis import strategies as st

import embscale
import tbe_reference as ref


# ---- TBE: configurations and lookups --------------------------------------------------------------------
@st.composite
def tbe_configs(draw, pooling=None):
    T = draw(st.integers(1, 4))
    pooling = draw(st.sampled_from(["sum", "mean", "none"])) if pooling is None else pooling
    if pooling == "none":
        D = draw(st.integers(1, 9))
        specs = [(draw(st.integers(1, 30)), D) for _ in range(T)]
    else:
        specs = [(draw(st.integers(1, 30)), draw(st.sampled_from([1, 2, 3, 4, 5, 8, 16, 33]))) for _ in range(T)]
    fmap = draw(st.one_of(st.none(), st.lists(st.integers(0, T - 1), min_size=1, max_size=5)))
    return dict(
        specs=specs, fmap=fmap, pooling=pooling,
        optimizer=draw(st.sampled_from(["sgd", "rowwise_adagrad", "adam", "partial_rowwise_adam", "adagrad", "lamb",
                                        "partial_rowwise_lamb", "lars_sgd"])),
        weights_dtype=draw(st.sampled_from([torch.float32, torch.float32, torch.float16, torch.bfloat16])),
        output_dtype=draw(st.sampled_from([torch.float32, torch.float32, torch.float16, torch.bfloat16])),
        bounds_check=draw(st.sampled_from(["error", "skip", "off", "warn"])),
        index_dtype=draw(st.sampled_from([torch.int32, torch.int64])),
        B=draw(st.integers(0, 5)), max_bag=draw(st.integers(0, 4)),
        weighted=pooling != "mean" and draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)))


def make_module(cfg, **kw):
    m = embscale.TableBatchedEmbeddingBags(
        cfg["specs"], feature_table_map=cfg["fmap"], optimizer=cfg["optimizer"], pooling=cfg["pooling"],
        weights_dtype=cfg["weights_dtype"], output_dtype=cfg["output_dtype"], bounds_check=cfg["bounds_check"],
        learning_rate=0.05, eps=1e-6, beta1=0.9, beta2=0.99, device="cpu", **kw)
    return m


def lookups(cfg):
    fmap = cfg["fmap"] if cfg["fmap"] is not None else list(range(len(cfg["specs"])))
    g = torch.Generator().manual_seed(cfg["seed"])
    rows = [cfg["specs"][t][0] for t in fmap]
    indices, offsets, psw = ref.make_lookups(g, rows, cfg["B"], cfg["max_bag"], cfg["index_dtype"], cfg["weighted"])
    return fmap, indices, offsets, psw, g


def snapshot(m):
    return {name: bits(getattr(m, name)) for name in ("weights", "momentum1", "momentum2", "hparams")}


def assert_unchanged(m, snap, what):
    for name, before in snap.items():
        assert same_bits(bits(getattr(m, name)), before), f"{what}: {name} changed by a refused call"


OUT_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@isolated
@PROFILE
@given(cfg=tbe_configs())
def test_tbe_forward_matches_reference(cfg):
    crumb(f"TBE forward {cfg}")
    m = make_module(cfg)
    fmap, indices, offsets, psw, _ = lookups(cfg)
    out = m(indices, offsets, psw)
    want = ref.forward([w.detach().double() for w in m.split_embedding_weights()], fmap, indices, offsets, cfg["B"],
                       cfg["pooling"], psw)
    assert out.dtype == cfg["output_dtype"] and out.shape == want.shape
    tol = max(OUT_TOL[cfg["output_dtype"]], OUT_TOL[cfg["weights_dtype"]] if cfg["weights_dtype"] != torch.float32 else 0)
    torch.testing.assert_close(out.double(), want.to(cfg["output_dtype"]).double(), rtol=tol, atol=tol)


@isolated
@PROFILE
@given(cfg=tbe_configs(), pooling=st.sampled_from(["sum", "mean"]), steps=st.integers(1, 2))
def test_tbe_training_matches_reference(cfg, pooling, steps):
    """fp32 tables, nearest rounding: each backward applies the reference optimizer to the touched rows."""
    cfg = dict(cfg, pooling=pooling, weights_dtype=torch.float32, output_dtype=torch.float32,
               weighted=cfg["weighted"] and pooling == "sum", specs=[(r, d) for r, d in cfg["specs"]])
    crumb(f"TBE training {cfg}, {steps} steps")
    m = make_module(cfg, stochastic_rounding=False)
    tables = [w.detach().double().clone() for w in m.split_embedding_weights()]
    opt = cfg["optimizer"]
    state = [{"m1": torch.zeros(r if opt == "rowwise_adagrad" else (r, d), dtype=torch.float64),
              "m2": torch.zeros(r if opt.startswith("partial_rowwise") else (r, d), dtype=torch.float64)}
             for r, d in cfg["specs"]]
    hp = dict(learning_rate=0.05, eps=1e-6, beta1=0.9, beta2=0.99, weight_decay=0.0, weight_decay_mode="none",
              max_norm=0.0, gradient_clipping=0.0, eta=0.001, momentum=0.9)
    for step in range(1, steps + 1):
        fmap, indices, offsets, psw, g = lookups(dict(cfg, seed=cfg["seed"] + step))
        grad_out = torch.randn(cfg["B"], m.total_dim, generator=g)
        assert m.step == step - 1  # steps taken
        m(indices, offsets, psw).backward(grad_out)
        grads, touched, _ = ref.dense_grads(tables, fmap, indices, offsets, cfg["B"], pooling, grad_out, psw)
        ref.apply_optimizer(opt, tables, state, grads, touched, hp, step)
    assert m.step == steps
    for got, want in zip(m.split_embedding_weights(), tables):
        torch.testing.assert_close(got.detach().double(), want, rtol=1e-4, atol=1e-4)


# ---- TBE: hostile inputs to the module ------------------------------------------------------------------
HOSTILE_FORWARD = ["indices_dtype", "offsets_dtype", "offsets_2d", "offsets_len", "psw_dtype", "psw_len",
                   "psw_mean", "index_range", "offsets_decreasing", "offsets_negative", "offsets_last",
                   "indices_meta", "offsets_meta", "psw_2d", "indices_2d"]


@isolated
@PROFILE
@given(cfg=tbe_configs(), kind=st.sampled_from(HOSTILE_FORWARD), data=st.data())
def test_tbe_module_hostile_forward(cfg, kind, data):
    """The documented exception naming the argument; tables, state and step unchanged; a later valid
    training step still works."""
    if kind == "psw_mean":
        cfg = dict(cfg, pooling="mean", weighted=False)
    if kind == "index_range":
        cfg = dict(cfg, bounds_check="error", B=max(1, cfg["B"]), max_bag=max(1, cfg["max_bag"]))
    m = make_module(cfg)
    fmap, indices, offsets, psw, g = lookups(cfg)
    N, TB = indices.numel(), offsets.numel() - 1
    if kind == "indices_dtype":
        args, exc, names = (indices.to(data.draw(st.sampled_from([torch.float32, torch.int16, torch.uint8, torch.bool]))),
                            offsets, psw), TypeError, ("indices",)
    elif kind == "offsets_dtype":
        # (int32 and int64 mixed are accepted: the module runs them as int64, as FBGEMM)
        args, exc, names = (indices, offsets.to(data.draw(st.sampled_from([torch.int16, torch.uint8, torch.float32]))),
                            psw), TypeError, ("offsets",)
    elif kind == "offsets_2d":
        args, exc, names = (indices, offsets.reshape(1, -1), psw), ValueError, ("offsets",)
    elif kind == "indices_2d":
        args, exc, names = (indices.reshape(1, -1), offsets, psw), ValueError, ("indices",)
    elif kind == "offsets_len":
        extra = data.draw(st.sampled_from([-1, 1, 2]))
        off = torch.cat([offsets, offsets[-1:].repeat(extra)]) if extra > 0 else offsets[:extra]
        if off.numel() == 0 or (off.numel() - 1) % len(fmap) == 0:
            off = torch.cat([offsets, offsets[-1:]]) if len(fmap) > 1 else offsets[:0]
        args, exc, names = (indices, off, psw), ValueError, ("offsets",)
    elif kind == "psw_dtype":
        if cfg["pooling"] == "mean":
            return
        bad = torch.ones(N, dtype=data.draw(st.sampled_from([torch.float64, torch.float16, torch.int32])))
        args, exc, names = (indices, offsets, bad), TypeError, ("per_sample_weights",)
    elif kind == "psw_len":
        if cfg["pooling"] == "mean":
            return
        n = data.draw(st.sampled_from([N + 1, N + 3, max(0, N - 1)] if N else [1, 2]))
        if n == N:
            n = N + 1
        args, exc, names = (indices, offsets, torch.ones(n)), ValueError, ("per_sample_weights",)
    elif kind == "psw_2d":
        if cfg["pooling"] == "mean":
            return
        args, exc, names = (indices, offsets, torch.ones(1, N)), ValueError, ("per_sample_weights",)
    elif kind == "psw_mean":
        args, exc, names = (indices, offsets, torch.ones(N)), ValueError, ("per_sample_weights",)
    elif kind == "index_range":
        if N == 0:
            return
        bad = indices.clone()
        pos = data.draw(st.integers(0, N - 1))
        big = 2**31 - 1 if cfg["index_dtype"] == torch.int32 else data.draw(st.sampled_from([2**40, 2**63 - 1]))
        bad[pos] = data.draw(st.sampled_from([-1, big, max(r for r, _ in cfg["specs"]) + 1]))
        args, exc, names = (bad, offsets, psw), IndexError, ("indices",)
    elif kind in ("offsets_decreasing", "offsets_negative", "offsets_last"):
        bad = offsets.clone()
        if kind == "offsets_negative":
            bad[0] = -1
        elif kind == "offsets_last":
            bad[-1] = bad[-1] + data.draw(st.sampled_from([1, 5, 2**30]))
        else:
            if TB == 0:
                return
            i = data.draw(st.integers(1, TB))
            bad[i] = bad[i - 1] - data.draw(st.integers(1, 3))
        # Offsets are checked in every bounds-check mode on the CPU (out of range: IndexError).
        args, exc, names = (indices, bad, psw), IndexError, ("offsets",)
    elif kind == "indices_meta":
        args, exc, names = (indices.to("meta"), offsets, psw), ValueError, ("indices", "offsets", "weights", "device")
    else:  # offsets_meta
        args, exc, names = (indices, offsets.to("meta"), psw), ValueError, ("indices", "offsets", "weights", "device")
    crumb(f"TBE hostile forward {kind}: {cfg}")
    snap = snapshot(m)
    keep = [bits(t) for t in args if t is not None]
    expect_error(exc, names, m, *args)
    assert_unchanged(m, snap, kind)
    assert all(same_bits(bits(t), b) for t, b in zip([t for t in args if t is not None], keep)), "an input was written"
    # the module still trains
    out = m(indices, offsets, psw)
    out.float().sum().backward()
    assert m.step == 1


HOSTILE_HPARAMS = [("learning_rate", math.nan), ("learning_rate", math.inf), ("learning_rate", -0.5),
                   ("eps", math.nan), ("eps", 0.0), ("eps", -1.0), ("beta1", 1.0), ("beta1", math.nan),
                   ("beta2", -0.1), ("weight_decay", math.nan), ("max_norm", -1.0), ("max_norm", math.nan),
                   ("gradient_clipping", -1.0), ("gradient_clipping", math.inf), ("step", 0), ("step", -3),
                   ("step", math.nan), ("step", 2.0**70), ("step", 1.5), ("step", -(2.0**63)), ("eta", -0.1),
                   ("eta", math.inf), ("momentum", 1.0), ("momentum", -0.5), ("momentum", math.nan)]


@isolated
@PROFILE
@given(cfg=tbe_configs(pooling="sum"), bad=st.sampled_from(HOSTILE_HPARAMS))
def test_tbe_module_hostile_hyperparameters(cfg, bad):
    """A hyper-parameter the optimizer uses, set to a bad value, fails the backward with ValueError naming
    it; weights, state and step are unchanged."""
    name, value = bad
    adams = ("adam", "partial_rowwise_adam", "lamb", "partial_rowwise_lamb")
    uses = {"eps": ("rowwise_adagrad", "adagrad") + adams, "beta1": adams, "beta2": adams,
            "max_norm": ("rowwise_adagrad",), "eta": ("lars_sgd",), "momentum": ("lars_sgd",)}
    if name in uses and cfg["optimizer"] not in uses[name]:
        return  # not this optimizer's parameter (the library may ignore it)
    cfg = dict(cfg, B=max(1, cfg["B"]))
    m = make_module(cfg)
    fmap, indices, offsets, psw, _ = lookups(cfg)
    from embscale import ops as _ops  # the hyper-parameter layout of the module's hparams buffer
    m.hparams[_ops.HPARAM[name]] = value
    crumb(f"TBE hyper-parameter {name}={value}: {cfg}")
    out = m(indices, offsets, psw)
    snap = snapshot(m)
    expect_error(ValueError, (name,), out.float().sum().backward)
    assert_unchanged(m, snap, f"{name}={value}")


@isolated
@PROFILE
@given(cfg=tbe_configs(), kw=st.sampled_from([
    dict(embedding_specs=[]), dict(embedding_specs=[(0, 4)]), dict(embedding_specs=[(5, 0)]),
    dict(embedding_specs=[(-1, 4)]), dict(embedding_specs=[(5, 4, 1)]), dict(feature_table_map=[]),
    dict(feature_table_map=[7]), dict(feature_table_map=[-1]), dict(pooling="avg"), dict(optimizer="adagradd"),
    dict(bounds_check="warning"), dict(weight_decay_mode="l1"), dict(weights_dtype=torch.int32),
    dict(output_dtype=torch.float64), dict(weights_dtype=torch.float8_e4m3fn), dict(device="xla"),
    dict(device="nope"), dict(embedding_specs=[("a", 4)])]))
def test_tbe_module_hostile_construction(cfg, kw):
    crumb(f"TBE construction {kw}: {cfg}")
    args = dict(embedding_specs=cfg["specs"], feature_table_map=cfg["fmap"], pooling=cfg["pooling"],
                optimizer=cfg["optimizer"])
    args.update(kw)
    name = next(iter(kw))
    exc = TypeError if name.endswith("dtype") else ValueError
    names = (name, "device") if name == "device" else (name,)
    expect_error(exc, names, embscale.TableBatchedEmbeddingBags, **args)


# ---- TBE: hostile raw operators -------------------------------------------------------------------------
@isolated
@PROFILE
@given(cfg=tbe_configs(pooling="sum"), handle=st.one_of(
    st.integers(-2**63, 2**63 - 1), st.sampled_from([0, -1, 2**62, 2**63 - 1, -2**63, True, False])),
    op=st.sampled_from(["fwd", "bwd"]))
def test_raw_ops_refuse_garbage_handles(cfg, handle, op):
    """A handle that names no live TableBatchedEmbedding (any integer that is not a live id, an id freed
    with its module) raises ValueError naming `handle`; nothing is written."""
    m = make_module(cfg)
    fmap, indices, offsets, psw, _ = lookups(cfg)
    if not isinstance(handle, bool) and 0 < handle < 2**40:
        handle += 2**40  # live ids are small counters: keep clear of other modules' live handles
    if op == "fwd" and isinstance(handle, int) and handle % 7 == 3:
        dead = make_module(cfg)
        handle = dead._handle_id  # an id whose module is gone
        del dead
    crumb(f"raw {op} with handle={handle!r}: {cfg}")
    snap = snapshot(m)
    if op == "fwd":
        expect_error(ValueError, ("handle",), OPS.tbe_forward, m.weights, indices, offsets, psw, handle, cfg["B"],
                     "sum", cfg["bounds_check"], m.total_dim, torch.float32)
    else:
        go = torch.ones(cfg["B"], m.total_dim)
        expect_error(ValueError, ("handle",), OPS.tbe_backward, m.weights, m.momentum1, m.momentum2, m.hparams, go,
                     indices, offsets, psw, handle, cfg["B"], "sum", cfg["bounds_check"], cfg["optimizer"], "none",
                     True, 0, False)
    assert_unchanged(m, snap, f"handle={handle!r}")


RAW_BACKWARD_HOSTILE = ["momentum1_len", "momentum2_len", "momentum1_dtype", "momentum_missing", "momentum_extra",
                        "grad_output_shape", "grad_output_dtype", "hparams_shape", "hparams_dtype", "batch_size",
                        "batch_size_negative", "optimizer_name", "wd_mode", "pooling_name", "bounds_name",
                        "weights_len", "weights_dtype", "momentum1_meta", "grad_output_meta"]


@isolated
@PROFILE
@given(cfg=tbe_configs(pooling="sum"), kind=st.sampled_from(RAW_BACKWARD_HOSTILE), data=st.data())
def test_raw_tbe_backward_hostile(cfg, kind, data):
    """torch.ops.embscale.tbe_backward with one argument wrong: the documented exception naming it, and
    weights, optimizer state and step (hparams) unchanged."""
    cfg = dict(cfg, B=max(1, cfg["B"]))
    m = make_module(cfg)
    fmap, indices, offsets, psw, g = lookups(cfg)
    B = cfg["B"]
    w, m1, m2, hp = m.weights.detach(), m.momentum1, m.momentum2, m.hparams
    go = torch.randn(B, m.total_dim, generator=g)
    a = dict(weights=w, momentum1=m1, momentum2=m2, hparams=hp, grad_output=go, indices=indices, offsets=offsets,
             per_sample_weights=psw, handle=m._handle_id, batch_size=B, pooling="sum", bounds_check=cfg["bounds_check"],
             optimizer=cfg["optimizer"], weight_decay_mode="none", stochastic_rounding=True, seed=0,
             grad_per_sample_weights=False)
    exc, names = ValueError, (kind.split("_")[0],)
    delta = data.draw(st.sampled_from([-1, 1, 5]))
    if kind in ("momentum1_len", "momentum2_len"):
        name = kind[:9]
        cur = a[name]
        if cur.numel() == 0:
            return
        n = cur.numel() + delta  # 0: absent, refused as well
        a[name] = torch.zeros(n if n >= 0 else cur.numel() + 1)
        names = (name,)
    elif kind == "momentum1_dtype":
        if m1.numel() == 0:
            return
        a["momentum1"] = torch.zeros(m1.numel(), dtype=data.draw(st.sampled_from([torch.float64, torch.float16])))
        exc, names = TypeError, ("momentum1",)
    elif kind == "momentum_missing":
        if m1.numel() == 0:
            return
        a["momentum1"] = torch.zeros(0)
        names = ("momentum1",)
    elif kind == "momentum_extra":
        if m2.numel() > 0:
            return
        a["momentum2"] = torch.zeros(m.weights.numel())
        names = ("momentum2",)
    elif kind == "grad_output_shape":
        a["grad_output"] = data.draw(st.sampled_from([torch.zeros(B + 1, m.total_dim), torch.zeros(B, m.total_dim + 1),
                                                      torch.zeros(B * m.total_dim), torch.zeros(1, B, m.total_dim)]))
        names = ("grad_output",)
    elif kind == "grad_output_dtype":
        a["grad_output"] = go.to(data.draw(st.sampled_from([torch.float64, torch.int32])))
        exc, names = TypeError, ("grad_output",)
    elif kind == "hparams_shape":
        a["hparams"] = torch.zeros(data.draw(st.sampled_from([0, 3, 9])), dtype=torch.float64)
        names = ("hparams",)
    elif kind == "hparams_dtype":
        a["hparams"] = hp.float()
        names = ("hparams",)
    elif kind == "batch_size":
        a["batch_size"] = B + delta if B + delta >= 0 else B + 1
        names = ("batch_size", "offsets")
    elif kind == "batch_size_negative":
        a["batch_size"] = data.draw(st.sampled_from([-1, -(2**62)]))
        names = ("batch_size",)
    elif kind == "optimizer_name":
        a["optimizer"] = data.draw(st.sampled_from(["", "SGD", "Adagrad", "lambda", "lars"]))
        names = ("optimizer",)
    elif kind == "wd_mode":
        a["weight_decay_mode"] = data.draw(st.sampled_from(["", "l1", "L2"]))
        names = ("weight_decay_mode",)
    elif kind == "pooling_name":
        a["pooling"] = data.draw(st.sampled_from(["", "avg", "SUMM"]))
        names = ("pooling",)
    elif kind == "bounds_name":
        a["bounds_check"] = data.draw(st.sampled_from(["", "warning", "clamp"]))
        names = ("bounds_check",)
    elif kind == "weights_len":
        a["weights"] = torch.zeros(w.numel() + delta if w.numel() + delta > 0 else w.numel() + 1, dtype=w.dtype)
        names = ("weights",)
    elif kind == "weights_dtype":
        a["weights"] = torch.zeros(w.numel(), dtype=data.draw(st.sampled_from([torch.float64, torch.int32])))
        exc, names = TypeError, ("weights",)
    elif kind == "momentum1_meta":
        if m1.numel() == 0:
            return
        a["momentum1"] = m1.to("meta")
        names = ("momentum1", "device")
    else:  # grad_output_meta
        a["grad_output"] = go.to("meta")
        names = ("grad_output", "device")
    crumb(f"raw tbe_backward {kind}: {cfg}")
    snap = snapshot(m)
    expect_error(exc, names, OPS.tbe_backward, *a.values())
    assert_unchanged(m, snap, kind)


# ---- TBE: copies ----------------------------------------------------------------------------------------
@isolated
@PROFILE
@given(cfg=tbe_configs(pooling="sum"), how=st.sampled_from(["deepcopy", "pickle"]))
def test_tbe_copies_are_independent(cfg, how):
    """A deep copy or a pickle round trip gives the same outputs and trains without touching the
    original (its own C object)."""
    cfg = dict(cfg, B=max(1, cfg["B"]), max_bag=max(1, cfg["max_bag"]))
    m = make_module(cfg)
    fmap, indices, offsets, psw, _ = lookups(cfg)
    crumb(f"TBE {how}: {cfg}")
    c = copy.deepcopy(m) if how == "deepcopy" else pickle.loads(pickle.dumps(m))
    assert torch.equal(m(indices, offsets, psw), c(indices, offsets, psw))
    snap = snapshot(m)
    c(indices, offsets, psw).float().sum().backward()
    assert_unchanged(m, snap, f"training the {how}")
    del m
    c(indices, offsets, psw).float().sum().backward()  # the copy outlives the original
    assert c.step == 2


# ---- TBE: the meta device -------------------------------------------------------------------------------
@isolated
@PROFILE
@given(cfg=tbe_configs())
def test_tbe_meta_module_traces_shapes(cfg):
    """A module built on the meta device has the layout of a real one and maps meta lookups to meta
    outputs of the right shape and dtype (forward and backward run their fake implementations); CPU
    lookups given to it are refused with ValueError naming an argument, not run."""
    crumb(f"TBE on meta: {cfg}")
    m = embscale.TableBatchedEmbeddingBags(cfg["specs"], feature_table_map=cfg["fmap"], optimizer=cfg["optimizer"],
                                           pooling=cfg["pooling"], weights_dtype=cfg["weights_dtype"],
                                           output_dtype=cfg["output_dtype"], device="meta")
    real = make_module(cfg)
    assert m.weights.device.type == "meta" and m.weights.shape == real.weights.shape
    assert m.momentum1.shape == real.momentum1.shape and m.momentum2.shape == real.momentum2.shape
    fmap, indices, offsets, psw, _ = lookups(cfg)
    out = m(indices.to("meta"), offsets.to("meta"), None if psw is None else psw.to("meta"))
    want = real(indices, offsets, psw)
    assert out.device.type == "meta" and out.shape == want.shape and out.dtype == want.dtype
    out.float().sum().backward()
    expect_error(ValueError, ("indices", "offsets", "weights", "device", "handle"), m, indices, offsets, psw)
