"""FP8 training (embscale.fp8.convert_to_float8_training): the layer against a reference written from the
maths, the conversion (a layer that appears several times included), checkpoints, torch.compile, the
non-finite flag and non-finite values (an inf or NaN in the input, the weight or the gradient makes what it
reaches NaN), the distributed amax and a comparison with torchao's float8 training on a small transformer
block."""
import argparse
import copy
import pickle
import importlib.util
import math
import os
import pathlib

import pytest
import torch

import embscale
from embscale.fp8 import Float8Linear, convert_to_float8_training, default_module_filter, sync_float8_weight_amax
from embscale.fp8_training import _fp8_mm

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "fp8_training.py"
E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


# ---- the reference, from the maths ------------------------------------------------------------------------
def ref_cast(v, fp8_dtype):
    """(fp8 values as fp32, scale_inv) with tensorwise current scaling: scale = fp8_max / max|v| in fp32,
    codes = fp8(clamp(v * scale, +-fp8_max)) rounded to nearest even, scale_inv = 1 / scale in fp32."""
    v = v.float()
    scale = torch.tensor(FP8_MAX[fp8_dtype], dtype=torch.float32) / v.abs().max()
    codes = (v * scale).clamp(-FP8_MAX[fp8_dtype], FP8_MAX[fp8_dtype]).to(fp8_dtype)
    return codes.float(), 1.0 / scale


def ref_mm(a, a_dtype, b, b_dtype, out_dtype):
    """a @ b with each operand rounded to fp8 by ref_cast, the products summed in fp32, scaled once."""
    qa, sa = ref_cast(a, a_dtype)
    qb, sb = ref_cast(b, b_dtype)
    return ((qa @ qb) * (sa * sb)).to(out_dtype)


def assert_matches(got, want, device):
    """Both sides sum the same exact fp32 products. On the CPU only the summation order differs: fp32 agrees
    to a few ulp of the largest value. Hopper's fp8 tensor cores keep fewer accumulator bits than fp32
    between promotions (about 14 significant bits), so on CUDA fp32 agrees to 2^-10 of the largest value.
    bf16 agrees to one rounding."""
    assert got.dtype == want.dtype
    if got.dtype == torch.float32:
        tol = 1e-5 if device.type == "cpu" else 2**-10
        torch.testing.assert_close(got, want, rtol=tol, atol=tol * want.abs().max().item())
    else:
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=2**-7 * want.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_matches_reference_forward_and_gradients(device, gen, dtype, bias):
    lin = torch.nn.Linear(32, 48, bias=bias)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(48, 32, generator=gen))
        if bias:
            lin.bias.copy_(torch.randn(48, generator=gen))
    lin = lin.to(device=device, dtype=dtype)
    layer = Float8Linear.from_linear(lin)
    x = torch.randn(4, 12, 32, generator=gen).to(device=device, dtype=dtype).requires_grad_()
    g = torch.randn(4, 12, 48, generator=gen).to(device=device, dtype=dtype)
    out = layer(x)
    out.backward(g)

    x2, g2, w = x.detach().reshape(48, 32).cpu(), g.reshape(48, 48).cpu(), lin.weight.detach().cpu()
    e4m3, e5m2 = torch.float8_e4m3fn, torch.float8_e5m2
    want_out = ref_mm(x2, e4m3, w.t(), e4m3, dtype)
    if bias:
        want_out = want_out + lin.bias.detach().cpu()
    assert_matches(out.detach().cpu().reshape(48, 48), want_out, device)
    assert_matches(x.grad.cpu().reshape(48, 32), ref_mm(g2, e5m2, w, e4m3, dtype), device)
    assert_matches(lin.weight.grad.cpu(), ref_mm(g2.t(), e5m2, x2, e4m3, dtype), device)
    if bias:
        torch.testing.assert_close(lin.bias.grad.cpu(), g2.sum(0))
    # The fp8 rounding is really there: the high-precision product differs by far more than the tolerance.
    assert (out.detach().cpu().reshape(48, 48).float() - (x2.float() @ w.float().t() + (
        lin.bias.detach().cpu().float() if bias else 0))).abs().max() > 1e-3


