"""Property-based fuzz tests (hypothesis) of the raw operators torch.ops.embscale.* and of
embscale.TableBatchedEmbeddingBags, on the CPU.

Valid inputs drawn at random are compared with naive references (test_fp8's FP8 references,
tbe_reference.py); hostile inputs (wrong dtypes, devices, lengths, values, handles, hyper-parameters) must
raise the documented exception type (TypeError for a dtype, ValueError for a shape, device or value,
IndexError for an index or offset outside its range) with a message naming the argument, and leave the
inputs, the tables, the optimizer state and the step counter bit for bit as they were.

Reproducibility: the examples come from a fixed profile (derandomized, a bounded number of examples, no
deadline, no example database), so a run is the same on every machine. EMBSCALE_FUZZ_EXAMPLES=N draws N
examples per test instead; EMBSCALE_FUZZ_SEED=S draws them from seed S instead of derandomized (for longer
exploratory runs; a failure prints the seed and the falsifying example, which replays with the same
settings).

Crash isolation: each test runs in a fresh interpreter (a child pytest). Before every call into the library
the test writes the example to a breadcrumb file, so when the child dies on a signal the parent reports
which test died, how, and on which inputs, and the other tests still run.
"""
import copy
import math
import os
import pickle
import signal
import subprocess
import sys
import tempfile

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import embscale  # noqa: E402
import tbe_reference as ref  # noqa: E402
from test_fp8 import assert_fp8_equal, ref_amax, ref_quantize, ref_scale  # noqa: E402

CHILD = os.environ.get("EMBSCALE_FUZZ_CHILD") == "1"
EXAMPLES = int(os.environ.get("EMBSCALE_FUZZ_EXAMPLES", "40"))
SEED = os.environ.get("EMBSCALE_FUZZ_SEED")
PROFILE = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=SEED is None,
                   print_blob=True, suppress_health_check=list(HealthCheck),
                   phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink])
FLOATS = [torch.float32, torch.float16, torch.bfloat16]
FP8S = [torch.float8_e4m3fn, torch.float8_e5m2]
OPS = torch.ops.embscale


# ---- crash isolation ------------------------------------------------------------------------------------
# In the parent pytest every property test below is a stand-in: the first one to run starts a child pytest
# that runs all of them in a fresh interpreter (EMBSCALE_FUZZ_CHILD=1), and each stand-in reports its own
# test's outcome from that run. If the child dies, the test it was in is reported with the example it was
# running (the breadcrumb) and a new child runs the tests that had not run yet.
def crumb(what):
    """Records the example about to run (the parent reports it if the interpreter dies)."""
    path = os.environ.get("EMBSCALE_FUZZ_BREADCRUMB")
    if path:
        test = os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[-1].split(" ")[0]
        with open(path, "w") as f:
            f.write(f"{test}\n{what}")


_PROPERTY_TESTS = []  # names, in file order
_OUTCOMES = {}  # name -> (passed, report)


def _child_run(names):
    """Runs `names` in one child pytest; records the outcome of each test that finished or killed it."""
    here = os.path.abspath(__file__)
    with tempfile.TemporaryDirectory() as scratch:  # hypothesis keeps its files here, not in the tree
        crumb_path = os.path.join(scratch, "example")
        open(crumb_path, "w").close()
        env = dict(os.environ, EMBSCALE_FUZZ_CHILD="1", EMBSCALE_FUZZ_BREADCRUMB=crumb_path,
                   HYPOTHESIS_STORAGE_DIRECTORY=os.path.join(scratch, ".hypothesis"))
        cmd = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "--tb=short", "-W",
               "ignore::DeprecationWarning"] + [f"{here}::{n}" for n in names]
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=1200, cwd=scratch)
        out = p.stdout.decode("utf-8", "replace")
        last = open(crumb_path).read()
    status = {}
    for line in out.splitlines():
        for n in names:
            if f"::{n} " in line and any(w in line for w in ("PASSED", "FAILED", "ERROR")):
                status[n] = "PASSED" in line
    for n, ok in status.items():
        section = out.split(f"_ {n} _", 1)[1].split("\n____", 1)[0] if f"_ {n} _" in out else ""
        _OUTCOMES[n] = (ok, section or out[-3000:])
    died = p.returncode < 0 or p.returncode not in (0, 1)
    if died:
        how = (f"signal {-p.returncode} ({signal.Signals(-p.returncode).name})" if p.returncode < 0
               else f"exit status {p.returncode}")
        test, _, example = last.partition("\n")
        victim = test if test in names and test not in status else next((n for n in names if n not in status), None)
        if victim:
            _OUTCOMES[victim] = (False, f"the interpreter died ({how}) in {victim} on the example\n  {example}\n"
                                        f"(profile: {'seed ' + SEED if SEED else 'derandomized'}, {EXAMPLES} "
                                        f"examples)\n{out[-3000:]}")
    return out


