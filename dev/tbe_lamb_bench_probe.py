#!/usr/bin/env python3
"""Why LAMB disagreed with FBGEMM in bench/tbe_vs_fbgemm.py's check but not in the migration test: the check's
steps replayed on the benchmark's own Case (4 tables of 1M rows, D=32, B=8192, L=20, uniform ids), printing
FBGEMM's iter and embscale's step around each call, with and without the check's no-grad forward first, and
for the worst element: its row's lookup count and both libraries' values. Needs a GPU and FBGEMM's GPU build."""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import tbe_vs_fbgemm as tb  # noqa: E402
from torch_tbe_peers import make_indices  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--rows", type=int, default=1 << 20)
p.add_argument("--dim", type=int, default=32)
p.add_argument("--tables", type=int, default=4)
p.add_argument("--optimizer", default="lamb")
args = p.parse_args()
T, B, L, E, D = args.tables, 8192, 20, args.rows, args.dim
dev = torch.device("cuda")
a = argparse.Namespace(learning_rate=0.01, eps=1e-8, bounds_check="none")
gen = torch.Generator(device=dev)
gen.manual_seed(0)
print("seed 0", "T", T, "E", E, "D", D, "optimizer", args.optimizer)
idx = make_indices(torch, T, B, L, E, 0.0, gen, dev).reshape(-1)
off = torch.arange(0, T * B * L + 1, L, device=dev, dtype=torch.int64)
grad = torch.rand((B, T * D), generator=gen, device=dev, dtype=torch.float32) - 0.5


def it(case):
    """FBGEMM's iter (checkpointed) / iter_cpu (what its kernels are given)."""
    i, c = getattr(case.fb, "iter", None), getattr(case.fb, "iter_cpu", None)
    return f"{None if i is None else int(i.item())}/{None if c is None else int(c.item())}"


for nograd_first in (True, False):
    torch.manual_seed(1)
    case = tb.Case(torch, a, [D] * T, E, "fp32", args.optimizer, dev)
    case.copy_fbgemm_state()
    print(f"-- no-grad forward first: {nograd_first}; after copy: fbgemm iter {it(case)}, embscale step {case.es.step}")
    if nograd_first:
        with torch.no_grad():
            for m in case.modules.values():
                m(idx, off)
        print(f"   after the no-grad forwards: fbgemm iter {it(case)}, embscale step {case.es.step}")
    w0 = [w.detach().clone() for w in case.fb.split_embedding_weights()]
    for m in case.modules.values():
        m(idx, off).backward(grad)
    print(f"   after the training step: fbgemm iter {it(case)}, embscale step {case.es.step}")
    w_err, s_err = case.compare_state()
    print(f"   max rel error: tables {w_err:.3e}, state {s_err:.3e}")
    for t, (mine, theirs) in enumerate(zip(case.es.split_embedding_weights(), case.fb.split_embedding_weights())):
        diff = (mine.double() - theirs.double()).abs()
        r = int(diff.max(dim=1).values.argmax())
        ids = idx[t * B * L:(t + 1) * B * L]
        count = int((ids == r).sum())
        print(f"   table {t}: worst row {r} (looked up {count}x) |diff| {float(diff[r].max()):.3e}; "
              f"w0 {w0[t][r, :3].tolist()} fbgemm {theirs[r, :3].tolist()} embscale {mine[r, :3].tolist()}")
    case.close()
