"""torch.compile traces the operators (fake implementations) and a compiled model trains like eager."""
import copy

import pytest
import torch

import embscale
import tbe_reference as ref


def fp8_step(x, w):
    y, sx = embscale.quantize_current_scaling(x)
    xq = embscale.dequantize(y, sx, torch.float32)
    h, amax = embscale.activation_amax(xq @ w, "gelu_tanh")
    s, si = embscale.compute_scale(amax)
    return embscale.quantize(h, s), si, embscale.amax(h)


def test_compiled_fp8_ops_match_eager(device, gen):
    x = torch.randn(32, 64, generator=gen).to(device)
    w = torch.randn(64, 16, generator=gen).to(device)
    torch._dynamo.reset()
    compiled = torch.compile(fp8_step, fullgraph=True, backend="aot_eager")
    for got, want in zip(compiled(x, w), fp8_step(x, w)):
        assert torch.equal(got.view(torch.uint8) if got.dtype == torch.float8_e4m3fn else got,
                           want.view(torch.uint8) if want.dtype == torch.float8_e4m3fn else want)


def test_fake_outputs_are_laid_out_as_the_real_ones(device, gen):
    """Every FP8 operator returns contiguous outputs whatever its input's strides; the fake implementations
    must say the same, or a compiled graph that views an output (or inductor's stride asserts) fails
    where eager runs (a transposed input, as Float8Linear's weight gradient passes)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    x = torch.randn(8, 6, generator=gen).to(device).t()  # [6, 8], strides (1, 6)
    s = torch.tensor(2.0, device=device)
    e4 = torch.float8_e4m3fn
    calls = [lambda x, s: [torch.ops.embscale.quantize(x, s, e4)],
             lambda x, s: list(torch.ops.embscale.quantize_current_scaling(x, e4)),
             lambda x, s: list(torch.ops.embscale.activation_amax(x, "relu")),
             lambda x, s: list(torch.ops.embscale.cast_transpose(x, s, e4)),
             lambda x, s: [torch.ops.embscale.dequantize(torch.ops.embscale.quantize(x, s, e4).t(), s, torch.float32)]]
    for call in calls:
        real = call(x, s)
        with FakeTensorMode() as mode:
            fake = call(mode.from_tensor(x), mode.from_tensor(s))
        assert [(r.shape, r.stride(), r.dtype) for r in real] == [(f.shape, f.stride(), f.dtype) for f in fake]

    def f(x):
        return embscale.activation_amax(x.t(), "relu")[0].view(-1) * 2
    torch._dynamo.reset()
    x = torch.randn(8, 6, generator=gen).to(device)
    assert torch.equal(torch.compile(f, backend="aot_eager")(x), f(x))


class Model(torch.nn.Module):
    def __init__(self, device):
        super().__init__()
        self.emb = embscale.TableBatchedEmbeddingBags([(100, 8), (50, 8)], optimizer="rowwise_adagrad",
                                                      learning_rate=0.1, device=device)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)).to(device)

    def forward(self, indices, offsets):
        return self.mlp(self.emb(indices, offsets)).squeeze(1)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_model_trains_like_eager(device, gen, backend):
    torch.manual_seed(0)
    eager = Model(device)
    compiled_model = copy.deepcopy(eager)
    torch._dynamo.reset()
    compiled = torch.compile(compiled_model, backend=backend, fullgraph=True)
    opts = [torch.optim.SGD(m.mlp.parameters(), lr=0.05) for m in (eager, compiled_model)]
    B = 8
    for step in range(3):
        indices, offsets, _ = ref.make_lookups(gen, [100, 50], B, 4)
        target = torch.randn(B, generator=gen).to(device)
        if step == 2:
            for m in (eager, compiled_model):
                m.emb.set_learning_rate(0.01)
        losses = []
        for m, fn, opt in ((eager, eager, opts[0]), (compiled_model, compiled, opts[1])):
            opt.zero_grad()
            loss = ((fn(indices.to(device), offsets.to(device)) - target) ** 2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], rel=1e-5, abs=1e-6)
    assert eager.emb.step == compiled_model.emb.step == 3
    torch.testing.assert_close(compiled_model.emb.weights, eager.emb.weights, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(compiled_model.emb.momentum1, eager.emb.momentum1, rtol=1e-5, atol=1e-6)
