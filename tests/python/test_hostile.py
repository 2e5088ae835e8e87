"""Regression tests for the defects found by fuzzing the Python package, one test (or a few) per defect,
named after it. Every error case also checks that the error left the tables, the optimizer state and the
step counter exactly as they were (bit for bit).

The module most of them use: two tables (10 x 4, 7 x 3), one feature each, and the lookups
indices = [1, 2, 3, 9, 0, 6, 6, 5], offsets = [0, 3, 5, 7, 8] (B = 2).
"""
import contextlib
import copy
import gc
import io
import os
import pickle
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

import embscale
import tbe_reference as ref
from embscale import ops
from conftest import requires_cuda

SPECS = [(10, 4), (7, 3)]
I = [1, 2, 3, 9, 0, 6, 6, 5]
O = [0, 3, 5, 7, 8]
B = 2
TOTAL_DIM = 7


def make(device, **kw):
    return embscale.TableBatchedEmbeddingBags(SPECS, device=device, **kw)


def lookups(device, indices=I, offsets=O, dtype=torch.int64):
    return torch.tensor(indices, dtype=dtype, device=device), torch.tensor(offsets, dtype=dtype, device=device)


def snapshot(m):
    """Bit-exact copies of everything training changes."""
    return {name: getattr(m, name).detach().clone() for name in ("weights", "momentum1", "momentum2", "hparams")}


def assert_unchanged(m, snap):
    for name, before in snap.items():
        now = getattr(m, name).detach()
        assert now.dtype == before.dtype and now.device == before.device, name
        if now.device.type == "meta":
            continue  # shapes only
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[before.element_size()]
        assert torch.equal(now.view(bits), before.view(bits)), f"{name} changed by a failed call"


@contextlib.contextmanager
def refused(m, exc, match):
    """The block raises exc matching `match`, and m's tables, optimizer state and step are unchanged."""
    snap = snapshot(m)
    with pytest.raises(exc, match=match):
        yield
    assert_unchanged(m, snap)


def raw_forward(m, indices, offsets, psw=None, **over):
    a = dict(handle=m._handle_id, batch_size=(offsets.numel() - 1) // len(m.feature_table_map), pooling=m.pooling,
             bounds_check=m.bounds_check, output_cols=m.total_dim, output_dtype=m.output_dtype)
    a.update(over)
    return torch.ops.embscale.tbe_forward(m.weights, indices, offsets, psw, a["handle"], a["batch_size"],
                                          a["pooling"], a["bounds_check"], a["output_cols"], a["output_dtype"])


def raw_backward(m, grad, indices, offsets, psw=None, **over):
    a = dict(weights=m.weights, momentum1=m.momentum1, momentum2=m.momentum2, hparams=m.hparams,
             handle=m._handle_id, batch_size=(offsets.numel() - 1) // len(m.feature_table_map), pooling=m.pooling,
             bounds_check=m.bounds_check, optimizer=m.optimizer, weight_decay_mode=m.weight_decay_mode,
             grad_psw=False)
    a.update(over)
    with torch.no_grad():
        return torch.ops.embscale.tbe_backward(
            a["weights"], a["momentum1"], a["momentum2"], a["hparams"], grad, indices, offsets, psw, a["handle"],
            a["batch_size"], a["pooling"], a["bounds_check"], a["optimizer"], a["weight_decay_mode"],
            m.stochastic_rounding, m.seed, a["grad_psw"])


def train_step(m, indices, offsets, grad=None):
    out = m(indices, offsets)
    out.backward(torch.ones_like(out) if grad is None else grad)


def assert_same_state(a, b, exact=True):
    for name in ("weights", "momentum1", "momentum2", "hparams"):
        x, y = getattr(a, name).detach().cpu(), getattr(b, name).detach().cpu()
        if exact:
            assert torch.equal(x, y), name
        else:
            torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)


# ---- defect 1: per-sample weights of the wrong length or shape --------------------------------------------
@pytest.mark.parametrize("n", [4, 0, 9])
def test_defect1_per_sample_weights_wrong_length(device, n):
    m = make(device, optimizer="sgd")
    i, o = lookups(device)
    with refused(m, ValueError, f"per_sample_weights: {n} elements; expected N .* = 8"):
        m(i, o, torch.ones(n, device=device))
    # the backward checks them too (the raw operator, whose forward was not run)
    with refused(m, ValueError, f"per_sample_weights: {n} elements"):
        raw_backward(m, torch.ones(B, TOTAL_DIM, device=device), i, o, torch.ones(n, device=device))
    assert m.step == 1


