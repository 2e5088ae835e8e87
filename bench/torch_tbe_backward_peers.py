#!/usr/bin/env python3
"""torch's peer for `embscale bench tbe-backward` and `tbe-train`: one nn.EmbeddingBag(mode="sum",
sparse=True) per table with a sparse torch.optim step, on the same configuration, measured the same way
and written in the same record format (impl "torch_embeddingbag_sparse").

Measurements (op field, as embscale names them):
  tbe_backward_rowwise_adagrad  backward + torch.optim.Adagrad step. torch has no row-wise Adagrad: its
                                Adagrad keeps element-wise state (optimizer_note says so), which is what
                                a torch user would run instead.
  tbe_backward_sgd              backward + torch.optim.SGD step (sparse gradients).
  tbe_train_sgd                 forward + backward + SGD step.
Backward records time from after the forward (CUDA event recorded once the forward is enqueued) to the
end of the optimizer step; the gradients are set to None after each step, as in training.

Inputs, sets, weights and bytes as bench/torch_tbe_peers.py (its input functions are reused): grad_output is
uniform in [-0.5, 0.5]; bytes = out_bytes*B*T*D + w_bytes*B*T*D*L (FBGEMM); backward GB/s = 2*bytes/t,
training GB/s = 3*bytes/t, as tools/bench_tbe_backward.cpp reports them.

One JSON record per line goes to stdout and, when given, to --out.
"""
import argparse
import datetime
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_tbe_peers import make_indices, nonneg_int, parse_alphas, positive_int  # noqa: E402

MEASUREMENTS = ("tbe_backward_rowwise_adagrad", "tbe_backward_sgd", "tbe_train_sgd")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch-size", type=nonneg_int, default=8192)
    p.add_argument("--num-tables", type=positive_int, default=32)
    p.add_argument("--embedding-dim", type=positive_int, default=128)
    p.add_argument("--bag-size", type=nonneg_int, default=20)
    p.add_argument("--num-embeddings", type=positive_int, default=1_000_000)
    p.add_argument("--alphas", type=parse_alphas, default=[0.0, 1.15],
                   help="comma-separated; 0 = uniform (default: 0,1.15)")
    p.add_argument("--weights-precision", choices=("fp32", "fp16", "bf16"), default="fp32")
    p.add_argument("--indices-dtype", choices=("32", "64"), default="64")
    p.add_argument("--learning-rate", type=float, default=0.1)
    p.add_argument("--ops", default=",".join(MEASUREMENTS), help="comma-separated subset of " + ", ".join(MEASUREMENTS))
    p.add_argument("--iters", type=positive_int, default=20)
    p.add_argument("--warmup", type=nonneg_int, default=5)
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default="", help="also append the JSON lines to this file")
    a = p.parse_args(argv)
    a.ops = [o.strip() for o in a.ops.split(",") if o.strip()]
    for o in a.ops:
        if o not in MEASUREMENTS:
            p.error(f"--ops: unknown measurement '{o}'")
    if not (a.learning_rate >= 0 and math.isfinite(a.learning_rate)):
        p.error("--learning-rate: expected a finite value >= 0")
    return a


def time_steps(torch, fwd, rest, n_sets, warmup, iters, include_forward):
    """Median microseconds of rest(i, out) (and of fwd(i) too when include_forward)."""
    for i in range(warmup):
        rest(i % n_sets, fwd(i % n_sets))
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        if include_forward:
            starts[i].record()
            out = fwd(i % n_sets)
        else:
            out = fwd(i % n_sets)
            starts[i].record()
        rest(i % n_sets, out)
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends))