def isolated(test):
    """In the parent: the stand-in described above. In the child: the hypothesis test itself."""
    if CHILD:
        if SEED is not None:
            test = hypothesis.seed(int(SEED))(test)
        return test
    name = test.__name__
    _PROPERTY_TESTS.append(name)

    def stand_in():
        while name not in _OUTCOMES:
            todo = [n for n in _PROPERTY_TESTS if n not in _OUTCOMES]
            out = _child_run(todo)
            if not any(n in _OUTCOMES for n in todo):
                for n in todo:
                    _OUTCOMES[n] = (False, f"the child pytest ran none of the tests:\n{out[-3000:]}")
        ok, report = _OUTCOMES[name]
        if not ok:
            pytest.fail(f"{name}:\n{report}", pytrace=False)

    stand_in.__name__ = name
    stand_in.__doc__ = test.__doc__
    return stand_in


def test_profile_is_reported():
    print(f"hypothesis profile: {'seed ' + SEED if SEED else 'derandomized'}, {EXAMPLES} examples per test, "
          "no deadline, no database")


# ---- helpers --------------------------------------------------------------------------------------------
def bits(t):
    """A bit-exact copy (NaN-safe comparisons)."""
    t = t.detach()
    if t.device.type == "meta":
        return t.clone()
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.contiguous().view(view).clone()


