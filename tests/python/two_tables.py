"""A small TableBatchedEmbeddingBags and the checks the TBE tests of refused calls, copies, moves and shared
modules make with it: two tables (10 x 4, 7 x 3), one feature each, and the lookups
indices = [1, 2, 3, 9, 0, 6, 6, 5], offsets = [0, 3, 5, 7, 8] (B = 2); `refused` checks that an error left
the tables, the optimizer state and the step counter exactly as they were (bit for bit), and raw_forward /
raw_backward call the operators torch.ops.embscale.tbe_forward / tbe_backward with one argument replaced."""
import contextlib

import pytest
import torch

import embscale


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