def main(argv):
    a = parse_args(argv)
    try:
        import torch
    except ImportError:
        print("error: torch is not installed", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("error: no CUDA device", file=sys.stderr)
        return 1
    dev = torch.device(a.device)
    wdt = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[a.weights_precision]
    idt = torch.int32 if a.indices_dtype == "32" else torch.int64
    T, B, L, E, D = a.num_tables, a.batch_size, a.bag_size, a.num_embeddings, a.embedding_dim
    es = torch.tensor([], dtype=wdt).element_size()
    l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 60 << 20) or (60 << 20)
    nbytes = es * B * T * D + es * B * T * D * L
    n_sets = 1 if nbytes >= 3 * l2 else min(16, math.ceil(3 * l2 / max(nbytes, 1)))
    out_file = open(a.out, "a") if a.out else None
    gen = torch.Generator(device=dev)
    status = 0
    for alpha in a.alphas:
        gen.manual_seed(a.seed)
        sets = [make_indices(torch, T, B, L, E, alpha, gen, dev) for _ in range(n_sets)]
        keys = sets[0] + torch.arange(T, device=dev, dtype=torch.int64).unsqueeze(1) * E
        unique_rows = int(torch.unique(keys).numel())
        del keys
        bag_offsets = torch.arange(0, B * L, L, device=dev, dtype=idt)  # [B]
        idx_sets = [[s[t].to(idt).contiguous() for t in range(T)] for s in sets]
        grads = [(torch.rand((B, D), generator=gen, device=dev, dtype=torch.float32) - 0.5).to(wdt) for _ in range(T)]
        for op in a.ops:
            bags = opt = None
            try:
                bags = []
                for _ in range(T):
                    eb = torch.nn.EmbeddingBag(E, D, mode="sum", sparse=True, dtype=wdt, device=dev)
                    with torch.no_grad():
                        eb.weight.uniform_(-1.0, 1.0, generator=gen)
                    bags.append(eb)
                params = [eb.weight for eb in bags]
                if op == "tbe_backward_rowwise_adagrad":
                    opt = torch.optim.Adagrad(params, lr=a.learning_rate, eps=0.1)
                else:
                    opt = torch.optim.SGD(params, lr=a.learning_rate)

                def fwd(i, bags=bags):
                    return [bags[t](idx_sets[i][t], bag_offsets) for t in range(T)]

                def rest(i, outs, opt=opt):
                    torch.autograd.backward(outs, grads)
                    opt.step()
                    opt.zero_grad(set_to_none=True)

                train = op.startswith("tbe_train")
                us = time_steps(torch, fwd, rest, n_sets, a.warmup, a.iters, train)
                factor = 3.0 if train else 2.0
                rec = {
                    "date": datetime.date.today().isoformat(),
                    "device": torch.cuda.get_device_name(dev),
                    "backend": "cuda",
                    "op": op,
                    "impl": "torch_embeddingbag_sparse",
                    "num_tables": T,
                    "batch_size": B,
                    "embedding_dim": D,
                    "bag_size": L,
                    "num_embeddings": E,
                    "alpha": alpha,
                    "weights_precision": a.weights_precision,
                    "output_dtype": a.weights_precision,
                    "pooling": "sum",
                    "weighted": False,
                    "indices_dtype": "int32" if a.indices_dtype == "32" else "int64",
                    "optimizer": "rowwise_adagrad" if "adagrad" in op else "sgd",
                    "learning_rate": a.learning_rate,
                    "num_lookups": T * B * L,
                    "unique_rows": unique_rows,
                    "input_sets": n_sets,
                    "bytes": factor * nbytes,
                    "median_us": us,
                    "GBps": factor * nbytes / (us * 1e-6) / 1e9,
                    "torch": torch.__version__,
                }
                if "adagrad" in op:
                    rec["optimizer_note"] = "torch.optim.Adagrad: element-wise state (torch has no row-wise Adagrad)"
                line = json.dumps(rec)
                print(line, flush=True)
                if out_file:
                    out_file.write(line + "\n")
                    out_file.flush()
            except Exception as e:  # report and continue with the next measurement (e.g. out of memory)
                print(f"error: {op} alpha={alpha}: {type(e).__name__}: {e}", file=sys.stderr)
                status = 1
            finally:
                bags = opt = None
                torch.cuda.empty_cache()
        del sets, idx_sets, grads
    if out_file:
        out_file.close()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
