"""TransformerEngine's no-op flag on the FP8 functions (``noop_flag=`` with ``out=``): with the flag at 1.0
the given outputs keep their pre-filled sentinels, with 0.0 (or any other value) they equal the references
written from the maths (test_fp8's), and bad flags or outputs raise naming the argument."""
import pytest
import torch

import embscale
from test_fp8 import assert_fp8_equal, ref_amax, ref_quantize, ref_scale

E4M3 = torch.float8_e4m3fn
SENTINEL = 12345.0
SENTINEL_CODE = 0x7F  # an e4m3 NaN: no quantize of finite inputs writes it


def flag(value, device):
    return torch.tensor([value], dtype=torch.float32, device=device)


def scalar_sentinel(device, dtype=torch.float32):
    return torch.full((), SENTINEL if dtype == torch.float32 else 7, dtype=dtype, device=device)


def codes_sentinel(shape, device):
    return torch.full(shape, SENTINEL_CODE, dtype=torch.uint8, device=device).view(E4M3)


def sample(gen, shape=(6, 9)):
    return (torch.randn(shape, generator=gen) * 40).to(torch.bfloat16)


@pytest.mark.parametrize("value", [1.0, 0.0, 2.0])
def test_amax(device, gen, value):
    x = sample(gen)
    a, nf = scalar_sentinel(device), scalar_sentinel(device, torch.int32)
    got = embscale.amax(x.to(device), return_nonfinite=True, out=(a, nf), noop_flag=flag(value, device))
    assert got[0] is a and got[1] is nf
    if value == 1.0:
        assert a.item() == SENTINEL and nf.item() == 7
    else:
        assert a.item() == ref_amax(x).item() and nf.item() == 0
    single = scalar_sentinel(device)
    assert embscale.amax(x.to(device), out=single, noop_flag=flag(value, device)) is single
    assert single.item() == (SENTINEL if value == 1.0 else ref_amax(x).item())


@pytest.mark.parametrize("value", [1.0, 0.0])
def test_compute_scale(device, value):
    amax = torch.tensor(3.75, device=device)
    scale, scale_inv = scalar_sentinel(device), scalar_sentinel(device)
    embscale.compute_scale(amax, E4M3, eps=1e-4, out=(scale, scale_inv), noop_flag=flag(value, device))
    want_s, want_si = ref_scale(torch.tensor(3.75), E4M3, eps=1e-4)
    assert scale.item() == (SENTINEL if value == 1.0 else want_s.item())
    assert scale_inv.item() == (SENTINEL if value == 1.0 else want_si.item())


@pytest.mark.parametrize("value", [1.0, 0.0])
def test_quantize_and_dequantize(device, gen, value):
    x = sample(gen)
    scale = torch.tensor(4.0)
    y = codes_sentinel(x.shape, device)
    embscale.quantize(x.to(device), scale.to(device), out=y, noop_flag=flag(value, device))
    want = ref_quantize(x, scale, E4M3)
    if value == 1.0:
        assert torch.all(y.cpu().view(torch.uint8) == SENTINEL_CODE)
    else:
        assert_fp8_equal(y, want)
    back = torch.full(x.shape, SENTINEL, device=device)
    embscale.dequantize(want.to(device), torch.tensor(0.25, device=device), out=back, noop_flag=flag(value, device))
    expect = torch.full(x.shape, SENTINEL) if value == 1.0 else want.float() * 0.25
    assert torch.equal(back.cpu(), expect)


@pytest.mark.parametrize("value", [1.0, 0.0])
def test_quantize_current_scaling(device, gen, value):
    x = sample(gen)
    y = codes_sentinel(x.shape, device)
    a, s, si = scalar_sentinel(device), scalar_sentinel(device), scalar_sentinel(device)
    nf = scalar_sentinel(device, torch.int32)
    got = embscale.quantize_current_scaling(x.to(device), return_amax=True, return_nonfinite=True,
                                            out=(y, a, s, si, nf), noop_flag=flag(value, device))
    assert got[0] is y and got[1] is si and got[2] is a and got[3] is nf
    if value == 1.0:
        assert torch.all(y.cpu().view(torch.uint8) == SENTINEL_CODE)
        assert (a.item(), s.item(), si.item(), nf.item()) == (SENTINEL, SENTINEL, SENTINEL, 7)
    else:
        want_s, want_si = ref_scale(ref_amax(x), E4M3)
        assert (a.item(), s.item(), si.item(), nf.item()) == (ref_amax(x).item(), want_s.item(), want_si.item(), 0)
        assert_fp8_equal(y, ref_quantize(x, want_s, E4M3))