def test_layer_without_input_gradient_and_frozen_weight(gen):
    layer = Float8Linear(16, 16)
    x = torch.randn(8, 16, generator=gen)
    layer(x).sum().backward()  # x needs no gradient
    assert layer.weight.grad is not None
    layer.weight.requires_grad_(False)
    layer.weight.grad = None
    xg = x.clone().requires_grad_()
    layer(xg).sum().backward()
    assert layer.weight.grad is None and xg.grad is not None


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = torch.nn.Linear(32, 64)                 # converted
        self.body = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(),  # body.0 converted
                                        torch.nn.Linear(64, 16))                   # body.2 converted
        self.attn = torch.nn.MultiheadAttention(16, 2)     # in_proj is a raw weight; out_proj a subclass: kept
        self.head = torch.nn.Linear(16, 10)                # 10 is not a multiple of 16: kept

    def forward(self, x):
        h = self.body(torch.relu(self.inp(x)))
        a, _ = self.attn(h, h, h, need_weights=False)
        return self.head(h + a)


def test_conversion_swaps_exactly_the_eligible_linears():
    net = Net()
    params = dict(net.named_parameters())
    assert convert_to_float8_training(net) is net
    converted = {name for name, m in net.named_modules() if isinstance(m, Float8Linear)}
    assert converted == {"inp", "body.0", "body.2"}
    assert type(net.attn.out_proj) is not Float8Linear and type(net.head) is torch.nn.Linear
    # The parameters are the same objects under the same names: optimizers and checkpoints are unaffected.
    assert {n: id(p) for n, p in net.named_parameters()} == {n: id(p) for n, p in params.items()}

    net = convert_to_float8_training(Net(), module_filter_fn=lambda m, fqn: fqn != "body.0")
    assert {n for n, m in net.named_modules() if isinstance(m, Float8Linear)} == {"inp", "body.2", "head"}
    assert type(convert_to_float8_training(torch.nn.Linear(16, 32))) is Float8Linear


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


def test_conversion_and_layer_errors_name_the_argument():
    with pytest.raises(TypeError, match="model"):
        convert_to_float8_training(object())
    with pytest.raises(TypeError, match="module_filter_fn"):
        convert_to_float8_training(Net(), module_filter_fn=3)
    with pytest.raises(ValueError, match="eps"):
        Float8Linear(16, 16, eps=-1.0)
    with pytest.raises(ValueError, match="input: last dimension is 8"):
        Float8Linear(16, 16)(torch.randn(4, 8))
    with pytest.raises(TypeError, match="^input: dtype torch.int64 is not supported by Float8Linear"):
        Float8Linear(16, 16)(torch.ones(4, 16, dtype=torch.int64))
    with pytest.raises(ValueError, match="group"):
        sync_float8_weight_amax(convert_to_float8_training(Net()), group=object())


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


def test_a_float64_layer_names_its_input_or_weight():
    # The error used to name "x", an internal argument of the amax operator.
    model = convert_to_float8_training(Net().double())
    with pytest.raises(TypeError, match=r"^input: dtype torch.float64 is not supported by Float8Linear; expected "
                                        r"torch.float32, float16 or bfloat16"):
        model(torch.randn(4, 32, dtype=torch.float64))
    layer = Float8Linear(16, 16, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"^weight: dtype torch.float64 is not supported by Float8Linear"):
        layer(torch.randn(4, 16))
    with pytest.raises(TypeError, match=r"^input: dtype torch.float64"):
        Float8Linear(0, 16)(torch.randn(4, 0, dtype=torch.float64))  # (no GEMM to run, refused all the same)


