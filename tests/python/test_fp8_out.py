"""The FP8 functions writing outputs the caller gives (``out=``, and the raw ``*_out`` operators): an output
that shares memory with an input (also a strided one, which the operator copies to a contiguous buffer before
the C library's own overlap check) or with another output is refused, naming both, before anything is
written; an explicit dtype that conflicts with out's is refused; a written buffer that requires grad, or an
inference tensor outside inference mode, is refused. (The no-op flag: test_fp8_noop.py.)"""
import pytest
import torch

import embscale
from test_fp8 import E4, E5, bits


# ---- an output that overlaps an argument ----------------------------------------------------------------------
def _cast_transpose_same_output(device):
    x = torch.arange(16.0, device=device).view(4, 4)
    buf = torch.zeros(4, 4, dtype=E4, device=device)
    return (lambda: torch.ops.embscale.cast_transpose_out(x, torch.ones(1, device=device), buf, buf, None),
            "y: overlaps yt", [buf])


def _scale_is_scale_inv(device):
    s = torch.full((1,), 5.0, device=device)
    return (lambda: torch.ops.embscale.compute_scale_out(torch.ones(1, device=device), s, s, E4, None),
            "scale: overlaps scale_inv", [s])


def _raw_amax_into_x(device):
    x = torch.arange(1.0, 9.0, device=device)
    return (lambda: torch.ops.embscale.amax_out(x, x[0:1], None, None), "amax: overlaps x", [x])


def _raw_quantize_into_x(device):
    x = torch.arange(1.0, 17.0, device=device)
    y = x.view(torch.uint8)[:16].view(E4)  # x's first 16 bytes as the fp8 output
    return (lambda: torch.ops.embscale.quantize_out(x, torch.ones(1, device=device), y, None), "y: overlaps x", [x])


@pytest.mark.parametrize("case", [_cast_transpose_same_output, _scale_is_scale_inv, _raw_amax_into_x,
                                  _raw_quantize_into_x])
def test_raw_out_operators_refuse_an_output_aliasing_an_argument(device, case):
    call, message, buffers = case(device)
    before = [b.clone() for b in buffers]
    with pytest.raises(ValueError, match=message):
        call()
    for b, was in zip(buffers, before):
        assert torch.equal(b.view(torch.uint8), was.view(torch.uint8)), f"{message}: a refused call wrote"


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


# ---- out= and an explicit dtype -------------------------------------------------------------------------------
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


# ---- written buffers: inference tensors, tensors that require grad --------------------------------------------
def test_an_inference_tensor_written_outside_inference_mode_is_refused():
    with torch.inference_mode():
        a = torch.zeros(1)
    with pytest.raises(RuntimeError, match="amax: an inference tensor cannot be updated in place"):
        torch.ops.embscale.amax_out(torch.randn(4, 8), a, None, None)
    assert a.item() == 0.0


def test_an_output_that_requires_grad_is_refused():
    a = torch.zeros(1, requires_grad=True)
    for grad_mode in (True, False):  # the operators run below autograd: they cannot tell the two apart
        with torch.set_grad_enabled(grad_mode), pytest.raises(RuntimeError, match="amax: requires grad"):
            torch.ops.embscale.amax_out(torch.randn(4, 8), a, None, None)
    assert a.item() == 0.0
    torch.ops.embscale.amax_out(torch.ones(4, 8), a.detach(), None, None)
    assert a.item() == 1.0