@pytest.mark.parametrize("value", [1.0, 0.0])
def test_cast_transpose(device, gen, value):
    x = sample(gen)
    scale = torch.tensor(2.0)
    y, yt = codes_sentinel(x.shape, device), codes_sentinel(x.T.shape, device)
    embscale.cast_transpose(x.to(device), scale.to(device), out=(y, yt), noop_flag=flag(value, device))
    if value == 1.0:
        assert torch.all(y.cpu().view(torch.uint8) == SENTINEL_CODE)
        assert torch.all(yt.cpu().view(torch.uint8) == SENTINEL_CODE)
    else:
        want = ref_quantize(x, scale, E4M3)
        assert_fp8_equal(y, want)
        assert_fp8_equal(yt, want.T.contiguous())


@pytest.mark.parametrize("value", [1.0, 0.0])
@pytest.mark.parametrize("act", ["relu", "gelu_tanh", "silu"])
def test_activation_amax(device, gen, value, act):
    x = sample(gen).float()
    y = torch.full(x.shape, SENTINEL, device=device)
    a = scalar_sentinel(device)
    got = embscale.activation_amax(x.to(device), act, out=(y, a), noop_flag=flag(value, device))
    assert got[0] is y and got[1] is a
    if value == 1.0:
        assert torch.all(y.cpu() == SENTINEL) and a.item() == SENTINEL
    else:
        xd = x.double()
        want = {"relu": torch.relu(xd), "gelu_tanh": torch.nn.functional.gelu(xd, approximate="tanh"),
                "silu": torch.nn.functional.silu(xd)}[act]
        torch.testing.assert_close(y.cpu().double(), want, rtol=1e-5, atol=1e-5)
        assert a.item() == y.cpu().abs().max().item()  # max |y| of the values as stored


def test_activation_amax_out_in_another_dtype(gen):
    x = sample(gen)  # bf16 in, fp32 out
    y, a = torch.empty(x.shape), scalar_sentinel("cpu")
    embscale.activation_amax(x, "relu", out=(y, a))
    assert torch.equal(y, torch.relu(x.float())) and a.item() == y.max().item()
    with pytest.raises(ValueError, match="out: y has dtype torch.float32, but out_dtype is torch.bfloat16"):
        embscale.activation_amax(x, "relu", torch.bfloat16, out=(y, a))


def test_out_without_a_flag_writes_the_given_tensors(gen):
    x = sample(gen)
    y = codes_sentinel(x.shape, "cpu")
    assert embscale.quantize(x, torch.tensor(4.0), out=y) is y
    assert_fp8_equal(y, ref_quantize(x, torch.tensor(4.0), E4M3))


@pytest.mark.parametrize("bad, match", [
    (torch.tensor([1.0], dtype=torch.float64), "noop_flag: dtype float64"),
    (torch.tensor([1, 1], dtype=torch.float32), "noop_flag: has 2 elements"),
    (torch.tensor([1.0], device="meta"), "noop_flag: is on meta"),
])
def test_bad_flags_are_refused_naming_noop_flag(gen, bad, match):
    x = sample(gen)
    calls = [
        lambda: embscale.amax(x, out=scalar_sentinel("cpu"), noop_flag=bad),
        lambda: embscale.compute_scale(torch.tensor(1.0), out=(scalar_sentinel("cpu"), scalar_sentinel("cpu")),
                                       noop_flag=bad),
        lambda: embscale.quantize(x, torch.tensor(1.0), out=codes_sentinel(x.shape, "cpu"), noop_flag=bad),
        lambda: embscale.dequantize(codes_sentinel(x.shape, "cpu"), torch.tensor(1.0),
                                    out=torch.empty(x.shape), noop_flag=bad),
        lambda: embscale.quantize_current_scaling(
            x, out=(codes_sentinel(x.shape, "cpu"),) + tuple(scalar_sentinel("cpu") for _ in range(3)),
            noop_flag=bad),
        lambda: embscale.cast_transpose(x, torch.tensor(1.0), out=(codes_sentinel(x.shape, "cpu"),
                                                                   codes_sentinel(x.T.shape, "cpu")), noop_flag=bad),
        lambda: embscale.activation_amax(x, "silu", out=(torch.empty(x.shape), scalar_sentinel("cpu")),
                                         noop_flag=bad),
    ]
    for call in calls:
        with pytest.raises((TypeError, ValueError), match=match):
            call()