def test_replaced_weight_after_sync_raises_and_edge_layers():
    """A weight replaced after sync_float8_weight_amax (by a load with assign=True, or through .data) whose
    version counter happens to match must still be caught; eps beyond
    what the GEMMs' fp32 scale product holds, 0-d inputs and layers of no input features are refused or
    handled as nn.Linear does."""
    m = torch.nn.Sequential(torch.nn.Linear(16, 16))
    convert_to_float8_training(m)
    sync_float8_weight_amax(m)
    sd = {k: v.clone().mul_(100) for k, v in m.state_dict().items()}  # version 1, as the synced weight's
    m.load_state_dict(sd, assign=True)
    with pytest.raises(RuntimeError, match="weight_amax: the weight changed"):
        m(torch.randn(4, 16))
    sync_float8_weight_amax(m)
    m(torch.randn(4, 16))  # synced again: runs
    m[0].weight.data = m[0].weight.data * 2
    with pytest.raises(RuntimeError, match="weight_amax: the weight changed"):
        m(torch.randn(4, 16))
    sync_float8_weight_amax(m)
    again = pickle.loads(pickle.dumps(m))  # a copy scales locally until its own sync
    assert again[0].weight_amax is None
    x = torch.randn(4, 16)
    assert torch.equal(again(x), m(x))

    with pytest.raises(ValueError, match=r"eps: 1e\+22 is not a number in \[0, 1e\+18\]"):
        Float8Linear(16, 16, eps=1e22)
    assert not Float8Linear(16, 16, bias=False, eps=1e18)(torch.randn(2, 16)).isnan().any()
    with pytest.raises(ValueError, match="input: a 0-d tensor"):
        Float8Linear(16, 16)(torch.tensor(1.0))
    assert not default_module_filter(torch.nn.Linear(0, 16), "l")
    empty = Float8Linear(0, 16)
    assert torch.equal(empty(torch.randn(3, 0)), empty.bias.expand(3, 16))


def test_a_new_parameter_over_the_synced_weights_memory_is_another_weight():
    # A new Parameter at the synced weight's address, with its shape and version (here a detached view:
    # same storage, same version counter; after a free, the allocator can give a new weight the same
    # address) is another weight: its amax was never synced, whatever its values.
    from embscale import fp8_training

    old = torch.nn.Parameter(torch.ones(16, 16))
    recorded = fp8_training._weight_identity(old)
    new = torch.nn.Parameter(old.detach())
    assert (new.data_ptr(), tuple(new.shape), new._version) == recorded[1:]
    assert fp8_training._same_weight(recorded, old)
    assert not fp8_training._same_weight(recorded, new)


def test_state_dict_round_trip(gen):
    torch.manual_seed(gen.initial_seed())
    plain = Net()
    fp8 = convert_to_float8_training(copy.deepcopy(plain))
    assert list(fp8.state_dict()) == list(plain.state_dict())
    restored = convert_to_float8_training(Net())
    restored.load_state_dict(fp8.state_dict())
    back = Net()
    back.load_state_dict(fp8.state_dict())
    x = torch.randn(5, 32, generator=gen)
    assert torch.equal(restored(x), fp8(x))
    assert torch.equal(back(x), plain(x))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_model_matches_eager(device, gen, backend):
    torch.manual_seed(gen.initial_seed())
    model = convert_to_float8_training(torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32))).to(device)
    compiled_model = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = torch.compile(compiled_model, backend=backend, fullgraph=True)
    x = torch.randn(3, 16, 32, generator=gen).to(device)
    for m in (model, compiled):
        m(x).square().mean().backward()
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-6, atol=1e-6)
    for (name, p), q in zip(model.named_parameters(), compiled_model.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-6, atol=1e-6, msg=name)


