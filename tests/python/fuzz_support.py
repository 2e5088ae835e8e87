"""Shared by the property-based fuzz tests (test_fuzz_fp8.py, test_fuzz_tbe.py): the hypothesis profile,
crash isolation, bit-exact comparisons, the expected-error check and the float input strategy.

Reproducibility: the examples come from a fixed profile (derandomized, a bounded number of examples, no
deadline, no example database), so a run is the same on every machine. EMBSCALE_FUZZ_EXAMPLES=N draws N
examples per test instead; EMBSCALE_FUZZ_SEED=S draws them from seed S instead of derandomized (for longer
exploratory runs; a failure prints the seed and the falsifying example, which replays with the same
settings).

Crash isolation: each test file's property tests run in a fresh interpreter (a child pytest). Before every
call into the library the test writes the example to a breadcrumb file, so when the child dies on a signal
the parent reports which test died, how, and on which inputs, and the other tests still run.
"""
import math
import os
import signal
import subprocess
import sys
import tempfile

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

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
# In the parent pytest every property test of a file is a stand-in: the first one to run starts a child
# pytest that runs all of that file's property tests in a fresh interpreter (EMBSCALE_FUZZ_CHILD=1), and each stand-in reports its own
# test's outcome from that run. If the child dies, the test it was in is reported with the example it was
# running (the breadcrumb) and a new child runs the tests that had not run yet.
def crumb(what):
    """Records the example about to run (the parent reports it if the interpreter dies)."""
    path = os.environ.get("EMBSCALE_FUZZ_BREADCRUMB")
    if path:
        test = os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[-1].split(" ")[0]
        with open(path, "w") as f:
            f.write(f"{test}\n{what}")


_PROPERTY_TESTS = {}  # test file -> names, in file order
_OUTCOMES = {}  # (test file, name) -> (passed, report)


def _child_run(here, names):
    """Runs `names` of test file `here` in one child pytest; records the outcome of each test that finished
    or killed it."""
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
        _OUTCOMES[here, n] = (ok, section or out[-3000:])
    died = p.returncode < 0 or p.returncode not in (0, 1)
    if died:
        how = (f"signal {-p.returncode} ({signal.Signals(-p.returncode).name})" if p.returncode < 0
               else f"exit status {p.returncode}")
        test, _, example = last.partition("\n")
        victim = test if test in names and test not in status else next((n for n in names if n not in status), None)
        if victim:
            _OUTCOMES[here, victim] = (False, f"the interpreter died ({how}) in {victim} on the example\n  {example}\n"
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
    here = os.path.abspath(sys.modules[test.__module__].__file__)
    _PROPERTY_TESTS.setdefault(here, []).append(name)

    def stand_in():
        while (here, name) not in _OUTCOMES:
            todo = [n for n in _PROPERTY_TESTS[here] if (here, n) not in _OUTCOMES]
            out = _child_run(here, todo)
            if not any((here, n) in _OUTCOMES for n in todo):
                for n in todo:
                    _OUTCOMES[here, n] = (False, f"the child pytest ran none of the tests:\n{out[-3000:]}")
        ok, report = _OUTCOMES[here, name]
        if not ok:
            pytest.fail(f"{name}:\n{report}", pytrace=False)

    stand_in.__name__ = name
    stand_in.__doc__ = test.__doc__
    return stand_in


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
