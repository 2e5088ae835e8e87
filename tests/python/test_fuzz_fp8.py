"""Property-based fuzz tests (hypothesis) of the FP8 raw operators torch.ops.embscale.*, on the CPU.

Valid inputs drawn at random are compared with test_fp8's FP8 references; hostile inputs (wrong dtypes,
devices, lengths, values) must raise the documented exception type (TypeError for a dtype, ValueError for a
shape, device or value) with a message naming the argument, and leave the inputs bit for bit as they were.
The profile, crash isolation and shared checks are in fuzz_support.py.
"""
import math

import torch

# fuzz_support skips this file when hypothesis is not installed, so it is imported first.
from fuzz_support import (EXAMPLES, SEED, PROFILE, FLOATS, FP8S, OPS, crumb, isolated, bits, same_bits, expect_error,
                          float_inputs)
from hypothesis import given
from hypothesis import strategies as st

from test_fp8 import assert_fp8_equal, ref_amax, ref_quantize, ref_scale


def test_profile_is_reported():
    print(f"hypothesis profile: {'seed ' + SEED if SEED else 'derandomized'}, {EXAMPLES} examples per test, "
          "no deadline, no database")


# ---- FP8: valid inputs against the references -----------------------------------------------------------
@isolated
@PROFILE
@given(x=float_inputs(), algo=st.sampled_from(["auto", "atomic", "two_stage"]))
def test_amax_matches_reference(x, algo):
    crumb(f"amax(x={x.dtype} {tuple(x.shape)}, algo={algo!r})")
    before = bits(x)
    got = OPS.amax(x, algo)
    assert got.dtype == torch.float32 and got.dim() == 0
    assert got.item() == ref_amax(x).item() or (math.isnan(got.item()) and math.isnan(ref_amax(x).item()))
    assert same_bits(bits(x), before), "x was written"


@isolated
@PROFILE
@given(amax=st.floats(width=32), fp8=st.sampled_from(FP8S), eps=st.floats(0, 1e6, width=32),
       power_of_2=st.booleans())
def test_compute_scale_matches_reference(amax, fp8, eps, power_of_2):
    crumb(f"compute_scale(amax={amax!r}, {fp8}, eps={eps!r}, power_of_2={power_of_2})")
    s, si = OPS.compute_scale(torch.tensor(amax, dtype=torch.float32), fp8, eps, power_of_2)
    ws, wsi = ref_scale(amax, fp8, eps, power_of_2)
    assert s.item() == ws.item() and si.item() == wsi.item(), (s.item(), ws.item(), si.item(), wsi.item())


@isolated
@PROFILE
@given(x=float_inputs(), fp8=st.sampled_from(FP8S), scale=st.floats(1e-3, 1e3),
       out_dtype=st.sampled_from(FLOATS))
def test_quantize_dequantize_match_reference(x, fp8, scale, out_dtype):
    crumb(f"quantize/dequantize(x={x.dtype} {tuple(x.shape)}, {fp8}, scale={scale!r}, out={out_dtype})")
    s = torch.tensor(scale, dtype=torch.float32)
    before = bits(x)
    y = OPS.quantize(x, s, fp8)
    assert y.dtype == fp8 and y.shape == x.shape
    assert_fp8_equal(y, ref_quantize(x, s, fp8))
    inv = 1 / s
    back = OPS.dequantize(y, inv, out_dtype)
    want = (y.float() * inv).to(out_dtype)
    assert torch.equal(torch.isnan(back), torch.isnan(want))
    assert torch.equal(back[~torch.isnan(want)], want[~torch.isnan(want)])
    assert same_bits(bits(x), before), "x was written"


@isolated
@PROFILE
@given(x=float_inputs(), fp8=st.sampled_from(FP8S), eps=st.sampled_from([0.0, 1e-6, 1.0, 1e3]),
       power_of_2=st.booleans())
def test_quantize_current_scaling_matches_reference(x, fp8, eps, power_of_2):
    crumb(f"quantize_current_scaling(x={x.dtype} {tuple(x.shape)}, {fp8}, eps={eps}, power_of_2={power_of_2})")
    y, amax, scale, scale_inv = OPS.quantize_current_scaling(x, fp8, eps, power_of_2)
    want_amax = ref_amax(x)
    want_scale, want_inv = ref_scale(want_amax, fp8, eps, power_of_2)
    assert amax.item() == want_amax.item()
    assert scale.item() == want_scale.item() and scale_inv.item() == want_inv.item()
    assert_fp8_equal(y, ref_quantize(x, want_scale, fp8))


