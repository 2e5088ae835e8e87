"""Dense-gradient mode (optimizer="none", FBGEMM's OptimType.NONE): the backward updates nothing and gives
the tables a sparse gradient, checked against the gradient written from the maths (tbe_reference), and a
torch optimizer stepping it equals embscale's fused SGD; its hyper-parameters are neither read nor checked."""
import pytest
import torch

import embscale
import tbe_reference as ref
from two_tables import make, lookups

SPECS = [(20, 4), (15, 3), (11, 5)]
FMAP = [0, 1, 0, 2]
ROWS = [SPECS[t][0] for t in FMAP]
TOTAL_DIM = sum(SPECS[t][1] for t in FMAP)


def module(device, optimizer, **kw):
    return embscale.TableBatchedEmbeddingBags(SPECS, feature_table_map=FMAP, optimizer=optimizer, device=device, **kw)


def dense(grad):
    return grad.to_dense() if grad.is_sparse else grad


@pytest.mark.parametrize("pooling, weighted", [("sum", False), ("mean", False), ("sum", True)])
def test_gradient_equals_the_reference(device, gen, pooling, weighted):
    m = module(device, "none", pooling=pooling)
    assert m.weights.requires_grad
    indices, offsets, psw = ref.make_lookups(gen, ROWS, 5, 4, weighted=weighted, hot_row=3, hot_share=0.3)
    g = torch.randn(5, TOTAL_DIM, generator=gen)
    before = m.weights.detach().clone()
    psw_arg = None if psw is None else psw.clone().to(device).requires_grad_()
    m(indices.to(device), offsets.to(device), psw_arg).backward(g.to(device))
    assert torch.equal(m.weights.detach(), before) and m.step == 0  # nothing updated, no step taken
    grad = m.weights.grad
    assert grad.is_sparse and grad.shape == m.weights.shape
    assert torch.equal(grad.coalesce().indices(), grad._indices())  # ascending, no repeats
    tables = [w.detach().cpu().double() for w in m.split_embedding_weights()]
    want, touched, want_psw = ref.dense_grads(tables, FMAP, indices, offsets, 5, pooling, g, psw)
    got = dense(grad).cpu()
    for t, (rows, dim) in enumerate(SPECS):
        start = sum(r * d for r, d in SPECS[:t])
        torch.testing.assert_close(got[start:start + rows * dim].view(rows, dim).double(), want[t],
                                   rtol=1e-5, atol=1e-6)
    # Only the touched rows' elements are stored.
    assert grad._nnz() == sum(len(touched[t]) * SPECS[t][1] for t in range(len(SPECS)))
    if weighted:
        torch.testing.assert_close(psw_arg.grad.cpu().double(), want_psw, rtol=1e-5, atol=1e-6)


def test_gradient_accumulates_over_backwards_and_keeps_the_weights_dtype(gen):
    m = module("cpu", "none", weights_dtype=torch.bfloat16)
    lookups = [ref.make_lookups(gen, ROWS, 3, 3) for _ in range(2)]
    grads = [torch.randn(3, TOTAL_DIM, generator=gen) for _ in range(2)]
    for (indices, offsets, _), g in zip(lookups, grads):
        m(indices, offsets).backward(g)
    assert m.weights.grad.dtype == torch.bfloat16
    tables = [w.detach().double() for w in m.split_embedding_weights()]
    want = torch.zeros(m.weights.numel(), dtype=torch.float64)
    for (indices, offsets, _), g in zip(lookups, grads):
        per_table, _, _ = ref.dense_grads(tables, FMAP, indices, offsets, 3, "sum", g)
        want += torch.cat([w.flatten() for w in per_table])
    torch.testing.assert_close(dense(m.weights.grad).double(), want, rtol=2e-2, atol=1e-2)


def test_torch_sgd_on_the_gradient_equals_the_fused_sgd(device, gen):
    lr = 0.125
    dense_mode, fused = module(device, "none"), module(device, "sgd", learning_rate=lr)
    with torch.no_grad():
        fused.weights.copy_(dense_mode.weights)
    opt = torch.optim.SGD(dense_mode.parameters(), lr=lr)
    for _ in range(3):
        indices, offsets, _ = ref.make_lookups(gen, ROWS, 4, 3)
        g = torch.randn(4, TOTAL_DIM, generator=gen)
        opt.zero_grad()
        dense_mode(indices.to(device), offsets.to(device)).backward(g.to(device))
        opt.step()
        fused(indices.to(device), offsets.to(device)).backward(g.to(device))
    torch.testing.assert_close(dense_mode.weights.detach(), fused.weights.detach(), rtol=0, atol=1e-7)


def test_sparse_false_gives_the_same_gradient_dense(device, gen):
    """sparse=False (for DistributedDataParallel, which reduces dense gradients only): the gradient of the
    reference as a strided tensor of the tables' size, accumulated over two backwards."""
    m = module(device, "none", sparse=False)
    tables = [w.detach().cpu().double() for w in m.split_embedding_weights()]
    want = torch.zeros(m.weights.numel(), dtype=torch.float64)
    for _ in range(2):
        indices, offsets, _ = ref.make_lookups(gen, ROWS, 4, 3, hot_row=2, hot_share=0.4)
        g = torch.randn(4, TOTAL_DIM, generator=gen)
        m(indices.to(device), offsets.to(device)).backward(g.to(device))
        per_table, _, _ = ref.dense_grads(tables, FMAP, indices, offsets, 4, "sum", g)
        want += torch.cat([w.flatten() for w in per_table])
    grad = m.weights.grad
    assert grad.layout == torch.strided and grad.shape == m.weights.shape and grad.device == m.weights.device
    torch.testing.assert_close(grad.cpu().double(), want, rtol=1e-5, atol=1e-6)


def test_sparse_is_checked():
    with pytest.raises(ValueError, match="sparse: False applies to optimizer='none' only"):
        module("cpu", "sgd", sparse=False)
    with pytest.raises(TypeError, match="sparse"):
        module("cpu", "none", sparse="no")
    assert module("cpu", "sgd", sparse=True).sparse is True  # the default, accepted with any optimizer


def test_meta_module_traces_and_gives_no_gradient(gen):
    m = module("meta", "none")
    indices, offsets, _ = ref.make_lookups(gen, ROWS, 2, 2)
    out = m(indices.to("meta"), offsets.to("meta"))
    assert out.shape == (2, TOTAL_DIM) and out.device.type == "meta"
    out.sum().backward()
    assert m.weights.grad is None


def test_raw_operator_refuses_a_bad_handle(gen):
    m = module("cpu", "none")
    indices, offsets, _ = ref.make_lookups(gen, ROWS, 2, 2)
    with pytest.raises(ValueError, match="handle: "):
        torch.ops.embscale.tbe_dense_grad(m.weights.detach(), torch.zeros(2, TOTAL_DIM), indices, offsets, None,
                                          -5, 2, "sum", "error", False)


def test_dense_gradient_mode_reads_no_hyper_parameter_and_checks_none():
    """optimizer "none" returns the plain summed gradient: its hyper-parameters are not read, as before."""
    m = make("cpu", optimizer="none", learning_rate=-1.0, gradient_clipping=1.0, max_norm=1.0)
    m.set_learning_rate(float("nan"))
    i, o = lookups("cpu")
    m(i, o).sum().backward()
    assert m.weights.grad is not None
