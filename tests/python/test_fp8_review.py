"""Regression tests for the defects a review of the Python FP8 package found: out= operators whose input
is strided (copied to a contiguous buffer before the C library's overlap check) overwrote that input (1);
the FP8 operators had no autograd formula, so a Parameter input failed torch.compile and eager backward
(2); convert_to_float8_training converted a repeated layer only at its first place (3); Float8Linear
turned infinities and NaNs into finite outputs and gradients (4); out= with a conflicting explicit dtype was
silently ignored (5); a None or sparse tensor argument and bad eps values gave errors that did not name the
argument (6). Each refused call leaves the caller's tensors as they were."""
import math

import pytest
import torch

import embscale
from embscale.fp8 import Float8Linear, convert_to_float8_training, sync_float8_weight_amax
from embscale.fp8_training import _fp8_mm

E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
FLOATS = [torch.float32, torch.float16, torch.bfloat16]


def bits(t):
    """A tensor's bytes, to compare bit for bit (NaN included)."""
    return t.detach().reshape(-1).view(torch.uint8).clone()


# ---- 1: out= with a strided input that overlaps an output ---------------------------------------------------
def _base(device):
    return torch.arange(1.0, 17.0, device=device).view(4, 4)


def _fp8_view(t):
    """t's first 16 bytes as a contiguous 4x4 fp8 tensor."""
    return t.view(-1).view(torch.uint8)[:16].view(E4).view(4, 4)


def _amax_into_x(device):
    base = _base(device)
    return base, lambda: embscale.amax(base.t(), out=base.view(-1)[:1]), "amax: overlaps x"


def _nonfinite_into_x(device):
    base = _base(device)
    flag = base.view(-1).view(torch.int32)[5:6]
    return (base, lambda: embscale.amax(base.t(), return_nonfinite=True, out=(torch.zeros((), device=device), flag)),
            "nonfinite: overlaps x")


def _quantize_into_x(device):
    base = _base(device)
    return (base, lambda: embscale.quantize(base.t(), torch.ones((), device=device), out=_fp8_view(base)),
            "y: overlaps x")


def _dequantize_into_y(device):
    buf = torch.zeros(16, device=device)
    codes = _fp8_view(buf)
    codes.copy_(torch.arange(16.0, device=device).view(4, 4).to(E4))
    return (buf, lambda: embscale.dequantize(codes.t(), torch.ones((), device=device), out=buf.view(4, 4)),
            "x: overlaps y")


def _quantize_current_scaling_into_x(device):
    base = _base(device)
    s = [torch.zeros((), device=device) for _ in range(2)]
    out = (torch.empty(4, 4, dtype=E4, device=device), base.view(-1)[15:16], *s)
    return base, lambda: embscale.quantize_current_scaling(base.t(), out=out), "amax: overlaps x"


def _activation_into_x(device):
    xs = torch.randn(8, 4, generator=torch.Generator().manual_seed(1)).to(device)
    return (xs, lambda: embscale.activation_amax(xs[::2], "relu", out=(xs[:4], torch.zeros((), device=device))),
            "y: overlaps x")


def _cast_transpose_into_x(device):
    base = _base(device)
    return (base, lambda: embscale.cast_transpose(base.t(), torch.ones((), device=device),
                                                  out=(torch.empty(4, 4, dtype=E4, device=device), _fp8_view(base))),
            "yt: overlaps x")


@pytest.mark.parametrize("case", [_amax_into_x, _nonfinite_into_x, _quantize_into_x, _dequantize_into_y,
                                  _quantize_current_scaling_into_x, _activation_into_x, _cast_transpose_into_x])
def test_out_refuses_an_output_overlapping_a_strided_input(device, case):
    watched, call, message = case(device)
    before = bits(watched)
    with pytest.raises(ValueError, match=f"^{message};"):
        call()
    assert torch.equal(bits(watched), before), "a refused call changed the caller's input"


