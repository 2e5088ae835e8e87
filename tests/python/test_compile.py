"""torch.compile traces the operators (fake implementations) and a compiled model trains like eager, also
with hyper-parameters set inside the compiled function or between a compiled forward and its backward."""
import copy

import pytest
import torch

import embscale
import tbe_reference as ref
from two_tables import O, make, lookups, assert_same_state


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


# ---- hyper-parameters set around a compiled step --------------------------------------------------------------
def test_compiled_learning_rate_set_between_forward_and_backward_and_two_lookups(device):
    eager = make(device, optimizer="rowwise_adagrad", learning_rate=0.05)
    compiled_module = copy.deepcopy(eager)
    i, o = lookups(device)
    i2, o2 = lookups(device, [4, 4, 1, 0, 2, 3, 3, 6], O)

    def loss_fn(mod, a, b, c, d):
        return (mod(a, b) * 2).sum() + mod(c, d).sum()

    torch._dynamo.reset()
    compiled = torch.compile(loss_fn, backend="aot_eager", fullgraph=True)
    for lr in (0.5, 0.25):
        for mod, fn in ((eager, loss_fn), (compiled_module, compiled)):
            loss = fn(mod, i, o, i2, o2)
            mod.set_learning_rate(lr)
            loss.backward()
    assert eager.step == compiled_module.step == 4
    assert_same_state(eager, compiled_module, exact=False)


def test_set_learning_rate_traces_in_a_full_graph():
    """Inside torch.compile the value is written as before (the library's check is not traceable); the
    backward checks it."""
    m = make("cpu", optimizer="sgd", learning_rate=0.1)
    eager = make("cpu", optimizer="sgd", learning_rate=0.1)
    eager.load_state_dict(m.state_dict())
    i, o = lookups("cpu")

    def step(mod, lr):
        mod.set_learning_rate(lr)
        mod.update_hyper_parameters({"lr": lr})
        return mod(i, o).sum()

    torch._dynamo.reset()
    torch.compile(step, backend="aot_eager", fullgraph=True)(m, 0.5).backward()
    step(eager, 0.5).backward()
    assert m.learning_rate == eager.learning_rate == 0.5 and m.step == eager.step == 1
    assert torch.equal(m.weights, eager.weights)
