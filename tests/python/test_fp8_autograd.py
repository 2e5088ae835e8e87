"""Gradients of the FP8 functions: amax values, non-finite flags, scales, fp8 codes and dequantized values
are not differentiable (as TransformerEngine's casts are not), in eager mode and under torch.compile with an
nn.Parameter input; activation_amax's y = act(x) is, with the gradient torch's autograd gives for the same
activation (also at infinities and NaN, and compiled); out= refuses an input that requires grad while grad
mode is on."""
import math

import pytest
import torch

import embscale
from test_fp8 import E4, E5, FLOATS, bits


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