def test_defect1_per_sample_weights_2d_refused(device):
    m = make(device, optimizer="sgd")
    i, o = lookups(device)
    for shape in [(8, 1), (1, 8), (2, 4)]:
        with refused(m, ValueError, "per_sample_weights: has 2 dimensions, expected 1"):
            m(i, o, torch.ones(shape, device=device))
        with refused(m, ValueError, "per_sample_weights: has 2 dimensions, expected 1"):
            raw_backward(m, torch.ones(B, TOTAL_DIM, device=device), i, o, torch.ones(shape, device=device))


# ---- defect 2: optimizer state of the wrong length --------------------------------------------------------
@pytest.mark.parametrize("optimizer,name,size", [
    ("rowwise_adagrad", "momentum1", 16),     # 17 rows
    ("rowwise_adagrad", "momentum1", 18),
    ("rowwise_adagrad", "momentum1", 61),     # element-wise instead of row-wise
    ("adam", "momentum1", 60),                # 61 elements
    ("adam", "momentum2", 17),
    ("partial_rowwise_adam", "momentum2", 61),
    ("sgd", "momentum1", 17),                 # sgd keeps none
])
def test_defect2_raw_backward_momentum_wrong_length(device, optimizer, name, size):
    m = make(device, optimizer=optimizer)
    i, o = lookups(device)
    with refused(m, ValueError, f"{name}: "):
        raw_backward(m, torch.ones(B, TOTAL_DIM, device=device), i, o,
                     **{name: torch.zeros(size, dtype=torch.float32, device=device)})
    with refused(m, TypeError, f"{name}: dtype float64"):
        raw_backward(m, torch.ones(B, TOTAL_DIM, device=device), i, o,
                     **{name: torch.zeros(size, dtype=torch.float64, device=device)})


# ---- defect 3: copies, pickles and saved modules used the original's C object ------------------------------
def test_defect3_deepcopy_owns_its_handle(device):
    m = make(device, optimizer="rowwise_adagrad")
    i, o = lookups(device)
    c = copy.deepcopy(m)
    assert c._handle_id != m._handle_id and c._layout.ptr != m._layout.ptr
    want = m(i, o).detach().clone()
    twin = copy.deepcopy(m)
    del m
    gc.collect()
    out = c(i, o)
    torch.testing.assert_close(out.detach(), want, rtol=0, atol=0)
    out.sum().backward()
    train_step(twin, i, o)
    assert_same_state(c, twin)


def test_defect3_pickle_round_trip(device):
    m = make(device, optimizer="adam", learning_rate=0.1)
    i, o = lookups(device)
    train_step(m, i, o)
    c = pickle.loads(pickle.dumps(m))
    assert c._handle_id != m._handle_id and c._layout.ptr != m._layout.ptr
    assert_same_state(c, m)
    del m
    gc.collect()
    twin = copy.deepcopy(c)
    train_step(c, i, o)
    train_step(twin, i, o)
    assert_same_state(c, twin)
    assert c.step == 3


def test_defect3_torch_save_module_loads_in_this_process(device):
    m = make(device, optimizer="rowwise_adagrad")
    i, o = lookups(device)
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    c = torch.load(buf, weights_only=False)
    assert c._handle_id != m._handle_id
    del m
    gc.collect()
    c(i, o).sum().backward()
    assert c.step == 2


_LOAD_IN_FRESH_PROCESS = textwrap.dedent("""
    import sys, torch
    import embscale
    m = torch.load(sys.argv[1], weights_only=False)
    i = torch.tensor({I}, device=m.weights.device)
    o = torch.tensor({O}, device=m.weights.device)
    out = m(i, o)
    out.sum().backward()
    torch.save({{"out": out.detach().cpu(), "weights": m.weights.detach().cpu(), "sum": m.momentum1.cpu(),
                "step": m.step}}, sys.argv[2])
""").format(I=I, O=O)


