"""FP8 operators against references written from the maths with plain torch ops; meta arguments (shapes only,
and refused among real ones); errors that name the argument (a None or sparse tensor, a bad eps)."""
import functools
import math
import os

import pytest
import torch

import embscale
from conftest import requires_cuda

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
FLOATS = [torch.float32, torch.float16, torch.bfloat16]
SIZES = [0, 1, 3, 127, 1000, 65537]


def sample(n, dtype, gen, specials=False):
    """Values spread over many binades; with specials, also 0, -0, +-inf, NaN, huge and tiny values."""
    x = torch.randn(n, generator=gen, dtype=torch.float64) * torch.exp2(torch.randint(-20, 12, (n,), generator=gen))
    if specials and n >= 8:
        x[:8] = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 3e38, -1e-30, 1e-45], dtype=torch.float64)
    return x.to(dtype)


def ref_amax(x):
    a = x.float().abs()
    a = torch.where(torch.isnan(a), torch.zeros_like(a), a)
    return a.max() if a.numel() else torch.tensor(0.0)


def ref_scale(amax, fp8_dtype, eps=0.0, power_of_2=False):
    a = torch.tensor(max(float(amax), eps) if not math.isnan(float(amax)) else math.nan, dtype=torch.float32)
    if a.item() == 0.0 or not math.isfinite(a.item()):
        s = torch.tensor(1.0)
    else:
        s = torch.tensor(FP8_MAX[fp8_dtype], dtype=torch.float32) / a  # fp32 division, round to nearest
        if math.isinf(s.item()):
            s = torch.tensor(torch.finfo(torch.float32).max)
        if power_of_2:
            s = torch.tensor(2.0 ** math.floor(math.log2(s.item())), dtype=torch.float32)
    return s, torch.tensor(1.0, dtype=torch.float32) / s


def ref_quantize(x, scale, fp8_dtype):
    m = FP8_MAX[fp8_dtype]
    return (x.float() * scale.float().cpu()).clamp(-m, m).to(fp8_dtype)


def bits(t):
    """A tensor's bytes, to compare bit for bit (NaN included)."""
    return t.detach().reshape(-1).view(torch.uint8).clone()


def test_meta_tensors_give_shapes_only():
    y, si = embscale.quantize_current_scaling(torch.empty(7, 3, device="meta", dtype=torch.bfloat16))
    assert y.device.type == "meta" and y.shape == (7, 3) and y.dtype == torch.float8_e4m3fn and si.shape == ()


def test_a_meta_scale_among_real_tensors_is_refused(device):
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


def test_all_meta_arguments_give_meta_outputs_after_the_same_checks():
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


def assert_fp8_equal(got, want):
    g, w = got.cpu().float(), want.cpu().float()
    assert torch.equal(torch.isnan(g), torch.isnan(w))
    keep = ~torch.isnan(w)
    assert torch.equal(got.cpu().view(torch.uint8)[keep], want.cpu().view(torch.uint8)[keep])