@isolated
@PROFILE
@given(x=float_inputs(), act=st.sampled_from(["relu", "gelu_tanh", "silu"]),
       out_dtype=st.sampled_from([None] + FLOATS))
def test_activation_amax_is_consistent(x, act, out_dtype):
    crumb(f"activation_amax(x={x.dtype} {tuple(x.shape)}, {act!r}, out_dtype={out_dtype})")
    y, amax = OPS.activation_amax(x, act, out_dtype)
    assert y.shape == x.shape and y.dtype == (x.dtype if out_dtype is None else out_dtype)
    # amax is max |y| over the values as stored in y (NaN skipped)
    assert amax.item() == ref_amax(y).item()
    finite = torch.isfinite(x.double()) & (x.double().abs() < 30)
    xf = x.double()
    want = {"relu": torch.relu(xf), "gelu_tanh": torch.nn.functional.gelu(xf, approximate="tanh"),
            "silu": torch.nn.functional.silu(xf)}[act].to(y.dtype).double()
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[y.dtype]
    torch.testing.assert_close(y.double()[finite], want[finite], rtol=tol, atol=tol)


@isolated
@PROFILE
@given(x=float_inputs(ndim=2), fp8=st.sampled_from(FP8S), scale=st.floats(1e-3, 1e3))
def test_cast_transpose_matches_quantize(x, fp8, scale):
    crumb(f"cast_transpose(x={x.dtype} {tuple(x.shape)}, scale={scale!r}, {fp8})")
    s = torch.tensor(scale, dtype=torch.float32)
    y, yt = OPS.cast_transpose(x, s, fp8)
    want = ref_quantize(x, s, fp8)
    assert y.shape == x.shape and yt.shape == (x.shape[1], x.shape[0]) and yt.is_contiguous()
    assert_fp8_equal(y, want)
    assert_fp8_equal(yt, want.t().contiguous())


# ---- FP8: hostile inputs --------------------------------------------------------------------------------
BAD_FLOAT_DTYPES = [torch.int32, torch.int64, torch.float64, torch.bool, torch.uint8, torch.complex64,
                    torch.float8_e4m3fn]


def _tensor_of(dtype, shape=(5,)):
    if dtype.is_complex:
        return torch.zeros(shape, dtype=dtype)
    return torch.zeros(shape, dtype=torch.float32).to(dtype)


