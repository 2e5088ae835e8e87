"""Trains a small transformer block three ways from the same initial weights and data: in high precision,
with embscale's FP8 conversion (embscale.fp8.convert_to_float8_training) and, when torchao can be
imported, with torchao's (torchao.float8.convert_to_float8_training). Writes the loss curves to
OUT/loss_curves.json and OUT/loss_curves.png and prints the progress every --log-every steps.

The task is regression onto a fixed, randomly initialised teacher block (the same architecture), so it
needs no data set and the loss falls steadily from the first step.

    python3 examples/fp8_training.py --out fp8_training_out                  # CPU (exact FP8 emulation)
    python3 examples/fp8_training.py --device cuda --dtype bf16 --out out    # H200: torch._scaled_mm
"""

import argparse
import copy
import json
import os
import time

import torch
import torch.nn.functional as F

import embscale


class TransformerBlock(torch.nn.Module):
    """Pre-norm block: x + attention(ln(x)), then + MLP(ln(.)) with a 4x GELU MLP. Six linear layers."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        if dim % heads != 0:
            raise ValueError(f"heads: {heads} does not divide dim = {dim}")
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.ln2 = torch.nn.LayerNorm(dim)
        self.fc1 = torch.nn.Linear(dim, 4 * dim)
        self.fc2 = torch.nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(att)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


def batches(steps, batch, seq, dim, teacher, seed, device, dtype):
    """The same (input, target) sequence for every run: inputs drawn from `seed`, targets from the teacher."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(batch, seq, dim, generator=g).to(device)
        with torch.no_grad():
            y = teacher(x)
        yield x.to(dtype), y.to(dtype)


def train(name, model, data, lr, log_every, compile_model):
    """Adam on the MSE loss; returns the loss per step."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    step_fn = torch.compile(model) if compile_model else model
    losses, start = [], time.time()
    for step, (x, y) in enumerate(data, 1):
        loss = F.mse_loss(step_fn(x).float(), y.float())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % log_every == 0:
            print(f"  {name:>14} step {step:5d}  loss {losses[-1]:.5f}  ({time.time() - start:.1f} s)", flush=True)
    return losses


def torchao_convert():
    """torchao's convert_to_float8_training, or None with the reason when torchao cannot be imported."""
    try:
        from torchao.float8 import convert_to_float8_training
    except Exception as e:  # ImportError, or a torchao built for another torch
        return None, f"{type(e).__name__}: {e}"
    return convert_to_float8_training, None


def run(args):
    """Trains every variant; returns {"config": ..., "losses": {variant: [loss per step]}, ...}."""
    device = torch.device(args.device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    torch.manual_seed(args.seed)
    teacher = TransformerBlock(args.dim, args.heads).to(device)
    initial = TransformerBlock(args.dim, args.heads).to(device=device, dtype=dtype)
    variants = {"high precision": lambda m: m, "embscale fp8": embscale.fp8.convert_to_float8_training}
    convert, why_not = torchao_convert()
    if convert is not None:
        variants["torchao fp8"] = convert
    else:
        print(f"torchao fp8: skipped ({why_not})")
    config = {k: v for k, v in vars(args).items() if k != "out"}  # the run, not where it was written
    result = {"config": config, "losses": {}, "skipped": {} if convert else {"torchao fp8": why_not}}
    for name, conv in variants.items():
        print(f"{name}:")
        model = conv(copy.deepcopy(initial))
        data = batches(args.steps, args.batch, args.seq, args.dim, teacher, args.seed + 1, device, dtype)
        result["losses"][name] = train(name, model, data, args.lr, args.log_every, args.compile)
    losses = result["losses"]
    ref = losses["torchao fp8"] if "torchao fp8" in losses else losses["high precision"]
    result["max_relative_difference_embscale_vs_" + ("torchao" if "torchao fp8" in losses else "high_precision")] = \
        max(abs(a - b) / b for a, b in zip(losses["embscale fp8"], ref))
    return result


def write(result, out):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "loss_curves.json"), "w") as f:
        json.dump(result, f, indent=1)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, losses in result["losses"].items():
        ax.plot(range(1, len(losses) + 1), losses, label=name, linewidth=1)
    cfg = result["config"]
    ax.set(xlabel="step", ylabel="MSE loss", yscale="log",
           title=f"transformer block d={cfg['dim']}, {cfg['device']} {cfg['dtype']}" +
                 (", torch.compile" if cfg["compile"] else ""))
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "loss_curves.png"), dpi=120)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for loss_curves.json and loss_curves.png")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="parameters and activations")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--compile", action="store_true", help="train the torch.compile'd model")
    args = p.parse_args()
    for name in ("steps", "batch", "seq", "dim", "heads", "log_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: must be at least 1")
    if os.path.exists(args.out) and not os.path.isdir(args.out):  # found now, not after the training
        p.error(f"--out: {args.out} exists and is not a folder")
    result = run(args)
    write(result, args.out)
    for key, value in result.items():
        if key.startswith("max_relative_difference"):
            print(f"{key}: {value:.3g}")
    print(f"wrote {os.path.join(args.out, 'loss_curves.json')}")


if __name__ == "__main__":
    main()
