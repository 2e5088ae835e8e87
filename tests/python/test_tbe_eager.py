"""The module's eager calls: in eager mode TableBatchedEmbeddingBags calls its operators' bodies directly
(no custom-operator dispatch); under tracing, fake tensors, vmap or compile it goes through
torch.ops.embscale.*. Both paths must give the same bits, and the direct one must advance the version
counters of what it updates as the operator does, so that autograd still refuses stale saved tables."""
import copy

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import embscale
from embscale import ops
import tbe_reference as ref

SPECS = [(30, 8), (12, 5), (40, 16)]
FMAP = [0, 1, 2, 0]
ROWS = [SPECS[t][0] for t in FMAP]
TOTAL_DIM = sum(SPECS[t][1] for t in FMAP)
B = 6


def lookups(gen, device, weighted=False):
    indices, offsets, psw = ref.make_lookups(gen, ROWS, B, 5, weighted=weighted, hot_row=2, hot_share=0.3)
    return indices.to(device), offsets.to(device), None if psw is None else psw.to(device)


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad", "adam", "partial_rowwise_adam", "none"])
def test_eager_and_operator_paths_give_the_same_bits(device, gen, monkeypatch, optimizer):
    eager = embscale.TableBatchedEmbeddingBags(SPECS, feature_table_map=FMAP, optimizer=optimizer, device=device,
                                               learning_rate=0.05)
    through_ops = copy.deepcopy(eager)
    steps = [(lookups(gen, device, weighted=True), torch.randn(B, TOTAL_DIM, generator=gen).to(device))
             for _ in range(3)]
    results = {}
    for name, m in (("eager", eager), ("ops", through_ops)):
        if name == "ops":
            monkeypatch.setattr(ops, "eager_call", lambda *tensors: False)
        versions = (m.weights._version, m.momentum1._version, m.momentum2._version)
        outs = []
        for (indices, offsets, psw), g in steps:
            psw = psw.clone().requires_grad_()
            out = m(indices, offsets, psw)
            out.backward(g)
            # Each step's table gradient on its own: torch adds sparse gradients of successive steps by
            # concatenation, and densifying that sum on CUDA adds duplicates atomically (in no fixed order).
            grad = None if m.weights.grad is None else m.weights.grad.to_dense()
            m.weights.grad = None
            outs.append((out.detach(), psw.grad, grad))
        advanced = tuple(after - before for after, before in
                         zip((m.weights._version, m.momentum1._version, m.momentum2._version), versions))
        results[name] = (outs, m.weights.detach().clone(), m.momentum1.clone(), m.momentum2.clone(), m.step,
                         advanced)
    (eo, ew, em1, em2, estep, ev), (oo, ow, om1, om2, ostep, ov) = results["eager"], results["ops"]
    for (a_out, a_psw, a_grad), (b_out, b_psw, b_grad) in zip(eo, oo):
        assert torch.equal(a_out, b_out) and torch.equal(a_psw, b_psw)
        if optimizer == "none":
            assert torch.equal(a_grad, b_grad)
        else:
            assert a_grad is None and b_grad is None
    assert torch.equal(ew, ow) and torch.equal(em1, om1) and torch.equal(em2, om2) and estep == ostep
    assert ev == ov  # the same version counters advanced by the same amounts
    if optimizer != "none":
        assert ev[0] == 3  # one update of the tables per step


def test_an_update_invalidates_tables_saved_by_another_graph(device, gen):
    m = embscale.TableBatchedEmbeddingBags(SPECS, feature_table_map=FMAP, optimizer="sgd", device=device)
    indices, offsets, _ = lookups(gen, device)
    scale = torch.ones((), device=device, requires_grad=True)
    penalty = (scale * m.weights).sum()  # saves the tables for its backward (the gradient of scale)
    m(indices, offsets).sum().backward()      # updates them in place
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        penalty.backward()


def test_eager_calls_only_for_real_tensors_outside_tracing():
    x = torch.zeros(4)
    assert ops.eager_call(x, None, torch.nn.Parameter(torch.zeros(2), requires_grad=False))
    assert not ops.eager_call(x, torch.zeros(2, device="meta"))
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(x)
        assert not ops.eager_call(fake)
        assert not ops.eager_call(x)  # a dispatch mode is active
    seen = []
    torch.vmap(lambda t: seen.append(ops.eager_call(t)) or t)(torch.zeros(2, 3))
    assert seen == [False]
    traced = []
    torch.jit.trace(lambda t: traced.append(ops.eager_call(t)) or t * 2, (x,), check_trace=False)
    assert traced == [False]


def test_a_double_backward_through_the_update_is_refused(device, gen):
    # The per-sample weights' gradient comes from the fused update, which has no derivative: a second
    # backward through it must raise, not silently drop that term (the direct call would leave no graph).
    m = embscale.TableBatchedEmbeddingBags(SPECS, feature_table_map=FMAP, optimizer="sgd", device=device)
    indices, offsets, psw = lookups(gen, device, weighted=True)
    psw = psw.clone().requires_grad_()
    (grad_psw,) = torch.autograd.grad(m(indices, offsets, psw).sum(), psw, create_graph=True)
    with pytest.raises(RuntimeError):
        (grad_psw.sum() + (2 * psw).sum()).backward()


def test_observers_see_the_operators():
    x = torch.zeros(4)
    assert not ops.eager_call(torch.zeros(2, requires_grad=True))  # autograd would record the call
    with torch.no_grad():
        assert ops.eager_call(torch.zeros(2, requires_grad=True))
    with torch.profiler.profile():
        assert not ops.eager_call(x)

    class Watch(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Watch():
        assert not ops.eager_call(x)


@pytest.mark.parametrize("seed", [-1, 2**63, 2**64 + 5])
def test_seeds_outside_int64_are_refused(seed):
    with pytest.raises(ValueError, match=r"seed: .*\[0, 2\^63\)"):
        embscale.TableBatchedEmbeddingBags(SPECS, feature_table_map=FMAP, seed=seed)


def test_a_module_built_in_inference_mode_refuses_to_train_and_changes_nothing(gen):
    with torch.inference_mode():
        m = embscale.TableBatchedEmbeddingBags(SPECS, feature_table_map=FMAP, optimizer="sgd")
    before = m.weights.clone()
    indices, offsets, _ = lookups(gen, "cpu")
    with pytest.raises(ValueError, match="hparams: an inference tensor"):
        m(indices, offsets).sum().backward()
    assert torch.equal(m.weights, before) and m.step == 0


@pytest.mark.parametrize("bounds_check", ["off", "error", "skip", "warn"])
def test_eager_forward_counts_skipped_indices_only_where_asked(device, gen, bounds_check):
    """The module's eager forward asks for no count of skipped indices in the modes that skip none (no
    allocation and fill per call); skip and warn still count, and the operator always returns one."""
    m = embscale.TableBatchedEmbeddingBags(SPECS, feature_table_map=FMAP, device=device, bounds_check=bounds_check)
    indices, offsets, _ = lookups(gen, device)
    if bounds_check in ("skip", "warn"):
        indices[0] = 10_000  # out of range: dropped and counted
    args = (m.weights, indices, offsets, None, m._handle_id, B, "sum", bounds_check, TOTAL_DIM, torch.float32)
    out, counted = ops.tbe_forward_eager(*args, count_skipped=False)
    want_out, want_count = torch.ops.embscale.tbe_forward(*args)
    assert torch.equal(out, want_out)
    assert int(want_count) == (1 if bounds_check in ("skip", "warn") else 0)
    if bounds_check in ("skip", "warn"):
        assert int(counted) == 1
    else:
        assert counted is None