def same_bits(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and (a.device.type == "meta" or torch.equal(a, b))


def expect_error(exc, names, fn, *args, **kw):
    """fn(*args) raises exactly `exc` (not a subclass mix-up) whose message names one of `names`."""
    names = (names,) if isinstance(names, str) else names
    with pytest.raises(Exception) as info:
        fn(*args, **kw)
    e = info.value
    assert type(e) is exc or (exc is ValueError and type(e).__name__ == "ValueError"), \
        f"raised {type(e).__name__} ({e}); expected {exc.__name__}"
    msg = str(e)
    assert any(n in msg for n in names), f"{type(e).__name__} message names none of {names}: {msg!r}"
    return e


@st.composite
def float_inputs(draw, max_numel=600, ndim=None, dtypes=FLOATS):
    """A float tensor on the CPU: shape, dtype, values from a seed (spread over many binades) and planted
    special values (0, -0, +-inf, NaN, huge, tiny) at drawn positions."""
    nd = draw(st.integers(0, 3)) if ndim is None else ndim
    shape = tuple(draw(st.lists(st.integers(0, 12), min_size=nd, max_size=nd)))
    while math.prod(shape) > max_numel:
        shape = tuple(max(1, s // 2) for s in shape)
    dtype = draw(st.sampled_from(dtypes))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    n = math.prod(shape)
    x = torch.randn(n, generator=g, dtype=torch.float64) * torch.exp2(torch.randint(-20, 12, (n,), generator=g))
    specials = draw(st.lists(st.tuples(st.integers(0, max(0, n - 1)),
                                       st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan, 3e38, -1e-30,
                                                        1e-45, 65504.0, 448.0, 57344.0])), max_size=4))
    for i, v in specials:
        if n:
            x[i] = v
    return x.to(dtype).reshape(shape)


# ---- FP8: valid inputs against the references -----------------------------------------------------------
@isolated
@PROFILE
@given(x=float_inputs(), algo=st.sampled_from(["auto", "atomic", "two_stage"]))
def test_amax_matches_reference(x, algo):
    crumb(f"amax(x={x.dtype} {tuple(x.shape)}, algo={algo!r})")
    before = bits(x)
    got = OPS.amax(x, algo)
    assert got.dtype == torch.float32 and got.dim() == 0
    assert got.item() == ref_amax(x).item() or (math.isnan(got.item()) and math.isnan(ref_amax(x).item()))
    assert same_bits(bits(x), before), "x was written"


@isolated
@PROFILE
@given(amax=st.floats(width=32), fp8=st.sampled_from(FP8S), eps=st.floats(0, 1e6, width=32),
       power_of_2=st.booleans())
def test_compute_scale_matches_reference(amax, fp8, eps, power_of_2):
    crumb(f"compute_scale(amax={amax!r}, {fp8}, eps={eps!r}, power_of_2={power_of_2})")
    s, si = OPS.compute_scale(torch.tensor(amax, dtype=torch.float32), fp8, eps, power_of_2)
    ws, wsi = ref_scale(amax, fp8, eps, power_of_2)
    assert s.item() == ws.item() and si.item() == wsi.item(), (s.item(), ws.item(), si.item(), wsi.item())


@isolated
@PROFILE
@given(x=float_inputs(), fp8=st.sampled_from(FP8S), scale=st.floats(1e-3, 1e3),
       out_dtype=st.sampled_from(FLOATS))
def test_quantize_dequantize_match_reference(x, fp8, scale, out_dtype):
    crumb(f"quantize/dequantize(x={x.dtype} {tuple(x.shape)}, {fp8}, scale={scale!r}, out={out_dtype})")
    s = torch.tensor(scale, dtype=torch.float32)
    before = bits(x)
    y = OPS.quantize(x, s, fp8)
    assert y.dtype == fp8 and y.shape == x.shape
    assert_fp8_equal(y, ref_quantize(x, s, fp8))
    inv = 1 / s
    back = OPS.dequantize(y, inv, out_dtype)
    want = (y.float() * inv).to(out_dtype)
    assert torch.equal(torch.isnan(back), torch.isnan(want))
    assert torch.equal(back[~torch.isnan(want)], want[~torch.isnan(want)])
    assert same_bits(bits(x), before), "x was written"


@isolated
@PROFILE
@given(x=float_inputs(), fp8=st.sampled_from(FP8S), eps=st.sampled_from([0.0, 1e-6, 1.0, 1e3]),
       power_of_2=st.booleans())
def test_quantize_current_scaling_matches_reference(x, fp8, eps, power_of_2):
    crumb(f"quantize_current_scaling(x={x.dtype} {tuple(x.shape)}, {fp8}, eps={eps}, power_of_2={power_of_2})")
    y, amax, scale, scale_inv = OPS.quantize_current_scaling(x, fp8, eps, power_of_2)
    want_amax = ref_amax(x)
    want_scale, want_inv = ref_scale(want_amax, fp8, eps, power_of_2)
    assert amax.item() == want_amax.item()
    assert scale.item() == want_scale.item() and scale_inv.item() == want_inv.item()
    assert_fp8_equal(y, ref_quantize(x, want_scale, fp8))


@isolated
@PROFILE
@given(x=float_inputs(), act=st.sampled_from(["relu", "gelu_tanh", "silu"]),
       out_dtype=st.sampled_from([None] + FLOATS))
def test_activation_amax_is_consistent(x, act, out_dtype):
    crumb(f"activation_amax(x={x.dtype} {tuple(x.shape)}, {act!r}, out_dtype={out_dtype})")
    y, amax = OPS.activation_amax(x, act, out_dtype)
    assert y.shape == x.shape and y.dtype == (x.dtype if out_dtype is None else out_dtype)
    # amax is max |y| over the values as stored in y (NaN skipped)
    assert amax.item() == ref_amax(y).item()
    finite = torch.isfinite(x.double()) & (x.double().abs() < 30)
    xf = x.double()
    want = {"relu": torch.relu(xf), "gelu_tanh": torch.nn.functional.gelu(xf, approximate="tanh"),
            "silu": torch.nn.functional.silu(xf)}[act].to(y.dtype).double()
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[y.dtype]
    torch.testing.assert_close(y.double()[finite], want[finite], rtol=tol, atol=tol)


@isolated
@PROFILE
@given(x=float_inputs(ndim=2), fp8=st.sampled_from(FP8S), scale=st.floats(1e-3, 1e3))
def test_cast_transpose_matches_quantize(x, fp8, scale):
    crumb(f"cast_transpose(x={x.dtype} {tuple(x.shape)}, scale={scale!r}, {fp8})")
    s = torch.tensor(scale, dtype=torch.float32)
    y, yt = OPS.cast_transpose(x, s, fp8)
    want = ref_quantize(x, s, fp8)
    assert y.shape == x.shape and yt.shape == (x.shape[1], x.shape[0]) and yt.is_contiguous()
    assert_fp8_equal(y, want)
    assert_fp8_equal(yt, want.t().contiguous())


# ---- FP8: hostile inputs --------------------------------------------------------------------------------
BAD_FLOAT_DTYPES = [torch.int32, torch.int64, torch.float64, torch.bool, torch.uint8, torch.complex64,
                    torch.float8_e4m3fn]


def _tensor_of(dtype, shape=(5,)):
    if dtype.is_complex:
        return torch.zeros(shape, dtype=dtype)
    return torch.zeros(shape, dtype=torch.float32).to(dtype)


@st.composite
def fp8_hostile(draw):
    """(description, callable, expected exception, names the message may use, tensors that must not change)."""
    x = draw(float_inputs(max_numel=64, ndim=2))
    s = torch.tensor(2.0)
    kind = draw(st.sampled_from([
        "x_dtype", "fp8_dtype", "scale_dtype", "scale_numel", "scale_meta", "algo", "activation", "out_dtype",
        "ct_ndim", "eps", "amax_dtype", "amax_numel", "y_dtype", "x_meta_scale_cpu", "dequant_out"]))
    op = draw(st.sampled_from(["quantize", "cast_transpose", "amax", "qcs", "activation_amax", "dequantize",
                               "compute_scale"]))
    bad_dt = draw(st.sampled_from(BAD_FLOAT_DTYPES))
    fp8 = draw(st.sampled_from(FP8S))
    if kind == "x_dtype":
        xb = _tensor_of(bad_dt, (3, 4))
        calls = {"quantize": (lambda: OPS.quantize(xb, s, fp8)), "cast_transpose": (lambda: OPS.cast_transpose(xb, s, fp8)),
                 "amax": (lambda: OPS.amax(xb)), "qcs": (lambda: OPS.quantize_current_scaling(xb, fp8)),
                 "activation_amax": (lambda: OPS.activation_amax(xb, "relu"))}
        op = op if op in calls else "amax"
        return f"{op}(x of {bad_dt})", calls[op], TypeError, ("x",), [xb]
    if kind == "fp8_dtype":
        bad = draw(st.sampled_from([torch.float32, torch.float16, torch.int8, torch.uint8, torch.float64]))
        calls = {"quantize": (lambda: OPS.quantize(x, s, bad)), "cast_transpose": (lambda: OPS.cast_transpose(x, s, bad)),
                 "qcs": (lambda: OPS.quantize_current_scaling(x, bad)),
                 "compute_scale": (lambda: OPS.compute_scale(torch.tensor(1.0), bad))}
        op = op if op in calls else "quantize"
        return f"{op}(fp8_dtype={bad})", calls[op], TypeError, ("fp8_dtype",), [x]
    if kind in ("scale_dtype", "scale_numel", "scale_meta"):
        if kind == "scale_dtype":
            sb, exc = torch.tensor(2.0, dtype=draw(st.sampled_from([torch.float64, torch.float16, torch.int32]))), TypeError
        elif kind == "scale_numel":
            sb, exc = torch.ones(draw(st.sampled_from([0, 2, 7]))), ValueError
        else:
            sb, exc = torch.ones((), device="meta"), ValueError
        name = "scale_inv" if op == "dequantize" else "scale"
        y8 = torch.zeros(3, dtype=fp8)
        calls = {"quantize": (lambda: OPS.quantize(x, sb, fp8)), "cast_transpose": (lambda: OPS.cast_transpose(x, sb, fp8)),
                 "dequantize": (lambda: OPS.dequantize(y8, sb, torch.float32))}
        op = op if op in calls else "quantize"
        name = "scale_inv" if op == "dequantize" else "scale"
        return f"{op}({kind}: {sb.dtype} {tuple(sb.shape)} on {sb.device})", calls[op], exc, (name,), [x, sb]
    if kind == "algo":
        a = draw(st.sampled_from(["", "AUTO", "fast", "atomic ", "two-stage"]))
        calls = {"amax": (lambda: OPS.amax(x, a)), "qcs": (lambda: OPS.quantize_current_scaling(x, fp8, 0.0, False, a)),
                 "activation_amax": (lambda: OPS.activation_amax(x, "relu", None, a))}
        op = op if op in calls else "amax"
        return f"{op}(algo={a!r})", calls[op], ValueError, ("algo",), [x]
    if kind == "activation":
        a = draw(st.sampled_from(["", "gelu", "RELU", "tanh", "silu "]))
        return f"activation_amax(activation={a!r})", (lambda: OPS.activation_amax(x, a)), ValueError, ("activation",), [x]
    if kind == "out_dtype":
        return (f"activation_amax(out_dtype={bad_dt})", (lambda: OPS.activation_amax(x, "relu", bad_dt)), TypeError,
                ("out_dtype",), [x])
    if kind == "dequant_out":
        y8 = torch.zeros(4, dtype=fp8)
        return f"dequantize(out_dtype={bad_dt})", (lambda: OPS.dequantize(y8, s, bad_dt)), TypeError, ("out_dtype",), [y8]
    if kind == "ct_ndim":
        xb = x.reshape(-1) if draw(st.booleans()) else x.reshape(1, 1, *x.shape)
        return f"cast_transpose(x of {xb.dim()} dims)", (lambda: OPS.cast_transpose(xb, s, fp8)), ValueError, ("x",), [xb]
    if kind == "eps":
        e = draw(st.sampled_from([-1.0, -1e-30, math.nan, math.inf, -math.inf]))
        calls = {"qcs": (lambda: OPS.quantize_current_scaling(x, fp8, e)),
                 "compute_scale": (lambda: OPS.compute_scale(torch.tensor(1.0), fp8, e))}
        op = op if op in calls else "qcs"
        return f"{op}(eps={e})", calls[op], ValueError, ("eps",), [x]
    if kind == "amax_dtype":
        a = torch.tensor(1.0, dtype=draw(st.sampled_from([torch.float64, torch.float16, torch.int32])))
        return f"compute_scale(amax {a.dtype})", (lambda: OPS.compute_scale(a, fp8)), TypeError, ("amax",), [a]
    if kind == "amax_numel":
        a = torch.ones(draw(st.sampled_from([0, 2, 3])))
        return f"compute_scale(amax of {a.numel()})", (lambda: OPS.compute_scale(a, fp8)), ValueError, ("amax",), [a]
    if kind == "y_dtype":
        yb = _tensor_of(draw(st.sampled_from([torch.float32, torch.int8, torch.uint8, torch.float16])), (4,))
        return f"dequantize(y of {yb.dtype})", (lambda: OPS.dequantize(yb, s, torch.float32)), TypeError, ("y",), [yb]
    # x on meta, scale on the CPU: a mix of devices is refused, not run as meta
    xm = x.to("meta")
    return "quantize(x on meta, scale on cpu)", (lambda: OPS.quantize(xm, s, fp8)), ValueError, ("scale", "x"), [s]


@isolated
@PROFILE
@given(case=fp8_hostile())
def test_fp8_hostile_inputs_raise_documented_errors(case):
    what, call, exc, names, keep = case
    crumb(f"fp8 hostile: {what}")
    before = [bits(t) for t in keep]
    expect_error(exc, names, call)
    for t, b in zip(keep, before):
        assert same_bits(bits(t), b), f"{what}: an input was written"


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
        optimizer=draw(st.sampled_from(["sgd", "rowwise_adagrad", "adam", "partial_rowwise_adam"])),
        weights_dtype=draw(st.sampled_from([torch.float32, torch.float32, torch.float16, torch.bfloat16])),
        output_dtype=draw(st.sampled_from([torch.float32, torch.float32, torch.float16, torch.bfloat16])),
        bounds_check=draw(st.sampled_from(["error", "skip", "off"])),
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
              "m2": torch.zeros(r if opt == "partial_rowwise_adam" else (r, d), dtype=torch.float64)}
             for r, d in cfg["specs"]]
    hp = dict(learning_rate=0.05, eps=1e-6, beta1=0.9, beta2=0.99, weight_decay=0.0, weight_decay_mode="none",
              max_norm=0.0, gradient_clipping=0.0)
    for step in range(1, steps + 1):
        fmap, indices, offsets, psw, g = lookups(dict(cfg, seed=cfg["seed"] + step))
        grad_out = torch.randn(cfg["B"], m.total_dim, generator=g)
        assert m.step == step
        m(indices, offsets, psw).backward(grad_out)
        grads, touched, _ = ref.dense_grads(tables, fmap, indices, offsets, cfg["B"], pooling, grad_out, psw)
        ref.apply_optimizer(opt, tables, state, grads, touched, hp, step)
    assert m.step == steps + 1
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
    other = torch.int64 if cfg["index_dtype"] == torch.int32 else torch.int32
    if kind == "indices_dtype":
        args, exc, names = (indices.to(data.draw(st.sampled_from([torch.float32, torch.int16, torch.uint8, torch.bool]))),
                            offsets, psw), TypeError, ("indices",)
    elif kind == "offsets_dtype":
        args, exc, names = (indices, offsets.to(data.draw(st.sampled_from([other, torch.float32]))), psw), TypeError, ("offsets",)
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
    assert m.step == 2