def test_defect3_torch_save_module_loads_in_a_fresh_process(device, tmp_path):
    m = make(device, optimizer="rowwise_adagrad")
    i, o = lookups(device)
    train_step(m, i, o)
    torch.save(m, tmp_path / "module.pt")
    want_out = m(i, o)
    want_out.sum().backward()
    env = dict(os.environ)
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(embscale.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    script = tmp_path / "load.py"
    script.write_text(_LOAD_IN_FRESH_PROCESS)
    run = subprocess.run([sys.executable, str(script), str(tmp_path / "module.pt"), str(tmp_path / "result.pt")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = torch.load(tmp_path / "result.pt")
    assert torch.equal(got["out"], want_out.detach().cpu())
    assert torch.equal(got["weights"], m.weights.detach().cpu())
    assert torch.equal(got["sum"], m.momentum1.cpu())
    assert got["step"] == m.step == 3


# ---- defect 4: the raw operators trusted an integer handle ------------------------------------------------
@pytest.mark.parametrize("handle", [12345, 0, -1, 2**62])
def test_defect4_raw_ops_refuse_unknown_handle(device, handle):
    m = make(device, optimizer="rowwise_adagrad")
    i, o = lookups(device)
    with refused(m, ValueError, "handle: "):
        raw_forward(m, i, o, handle=handle)
    with refused(m, ValueError, "handle: "):
        raw_backward(m, torch.ones(B, TOTAL_DIM, device=device), i, o, handle=handle)
    # the fake implementations look the handle up too
    meta = dict(indices=i.to("meta"), offsets=o.to("meta"))
    with pytest.raises(ValueError, match="handle: "):
        torch.ops.embscale.tbe_forward(m.weights.to("meta"), meta["indices"], meta["offsets"], None, handle, B,
                                       "sum", "error", TOTAL_DIM, torch.float32)


def test_defect4_freed_modules_handle_is_refused(device):
    i, o = lookups(device)
    # A handle owned by nothing but this test (a module may be kept alive by references outside the
    # test's control, e.g. a traceback), freed, then looked up.
    gone = ops.TbeHandle(device, [r for r, _ in SPECS], [d for _, d in SPECS], [0, 1], torch.float32)
    stale = gone.id
    del gone
    gc.collect()
    m = make(device, optimizer="sgd")
    assert m._handle_id != stale  # ids are never reused
    with refused(m, ValueError, f"handle: {stale} is not the id of a live"):
        raw_forward(m, i, o, handle=stale)
    with refused(m, ValueError, f"handle: {stale} is not the id of a live"):
        raw_backward(m, torch.ones(B, TOTAL_DIM, device=device), i, o, handle=stale)


def test_defect4_handle_of_another_module_or_device(device):
    i, o = lookups(device)
    m = make(device, optimizer="sgd")
    other = embscale.TableBatchedEmbeddingBags([(5, 2)], device=device)
    # another module's handle: its layout does not fit (one feature, total_dim 2) - refused before any call
    with refused(m, ValueError, "batch_size: 2 needs offsets of T\\*B\\+1 = 3 entries"):
        raw_forward(m, i, o, handle=other._handle_id)
    with refused(m, ValueError, "weights: 61 elements; expected num_weights"):
        raw_backward(m, torch.ones(1, 2, device=device), i, torch.tensor([0, 8], device=device), batch_size=1,
                     handle=other._handle_id)
    # a handle made for the meta device has no C object: refused for real tensors
    meta = make("meta")
    with refused(m, ValueError, "handle: .* is a TableBatchedEmbedding on meta"):
        raw_forward(m, i, o, handle=meta._handle_id)
    with refused(m, ValueError, "handle: .* is a TableBatchedEmbedding on meta"):
        raw_backward(m, torch.ones(B, TOTAL_DIM, device=device), i, o, handle=meta._handle_id)


@requires_cuda
def test_defect4_cpu_handle_with_cuda_tensors():
    cpu, gpu = make("cpu"), make("cuda")
    i, o = lookups("cuda")
    with refused(gpu, ValueError, "handle: .* is a TableBatchedEmbedding on cpu; the tensors are on cuda"):
        raw_forward(gpu, i, o, handle=cpu._handle_id)
    with refused(gpu, ValueError, "handle: .* is a TableBatchedEmbedding on cpu"):
        raw_backward(gpu, torch.ones(B, TOTAL_DIM, device="cuda"), i, o, handle=cpu._handle_id)


# ---- defect 6: hyper-parameters and tables saved for the backward ------------------------------------------
def test_defect6_learning_rate_set_between_forward_and_backward(device, gen):
    a = make(device, optimizer="rowwise_adagrad", learning_rate=0.01)
    b = copy.deepcopy(a)
    i, o = lookups(device)
    g = torch.randn(B, TOTAL_DIM, generator=gen).to(device)
    out = a(i, o)
    a.set_learning_rate(0.5)  # documented: takes effect at the next backward, which is this one
    out.backward(g)
    b.set_learning_rate(0.5)
    b(i, o).backward(g)
    assert_same_state(a, b)
    assert a.learning_rate == 0.5 and a.step == 2


def test_defect6_two_lookups_in_one_loss(device, gen):
    m = make(device, optimizer="rowwise_adagrad", learning_rate=0.1)
    i, o = lookups(device)
    i2, o2 = lookups(device, [4, 4, 1, 0, 2, 3, 3, 6], O)
    g1, g2 = (torch.randn(B, TOTAL_DIM, generator=gen).to(device) for _ in range(2))
    orders = []
    for first, second in (((i, o, g1), (i2, o2, g2)), ((i2, o2, g2), (i, o, g1))):
        r = copy.deepcopy(m)
        for idx, off, g in (first, second):
            r(idx, off).backward(g)
        orders.append(r)
    # the reproduction: the same lookups twice, then two different ones
    twice, ref_twice = copy.deepcopy(m), copy.deepcopy(m)
    (twice(i, o).sum() + twice(i, o).sum()).backward()
    train_step(ref_twice, i, o)
    train_step(ref_twice, i, o)
    assert_same_state(twice, ref_twice)
    assert twice.step == 3
    ((m(i, o) * g1).sum() + (m(i2, o2) * g2).sum()).backward()
    assert m.step == 3
    # each lookup applied its own update, one after the other, in the order autograd ran them
    matches = []
    for r in orders:
        try:
            assert_same_state(m, r, exact=False)
            matches.append(r)
        except AssertionError:
            pass
    assert matches, "two lookups in one loss did not apply one update each"


def test_defect6_two_lookups_with_per_sample_weight_gradients(device, gen):
    """The second backward sees the first one's update (FBGEMM's behaviour), also in its gradient of the
    per-sample weights."""
    m = make(device, optimizer="sgd", learning_rate=0.5)
    i, o = lookups(device)
    psw = (torch.rand(8, generator=gen) + 0.5).to(device)
    p1, p2 = psw.clone().requires_grad_(), psw.clone().requires_grad_()
    r = copy.deepcopy(m)
    (m(i, o, p1).sum() + m(i, o, p2).sum()).backward()
    q1, q2 = psw.clone().requires_grad_(), psw.clone().requires_grad_()
    r(i, o, q2).sum().backward()  # autograd runs the later lookup's backward first
    r(i, o, q1).sum().backward()
    assert_same_state(m, r, exact=False)
    torch.testing.assert_close(p1.grad, q1.grad)
    torch.testing.assert_close(p2.grad, q2.grad)
    assert not torch.equal(p1.grad, p2.grad)


def test_defect6_threads_sharing_a_module(device, gen):
    """Each thread trains the shared module with its own lookups; SGD updates commute, so the result
    equals the serial one (up to rounding) and every step is counted."""
    threads, steps = 4, 25
    m = make(device, optimizer="sgd", learning_rate=0.01)
    serial = copy.deepcopy(m)
    work = []
    for _ in range(threads):
        indices, offsets, _ = ref.make_lookups(gen, [10, 7], 16, 6)
        work.append((indices.to(device), offsets.to(device), torch.randn(16, TOTAL_DIM, generator=gen).to(device)))
    errors = []
    barrier = threading.Barrier(threads)

    def run(idx, off, g):
        try:
            barrier.wait()
            for _ in range(steps):
                m(idx, off).backward(g)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    pool = [threading.Thread(target=run, args=w) for w in work]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors, errors[0]
    for idx, off, g in work:
        for _ in range(steps):
            serial(idx, off).backward(g)
    assert m.step == serial.step == 1 + threads * steps
    torch.testing.assert_close(m.weights.detach(), serial.weights.detach(), rtol=1e-5, atol=1e-5)


def test_defect6_threads_on_the_raw_backward_count_every_step(device):
    """The raw operator reads and advances the step under the handle's lock."""
    threads, steps = 4, 50
    m = make(device, optimizer="adam")
    i, o = lookups(device)
    g = torch.ones(B, TOTAL_DIM, device=device)
    errors = []

    def run():
        try:
            for _ in range(steps):
                raw_backward(m, g, i, o)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    pool = [threading.Thread(target=run) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors, errors[0]
    assert m.step == 1 + threads * steps


def test_defect6_compiled_learning_rate_between_forward_and_backward_and_two_lookups(device):
    eager = make(device, optimizer="rowwise_adagrad", learning_rate=0.05)
    compiled_module = copy.deepcopy(eager)
    i, o = lookups(device)
    i2, o2 = lookups(device, [4, 4, 1, 0, 2, 3, 3, 6], O)

    def loss_fn(mod, a, b, c, d):
        return (mod(a, b) * 2).sum() + mod(c, d).sum()

    torch._dynamo.reset()
    compiled = torch.compile(loss_fn, backend="aot_eager", fullgraph=True)
    for lr in (0.5, 0.25):
        for mod, fn in ((eager, loss_fn), (compiled_module, compiled)):
            loss = fn(mod, i, o, i2, o2)
            mod.set_learning_rate(lr)
            loss.backward()
    assert eager.step == compiled_module.step == 5
    assert_same_state(eager, compiled_module, exact=False)


# ---- defect 7: the step counter ---------------------------------------------------------------------------
@pytest.mark.parametrize("step", [2.0**64 + 4096, 2.0**63, -2.0**64, float("nan"), float("inf"), float("-inf"),
                                  1.5, 0.0, -5.0])
def test_defect7_step_out_of_range(device, step):
    m = make(device, optimizer="adam")
    i, o = lookups(device)
    m.hparams[7] = step
    out = m(i, o)
    with refused(m, ValueError, "step"):
        out.sum().backward()
    with refused(m, ValueError, "step"):
        raw_backward(m, torch.ones(B, TOTAL_DIM, device=device), i, o)


def test_defect7_large_steps_accepted(device):
    m = make(device, optimizer="adam")
    i, o = lookups(device)
    m.hparams[7] = 2.0**40
    train_step(m, i, o)
    assert m.step == 2**40 + 1
    m.hparams[7] = 2.0**63 - 1024  # the largest float64 below 2^63
    before = m.weights.detach().clone()
    train_step(m, i, o)
    assert not torch.equal(m.weights.detach(), before)


# ---- defect 8: meta tensors among real ones ran the fake implementation -----------------------------------
def test_defect8_meta_input_among_real_ones(device):
    m = make(device, optimizer="sgd")
    i, o = lookups(device)
    psw = torch.ones(8, device=device)
    meta = torch.device("meta")
    with refused(m, ValueError, "indices: is on meta"):
        m(i.to(meta), o)
    with refused(m, ValueError, "offsets: is on meta"):
        m(i, o.to(meta))
    with refused(m, ValueError, "per_sample_weights: is on meta"):
        m(i, o, psw.to(meta))
    g = torch.ones(B, TOTAL_DIM, device=device)
    with refused(m, ValueError, "grad_output: is on meta"):
        raw_backward(m, g.to(meta), i, o)
    with refused(m, ValueError, "indices: is on meta"):
        raw_backward(m, g, i.to(meta), o)
    with refused(m, ValueError, "momentum1: is on meta"):
        raw_backward(m, g, i, o, momentum1=torch.zeros(0, device=meta))


def test_defect8_fp8_ops_meta_scale(device):
    x = torch.ones(3, 4, device=device)
    one = torch.tensor(1.0, device=device)
    meta = torch.device("meta")
    with pytest.raises(ValueError, match="scale: is on meta"):
        embscale.quantize(x, one.to(meta))
    with pytest.raises(ValueError, match=f"scale: is on {device.type}.*, expected meta"):
        embscale.quantize(x.to(meta), one)  # the first argument sets the device
    y = embscale.quantize(x, one)
    with pytest.raises(ValueError, match="scale_inv: is on meta"):
        embscale.dequantize(y, one.to(meta))
    with pytest.raises(ValueError, match="scale: is on meta"):
        embscale.cast_transpose(x, one.to(meta))


def test_defect8_all_meta_still_works():
    x, s = torch.empty(3, 4, device="meta"), torch.empty((), device="meta")
    assert embscale.quantize(x, s).device.type == "meta"
    y, yt = embscale.cast_transpose(x, s)
    assert y.shape == (3, 4) and yt.shape == (4, 3) and yt.device.type == "meta"
    assert embscale.dequantize(embscale.quantize(x, s), s).shape == (3, 4)
    y, scale_inv = embscale.quantize_current_scaling(x)
    assert y.device.type == "meta" and scale_inv.shape == ()
    # and the fake implementations still check dtypes like the real ones
    with pytest.raises(TypeError, match="x: dtype int32"):
        embscale.quantize(x.int(), s)


# ---- defect 10: an empty feature_table_map ------------------------------------------------------------------
def test_defect10_empty_feature_table_map():
    with pytest.raises(ValueError, match="feature_table_map: empty"):
        embscale.TableBatchedEmbeddingBags(SPECS, feature_table_map=[])
    m = embscale.TableBatchedEmbeddingBags(SPECS, feature_table_map=None)
    assert m.feature_table_map == [0, 1]


# ---- defect 11: unsupported dtype or device moves; the meta device ------------------------------------------
@pytest.mark.filterwarnings("ignore:Complex modules")
@pytest.mark.parametrize("move", ["double", "to_float64", "to_complex", "type_float64"])
def test_defect11_unsupported_dtype_leaves_module_as_it_was(device, move):
    m = make(device, optimizer="adam")
    i, o = lookups(device)
    train_step(m, i, o)
    weights, handle_id = m.weights, m._handle_id
    apply = {"double": lambda: m.double(), "to_float64": lambda: m.to(torch.float64),
             "to_complex": lambda: m.to(torch.complex64), "type_float64": lambda: m.type(torch.float64)}[move]
    with refused(m, TypeError, "weights_dtype: torch.(float64|complex64) is not supported"):
        apply()
    assert m.weights is weights and m._handle_id == handle_id
    assert m._grad_anchor.dtype == torch.float32 and m.num_skipped.dtype == torch.int64
    train_step(m, i, o)
    assert m.step == 3


def test_defect11_unsupported_device():
    with pytest.raises(ValueError, match="device: xpu"):
        embscale.TableBatchedEmbeddingBags(SPECS, device="xpu")
    if not torch.cuda.is_available():
        m = make("cpu")
        with refused(m, Exception, None):  # torch's own error: no CUDA here
            m.cuda()
        assert m.weights.device.type == "cpu"


def test_defect11_module_on_meta():
    m = embscale.TableBatchedEmbeddingBags(SPECS, optimizer="rowwise_adagrad", device="meta")
    assert m.weights.device.type == "meta" and m._layout.ptr is None  # no C object on meta
    assert m.momentum1.shape == (17,) and m.hparams.device.type == "cpu"
    i, o = lookups("meta")
    out = m(i, o)
    assert out.device.type == "meta" and out.shape == (B, TOTAL_DIM)
    out.sum().backward()  # shapes only: nothing is trained
    assert m.step == 1
    seq = embscale.TableBatchedEmbeddingBags([(10, 4), (7, 4)], pooling="none", device="meta")
    assert seq(i, o).shape == (8, 4)
    with pytest.raises(ValueError, match="indices: is on cpu"):
        m(*lookups("cpu"))


def test_defect11_meta_materialised_with_to_empty(device):
    torch.manual_seed(3)
    want = make(device, optimizer="rowwise_adagrad")
    torch.manual_seed(3)
    m = embscale.TableBatchedEmbeddingBags(SPECS, optimizer="rowwise_adagrad", device="meta")
    with pytest.raises(NotImplementedError, match="to_empty"):
        m.to(device)  # torch refuses: meta tensors have no data to copy
    assert m.weights.device.type == "meta"
    m.to_empty(device=device)
    assert m.weights.device.type == device.type and m._layout.ptr is not None
    torch.manual_seed(3)
    m.reset_parameters()
    assert_same_state(m, want)
    i, o = lookups(device)
    train_step(m, i, o)
    train_step(want, i, o)
    assert_same_state(m, want)


def test_defect11_to_meta_and_back(device):
    m = make(device, optimizer="sgd")
    m.to("meta")
    assert m.weights.device.type == "meta" and m.hparams.device.type == "cpu"
    i, o = lookups("meta")
    assert m(i, o).shape == (B, TOTAL_DIM)
    m.to_empty(device=device)
    m.reset_parameters()
    train_step(m, *lookups(device))
    assert m.step == 2


# ---- defect 12: raw operator sizes validated before allocating -------------------------------------------
@pytest.mark.parametrize("on_meta", [False, True])
def test_defect12_raw_forward_sizes(device, on_meta):
    m = make(device)
    i, o = lookups(device)
    if on_meta:  # the fake implementation checks the same
        i, o = i.to("meta"), o.to("meta")
        m.to("meta")
    snap = snapshot(m)
    cases = [
        (dict(batch_size=-1), "batch_size: -1 is negative"),
        (dict(batch_size=2**40), "batch_size: 1099511627776 needs offsets of T\\*B\\+1"),
        (dict(batch_size=3), "batch_size: 3 needs offsets"),
        (dict(output_cols=-7), "output_cols: -7; expected total_dim \\(pooled\\) = 7"),
        (dict(output_cols=2**40), "output_cols: 1099511627776; expected total_dim"),
        (dict(output_cols=4, pooling="none"), "pooling: 'none' \\(sequence\\) needs all features of one dimension"),
        (dict(pooling="max"), "pooling: 'max' is not one of"),
        (dict(bounds_check="maybe"), "bounds_check: 'maybe' is not one of"),
    ]
    for over, match in cases:
        with pytest.raises(ValueError, match=match):
            raw_forward(m, i, o, **over)
    assert_unchanged(m, snap)
    seq = embscale.TableBatchedEmbeddingBags([(10, 4), (7, 4)], pooling="none", device=m.weights.device)
    with pytest.raises(ValueError, match="output_cols: 8; expected D \\(sequence\\) = 4"):
        raw_forward(seq, i, o, output_cols=8)
    assert raw_forward(seq, i, o, output_cols=4)[0].shape == (8, 4)


def test_defect12_raw_backward_sizes(device):
    m = make(device, optimizer="rowwise_adagrad")
    i, o = lookups(device)
    g = torch.ones(B, TOTAL_DIM, device=device)
    with refused(m, ValueError, "batch_size: -1 is negative"):
        raw_backward(m, g, i, o, batch_size=-1)
    with refused(m, ValueError, "batch_size: 1099511627776 needs offsets"):
        raw_backward(m, g, i, o, batch_size=2**40)
    with refused(m, ValueError, "grad_output: shape"):
        raw_backward(m, torch.ones(B, TOTAL_DIM + 1, device=device), i, o)


# ---- exception types, bad offsets in off mode ---------------------------------------------------------------
def test_exception_types(device):
    m = make(device, optimizer="sgd")
    i, o = lookups(device)
    with refused(m, TypeError, "offsets: dtype int32 differs from the indices' dtype int64"):
        m(i, o.int())
    with refused(m, TypeError, "offsets: dtype int64 differs from the indices' dtype int32"):
        m(i.int(), o)
    with refused(m, TypeError, "indices: dtype float32 is not supported"):
        m(i.float(), o)
    with refused(m, TypeError, "per_sample_weights: dtype float64 is not supported"):
        m(i, o, torch.ones(8, dtype=torch.float64, device=device))
    with refused(m, TypeError, "grad_output: dtype int64"):
        raw_backward(m, torch.ones(B, TOTAL_DIM, dtype=torch.int64, device=device), i, o)
    with refused(m, TypeError, "offsets: dtype int32 differs"):
        raw_backward(m, torch.ones(B, TOTAL_DIM, device=device), i, o.int())
    with refused(m, ValueError, "indices: has 2 dimensions"):
        m(i.view(2, 4), o)
    bad = i.clone()
    bad[5] = 7  # feature 1 (table 1, 7 rows), bag 0
    with refused(m, IndexError, "feature 1, bag 0"):
        m(bad, o)
    with refused(m, IndexError, "feature 1, bag 0"):
        raw_backward(m, torch.ones(B, TOTAL_DIM, device=device), bad, o)
    with refused(m, ValueError, "optimizer.learning_rate"):
        m.set_learning_rate(float("nan"))
        try:
            train_step(m, i, o)
        finally:
            m.hparams[0] = 0.01  # restores the snapshot's value (refused() compares after this)


@pytest.mark.parametrize("case", ["last_huge", "decreasing", "first_negative"])
def test_bad_offsets_with_bounds_check_off_on_cpu(case):
    m = make("cpu", optimizer="rowwise_adagrad", bounds_check="off")
    i, o = lookups("cpu")
    if case == "last_huge":
        o[-1] = 1 << 40
    elif case == "decreasing":
        o[2] = 2
    else:
        o[0] = -2**40
    with refused(m, IndexError, "offsets: "):
        m(i, o)
    with refused(m, IndexError, "offsets: "):
        raw_backward(m, torch.ones(B, TOTAL_DIM), i, o)