# ---- the non-finite flag ------------------------------------------------------------------------------------
@pytest.mark.parametrize("values, want_amax, want_flag", [
    ([1.0, float("nan")], 1.0, 1), ([1.0, float("-inf")], float("inf"), 1), ([1.0, -2.0], 2.0, 0), ([], 0.0, 0)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nonfinite_flag(device, values, want_amax, want_flag, dtype):
    x = torch.tensor(values, dtype=dtype, device=device)
    assert embscale.amax(x).item() == want_amax  # the amax alone cannot tell [1, nan] from [1]
    a, flag = embscale.amax(x, return_nonfinite=True)
    assert (a.item(), flag.item(), flag.dtype, flag.device) == (want_amax, want_flag, torch.int32, x.device)
    y, scale_inv, a2, flag2 = embscale.quantize_current_scaling(x, return_amax=True, return_nonfinite=True)
    assert (a2.item(), flag2.item()) == (want_amax, want_flag)
    y_fused, scale_inv_fused = embscale.quantize_current_scaling(x)
    assert torch.equal(y.view(torch.uint8), y_fused.view(torch.uint8)) and torch.equal(scale_inv, scale_inv_fused)


def test_nonfinite_flag_under_torch_compile():
    def f(x):
        return embscale.amax(x, return_nonfinite=True)

    torch._dynamo.reset()
    a, flag = torch.compile(f, fullgraph=True, backend="aot_eager")(torch.tensor([1.0, float("nan"), -3.0]))
    assert (a.item(), flag.item()) == (3.0, 1)


# ---- non-finite values in Float8Linear ------------------------------------------------------------------------
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


# ---- distributed: one batched collective per step ------------------------------------------------------------
def _distributed_worker(rank, world, init_file, out_dir):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    calls = []
    real_all_reduce = dist.all_reduce

    def counting_all_reduce(tensor, *args, **kwargs):
        calls.append(tuple(tensor.shape))
        return real_all_reduce(tensor, *args, **kwargs)

    dist.all_reduce = counting_all_reduce
    try:
        torch.manual_seed(0)
        model = convert_to_float8_training(Net())  # three Float8Linear layers
        with torch.no_grad():  # rank r's weights are (r + 1) times rank 0's, like different shards would be
            for p in model.parameters():
                p.mul_(rank + 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(6, 32)
        steps = 3
        results = []
        for _ in range(steps):
            assert sync_float8_weight_amax(model) == 3
            results.append([m.weight_amax.item() for m in embscale.fp8.float8_linears(model)])
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
        stale = False
        try:
            model(x)
        except RuntimeError as e:
            stale = "weight_amax" in str(e)
        local_flag = torch.tensor([1.0, float("nan") if rank == 1 else 0.0])
        a, flag = embscale.amax(local_flag, group=dist.group.WORLD, return_nonfinite=True)
        torch.save({"amax": results, "calls": calls, "steps": steps, "stale_detected": stale,
                    "group_amax": a.item(), "group_flag": flag.item()},
                   os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()  # no process tears its connections down while another still uses them
    finally:
        dist.all_reduce = real_all_reduce
        dist.destroy_process_group()


def test_weight_amax_is_all_reduced_in_one_collective_per_step(tmp_path):
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    mp.spawn(_distributed_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    # Per step one all-reduce carrying the three layers' amax, then one for amax(..., group) with its flag.
    for r in (r0, r1):
        assert r["calls"] == [(3,)] * r["steps"] + [(2,)]
        assert r["stale_detected"]
        assert (r["group_amax"], r["group_flag"]) == (1.0, 1)  # only rank 1 saw the NaN
    # Both ranks use the global max, which is rank 1's (its weights are twice rank 0's at the first step).
    assert r0["amax"] == r1["amax"]
    assert r0["amax"][0] == pytest.approx([2 * v for v in _initial_weight_amax()], rel=1e-6)


def _initial_weight_amax():
    torch.manual_seed(0)
    model = convert_to_float8_training(Net())
    return [m.weight.abs().max().item() for m in embscale.fp8.float8_linears(model)]


# ---- torchao --------------------------------------------------------------------------------------------
def _example():
    spec = importlib.util.spec_from_file_location("fp8_training_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_matches_torchao_on_a_transformer_block(gen):
    example = _example()
    convert, why_not = example.torchao_convert()
    if convert is None:
        pytest.skip(f"torchao cannot be imported: {why_not}")
    torch.manual_seed(gen.initial_seed())
    block = example.TransformerBlock(64, 4)
    ours, theirs = convert_to_float8_training(copy.deepcopy(block)), convert(copy.deepcopy(block))
    x = torch.randn(2, 16, 64, generator=gen)
    xo, xt = x.clone().requires_grad_(), x.clone().requires_grad_()
    yo, yt = ours(xo), theirs(xt)
    g = torch.randn(yo.shape, generator=gen)
    yo.backward(g)
    yt.backward(g)
    # Same recipe, same rounding of every fp8 operand: only the fp32 summation order may differ.
    torch.testing.assert_close(yo, yt, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xo.grad, xt.grad, rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_training_curve_matches_torchao(tmp_path):
    example = _example()
    if example.torchao_convert()[0] is None:
        pytest.skip(f"torchao cannot be imported: {example.torchao_convert()[1]}")
    args = argparse.Namespace(device="cpu", dtype="bf16", steps=20, batch=2, seq=16, dim=64, heads=4, lr=1e-3, seed=3,
                              log_every=10, compile=False)
    result = example.run(args)
    losses = result["losses"]
    assert losses["embscale fp8"][-1] < 0.8 * losses["embscale fp8"][0]  # it trains
    # Within bf16 noise of torchao's curve at every step.
    assert result["max_relative_difference_embscale_vs_torchao"] < 2**-7, losses
    example.write(result, str(tmp_path))
    assert (tmp_path / "loss_curves.json").exists()