# ---- 2: gradients --------------------------------------------------------------------------------------------
# Each FP8 function on a w that requires grad, as (name, function of w returning a tuple of tensors).
FP8_FUNCTIONS = [
    ("amax", lambda w: (embscale.amax(w),)),
    ("amax_nonfinite", lambda w: embscale.amax(w, return_nonfinite=True)),
    ("compute_scale", lambda w: embscale.compute_scale(w.abs().max())),  # an amax that requires grad (torchao's)
    ("quantize", lambda w: (embscale.quantize(w, torch.tensor(3.0)),)),
    ("quantize_current_scaling", lambda w: embscale.quantize_current_scaling(w, E5, return_amax=True)),
    ("cast_transpose", lambda w: embscale.cast_transpose(w, torch.tensor(3.0))),
    ("dequantize", lambda w: (embscale.dequantize(w.detach().to(E4), w.abs().max() / 448),)),  # a scale_inv that does
    ("activation_amax", lambda w: embscale.activation_amax(w, "silu")[1:]),
]


def test_fp8_outputs_are_not_differentiable_in_eager_mode(gen):
    w = torch.nn.Parameter(torch.randn(16, 16, generator=gen))
    for name, f in FP8_FUNCTIONS:
        assert not any(t.requires_grad for t in f(w)), name
    # A loss that mixes them with w: the FP8 outputs are constants for the gradient.
    _, scale_inv = embscale.compute_scale(w.abs().max())
    (w * scale_inv).sum().backward()
    assert torch.equal(w.grad, scale_inv.expand(16, 16))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("name, f", FP8_FUNCTIONS, ids=[name for name, _ in FP8_FUNCTIONS])
def test_fp8_functions_compile_with_a_parameter_input(gen, backend, name, f):
    w = torch.nn.Parameter(torch.randn(16, 16, generator=gen))
    torch._dynamo.reset()
    compiled = torch.compile(f, backend=backend, fullgraph=True)(w)
    for got, want in zip(compiled, f(w)):
        assert not got.requires_grad
        assert got.dtype == want.dtype and torch.equal(bits(got), bits(want))


def _torch_activation(act, x):
    """The activations of src/fp8/activation.h written with torch functions (gelu_tanh: the tanh form)."""
    if act == "relu":
        return torch.relu(x)
    if act == "gelu_tanh":
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    return x * torch.sigmoid(x)


def _activation_sample(dtype, gen):
    big = [1e4, 6e4] + ([3e38] if dtype != torch.float16 else [])
    special = [0.0, -0.0, 1e-30, -1e-30, 0.5, -0.75, 8.0, -8.0, 20.0, -20.0, 100.0, -100.0] + big + [-v for v in big]
    return torch.cat([torch.randn(2000, generator=gen, dtype=torch.float64) * 4,
                      torch.tensor(special, dtype=torch.float64)]).to(dtype)