def test_bad_outputs_and_combinations_are_refused(gen):
    x = sample(gen)
    one = flag(1.0, "cpu")
    with pytest.raises(ValueError, match="noop_flag: needs out="):
        embscale.quantize(x, torch.tensor(1.0), noop_flag=one)
    with pytest.raises(ValueError, match=r"y: has shape \[9, 6\], expected \[6, 9\]"):
        embscale.quantize(x, torch.tensor(1.0), out=codes_sentinel((9, 6), "cpu"), noop_flag=one)
    with pytest.raises(TypeError, match="y: dtype float32"):
        embscale.quantize(x, torch.tensor(1.0), out=torch.empty(x.shape), noop_flag=one)
    with pytest.raises(ValueError, match="y: must be contiguous"):
        embscale.quantize(x, torch.tensor(1.0), out=codes_sentinel((9, 6), "cpu").T, noop_flag=one)
    with pytest.raises(ValueError, match=r"yt: has shape \[6, 9\]"):
        embscale.cast_transpose(x, torch.tensor(1.0), out=(codes_sentinel(x.shape, "cpu"),) * 2, noop_flag=one)
    with pytest.raises(ValueError, match=r"out: expected the tensors \(scale, scale_inv\)"):
        embscale.compute_scale(torch.tensor(1.0), out=scalar_sentinel("cpu"), noop_flag=one)
    with pytest.raises(ValueError, match=r"out: expected the tensors \(y\)"):
        embscale.quantize(x, torch.tensor(1.0), out=(codes_sentinel(x.shape, "cpu"),), noop_flag=one)
    with pytest.raises(ValueError, match=r"out: expected the tensors \(amax\)"):
        embscale.amax(x, out=[scalar_sentinel("cpu")], noop_flag=one)
    with pytest.raises(ValueError, match=r"y: has shape \[9, 6\], expected \[6, 9\]"):
        embscale.activation_amax(x, "relu", out=(torch.empty(9, 6), scalar_sentinel("cpu")), noop_flag=one)
    with pytest.raises(ValueError, match=r"out: expected the tensors \(y, amax\)"):
        embscale.activation_amax(x, "relu", out=torch.empty(x.shape), noop_flag=one)
    with pytest.raises(ValueError, match="activation"):
        embscale.activation_amax(x, "tanh", out=(torch.empty(x.shape), scalar_sentinel("cpu")), noop_flag=one)
    with pytest.raises(TypeError, match="nonfinite: dtype float32"):
        embscale.amax(x, return_nonfinite=True, out=(scalar_sentinel("cpu"), scalar_sentinel("cpu")), noop_flag=one)


def test_out_variants_compile(gen):
    x = sample(gen)

    @torch.compile(backend="aot_eager", fullgraph=True)
    def step(x, y, a, s, si, noop):
        embscale.quantize_current_scaling(x, out=(y, a, s, si), noop_flag=noop)
        return y.view(torch.uint8).sum()

    y = codes_sentinel(x.shape, "cpu")
    a, s, si = (scalar_sentinel("cpu") for _ in range(3))
    step(x, y, a, s, si, flag(1.0, "cpu"))
    assert a.item() == SENTINEL and torch.all(y.view(torch.uint8) == SENTINEL_CODE)
    step(x, y, a, s, si, flag(0.0, "cpu"))
    assert a.item() == ref_amax(x).item()
