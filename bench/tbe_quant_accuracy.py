"""How much accuracy each quantized weight type costs: the relative error of pooled outputs of
QuantizedTableBatchedEmbeddingBags against the fp32 tables it was quantized from
(QuantizedTableBatchedEmbeddingBags.error_report: per bag |q - f|_2 / |f|_2, mean and max), per distribution of
the table's values. Answers whether FP8 rows with a per-row scale from the row's own amax are as accurate as
int8 rows with a per-row scale and bias. Runs on the CPU (the numbers do not depend on the device).

  python3 bench/tbe_quant_accuracy.py [--rows 100000] [--dim 128] [--batch 2048] [--bag 20] [--out FILE]

One JSON record per (distribution, weight type); a table on stdout.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import embscale  # noqa: E402
from build_info import build_id  # noqa: E402
from fbgemm_tbe_cpu_peers import cpu_model  # noqa: E402

TYPES = ["int8", "fp8e4m3", "fp8e5m2", "int4", "int2", "bf16", "fp16"]


def draw(name, rows, dim, gen):
    """A table's values: how trained embedding tables are often shaped, and harder cases."""
    if name == "normal":  # N(0, 0.1)
        return torch.randn(rows, dim, generator=gen) * 0.1
    if name == "uniform":  # TorchRec's default init, +-sqrt(1/E)
        bound = (1.0 / rows) ** 0.5
        return (torch.rand(rows, dim, generator=gen) * 2 - 1) * bound
    if name == "student_t3":  # heavy tails
        t = torch.distributions.StudentT(3.0)
        return t.sample((rows, dim)) * 0.05
    if name == "row_outlier":  # N(0, 0.1) with one value a row 20x larger
        x = torch.randn(rows, dim, generator=gen) * 0.1
        col = torch.randint(0, dim, (rows,), generator=gen)
        x[torch.arange(rows), col] *= 20
        return x
    if name == "offset_rows":  # N(0, 0.1) around a per-row offset of N(0, 1)
        return torch.randn(rows, dim, generator=gen) * 0.1 + torch.randn(rows, 1, generator=gen)
    raise ValueError(name)


DISTRIBUTIONS = ["normal", "uniform", "student_t3", "row_outlier", "offset_rows"]


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--bag", type=int, default=20)
    p.add_argument("--seed", type=int, default=20261206)
    p.add_argument("--out", default=None, help="append the records to this file (default: print them)")
    a = p.parse_args(argv)
    print(f"seed {a.seed}", file=sys.stderr)
    torch.manual_seed(a.seed)
    gen = torch.Generator().manual_seed(a.seed)
    rng = np.random.default_rng(a.seed)
    ids = torch.from_numpy(rng.integers(0, a.rows, size=a.batch * a.bag))  # a held-out batch, L lookups a bag
    offsets = torch.arange(0, a.batch * a.bag + 1, a.bag)
    records, start = [], time.strftime("%H:%M")
    for dist in DISTRIBUTIONS:
        values = draw(dist, a.rows, a.dim, gen)
        fp32 = embscale.TableBatchedEmbeddingBags([(a.rows, a.dim)], pooling="sum")
        with torch.no_grad():
            fp32.split_embedding_weights()[0].copy_(values)
        for wtype in TYPES:
            q = embscale.QuantizedTableBatchedEmbeddingBags.from_float(fp32, wtype)
            r = q.error_report(fp32, ids, offsets)[0]
            records.append(dict(date=time.strftime("%Y-%m-%d"), time=start, harness="tbe_quant_accuracy",
                                build=build_id(), device=cpu_model(),
                                distribution=dist, weight_type=wtype, rows=a.rows, dim=a.dim, batch=a.batch,
                                bag=a.bag, seed=a.seed, bags=r["bags"], mean_rel_err=r["mean_rel_err"],
                                max_rel_err=r["max_rel_err"]))
    out = open(a.out, "a") if a.out else sys.stdout
    for r in records:
        out.write(json.dumps(r) + "\n")
    if a.out:
        out.close()
    print(f"\nrelative error of pooled rows (mean / max), D={a.dim}, L={a.bag}, {a.batch} bags", file=sys.stderr)
    print("distribution  " + "".join(f"{t:>18}" for t in TYPES), file=sys.stderr)
    for dist in DISTRIBUTIONS:
        row = {r["weight_type"]: r for r in records if r["distribution"] == dist}
        print(f"{dist:<14}" + "".join(f"{row[t]['mean_rel_err']:>9.2e}/{row[t]['max_rel_err']:<8.1e}" for t in TYPES),
              file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