@pytest.mark.parametrize("act", ["relu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("out_dtype", [None, torch.float32, torch.bfloat16])
def test_activation_amax_gradient_matches_torch_autograd(device, gen, act, dtype, out_dtype):
    x = torch.nn.Parameter(_activation_sample(dtype, gen).to(device))
    y, amax = embscale.activation_amax(x, act, out_dtype)
    assert y.requires_grad and not amax.requires_grad
    grad_y = torch.randn(y.shape, generator=gen).to(device=device, dtype=y.dtype)
    got, = torch.autograd.grad(y, x, grad_y)
    assert got.dtype == dtype and torch.isfinite(got).all()
    xd = x.detach().cpu().double().requires_grad_()
    want, = torch.autograd.grad(_torch_activation(act, xd), xd, grad_y.cpu().double())
    tol = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    torch.testing.assert_close(got.cpu().double(), want, rtol=tol, atol=tol * want.abs().max().item())


@pytest.mark.parametrize("act, at_inf, at_minus_inf", [("relu", 1.0, 0.0), ("gelu_tanh", 1.0, 0.0), ("silu", 1.0, 0.0)])
def test_activation_amax_gradient_at_infinities_and_nan(act, at_inf, at_minus_inf):
    """The derivative's limits at +-inf (no 0 * inf NaN from the overflowing terms); NaN stays NaN, except
    for relu, which passes a NaN's gradient on (derivative 1) as torch.relu does."""
    x = torch.tensor([math.inf, -math.inf, math.nan], requires_grad=True)
    y, _ = embscale.activation_amax(x, act)
    got, = torch.autograd.grad(y, x, torch.ones(3))
    assert got[:2].tolist() == [at_inf, at_minus_inf]
    if act == "relu":
        want, = torch.autograd.grad(torch.relu(x), x, torch.ones(3))
        assert got[2].item() == want[2].item() == 1.0
    else:
        assert math.isnan(got[2].item())


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_activation_amax_gradient_under_torch_compile(gen, backend):
    def f(x):
        y, amax = embscale.activation_amax(x, "gelu_tanh", torch.bfloat16)
        return (y.float() * 3).sum() + amax  # the amax takes part in the loss but passes no gradient

    x = torch.nn.Parameter(torch.randn(64, 32, generator=gen))
    torch._dynamo.reset()
    compiled_loss = torch.compile(f, backend=backend, fullgraph=True)(x)
    got, = torch.autograd.grad(compiled_loss, x)
    want, = torch.autograd.grad(f(x), x)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_activation_amax_out_refuses_an_input_that_requires_grad():
    """y written into a given tensor cannot carry act'(x): refused while grad mode is on (as torch's out=
    functions are), nothing written; under torch.no_grad() it runs."""
    x = torch.nn.Parameter(torch.randn(4, 4))
    y, a = torch.zeros(4, 4), torch.zeros(())
    with pytest.raises(RuntimeError, match="^out: activation_amax with out= does not support automatic"):
        embscale.activation_amax(x, "relu", out=(y, a))
    assert not y.any() and a.item() == 0.0
    with torch.no_grad():
        embscale.activation_amax(x, "relu", out=(y, a))
    assert torch.equal(y, torch.relu(x.detach()))


# ---- 3: a layer that appears several times -------------------------------------------------------------------
def test_conversion_converts_every_place_of_a_repeated_layer(gen):
    lin = torch.nn.Linear(16, 16)
    seen = []
    m = convert_to_float8_training(torch.nn.Sequential(lin, torch.nn.ReLU(), lin),
                                   module_filter_fn=lambda mod, fqn: seen.append(fqn) is None)
    assert [type(c) for c in m] == [Float8Linear, torch.nn.ReLU, Float8Linear]
    assert m[0] is m[2] and m[0].weight is lin.weight and m[0].bias is lin.bias
    assert seen == ["0"]  # one decision per layer, under its first name
    assert len(list(m.parameters())) == 2  # still shared: one weight, one bias

    m3 = convert_to_float8_training(torch.nn.Sequential(*[torch.nn.Linear(16, 16)] * 3))
    assert all(type(c) is Float8Linear for c in m3) and m3[0] is m3[1] is m3[2]
    x = torch.randn(4, 16, generator=gen)
    m3(x).sum().backward()  # the one weight gets the three uses' gradients
    assert m3[0].weight.grad is not None and torch.isfinite(m3[0].weight.grad).all()

    lst = convert_to_float8_training(torch.nn.ModuleList([lin, lin]))
    assert type(lst[1]) is Float8Linear and lst[0] is lst[1]


# ---- 4: non-finite values in Float8Linear --------------------------------------------------------------------
def _layer_and_input(device, gen):
    layer = Float8Linear(32, 16, bias=False).to(device)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(16, 32, generator=gen))
    return layer, torch.randn(16, 32, generator=gen).to(device)


def _cast(t, fp8):
    """The pipeline of the layer before the non-finite flags: amax -> scale -> cast + transpose."""
    scale, scale_inv = embscale.compute_scale(embscale.amax(t), fp8)
    y, yt = embscale.cast_transpose(t, scale, fp8)
    return y, yt, scale_inv


def test_nonfinite_input_makes_the_output_nan(device, gen):
    layer, x = _layer_and_input(device, gen)
    # Finite: bit for bit what the pipeline gave before.
    xc, _, xs = _cast(x, E4)
    wc, _, ws = _cast(layer.weight.detach(), E4)
    assert torch.equal(layer(x), _fp8_mm(xc, wc, xs, ws, torch.float32))
    for bad in (math.inf, -math.inf, math.nan):
        xb = x.clone()
        xb[3, 5] = bad
        assert layer(xb).isnan().all(), bad
    # and under torch.compile
    xb[3, 5] = math.inf
    torch._dynamo.reset()
    assert torch.compile(layer, backend="aot_eager", fullgraph=True)(xb).isnan().all()


def test_nonfinite_grad_out_makes_both_gradients_nan(device, gen):
    layer, x = _layer_and_input(device, gen)
    x.requires_grad_()
    g = torch.randn(16, 16, generator=gen).to(device)
    layer(x).backward(g)
    # Finite: bit for bit what the pipeline gave before.
    gc, gct, gs = _cast(g, E5)
    _, xct, xs = _cast(x.detach(), E4)
    _, wct, ws = _cast(layer.weight.detach(), E4)
    assert torch.equal(x.grad, _fp8_mm(gc, wct, gs, ws, torch.float32))
    assert torch.equal(layer.weight.grad, _fp8_mm(gct, xct, gs, xs, torch.float32))
    g[7, 2] = math.inf
    x.grad = layer.weight.grad = None
    layer(x).backward(g)
    assert x.grad.isnan().all() and layer.weight.grad.isnan().all()


@pytest.mark.parametrize("synced", [False, True])
def test_nonfinite_weight_makes_output_and_input_gradient_nan(device, gen, synced):
    layer, x = _layer_and_input(device, gen)
    x.requires_grad_()
    with torch.no_grad():
        layer.weight[2, 3] = math.nan  # amax alone skips a NaN
    if synced:
        sync_float8_weight_amax(torch.nn.Sequential(layer))
        assert layer.weight_amax.item() == math.inf
    out = layer(x)
    assert out.isnan().all()
    out.backward(torch.ones_like(out))
    assert x.grad.isnan().all()
    assert torch.isfinite(layer.weight.grad).all()  # grad_out and x are finite: as nn.Linear's


# ---- 5: out= and an explicit dtype ---------------------------------------------------------------------------
def test_quantize_dtype_against_out():
    x, s = torch.full((2, 2), 1000.0), torch.tensor(1.0)
    y4 = torch.zeros(2, 2, dtype=E4)
    with pytest.raises(ValueError, match="^out: y has dtype torch.float8_e4m3fn, but fp8_dtype is torch.float8_e5m2"):
        embscale.quantize(x, s, E5, out=y4)
    with pytest.raises(TypeError, match="^fp8_dtype: expected a torch.dtype, got str"):
        embscale.quantize(x, s, "garbage", out=y4)
    with pytest.raises(TypeError, match="^fp8_dtype: expected a torch.dtype, got str"):
        embscale.quantize(x, s, "garbage")
    assert not bits(y4).any(), "a refused call wrote"
    # Consistent calls keep working: out's dtype is the format when fp8_dtype is not given.
    y5 = torch.zeros(2, 2, dtype=E5)
    assert embscale.quantize(x, s, out=y5) is y5 and torch.equal(bits(y5), bits(embscale.quantize(x, s, E5)))
    assert embscale.quantize(x, s, E4, out=y4) is y4 and embscale.quantize(x, s).dtype == E4


def test_dequantize_dtype_against_out():
    y, s = torch.ones(2, 2).to(E4), torch.tensor(2.0)
    out = torch.zeros(2, 2)
    with pytest.raises(TypeError, match="^out_dtype: dtype int64 is not supported"):
        embscale.dequantize(y, s, torch.int64, out=out)
    with pytest.raises(ValueError, match="^out: x has dtype torch.float32, but out_dtype is torch.float16"):
        embscale.dequantize(y, s, torch.float16, out=out)
    assert not out.any()
    half = torch.zeros(2, 2, dtype=torch.float16)
    assert embscale.dequantize(y, s, out=half) is half and torch.equal(half, torch.full((2, 2), 2.0).half())
    assert embscale.dequantize(y, s).dtype == torch.float32 and embscale.dequantize(y, s, out=out) is out


def test_quantize_current_scaling_dtype_against_out():
    x = torch.full((2, 2), 1000.0)

    def outs(fp8):
        return (torch.zeros(2, 2, dtype=fp8), torch.zeros(()), torch.zeros(()), torch.zeros(()))

    o = outs(E4)
    with pytest.raises(ValueError, match="^out: y has dtype torch.float8_e4m3fn, but fp8_dtype is torch.float8_e5m2"):
        embscale.quantize_current_scaling(x, E5, out=o)
    assert not any(bits(t).any() for t in o)
    o5 = outs(E5)
    y, scale_inv = embscale.quantize_current_scaling(x, out=o5)
    want_y, want_si = embscale.quantize_current_scaling(x, E5)
    assert y is o5[0] and torch.equal(bits(y), bits(want_y)) and torch.equal(scale_inv, want_si)
    assert embscale.quantize_current_scaling(x)[0].dtype == E4


def test_cast_transpose_dtype_against_out():
    x, s = torch.randn(3, 5), torch.tensor(4.0)
    o = (torch.zeros(3, 5, dtype=E4), torch.zeros(5, 3, dtype=E4))
    with pytest.raises(ValueError, match="^out: y has dtype torch.float8_e4m3fn, but fp8_dtype is torch.float8_e5m2"):
        embscale.cast_transpose(x, s, E5, out=o)
    assert not any(bits(t).any() for t in o)
    o5 = (torch.zeros(3, 5, dtype=E5), torch.zeros(5, 3, dtype=E5))
    y, yt = embscale.cast_transpose(x, s, out=o5)
    assert y is o5[0] and torch.equal(bits(y), bits(embscale.cast_transpose(x, s, E5)[0]))


def test_activation_amax_out_dtype_is_checked_as_a_dtype():
    x = torch.randn(4)
    with pytest.raises(TypeError, match="^out_dtype: expected a torch.dtype, got str"):
        embscale.activation_amax(x, "relu", "float16", out=(torch.zeros(4), torch.zeros(())))
    with pytest.raises(TypeError, match="^out_dtype: expected a torch.dtype, got str"):
        embscale.activation_amax(x, "relu", "float16")


# ---- 6: errors naming the argument ---------------------------------------------------------------------------
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


@pytest.mark.parametrize("bad", ["1", None, True, False])
def test_float8_linear_eps_must_be_a_number(bad):
    with pytest.raises(TypeError, match=f"^eps: expected a real number, got {type(bad).__name__}"):
        Float8Linear(16, 16, eps=bad)
    with pytest.raises(TypeError, match=f"^eps: expected a real number, got {type(bad).__name__}"):
        convert_to_float8_training(torch.nn.Linear(3, 3), eps=bad)  # no layer qualifies: still checked


def test_convert_checks_eps_when_no_layer_qualifies():
    with pytest.raises(ValueError, match="^eps: -1 is not a number"):
        convert_to_float8_training(torch.nn.Sequential(torch.nn.ReLU()), eps=-1)
    with pytest.raises(ValueError, match="^eps: 10{400} is not a number"):  # too large for a float: no OverflowError
        Float8Linear(16, 16, eps=10 ** 400)
