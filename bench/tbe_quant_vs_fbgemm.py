"""Quantized-table forward against FBGEMM's IntNBit TBE (IntNBitTableBatchedEmbeddingBagsCodegen) on the CPU,
same process, identical bytes: FBGEMM's tables (random rows, finite headers) are copied into embscale's
QuantizedTableBatchedEmbeddingBags (row_alignment 1, FBGEMM's CPU layout), the outputs are checked equal (to a
few fp32 ulps of each term: FBGEMM fuses q * scale + bias) and then both forwards are timed, interleaved, on
one thread each (torch.set_num_threads(1): FBGEMM's CPU kernels and embscale's context use torch's count).

  python3 bench/tbe_quant_vs_fbgemm.py [--types int8,int4] [--dims 32,64,128,256,512,mixed]
      [--batches 512,8192] [--alphas 0,1.15] [--tables 8] [--rows 100000] [--bag 20] [--reps 7] [--out FILE]

Per case: the median ms of each, FBGEMM / embscale, and the bytes a forward reads (the rows it looks up) over
its time against the machine's measured copy bandwidth (one thread, a large memcpy): the share of the byte
floor. Needs fbgemm_gpu (the CPU build is enough). One JSON record per case; a table on stdout.
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

from embscale.tbe_quant import QuantizedTableBatchedEmbeddingBags  # noqa: E402

from fbgemm_tbe_cpu_peers import cpu_model  # noqa: E402
from tbe_quant_accuracy import build_id  # noqa: E402

MIXED_DIMS = [32, 64, 128, 256, 512, 64, 128, 32]


def zipf_ids(rng, rows, n, alpha):
    if alpha == 0:
        return rng.integers(0, rows, size=n)
    ranks = np.arange(1, rows + 1, dtype=np.float64)
    p = ranks ** -alpha
    p /= p.sum()
    perm = rng.permutation(rows)  # the hot rows spread over the table
    return perm[rng.choice(rows, size=n, p=p)]


def copy_bandwidth():
    """One thread's copy rate of a buffer far larger than the caches (bytes read / s)."""
    src = torch.empty(256 << 20, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t0)
    return src.numel() / best


def main(argv):
    from fbgemm_gpu.split_embedding_configs import SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_inference import IntNBitTableBatchedEmbeddingBagsCodegen
    import fbgemm_gpu

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--types", default="int8,int4")
    p.add_argument("--dims", default="32,64,128,256,512,mixed")
    p.add_argument("--batches", default="512,8192")
    p.add_argument("--alphas", default="0,1.15")
    p.add_argument("--tables", type=int, default=8)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--bag", type=int, default=20)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--seed", type=int, default=20261206)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    print(f"seed {a.seed}", file=sys.stderr)
    sparse = {"int8": SparseType.INT8, "int4": SparseType.INT4, "int2": SparseType.INT2}
    bw = copy_bandwidth()
    print(f"one thread's copy bandwidth: {bw / 1e9:.2f} GB/s", file=sys.stderr)
    out = open(a.out, "a") if a.out else None
    rows_out = []
    start = time.strftime("%H:%M")
    for wtype in a.types.split(","):
        for dims_name in a.dims.split(","):
            dims = MIXED_DIMS[:a.tables] if dims_name == "mixed" else [int(dims_name)] * a.tables
            torch.manual_seed(a.seed)
            fb = IntNBitTableBatchedEmbeddingBagsCodegen(
                [(f"t{t}", a.rows, d, sparse[wtype], EmbeddingLocation.HOST) for t, d in enumerate(dims)],
                device="cpu", output_dtype=SparseType.FP32, pooling_mode=PoolingMode.SUM)
            fb.fill_random_weights()
            gen = torch.Generator().manual_seed(a.seed)
            for rows_u8, _ in fb.split_embedding_weights(split_scale_shifts=False):
                header = torch.stack([torch.rand(a.rows, generator=gen) * 0.01 + 1e-3,
                                      torch.randn(a.rows, generator=gen) * 0.1], 1)
                rows_u8[:, :4] = header.half().view(torch.uint8)
            es = QuantizedTableBatchedEmbeddingBags([(a.rows, d, wtype) for d in dims], row_alignment=1)
            for view, (rows_u8, _) in zip(es.split_embedding_weights(), fb.split_embedding_weights(
                    split_scale_shifts=False)):
                view.copy_(rows_u8)
            row_bytes = es.row_bytes
            for B in [int(b) for b in a.batches.split(",")]:
                for alpha in [float(x) for x in a.alphas.split(",")]:
                    rng = np.random.default_rng(a.seed)
                    ids = torch.from_numpy(np.concatenate(
                        [zipf_ids(rng, a.rows, B * a.bag, alpha) for _ in dims]).astype(np.int64))
                    offsets = torch.arange(0, len(dims) * B * a.bag + 1, a.bag, dtype=torch.int64)
                    ids32, off32 = ids.int(), offsets.int()
                    want = fb(ids32, off32)
                    got = es(ids, offsets)
                    err = float((got - want).abs().max())
                    scale = float(want.abs().max()) + 1.0
                    ok = err <= 64 * 2.0 ** -23 * scale * a.bag
                    times = {"embscale": [], "fbgemm": []}
                    for _ in range(a.reps + 1):  # the first round warms up
                        for name, fn in (("embscale", lambda: es(ids, offsets)), ("fbgemm", lambda: fb(ids32, off32))):
                            t0 = time.perf_counter()
                            fn()
                            times[name].append(time.perf_counter() - t0)
                    med = {k: float(np.median(v[1:])) * 1e3 for k, v in times.items()}
                    read = sum(row_bytes[t] * B * a.bag for t in range(len(dims)))
                    floor_ms = read / bw * 1e3
                    rec = dict(date=time.strftime("%Y-%m-%d"), time=start, harness="tbe_quant_vs_fbgemm",
                               build=build_id(), device=cpu_model(), backend="cpu", threads=1,
                               fbgemm_gpu=getattr(fbgemm_gpu, "__version__", "?"), torch=torch.__version__,
                               weight_type=wtype, dims=dims_name, tables=len(dims), rows=a.rows, batch_size=B,
                               bag_size=a.bag, alpha=alpha, check="ok" if ok else "FAILED", max_abs_diff=err,
                               embscale_ms=med["embscale"], fbgemm_ms=med["fbgemm"],
                               fbgemm_over_embscale=med["fbgemm"] / med["embscale"], bytes_read=read,
                               copy_GBps=bw / 1e9, floor_ms=floor_ms, pct_of_floor=floor_ms / med["embscale"])
                    rows_out.append(rec)
                    line = json.dumps(rec)
                    if out:
                        out.write(line + "\n")
                        out.flush()
                    else:
                        print(line)
                    print(f"{wtype:5} D={dims_name:6} B={B:5} alpha={alpha:<4} embscale {med['embscale']:8.2f} ms  "
                          f"fbgemm {med['fbgemm']:8.2f} ms  x{rec['fbgemm_over_embscale']:.2f}  "
                          f"floor {100 * rec['pct_of_floor']:.0f}%  check {rec['check']}", file=sys.stderr)
    if out:
        out.close()
    if any(r["check"] != "ok" for r in rows_out):
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
