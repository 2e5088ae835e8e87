"""embscale.TableBatchedEmbeddingBags against the float64 references in tbe_reference.py and against
torch's nn.EmbeddingBag + torch.optim.SGD."""
import copy
import ctypes
import gc
import io
import pickle
import warnings

import pytest
import torch

import embscale
import tbe_reference as ref
from conftest import requires_cuda

HP = dict(learning_rate=0.05, eps=1e-6, beta1=0.9, beta2=0.99, weight_decay=0.0, weight_decay_mode="none",
          max_norm=0.0, gradient_clipping=0.0, eta=0.001, momentum=0.9)


def make_module(specs, fmap, device, **kw):
    return embscale.TableBatchedEmbeddingBags(specs, feature_table_map=fmap, device=device, **kw)


def tables64(tbe):
    return [w.detach().cpu().double().clone() for w in tbe.split_embedding_weights()]


def rows_of(specs, fmap):
    return [specs[t][0] for t in fmap]


@pytest.mark.parametrize("pooling", ["sum", "mean", "none"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("weights_dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_forward(device, gen, pooling, index_dtype, weighted, weights_dtype):
    if pooling == "mean" and weighted:
        pytest.skip("weighted mean is refused (tested in test_errors)")
    if pooling == "none":
        specs, fmap = [(50, 5), (7, 5), (300, 5)], [0, 1, 2, 0]
    else:
        specs, fmap = [(50, 1), (7, 3), (300, 127), (20, 160)], [0, 1, 2, 3, 2]
    tbe = make_module(specs, fmap, device, weights_dtype=weights_dtype, pooling=pooling)
    B = 9
    indices, offsets, psw = ref.make_lookups(gen, rows_of(specs, fmap), B, 6, index_dtype, weighted)
    out = tbe(indices.to(device), offsets.to(device), None if psw is None else psw.to(device))
    want = ref.forward(tables64(tbe), fmap, indices, offsets, B, pooling, psw)
    assert out.dtype == torch.float32 and out.shape == want.shape
    torch.testing.assert_close(out.cpu().double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("output_dtype", [torch.float16, torch.bfloat16])
def test_forward_output_dtype(device, gen, output_dtype):
    specs, fmap = [(40, 8), (30, 3)], [0, 1]
    tbe = make_module(specs, fmap, device, output_dtype=output_dtype)
    indices, offsets, _ = ref.make_lookups(gen, rows_of(specs, fmap), 5, 4)
    out = tbe(indices.to(device), offsets.to(device))
    want = ref.forward(tables64(tbe), fmap, indices, offsets, 5, "sum")
    assert out.dtype == output_dtype
    torch.testing.assert_close(out.cpu().double(), want.to(output_dtype).double(), rtol=0, atol=0)


def test_empty_batch_and_empty_bags(device):
    tbe = make_module([(10, 4), (10, 3)], None, device, pooling="mean")
    out = tbe(torch.zeros(0, dtype=torch.int64, device=device), torch.zeros(1, dtype=torch.int64, device=device))
    assert out.shape == (0, 7)
    out = tbe(torch.zeros(0, dtype=torch.int64, device=device), torch.zeros(5, dtype=torch.int64, device=device))
    assert out.shape == (2, 7) and torch.count_nonzero(out) == 0


OPTIMIZER_CASES = [
    ("sgd", {}),
    ("rowwise_adagrad", {}),
    ("rowwise_adagrad", dict(weight_decay=0.01, weight_decay_mode="l2")),
    ("rowwise_adagrad", dict(weight_decay=0.01, weight_decay_mode="decoupled", max_norm=0.3)),
    ("rowwise_adagrad", dict(gradient_clipping=0.02)),
    ("adam", {}),
    ("adam", dict(weight_decay=0.01, weight_decay_mode="decoupled")),
    ("adam", dict(weight_decay=0.01)),  # FBGEMM's Adam: decoupled whatever the mode
    ("partial_rowwise_adam", dict(weight_decay=0.01, weight_decay_mode="l2")),
    ("adagrad", {}),
    ("adagrad", dict(gradient_clipping=0.02)),
    ("lamb", {}),
    ("lamb", dict(weight_decay=0.01, weight_decay_mode="decoupled")),
    ("partial_rowwise_lamb", dict(weight_decay=0.01, weight_decay_mode="decoupled")),
    ("lars_sgd", dict(eta=0.5, momentum=0.9)),
    ("lars_sgd", dict(eta=0.2, momentum=0.5, weight_decay=0.01, weight_decay_mode="decoupled")),
]
# The state each optimizer keeps, as optimizer_state() names it, and where the reference keeps it.
STATE_NAMES = {"rowwise_adagrad": [("sum", "m1")], "adagrad": [("sum", "m1")],
               "adam": [("exp_avg", "m1"), ("exp_avg_sq", "m2")], "lamb": [("exp_avg", "m1"), ("exp_avg_sq", "m2")],
               "partial_rowwise_adam": [("exp_avg", "m1"), ("exp_avg_sq", "m2")],
               "partial_rowwise_lamb": [("exp_avg", "m1"), ("exp_avg_sq", "m2")],
               "lars_sgd": [("momentum_buffer", "m1")], "sgd": []}


@pytest.mark.parametrize("optimizer,extra", OPTIMIZER_CASES)
@pytest.mark.parametrize("pooling", ["sum", "mean"])
@pytest.mark.filterwarnings("ignore:weight_decay.*whatever weight_decay_mode says:UserWarning")  # ("l2" with Adam)
def test_training_steps(device, gen, optimizer, extra, pooling):
    specs, fmap = [(60, 4), (25, 33), (9, 1)], [0, 1, 2, 1]
    hp = dict(HP, **extra)
    tbe = make_module(specs, fmap, device, optimizer=optimizer, pooling=pooling, **hp)
    tables = tables64(tbe)
    state = [{"m1": torch.zeros(r) if optimizer == "rowwise_adagrad" else torch.zeros(r, d),
              "m2": torch.zeros(r) if optimizer.startswith("partial_rowwise") else torch.zeros(r, d)}
             for r, d in specs]
    state = [{k: v.double() for k, v in s.items()} for s in state]
    B = 7
    for step in range(1, 4):
        if step == 3:  # a learning rate changed between steps is used
            tbe.set_learning_rate(0.02)
            hp["learning_rate"] = 0.02
        indices, offsets, _ = ref.make_lookups(gen, rows_of(specs, fmap), B, 5, hot_row=3, hot_share=0.3)
        grad_out = torch.randn(B, tbe.total_dim, generator=gen)
        assert tbe.step == step - 1  # steps taken
        out = tbe(indices.to(device), offsets.to(device))
        out.backward(grad_out.to(device))
        grads, touched, _ = ref.dense_grads(tables, fmap, indices, offsets, B, pooling, grad_out)
        ref.apply_optimizer(optimizer, tables, state, grads, touched, hp, step)
    tol = 1e-5 if optimizer == "sgd" else 1e-4
    for got, want in zip(tables64(tbe), tables):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    names = STATE_NAMES[optimizer]
    for t, st in enumerate(tbe.optimizer_state()):
        assert sorted(st) == sorted(n for n, _ in names)
        for name, key in names:
            torch.testing.assert_close(st[name].cpu().double(), state[t][key], rtol=tol, atol=tol)
    assert tbe.weights.grad is None


def test_training_steps_of_changing_batch_sizes(device, gen, monkeypatch):
    """Batches small, large, small, large: the module asks the backward's workspace size before its first
    call, keeps the largest size asked and asks the library again only when a batch needs more (a too-small
    workspace is refused before anything is written, then the call is made again); on the CPU it keeps the
    buffer too. Every step still matches the reference."""
    from embscale import _capi
    queries, calls = [], []
    size_query, backward = _capi.lib.embscale_tbe_backward_workspace_size, _capi.lib.embscale_tbe_backward

    def counted(*args):
        queries.append(len(workspaces))
        return size_query(*args)

    def counted_backward(*args):
        calls.append(len(workspaces))
        return backward(*args)

    monkeypatch.setattr(_capi.lib, "embscale_tbe_backward_workspace_size", counted)
    monkeypatch.setattr(_capi.lib, "embscale_tbe_backward", counted_backward)
    specs, fmap = [(50, 8), (30, 5)], [0, 1, 0]
    tbe = make_module(specs, fmap, device, optimizer="rowwise_adagrad", **HP)
    tables = tables64(tbe)
    state = [{"m1": torch.zeros(r, dtype=torch.float64), "m2": None} for r, _ in specs]
    workspaces, sizes = [], []
    for step, B in enumerate((2, 60, 3, 90), start=1):
        indices, offsets, _ = ref.make_lookups(gen, rows_of(specs, fmap), B, 6)
        grad_out = torch.randn(B, tbe.total_dim, generator=gen)
        tbe(indices.to(device), offsets.to(device)).backward(grad_out.to(device))
        grads, touched, _ = ref.dense_grads(tables, fmap, indices, offsets, B, "sum", grad_out)
        ref.apply_optimizer("rowwise_adagrad", tables, state, grads, touched, HP, step)
        for got, want in zip(tables64(tbe), tables):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        workspaces.append(embscale.ops.tbe_handle(tbe._handle_id).cpu_workspace)
        sizes.append(embscale.ops.tbe_handle(tbe._handle_id).workspace_bytes)
    assert sizes[0] < sizes[1] == sizes[2] < sizes[3]
    assert queries == [0, 1, 3]  # step 1 asked first; steps 2 and 4 grew it; step 3 fit
    assert calls == [0, 1, 1, 2, 3, 3]  # the first call is not refused; the growing ones are, once
    if device.type == "cpu":  # grown for the larger batches, reused for the smaller one between them
        assert [w.numel() for w in workspaces] == sizes
        assert workspaces[2].data_ptr() == workspaces[1].data_ptr()


@pytest.mark.parametrize("weights_dtype", [torch.float16, torch.bfloat16])
def test_half_precision_weights_nearest_rounding(device, gen, weights_dtype):
    specs, fmap = [(40, 16), (30, 5)], [0, 1]
    tbe = make_module(specs, fmap, device, optimizer="rowwise_adagrad", weights_dtype=weights_dtype,
                      stochastic_rounding=False, **HP)
    tables = tables64(tbe)
    state = [{"m1": torch.zeros(r, dtype=torch.float64)} for r, _ in specs]
    for step in range(1, 3):
        indices, offsets, _ = ref.make_lookups(gen, rows_of(specs, fmap), 6, 4)
        grad_out = torch.randn(6, tbe.total_dim, generator=gen)
        tbe(indices.to(device), offsets.to(device)).backward(grad_out.to(device))
        grads, touched, _ = ref.dense_grads(tables, fmap, indices, offsets, 6, "sum", grad_out)
        ref.apply_optimizer("rowwise_adagrad", tables, state, grads, touched, HP, step)
        tables = [t.to(weights_dtype).double() for t in tables]  # the stored weights are rounded each step
    ulp = torch.finfo(weights_dtype).eps
    for got, want in zip(tables64(tbe), tables):
        torch.testing.assert_close(got, want, rtol=ulp, atol=1e-4)


def _magnitude_neighbours(a, dtype):
    """For float32 magnitudes a >= 0: the largest value of `dtype` <= a and the next one up (both float64)."""
    r = a.to(dtype)
    above = r.double() > a.double()
    bits = r.view(torch.int16).to(torch.int32)  # positive values: the bit patterns order like the values
    lo_bits = torch.where(above, bits - 1, bits)
    lo = lo_bits.to(torch.int16).view(dtype).double()
    hi = (lo_bits + 1).to(torch.int16).view(dtype).double()
    return lo, hi


# Resolution of the random bits of stochastic rounding (tbe/rounding.h): bf16 uses 16 of them, fp16
# normals 13, so a rounding probability is off by at most 2^-k.
_RANDOM_BITS = {torch.bfloat16: 16, torch.float16: 13}


@pytest.mark.parametrize("weights_dtype", [torch.bfloat16, torch.float16])
def test_stochastic_rounding_against_the_maths(device, gen, weights_dtype):
    """One SGD step (lr = 2^-4) on 65,536 weights, each row looked up once: the fp32 update x = w - lr*g
    is computed here exactly as the library must (lr*g is exact, so there is one fp32 rounding, fused or
    not). Each stored weight must be one of the two neighbours of x in the weights' format (x itself when
    representable), the rounding must be unbiased (the summed error within 5 standard deviations, computed
    from the per-element probabilities, plus the random bits' 2^-k resolution) and both directions must
    occur about as often as the probabilities say."""
    E, D, lr = 1024, 64, 2.0 ** -4
    seed = int(torch.randint(0, 2 ** 31, (), generator=gen))
    tbe = make_module([(E, D)], None, device, optimizer="sgd", weights_dtype=weights_dtype, seed=seed,
                      **dict(HP, learning_rate=lr))
    w0 = (torch.rand(E * D, generator=gen) * 2 - 1).to(weights_dtype)
    with torch.no_grad():
        tbe.weights.copy_(w0.to(device))
    ulp_scale = 2.0 ** -8 if weights_dtype == torch.bfloat16 else 2.0 ** -11
    grad = torch.randn(E, D, generator=gen) * (ulp_scale / lr)  # updates of about one unit in the last place
    indices = torch.arange(E)
    offsets = torch.arange(E + 1)
    tbe(indices.to(device), offsets.to(device)).backward(grad.to(device))
    got = tbe.weights.detach().cpu().double()

    x = w0.float() - grad.reshape(-1) * torch.tensor(lr, dtype=torch.float32)  # float32 arithmetic
    sign = torch.where(x < 0, -1.0, 1.0).double()
    lo, hi = _magnitude_neighbours(x.abs(), weights_dtype)
    a = x.abs().double()
    mag = got.abs()
    assert torch.equal(torch.sign(got) * (mag > 0), torch.sign(x.double()) * (mag > 0)), "sign changed"
    exact = lo == a
    assert torch.equal(mag[exact], a[exact]), "a representable update must be stored exactly"
    inexact = ~exact
    assert int(inexact.sum()) > E * D // 2, "the data should mostly need rounding"
    is_lo, is_hi = mag == lo, mag == hi
    bad = inexact & ~is_lo & ~is_hi
    assert not bad.any(), (f"{int(bad.sum())} weights are not a neighbour of their fp32 update, e.g. "
                           f"x={float(x[bad][0])}, got={float(got[bad][0])}, neighbours "
                           f"{float(sign[bad][0] * lo[bad][0])}, {float(sign[bad][0] * hi[bad][0])}")
    lo, hi, a, mag = lo[inexact], hi[inexact], a[inexact], mag[inexact]
    spacing = hi - lo
    p = (a - lo) / spacing  # probability of rounding up in magnitude
    resolution = 2.0 ** -_RANDOM_BITS[weights_dtype]
    err = (mag - a).sum()
    err_sd = torch.sqrt((spacing ** 2 * p * (1 - p)).sum())
    err_bound = 5 * err_sd + resolution * spacing.sum()
    ups = int((mag == hi).sum())
    ups_sd = float(torch.sqrt((p * (1 - p)).sum()))
    print(f"n={a.numel()} summed error {float(err):.4g} (bound {float(err_bound):.4g}); "
          f"round-ups {ups} (expected {float(p.sum()):.1f} +- {ups_sd:.1f})")
    assert abs(float(err)) <= float(err_bound), "stochastic rounding is biased"
    assert abs(ups - float(p.sum())) <= 5 * ups_sd + resolution * a.numel(), "round-ups off their expected count"
    assert 0 < ups < a.numel(), "rounding went one way only"


def test_stochastic_rounding_is_reproducible(device, gen):
    """The same seed reproduces the bits; another seed changes them (the seed reaches the rounding)."""
    results = []
    indices, offsets, _ = ref.make_lookups(gen, [100], 16, 8)
    grad_out = torch.randn(16, 8, generator=gen)
    for seed in (11, 11, 12):
        torch.manual_seed(5)
        tbe = make_module([(100, 8)], None, device, optimizer="sgd", weights_dtype=torch.bfloat16, seed=seed, **HP)
        before = tbe.weights.detach().cpu().clone()
        tbe(indices.to(device), offsets.to(device)).backward(grad_out.to(device))
        results.append(tbe.weights.detach().cpu().clone())
        assert not torch.equal(results[-1], before)
    assert torch.equal(results[0].view(torch.int16), results[1].view(torch.int16))
    assert not torch.equal(results[0].view(torch.int16), results[2].view(torch.int16)), "the seed is ignored"


def test_grad_per_sample_weights(device, gen):
    specs, fmap = [(30, 6), (12, 3)], [0, 1, 0]
    tbe = make_module(specs, fmap, device, optimizer="sgd", **HP)
    tables = tables64(tbe)
    indices, offsets, psw = ref.make_lookups(gen, rows_of(specs, fmap), 5, 4, weighted=True)
    psw_d = psw.clone().to(device).requires_grad_()
    grad_out = torch.randn(5, tbe.total_dim, generator=gen)
    tbe(indices.to(device), offsets.to(device), psw_d).backward(grad_out.to(device))
    grads, touched, grad_psw = ref.dense_grads(tables, fmap, indices, offsets, 5, "sum", grad_out, psw)
    torch.testing.assert_close(psw_d.grad.cpu().double(), grad_psw, rtol=1e-5, atol=1e-5)
    ref.apply_optimizer("sgd", tables, None, grads, touched, HP, 1)
    for got, want in zip(tables64(tbe), tables):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_sequence_backward(device, gen):
    specs, fmap = [(30, 4), (12, 4)], [0, 1]
    tbe = make_module(specs, fmap, device, optimizer="sgd", pooling="none", **HP)
    tables = tables64(tbe)
    indices, offsets, _ = ref.make_lookups(gen, rows_of(specs, fmap), 4, 5)
    grad_out = torch.randn(indices.numel(), 4, generator=gen)
    tbe(indices.to(device), offsets.to(device)).backward(grad_out.to(device))
    grads, touched, _ = ref.dense_grads(tables, fmap, indices, offsets, 4, "none", grad_out)
    ref.apply_optimizer("sgd", tables, None, grads, touched, HP, 1)
    for got, want in zip(tables64(tbe), tables):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_hot_row(device, gen):
    """One row hit by 120,000 lookups (block-per-row and multi-block paths)."""
    tbe = make_module([(1000, 64)], None, device, optimizer="rowwise_adagrad", **HP)
    tables = tables64(tbe)
    state = [{"m1": torch.zeros(1000, dtype=torch.float64)}]
    B = 2000
    indices, offsets, _ = ref.make_lookups(gen, [1000], B, 120, hot_row=7, hot_share=1.0)
    indices[::97] = torch.randint(0, 1000, indices[::97].shape, generator=gen)
    assert (indices == 7).sum() > 100_000
    grad_out = torch.randn(B, 64, generator=gen)
    tbe(indices.to(device), offsets.to(device)).backward(grad_out.to(device))
    # dense gradient by index_add (the loop reference is too slow for 120k lookups)
    lengths = offsets[1:] - offsets[:-1]
    bag_of = torch.repeat_interleave(torch.arange(B), lengths)
    grads = [torch.zeros(1000, 64, dtype=torch.float64).index_add_(0, indices, grad_out.double()[bag_of])]
    ref.apply_optimizer("rowwise_adagrad", tables, state, grads, [set(indices.tolist())], HP, 1)
    torch.testing.assert_close(tables64(tbe)[0], tables[0], rtol=1e-4, atol=1e-4)


def test_matches_torch_embedding_bags_with_sgd(device, gen):
    bags = [torch.nn.EmbeddingBag(50, 8, mode="sum"), torch.nn.EmbeddingBag(20, 3, mode="sum")]
    bags = [b.to(device) for b in bags]
    tbe = embscale.TableBatchedEmbeddingBags.from_embedding_bags(bags, optimizer="sgd", learning_rate=0.1)
    opt = torch.optim.SGD([b.weight for b in bags], lr=0.1)
    B = 6
    for _ in range(3):
        indices, offsets, _ = ref.make_lookups(gen, [50, 20], B, 4)
        target = torch.randn(B, 11, generator=gen).to(device)
        outs = []
        for f, bag in enumerate(bags):
            s, e = int(offsets[f * B]), int(offsets[(f + 1) * B])
            outs.append(bag(indices[s:e].to(device), (offsets[f * B:(f + 1) * B] - s).to(device)))
        want = torch.cat(outs, 1)
        got = tbe(indices.to(device), offsets.to(device))
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        opt.zero_grad()
        ((want - target) ** 2).sum().backward()
        opt.step()
        ((got - target) ** 2).sum().backward()
    for got, bag in zip(tbe.split_embedding_weights(), bags):
        torch.testing.assert_close(got, bag.weight.detach(), rtol=1e-5, atol=1e-6)


def test_state_dict_round_trip(device, gen):
    specs = [(40, 8), (30, 5)]
    kw = dict(optimizer="adam", **HP)
    a = make_module(specs, None, device, **kw)
    batches = [ref.make_lookups(gen, [40, 30], 4, 3)[:2] + (torch.randn(4, 13, generator=gen),) for _ in range(3)]
    for indices, offsets, g in batches[:2]:
        a(indices.to(device), offsets.to(device)).backward(g.to(device))
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    b = make_module(specs, None, device, **kw)
    buf.seek(0)
    b.load_state_dict(torch.load(buf))
    assert b.step == a.step == 2
    for m in (a, b):
        indices, offsets, g = batches[2]
        m(indices.to(device), offsets.to(device)).backward(g.to(device))
    assert torch.equal(a.weights, b.weights) and torch.equal(a.momentum1, b.momentum1)
    assert torch.equal(a.momentum2, b.momentum2) and b.step == 3


def _vm_flags(ptr):
    """The VmFlags of the mapping of this process holding address ptr ("" when none holds it)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= ptr < hi
            elif inside and line.startswith("VmFlags:"):
                return line
    return ""


def _on_huge_pages(t):
    return t.data_ptr() % (2 << 20) == 0 and " hg" in _vm_flags(t.data_ptr())


def _huge_pages_usable():
    import mmap
    from embscale import _host_memory
    if not _host_memory.huge_pages_available():
        return False
    try:
        mmap.mmap(-1, 4 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS).madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # a kernel without transparent huge pages
        return False
    return True


@pytest.mark.skipif(not _huge_pages_usable(), reason="no transparent huge pages on this platform")
def test_cpu_tables_of_2_mib_or_more_live_on_huge_pages(gen):
    """CPU tables and optimizer state of 2 MiB or more are on 2 MiB-aligned memory advised for huge pages (at
    construction, after a cast, after to_empty); smaller ones are ordinary tensors; lookups
    and updates on them match the reference, and a cast keeps the values."""
    specs, fmap = [(70_000, 16), (30, 4)], [0, 1, 0]
    tbe = make_module(specs, fmap, "cpu", optimizer="adam", **HP)
    assert _on_huge_pages(tbe.weights) and _on_huge_pages(tbe.momentum1) and _on_huge_pages(tbe.momentum2)
    small = make_module([(100, 8)], None, "cpu", optimizer="rowwise_adagrad")
    assert not _on_huge_pages(small.weights) and not _on_huge_pages(small.momentum1)

    tables = tables64(tbe)
    state = [{"m1": torch.zeros(r, d, dtype=torch.float64), "m2": torch.zeros(r, d, dtype=torch.float64)}
             for r, d in specs]
    B = 6
    indices, offsets, _ = ref.make_lookups(gen, rows_of(specs, fmap), B, 5)
    grad_out = torch.randn(B, tbe.total_dim, generator=gen)
    out = tbe(indices, offsets)
    torch.testing.assert_close(out.double(), ref.forward(tables, fmap, indices, offsets, B, "sum"),
                               rtol=1e-5, atol=1e-5)
    out.backward(grad_out)
    grads, touched, _ = ref.dense_grads(tables, fmap, indices, offsets, B, "sum", grad_out)
    ref.apply_optimizer("adam", tables, state, grads, touched, dict(HP), 1)
    for got, want in zip(tables64(tbe), tables):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)

    tables = tbe.split_embedding_weights()
    copied = copy.copy(tbe)  # a shallow copy shares the tables: the original's views still write through
    assert copied.weights is tbe.weights and tables[0].data_ptr() == tbe.weights.data_ptr()
    copied = copy.deepcopy(tbe)
    assert torch.equal(copied.weights, tbe.weights) and torch.equal(copied.momentum2, tbe.momentum2)
    want_half = tbe.weights.detach().half()
    param = tbe.weights
    tbe.half()
    assert tbe.weights is param and tbe.weights.dtype == torch.float16  # the Parameter object is kept
    assert _on_huge_pages(tbe.weights) and torch.equal(tbe.weights, want_half)
    assert _on_huge_pages(tbe.momentum1) and tbe.momentum1.dtype == torch.float32
    empty = make_module(specs, fmap, "meta", optimizer="sgd").to_empty(device="cpu")
    assert _on_huge_pages(empty.weights)
    kept = tbe.weights.detach().clone()
    tbe.share_memory()  # shared memory is left shared, not copied back onto private pages
    assert tbe.weights.is_shared() and tbe.momentum1.is_shared() and torch.equal(tbe.weights, kept)


@requires_cuda
def test_module_to_cuda(gen):
    tbe = make_module([(40, 8)], None, "cpu", optimizer="sgd")
    indices, offsets, _ = ref.make_lookups(gen, [40], 4, 3)
    want = tbe(indices, offsets)
    tbe = tbe.cuda()
    assert tbe.hparams.device.type == "cpu" and tbe.weights.device.type == "cuda"
    torch.testing.assert_close(tbe(indices.cuda(), offsets.cuda()).cpu(), want.detach())


def test_bounds_check(device):
    tbe = make_module([(10, 4), (5, 2)], None, device, optimizer="sgd", bounds_check="error")
    before = tbe.weights.detach().clone()
    indices = torch.tensor([1, 2, 7, 3], device=device)  # 7 is outside table 1 (5 rows)
    offsets = torch.tensor([0, 1, 2, 3, 4], device=device)
    with pytest.raises(IndexError, match="feature 1"):
        tbe(indices, offsets)
    assert torch.equal(tbe.weights.detach(), before)
    skip = make_module([(10, 4), (5, 2)], None, device, optimizer="sgd", bounds_check="skip")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # skip mode counts without warning
        out = skip(indices, offsets)
    assert skip.num_skipped.item() == 1 and torch.count_nonzero(out[0, 4:]) == 0


def test_default_bounds_check_warns_and_drops(device):
    # The default (FBGEMM's default is its WARNING mode, which maps a bad index to row 0 instead): the bad
    # index is dropped as in skip mode, counted, and a
    # BoundsCheckWarning reports it, on CUDA at a later call or at check_bounds(), never making the step wait.
    warn = make_module([(10, 4), (5, 2)], None, device, optimizer="sgd")
    skip = make_module([(10, 4), (5, 2)], None, device, optimizer="sgd", bounds_check="skip")
    skip.load_state_dict(warn.state_dict())
    assert warn.bounds_check == "warn"
    indices = torch.tensor([1, 2, 7, 3], device=device)  # 7 is outside table 1 (5 rows)
    offsets = torch.tensor([0, 1, 2, 3, 4], device=device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = warn(indices, offsets)
        out.sum().backward()
        warn.check_bounds()
        warn.check_bounds()  # nothing left to report
    reports = [w for w in caught if issubclass(w.category, embscale.BoundsCheckWarning)]
    assert len(reports) == 1 and "1 indices outside their tables were dropped" in str(reports[0].message)
    want = skip(indices, offsets)
    want.sum().backward()
    assert torch.equal(out, want) and torch.equal(warn.weights, skip.weights)
    assert warn.num_skipped.item() == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # valid indices: no warning
        warn(torch.tensor([1, 2, 4, 3], device=device), offsets)
        warn.check_bounds()
    with warnings.catch_warnings():
        warnings.simplefilter("error", embscale.BoundsCheckWarning)
        with pytest.raises(embscale.BoundsCheckWarning):
            warn(indices, offsets)
            warn.check_bounds()


def test_forward_body_writes_the_count_where_it_is_told(device):
    # The eager body takes the module's count buffer (written in place) and, with bounds checks that count,
    # a host word the library also stores the count to: any host memory on the CPU, pinned memory on CUDA,
    # where plain host memory is refused by name before anything is written.
    m = make_module([(10, 4), (5, 2)], None, device, optimizer="sgd", bounds_check="skip")
    indices = torch.tensor([1, 12, 7, -1], device=device)  # 12 and 7 are outside their tables, -1 too
    offsets = torch.tensor([0, 1, 2, 3, 4], device=device)
    buffer = torch.full((1,), -5, dtype=torch.int64, device=device)
    word = ctypes.c_int64(-(1 << 63))
    args = (m.weights, indices, offsets, None, m._handle_id, 2, "sum", "skip", m.total_dim, torch.float32)
    if device.type == "cpu":
        out, count = embscale.ops.tbe_forward_eager(*args, num_skipped_out=buffer,
                                                    num_skipped_host=ctypes.addressof(word))
        assert count is buffer and buffer.item() == 3 and word.value == 3
        embscale.ops.tbe_forward_eager(*args[:7], "off", *args[8:], num_skipped_host=ctypes.addressof(word))
        assert word.value == 3  # off mode counts nothing: the word is left alone
    else:
        with pytest.raises(ValueError, match="^num_skipped_host: expected pinned host memory"):
            embscale.ops.tbe_forward_eager(*args, num_skipped_out=buffer, num_skipped_host=ctypes.addressof(word))
        assert buffer.item() == -5 and word.value == -(1 << 63)
        out, count = embscale.ops.tbe_forward_eager(*args, num_skipped_out=buffer)
        assert count is buffer and buffer.item() == 3
    assert torch.count_nonzero(out[0, 4:]) == 0 and torch.count_nonzero(out[1]) == 0


def test_a_count_buffer_of_another_kind_is_copied_into_not_overwritten(device):
    # The module writes its count in place only into the buffer it made (one int64 on the tables' device);
    # one cast by Module.type, or replaced by a view of a larger tensor, gets the count as a copy, and no
    # byte around it changes. The eager body refuses a count buffer it cannot write, by name.
    m = make_module([(10, 4), (5, 2)], None, device, optimizer="sgd", bounds_check="skip")
    indices = torch.tensor([1, 12, 7, -1], device=device)
    offsets = torch.tensor([0, 1, 2, 3, 4], device=device)
    m.num_skipped = m.num_skipped.to(torch.float16)
    m(indices, offsets)
    assert m.num_skipped.dtype == torch.float16 and m.num_skipped.item() == 3
    base = torch.full((4,), 77, dtype=torch.int32, device=device)
    m.num_skipped = base[:1]
    m(indices, offsets)
    assert base.tolist() == [3, 77, 77, 77]
    args = (m.weights, indices, offsets, None, m._handle_id, 2, "sum", "skip", m.total_dim, torch.float32)
    with pytest.raises(TypeError, match="^num_skipped_out: dtype int32"):
        embscale.ops.tbe_forward_eager(*args, num_skipped_out=base[:1])
    with pytest.raises(ValueError, match=r"^num_skipped_out: shape \[2\]"):
        embscale.ops.tbe_forward_eager(*args, num_skipped_out=torch.zeros(2, dtype=torch.int64, device=device))
    assert base.tolist() == [3, 77, 77, 77]


@requires_cuda
def test_a_host_word_the_device_may_still_write_is_never_reused(monkeypatch):
    # A forward that fails after the library took the word (here: saving for backward raises) drops it; a
    # refused call gives it back; a deleted module's pending words go back once the device has written them.
    from embscale import _bounds_warnings
    dev = torch.device("cuda")
    pool = _bounds_warnings.HostWords()
    monkeypatch.setattr(_bounds_warnings, "HOST_WORDS", pool)
    m = make_module([(10, 4), (5, 2)], None, dev, optimizer="sgd")
    offsets = torch.tensor([0, 1, 2], device=dev)

    def refuse(_):
        raise RuntimeError("pack hook")

    with torch.autograd.graph.saved_tensors_hooks(refuse, lambda x: x):
        with pytest.raises(RuntimeError, match="pack hook"):
            m(torch.tensor([1, 7], device=dev), offsets)
    assert len(pool.free) == pool.CHUNK - 1  # dropped: the device may still write it
    with pytest.raises(ValueError, match="offsets"):
        m(torch.tensor([1, 7], device=dev), torch.tensor([0, 1], device=dev))
    assert len(pool.free) == pool.CHUNK - 1  # refused before the library: given back (or never taken)
    indices = torch.tensor([1, 7], device=dev)  # (a copy from the host: waits for the stream)
    torch.cuda._sleep(200_000_000)  # the device busy for ~0.1 s: the call's word is still unwritten after it
    m(indices, offsets)
    assert len(m._bounds_reports) == 1 and len(pool.free) == pool.CHUNK - 2
    del m
    gc.collect()
    assert len(pool.inbox) == 1
    torch.cuda.synchronize()
    assert pool.take(dev) is not None and not pool.orphans and len(pool.free) == pool.CHUNK - 2


@requires_cuda
def test_warn_mode_on_cuda_reads_counts_from_pinned_host_words():
    # Each warn call has the device store its count to a pinned host word (no event, no copy on the stream);
    # the reports still come in call order, each with its own count, and the words go back to the pool.
    from embscale import _bounds_warnings
    dev = torch.device("cuda")
    m = make_module([(10, 4), (5, 2)], None, dev, optimizer="sgd")
    offsets = torch.tensor([0, 3, 6], device=dev)
    calls = [torch.tensor([1, 2, 3, 4, 0, 1], device=dev), torch.tensor([11, 2, 3, 4, 0, 1], device=dev),
             torch.tensor([11, 12, 3, 4, 9, 1], device=dev), torch.tensor([11, 12, 13, 5, 6, 7], device=dev)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for indices in calls:
            m(indices, offsets).sum().backward()
        assert all(isinstance(r, _bounds_warnings.HostWord) for r in m._bounds_reports)
        assert "_bounds_free" not in m.__dict__  # the event path was not taken
        m.check_bounds()
    reports = [str(w.message) for w in caught if issubclass(w.category, embscale.BoundsCheckWarning)]
    assert [r.split(" indices outside")[0].split()[-1] for r in reports] == ["1", "3", "6"], reports
    assert m.num_skipped.item() == 6 and not m._bounds_reports
    assert all(w.read() is not None for w in _bounds_warnings.HOST_WORDS.free)


@requires_cuda
def test_warn_mode_on_cuda_falls_back_to_events_when_the_library_refuses_a_host_word(monkeypatch):
    # Pinned memory that the device does not see at its host address (the library refuses it by name) sends
    # this device's reports back through a copy behind an event, losing none.
    from embscale import _bounds_warnings
    dev = torch.device("cuda")
    pool = _bounds_warnings.HostWords()
    monkeypatch.setattr(_bounds_warnings, "HOST_WORDS", pool)
    device_memory = torch.zeros(1, dtype=torch.int64, device=dev)
    real_take = pool.take

    def take(device):  # a word whose address is device memory: what the library must refuse
        word = real_take(device)
        if word is not None:
            word.address = device_memory.data_ptr()
        return word

    monkeypatch.setattr(pool, "take", take)
    m = make_module([(10, 4), (5, 2)], None, dev, optimizer="sgd")
    offsets = torch.tensor([0, 1, 2], device=dev)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m(torch.tensor([1, 7], device=dev), offsets).sum().backward()
        m(torch.tensor([11, 7], device=dev), offsets).sum().backward()
        m.check_bounds()
    reports = [str(w.message) for w in caught if issubclass(w.category, embscale.BoundsCheckWarning)]
    assert len(reports) == 2 and "1 indices" in reports[0] and "2 indices" in reports[1], reports
    assert torch.device("cuda", torch.cuda.current_device()) in pool.refused
    assert device_memory.item() == 0 and m.num_skipped.item() == 2


def test_errors(device):
    tbe = make_module([(10, 4)], None, device)
    i64 = torch.tensor([1, 2], device=device)
    off = torch.tensor([0, 1, 2], device=device)
    with pytest.raises(TypeError, match="indices: dtype float32"):
        tbe(i64.float(), off)
    with pytest.raises(ValueError, match=r"offsets: shape \(4,\); expected \[T\*B\+1\] with T = 2"):
        make_module([(10, 4), (10, 2)], None, device)(i64, torch.tensor([0, 1, 2, 2], device=device))
    with pytest.raises(TypeError, match="offsets: dtype float32 is not supported"):
        tbe(i64, off.float())
    with pytest.raises(ValueError, match="per_sample_weights: not supported with mean"):
        make_module([(10, 4)], None, device, pooling="mean")(i64, off, torch.ones(2, device=device))
    with pytest.raises(ValueError, match="optimizer: 'lambda'"):
        make_module([(10, 4)], None, device, optimizer="lambda")
    with pytest.raises(ValueError, match=r"embedding_specs\[0\]"):
        make_module([(0, 4)], None, device)
    with pytest.raises(ValueError, match="feature_table_map\\[1\\]: table 3"):
        make_module([(10, 4)], [0, 3], device)
    with pytest.raises(TypeError, match="weights_dtype"):
        make_module([(10, 4)], None, device, weights_dtype=torch.int8)
    # Every backend is deterministic; the old switch is refused, not silently ignored.
    with pytest.raises(TypeError, match="deterministic"):
        make_module([(10, 4)], None, device, deterministic=False)


# ---- constructor arguments: whole numbers and booleans, never coerced ------------------------------------------
@pytest.mark.parametrize("kw, error, message", [
    (dict(embedding_specs=[(5.7, 4)]), ValueError, r"embedding_specs\[0\]: \(5.7, 4\) is not"),
    (dict(embedding_specs=[(True, True)]), ValueError, r"embedding_specs\[0\]: \(True, True\) is not"),
    (dict(embedding_specs=[("5", 4)]), ValueError, r"embedding_specs\[0\]"),
    (dict(embedding_specs=[(5, 4), (3, 3)], feature_table_map=[0.9, 1]), ValueError, "feature_table_map"),
    (dict(embedding_specs=[(5, 4)], seed=3.7), TypeError, "seed: 3.7 is not a whole number"),
    (dict(embedding_specs=[(5, 4)], seed="3"), TypeError, "seed: '3'"),
    (dict(embedding_specs=[(5, 4)], stochastic_rounding="no"), TypeError, "stochastic_rounding: 'no' is not a boolean"),
    (dict(embedding_specs=[(5, 4)], stochastic_rounding=2), TypeError, "stochastic_rounding: 2"),
    (dict(embedding_specs=[(5, 4)], stochastic_rounding=1.0), TypeError, "stochastic_rounding: 1.0"),
    (dict(embedding_specs=[(5, 4)], seed=torch.tensor(2.5)), TypeError, "seed: tensor"),
])
def test_constructor_refuses_what_it_would_have_coerced(kw, error, message):
    # 5.7 rows used to become 5, feature 0.9 table 0, seed "3" 3 and stochastic_rounding="no" True.
    with pytest.raises(error, match=message):
        embscale.TableBatchedEmbeddingBags(**kw)


def test_constructor_takes_numpy_integers_tensors_and_whole_floats():
    np = pytest.importorskip("numpy")
    m = embscale.TableBatchedEmbeddingBags([(np.int64(5), 4.0), (np.float32(3), 2)], feature_table_map=[np.int32(0), 1],
                                           seed=np.uint8(3), stochastic_rounding=np.bool_(False))
    assert (m.embedding_specs, m.feature_table_map, m.seed, m.stochastic_rounding) == ([(5, 4), (3, 2)], [0, 1], 3,
                                                                                        False)
    assert all(type(v) is int for v in m.embedding_specs[0] + (m.seed,))
    # Integer tensors, as before the checks: a [T, 2] spec tensor, a map tensor, 0-d seed and flag tensors.
    t = embscale.TableBatchedEmbeddingBags(torch.tensor([[10, 4], [20, 4]]), feature_table_map=torch.tensor([0, 0, 1]),
                                           seed=torch.tensor(7), stochastic_rounding=torch.tensor(True))
    assert (t.embedding_specs, t.feature_table_map, t.seed, t.stochastic_rounding) == ([(10, 4), (20, 4)], [0, 0, 1],
                                                                                        7, True)
    assert embscale.TableBatchedEmbeddingBags([(5, 4)], stochastic_rounding=0).stochastic_rounding is False


# ---- what the module shows: its real parameters and state only ------------------------------------------------
def test_the_module_shows_only_its_tables_and_state_and_still_trains(device):
    """The module's only Parameter is its tables (an optimizer or DistributedDataParallel sees no parameter
    that never gets a gradient), and the backward still runs when no input requires grad."""
    m = make_module([(10, 4), (6, 3)], None, device, optimizer="adam")
    assert [name for name, _ in m.named_parameters()] == ["weights"]
    assert not any("anchor" in key for key in m.state_dict())
    before = m.weights.detach().clone()
    out = m(torch.tensor([1, 2, 5], device=device), torch.tensor([0, 2, 3], device=device))
    assert out.requires_grad
    out.sum().backward()
    assert m.step == 1 and not torch.equal(m.weights, before) and m.weights.grad is None
    with torch.no_grad():
        assert not m(torch.tensor([1], device=device), torch.tensor([0, 1, 1], device=device)).requires_grad
    copied = pickle.loads(pickle.dumps(m))
    assert [name for name, _ in copied.named_parameters()] == ["weights"]
    copied(torch.tensor([1], device=device), torch.tensor([0, 1, 1], device=device)).sum().backward()
    assert copied.step == 2
