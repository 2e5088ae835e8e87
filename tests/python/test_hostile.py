"""Regression tests for the defects found by fuzzing the Python package, one test (or a few) per defect,
named after it: copies, pickles and saved modules (defect 3), and the hyper-parameters, tables and
threads around a backward (defect 6). Bad inputs are in test_hostile_inputs.py, the meta device and
dtype or device moves in test_hostile_meta.py; the module they share is hostile_module.py."""
import copy
import gc
import io
import os
import pickle
import subprocess
import sys
import textwrap
import threading

import torch

import embscale
import tbe_reference as ref
from hostile_module import I, O, B, TOTAL_DIM, make, lookups, raw_backward, train_step, assert_same_state


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
    assert c.step == 2


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
    assert c.step == 1


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
    assert got["step"] == m.step == 2


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
    assert a.learning_rate == 0.5 and a.step == 1


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
    assert twice.step == 2
    ((m(i, o) * g1).sum() + (m(i2, o2) * g2).sum()).backward()
    assert m.step == 2
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
    assert m.step == serial.step == threads * steps
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
    assert m.step == threads * steps


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
    assert eager.step == compiled_module.step == 4
    assert_same_state(eager, compiled_module, exact=False)