def sample_with_planted_max(n, dtype, gen):
    """Finite data whose amax is a real maximum: spread values, with (n >= 8) 0, -0, NaN and tiny values
    at random positions, and the largest magnitude planted at a random position with a random sign."""
    x = sample(n, dtype, gen).to(torch.float64)
    if n == 0:
        return x.to(dtype)
    pos = torch.randperm(n, generator=gen)
    if n >= 8:
        x[pos[1:6]] = torch.tensor([0.0, -0.0, math.nan, -1e-30, 1e-45], dtype=torch.float64)
    peak = 1.5 * float(x[~torch.isnan(x)].abs().max()) + 1.0
    x[pos[0]] = -peak if bool(torch.randint(0, 2, (), generator=gen)) else peak
    return x.to(dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", SIZES)
def test_amax(device, gen, dtype, n):
    x = sample_with_planted_max(n, dtype, gen)
    want = ref_amax(x).item()
    if n > 0:
        assert math.isfinite(want) and want > 0.0, "the data must exercise a finite maximum"
    for algo in ("auto", "atomic", "two_stage"):
        got = embscale.amax(x.to(device), algo=algo)
        assert got.device.type == device.type and got.dtype == torch.float32 and got.dim() == 0
        assert got.cpu().item() == want


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("n", [s for s in SIZES if s >= 8])
def test_amax_with_infinities(device, gen, dtype, n):
    """+-inf anywhere makes the amax inf (NaN is still skipped)."""
    x = sample(n, dtype, gen, specials=True)
    x = x[torch.randperm(n, generator=gen)]
    assert ref_amax(x).item() == math.inf
    for algo in ("auto", "atomic", "two_stage"):
        assert embscale.amax(x.to(device), algo=algo).cpu().item() == math.inf


def test_amax_non_contiguous_input(device, gen):
    x = sample(4096, torch.float32, gen).view(64, 64).to(device).t()
    assert embscale.amax(x).cpu().item() == ref_amax(x.cpu()).item()


@pytest.mark.parametrize("fp8", list(FP8_MAX))
@pytest.mark.parametrize("power_of_2", [False, True])
def test_compute_scale(device, fp8, power_of_2):
    for amax, eps in [(0.0, 0.0), (0.0, 1e-3), (1.0, 0.0), (3.7, 0.0), (1e-40, 0.0), (1e-30, 0.0), (7e4, 0.0),
                      (math.inf, 0.0), (math.nan, 0.0), (0.5, 4.0)]:
        a = torch.tensor(amax, dtype=torch.float32, device=device)
        s, si = embscale.compute_scale(a, fp8, eps=eps, power_of_2=power_of_2)
        ws, wsi = ref_scale(amax, fp8, eps, power_of_2)
        assert s.cpu().item() == ws.item(), (amax, eps)
        assert si.cpu().item() == wsi.item(), (amax, eps)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("fp8", list(FP8_MAX))
@pytest.mark.parametrize("n", SIZES)
def test_quantize_dequantize(device, gen, dtype, fp8, n):
    x = sample(n, dtype, gen, specials=True)
    scale = torch.tensor(float(torch.rand((), generator=gen)) * 100 + 0.01, dtype=torch.float32)
    y = embscale.quantize(x.to(device), scale.to(device), fp8)
    assert y.dtype == fp8 and y.shape == x.shape
    assert_fp8_equal(y, ref_quantize(x, scale, fp8))
    for out in FLOATS:
        back = embscale.dequantize(y, (1 / scale).to(device), out)
        want = (y.cpu().float() * (1 / scale)).to(out)
        assert torch.equal(torch.isnan(back.cpu()), torch.isnan(want))
        assert torch.equal(back.cpu()[~torch.isnan(want)], want[~torch.isnan(want)])


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("fp8", list(FP8_MAX))
@pytest.mark.parametrize("n", SIZES)
def test_quantize_current_scaling(device, gen, dtype, fp8, n):
    x = sample(n, dtype, gen).view(-1, 1) if n else sample(n, dtype, gen)
    y, scale_inv, amax = embscale.quantize_current_scaling(x.to(device), fp8, return_amax=True)
    assert y.shape == x.shape
    want_amax = ref_amax(x)
    want_scale, want_inv = ref_scale(want_amax, fp8)
    assert amax.cpu().item() == want_amax.item()
    assert scale_inv.cpu().item() == want_inv.item()
    assert_fp8_equal(y, ref_quantize(x, want_scale, fp8))


def test_quantize_current_scaling_eps_and_power_of_2(device, gen):
    x = sample(999, torch.bfloat16, gen)
    y, si = embscale.quantize_current_scaling(x.to(device), torch.float8_e5m2, eps=1e3, power_of_2=True)
    s, wsi = ref_scale(max(ref_amax(x).item(), 1e3), torch.float8_e5m2, 0.0, True)
    assert si.cpu().item() == wsi.item()
    assert_fp8_equal(y, ref_quantize(x, s, torch.float8_e5m2))


@pytest.mark.parametrize("act", ["relu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_activation_amax(device, gen, act, dtype):
    x = (torch.randn(3001, generator=gen) * 4).to(dtype)
    y, amax = embscale.activation_amax(x.to(device), act)
    xf = x.double()
    want = {"relu": torch.relu(xf), "gelu_tanh": torch.nn.functional.gelu(xf, approximate="tanh"),
            "silu": torch.nn.functional.silu(xf)}[act]
    assert y.dtype == dtype and y.shape == x.shape
    tol = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    torch.testing.assert_close(y.cpu().double(), want, rtol=tol, atol=tol)
    # amax is max |y| of the values as stored in y.
    assert amax.cpu().item() == y.cpu().float().abs().max().item()


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shape", [(1, 1), (3, 5), (64, 64), (129, 77), (0, 4)])
def test_cast_transpose(device, gen, dtype, shape):
    x = sample(shape[0] * shape[1], dtype, gen).view(shape)
    scale = torch.tensor(2.5, dtype=torch.float32)
    y, yt = embscale.cast_transpose(x.to(device), scale.to(device), torch.float8_e4m3fn)
    want = ref_quantize(x, scale, torch.float8_e4m3fn)
    assert y.shape == shape and yt.shape == (shape[1], shape[0]) and yt.is_contiguous()
    assert_fp8_equal(y, want)
    assert_fp8_equal(yt, want.t().contiguous())


# ---- workspace sizes ----------------------------------------------------------------------------------------------
_WORKSPACE_OPS = {
    "amax": lambda x, algo: torch.ops.embscale.amax(x, algo=algo),
    "quantize_current_scaling": lambda x, algo: torch.ops.embscale.quantize_current_scaling(x, E4, algo=algo)[0],
    "activation_amax": lambda x, algo: torch.ops.embscale.activation_amax(x, "relu", algo=algo)[1],
}


@pytest.mark.parametrize("op", sorted(_WORKSPACE_OPS))
def test_workspace_size_is_asked_once_per_dtype_numel_and_algo(device, gen, monkeypatch, op):
    """An op that takes a workspace asks the library for its size once per (device, x's dtype, x's numel, amax
    algorithm): a repeated call makes only the op's own C call. Another numel, dtype or algorithm asks again,
    and every call's result still matches the reference."""
    from embscale import _capi, _ops_common

    name = f"embscale_{op}_workspace_size"
    size_fn, asked = getattr(_capi.lib, name), []

    @functools.wraps(size_fn)
    def counted(ctx, x, algo, nbytes):
        desc = x._obj  # the embscale_tensor behind ctypes.byref
        asked.append((desc.dtype, desc.shape[0], algo))
        return size_fn(ctx, x, algo, nbytes)

    monkeypatch.setattr(_capi.lib, name, counted)
    monkeypatch.setattr(_ops_common, "_WORKSPACE_BYTES", {})  # none asked yet by another test
    calls = [(1000, torch.float32, "auto"), (1000, torch.float32, "auto"), (37, torch.float32, "auto"),
             (1000, torch.float32, "auto"), (1000, torch.float16, "auto"), (1000, torch.float32, "two_stage"),
             (37, torch.float32, "auto"), (1000, torch.float16, "auto"), (1000, torch.float32, "two_stage")]
    for n, dtype, algo in calls:
        x = sample(n, dtype, gen)
        got = _WORKSPACE_OPS[op](x.to(device), algo)
        if op == "amax":
            assert got.cpu().item() == ref_amax(x).item()
        elif op == "activation_amax":
            assert got.cpu().item() == ref_amax(torch.relu(x)).item()
        else:
            assert_fp8_equal(got, ref_quantize(x, ref_scale(ref_amax(x), E4)[0], E4))
    algo = _capi.AMAX_ALGO
    assert asked == [(0, 1000, algo["auto"]), (0, 37, algo["auto"]), (1, 1000, algo["auto"]),
                     (0, 1000, algo["two_stage"])]


def test_workspace_sizes_kept_are_bounded(monkeypatch):
    """The sizes kept are cleared when they would outgrow their bound, so new shapes never grow them without
    limit; a size cleared is asked again."""
    from embscale import _ops_common

    kept = {}
    monkeypatch.setattr(_ops_common, "_WORKSPACE_BYTES", kept)
    monkeypatch.setattr(_ops_common, "_WORKSPACE_BYTES_MAX", 3)
    for n in range(1, 8):
        embscale.amax(torch.ones(n))
        assert 1 <= len(kept) <= 3
    assert len(kept) == 1 + (7 - 1) % 3


@requires_cuda
def test_scaled_mm_with_scale_inv(gen):
    a = torch.randn(64, 128, generator=gen).cuda().bfloat16()
    b = torch.randn(32, 128, generator=gen).cuda().bfloat16()
    qa, sa = embscale.quantize_current_scaling(a)
    qb, sb = embscale.quantize_current_scaling(b)
    out = torch._scaled_mm(qa, qb.t(), scale_a=sa, scale_b=sb, out_dtype=torch.float32)
    da, db = embscale.dequantize(qa, sa).double(), embscale.dequantize(qb, sb).double()
    ref = da @ db.t()
    # FP8 tensor-core GEMMs accumulate with fewer bits than fp32: bound the error by the sum of |products|.
    bound = 2.0 ** -10 * (da.abs() @ db.abs().t()) + 1e-6
    assert ((out.double() - ref).abs() <= bound).all()
    # and close to the unquantised product (e4m3: 3 mantissa bits)
    assert (out - a.float() @ b.float().t()).abs().max() < 0.1 * (a.float() @ b.float().t()).abs().max()


@requires_cuda
def test_current_scaling_in_cuda_graph(gen):
    x = torch.randn(1 << 16, generator=gen).cuda().bfloat16()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up outside capture
        embscale.quantize_current_scaling(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y, si = embscale.quantize_current_scaling(x)
    for scale_up in (1.0, 8.0, 0.25):
        x.mul_(scale_up)
        graph.replay()
        torch.cuda.synchronize()
        want_amax = ref_amax(x.cpu())
        s, wsi = ref_scale(want_amax, torch.float8_e4m3fn)
        assert si.cpu().item() == wsi.item()
        assert_fp8_equal(y, ref_quantize(x.cpu(), s, torch.float8_e4m3fn))


def test_errors(device):
    with pytest.raises(TypeError, match="x: dtype int32"):
        embscale.amax(torch.zeros(4, dtype=torch.int32, device=device))
    with pytest.raises(TypeError, match="fp8_dtype"):
        embscale.quantize_current_scaling(torch.zeros(4, device=device), torch.float16)
    with pytest.raises(ValueError, match="x: has 1 dimensions, expected 2"):
        embscale.cast_transpose(torch.zeros(4, device=device), torch.ones((), device=device))
    with pytest.raises(ValueError, match="amax: has 2 elements"):
        embscale.compute_scale(torch.zeros(2, device=device))
    with pytest.raises(ValueError, match="algo"):
        embscale.amax(torch.zeros(4, device=device), algo="fastest")


@requires_cuda
def test_errors_device_mismatch():
    with pytest.raises(ValueError, match="scale_inv: is on cpu"):
        embscale.dequantize(torch.zeros(4, device="cuda").to(torch.float8_e4m3fn), torch.ones(()))
    with pytest.raises(ValueError, match="scale: is on cpu"):
        embscale.quantize(torch.zeros(4, device="cuda"), torch.ones(()))


def _none_cases():
    x, s, a = torch.randn(4, 4), torch.tensor(1.0), torch.tensor(1.0)
    ops = torch.ops.embscale
    return [
        ("x", lambda: embscale.amax(None)),
        ("x", lambda: embscale.quantize_current_scaling(None)),
        ("x", lambda: embscale.activation_amax(None, "relu")),
        ("amax", lambda: embscale.compute_scale(None)),
        ("scale", lambda: embscale.quantize(x, None)),
        ("scale", lambda: embscale.cast_transpose(x, None)),
        ("y", lambda: embscale.dequantize(None, s)),
        ("scale_inv", lambda: embscale.dequantize(x.to(E4), None)),
        ("amax", lambda: ops.amax_out(x, None, None, None)),
        ("y", lambda: ops.quantize_out(x, s, None, None)),
        ("scale", lambda: ops.compute_scale_out(a, None, torch.zeros(()), E4, None)),
    ]


@pytest.mark.parametrize("i", range(len(_none_cases())))
def test_none_for_a_tensor_names_the_argument(i):
    name, call = _none_cases()[i]
    with pytest.raises(TypeError, match=f"^{name}: expected a tensor, got NoneType"):
        call()


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_sparse_tensors_are_refused_by_name(layout):
    def sparse(t):
        return t.to_sparse() if layout == "coo" else t.to_sparse_csr()

    x = torch.randn(4, 4)
    with pytest.raises(TypeError, match="^x: layout torch.sparse_.* is not supported"):
        embscale.amax(sparse(x))
    with pytest.raises(TypeError, match="^x: layout torch.sparse_.* is not supported"):
        embscale.quantize(sparse(x), torch.tensor(1.0))
    with pytest.raises(TypeError, match="^x: layout torch.sparse_.* is not supported"):
        embscale.cast_transpose(sparse(x), torch.tensor(1.0))
    with pytest.raises(TypeError, match="^amax: layout torch.sparse_.* is not supported"):
        embscale.amax(x, out=sparse(torch.zeros(1, 1)))
    if layout == "coo":  # a one-element scale (CSR needs 2-D)
        with pytest.raises(TypeError, match="^scale: layout torch.sparse_coo is not supported"):
            embscale.quantize(x, torch.tensor([1.0]).to_sparse())


def test_eps_errors_name_eps_and_the_value():
    a = torch.tensor(1.0)
    with pytest.raises(ValueError, match=r"^eps: 1e\+39 is not allowed"):
        embscale.compute_scale(a, eps=1e39)
    with pytest.raises(ValueError, match=r"^eps: 1e\+39 is not allowed"):
        torch.ops.embscale.compute_scale(a, E4, 1e39)
    with pytest.raises(ValueError, match=r"^eps: 1e\+39 is not allowed"):
        embscale.quantize_current_scaling(torch.randn(4), eps=1e39)
    for bad in (True, "1", None):
        with pytest.raises(TypeError, match="^eps: expected a real number"):
            embscale.compute_scale(a, eps=bad)


def _group_worker(rank, world, port, results):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    x = torch.full((100,), float(rank + 1)) * (1.0 if rank == 0 else -3.0)  # amax: 1 on rank 0, 6 on rank 1
    y, si, a = embscale.quantize_current_scaling(x, group=dist.group.WORLD, return_amax=True)
    results[rank] = (a.item(), si.item())
    dist.barrier()  # no process tears its connections down while another still uses them
    dist.destroy_process_group()


def test_group_all_reduces_amax():
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_group_worker, args=(2, port, results), nprocs=2, join=True)
    want_amax = 6.0
    _, want_inv = ref_scale(torch.tensor(want_amax), torch.float8_e4m3fn)
    for rank in range(2):
        assert results[rank] == (want_amax, want_inv.item())