@st.composite
def fp8_hostile(draw):
    """(description, callable, expected exception, names the message may use, tensors that must not change)."""
    x = draw(float_inputs(max_numel=64, ndim=2))
    s = torch.tensor(2.0)
    kind = draw(st.sampled_from([
        "x_dtype", "fp8_dtype", "scale_dtype", "scale_numel", "scale_meta", "algo", "activation", "out_dtype",
        "ct_ndim", "eps", "amax_dtype", "amax_numel", "y_dtype", "x_meta_scale_cpu", "dequant_out"]))
    op = draw(st.sampled_from(["quantize", "cast_transpose", "amax", "qcs", "activation_amax", "dequantize",
                               "compute_scale"]))
    bad_dt = draw(st.sampled_from(BAD_FLOAT_DTYPES))
    fp8 = draw(st.sampled_from(FP8S))
    if kind == "x_dtype":
        xb = _tensor_of(bad_dt, (3, 4))
        calls = {"quantize": (lambda: OPS.quantize(xb, s, fp8)), "cast_transpose": (lambda: OPS.cast_transpose(xb, s, fp8)),
                 "amax": (lambda: OPS.amax(xb)), "qcs": (lambda: OPS.quantize_current_scaling(xb, fp8)),
                 "activation_amax": (lambda: OPS.activation_amax(xb, "relu"))}
        op = op if op in calls else "amax"
        return f"{op}(x of {bad_dt})", calls[op], TypeError, ("x",), [xb]
    if kind == "fp8_dtype":
        bad = draw(st.sampled_from([torch.float32, torch.float16, torch.int8, torch.uint8, torch.float64]))
        calls = {"quantize": (lambda: OPS.quantize(x, s, bad)), "cast_transpose": (lambda: OPS.cast_transpose(x, s, bad)),
                 "qcs": (lambda: OPS.quantize_current_scaling(x, bad)),
                 "compute_scale": (lambda: OPS.compute_scale(torch.tensor(1.0), bad))}
        op = op if op in calls else "quantize"
        return f"{op}(fp8_dtype={bad})", calls[op], TypeError, ("fp8_dtype",), [x]
    if kind in ("scale_dtype", "scale_numel", "scale_meta"):
        if kind == "scale_dtype":
            sb, exc = torch.tensor(2.0, dtype=draw(st.sampled_from([torch.float64, torch.float16, torch.int32]))), TypeError
        elif kind == "scale_numel":
            sb, exc = torch.ones(draw(st.sampled_from([0, 2, 7]))), ValueError
        else:
            sb, exc = torch.ones((), device="meta"), ValueError
        name = "scale_inv" if op == "dequantize" else "scale"
        y8 = torch.zeros(3, dtype=fp8)
        calls = {"quantize": (lambda: OPS.quantize(x, sb, fp8)), "cast_transpose": (lambda: OPS.cast_transpose(x, sb, fp8)),
                 "dequantize": (lambda: OPS.dequantize(y8, sb, torch.float32))}
        op = op if op in calls else "quantize"
        name = "scale_inv" if op == "dequantize" else "scale"
        return f"{op}({kind}: {sb.dtype} {tuple(sb.shape)} on {sb.device})", calls[op], exc, (name,), [x, sb]
    if kind == "algo":
        a = draw(st.sampled_from(["", "AUTO", "fast", "atomic ", "two-stage"]))
        calls = {"amax": (lambda: OPS.amax(x, a)), "qcs": (lambda: OPS.quantize_current_scaling(x, fp8, 0.0, False, a)),
                 "activation_amax": (lambda: OPS.activation_amax(x, "relu", None, a))}
        op = op if op in calls else "amax"
        return f"{op}(algo={a!r})", calls[op], ValueError, ("algo",), [x]
    if kind == "activation":
        a = draw(st.sampled_from(["", "gelu", "RELU", "tanh", "silu "]))
        return f"activation_amax(activation={a!r})", (lambda: OPS.activation_amax(x, a)), ValueError, ("activation",), [x]
    if kind == "out_dtype":
        return (f"activation_amax(out_dtype={bad_dt})", (lambda: OPS.activation_amax(x, "relu", bad_dt)), TypeError,
                ("out_dtype",), [x])
    if kind == "dequant_out":
        y8 = torch.zeros(4, dtype=fp8)
        return f"dequantize(out_dtype={bad_dt})", (lambda: OPS.dequantize(y8, s, bad_dt)), TypeError, ("out_dtype",), [y8]
    if kind == "ct_ndim":
        xb = x.reshape(-1) if draw(st.booleans()) else x.reshape(1, 1, *x.shape)
        return f"cast_transpose(x of {xb.dim()} dims)", (lambda: OPS.cast_transpose(xb, s, fp8)), ValueError, ("x",), [xb]
    if kind == "eps":
        e = draw(st.sampled_from([-1.0, -1e-30, math.nan, math.inf, -math.inf]))
        calls = {"qcs": (lambda: OPS.quantize_current_scaling(x, fp8, e)),
                 "compute_scale": (lambda: OPS.compute_scale(torch.tensor(1.0), fp8, e))}
        op = op if op in calls else "qcs"
        return f"{op}(eps={e})", calls[op], ValueError, ("eps",), [x]
    if kind == "amax_dtype":
        a = torch.tensor(1.0, dtype=draw(st.sampled_from([torch.float64, torch.float16, torch.int32])))
        return f"compute_scale(amax {a.dtype})", (lambda: OPS.compute_scale(a, fp8)), TypeError, ("amax",), [a]
    if kind == "amax_numel":
        a = torch.ones(draw(st.sampled_from([0, 2, 3])))
        return f"compute_scale(amax of {a.numel()})", (lambda: OPS.compute_scale(a, fp8)), ValueError, ("amax",), [a]
    if kind == "y_dtype":
        yb = _tensor_of(draw(st.sampled_from([torch.float32, torch.int8, torch.uint8, torch.float16])), (4,))
        return f"dequantize(y of {yb.dtype})", (lambda: OPS.dequantize(yb, s, torch.float32)), TypeError, ("y",), [yb]
    # x on meta, scale on the CPU: a mix of devices is refused, not run as meta
    xm = x.to("meta")
    return "quantize(x on meta, scale on cpu)", (lambda: OPS.quantize(xm, s, fp8)), ValueError, ("scale", "x"), [s]


@isolated
@PROFILE
@given(case=fp8_hostile())
def test_fp8_hostile_inputs_raise_documented_errors(case):
    what, call, exc, names, keep = case
    crumb(f"fp8 hostile: {what}")
    before = [bits(t) for t in keep]
    expect_error(exc, names, call)
    for t, b in zip(keep, before):
        assert same_bits(bits(t), b), f"{what}: an input was written"