HOSTILE_HPARAMS = [("learning_rate", math.nan), ("learning_rate", math.inf), ("learning_rate", -0.5),
                   ("eps", math.nan), ("eps", 0.0), ("eps", -1.0), ("beta1", 1.0), ("beta1", math.nan),
                   ("beta2", -0.1), ("weight_decay", math.nan), ("max_norm", -1.0), ("max_norm", math.nan),
                   ("gradient_clipping", -1.0), ("gradient_clipping", math.inf), ("step", 0), ("step", -3),
                   ("step", math.nan), ("step", 2.0**70), ("step", 1.5), ("step", -(2.0**63))]


@isolated
@PROFILE
@given(cfg=tbe_configs(pooling="sum"), bad=st.sampled_from(HOSTILE_HPARAMS))
def test_tbe_module_hostile_hyperparameters(cfg, bad):
    """A hyper-parameter the optimizer uses, set to a bad value, fails the backward with ValueError naming
    it; weights, state and step are unchanged."""
    name, value = bad
    uses = {"eps": ("rowwise_adagrad", "adam", "partial_rowwise_adam"), "beta1": ("adam", "partial_rowwise_adam"),
            "beta2": ("adam", "partial_rowwise_adam"), "max_norm": ("rowwise_adagrad",)}
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
    dict(feature_table_map=[7]), dict(feature_table_map=[-1]), dict(pooling="avg"), dict(optimizer="adagrad"),
    dict(bounds_check="warn"), dict(weight_decay_mode="l1"), dict(weights_dtype=torch.int32),
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
        a["optimizer"] = data.draw(st.sampled_from(["", "SGD", "adagrad", "lamb"]))
        names = ("optimizer",)
    elif kind == "wd_mode":
        a["weight_decay_mode"] = data.draw(st.sampled_from(["", "l1", "L2"]))
        names = ("weight_decay_mode",)
    elif kind == "pooling_name":
        a["pooling"] = data.draw(st.sampled_from(["", "avg", "SUMM"]))
        names = ("pooling",)
    elif kind == "bounds_name":
        a["bounds_check"] = data.draw(st.sampled_from(["", "warn", "clamp"]))
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
    assert c.step == 3


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
