"""A copied (copy.deepcopy), pickled or saved (torch.save) TableBatchedEmbeddingBags owns a C object of its
own, under a new handle: it outlives the original, trains as the original would, loads in this process and
in a fresh one, and a pickle whose hyper-parameters the backward would refuse is refused when loaded."""
import copy
import gc
import io
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch

import embscale
from embscale import ops
from two_tables import I, O, make, lookups, train_step, assert_same_state


def test_a_deep_copy_owns_its_handle(device):
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


def test_a_pickled_module_owns_its_handle_and_trains_on(device):
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


def test_a_module_saved_with_torch_save_loads_in_this_process(device):
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


def test_a_module_saved_with_torch_save_loads_in_a_fresh_process(device, tmp_path):
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


def test_a_pickled_module_with_a_bad_hyper_parameter_is_refused_when_loaded():
    import io
    m = make("cpu", optimizer="rowwise_adagrad")
    m.hparams[ops.HPARAM["learning_rate"]] = float("nan")  # written directly, past set_learning_rate's check
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    with pytest.raises(ValueError, match=r"^pickle: hparams: learning_rate: nan; expected a finite value >= 0$"):
        torch.load(buf, weights_only=False)
