"""Quantized-table forward against FBGEMM's IntNBit TBE (IntNBitTableBatchedEmbeddingBagsCodegen), same process,
identical bytes: FBGEMM's tables (random rows, finite headers) are copied into embscale's
QuantizedTableBatchedEmbeddingBags, the outputs are checked equal (to a few fp32 ulps of each term: FBGEMM fuses
q * scale + bias) and then both forwards are timed, interleaved.

  python3 bench/tbe_quant_vs_fbgemm.py [--device cpu|cuda] [--types int8,int4] [--dims 32,64,128,256,512,mixed]
      [--batches 512,8192] [--alphas 0,1.15] [--tables 8] [--rows 100000] [--bag 20] [--reps 7] [--out FILE]

--device cpu (the default): row_alignment 1 (FBGEMM's CPU layout), one thread each (torch.set_num_threads(1):
FBGEMM's CPU kernels and embscale's context use torch's count), the host clock, the median of --reps calls; the
bytes a forward reads (the rows it looks up) over its time against one thread's measured copy bandwidth: the
share of the byte floor. Needs fbgemm_gpu (the CPU build is enough).

--device cuda: row_alignment 16 (FBGEMM's GPU layout), the tables in device memory (EmbeddingLocation.DEVICE),
int32 ids for both, bounds checks off in both (FBGEMM's NONE; embscale's off still drops an out-of-range id).
Two timings after --warmup calls, each the median of --reps: CUDA events around a train of --calls back-to-back
calls (the two libraries alternating train by train), a call's cost as a caller sees it, host work included
(small batches are host-bound: the host's rate); and the same calls captured in one CUDA graph and replayed,
the device's time alone (*_graph_ms). Id sets rotate when a set's rows are under three times the L2. Bytes as FBGEMM's benchmarks count them, with the
rows as stored: 4*B*sum(D) (fp32 output) + B*L*sum(row bytes); GB/s = bytes / time; the share of the byte floor
is those bytes at the device's copy rate measured at the start of the run (1 GiB copied back and forth on the
device, bytes read + written per second: torch_tbe_peers.copy_gbps, the training benchmarks' floor). --types may
also name fp8e4m3 and fp8e5m2: FBGEMM's FP8 rows are another format (no per-row scale), so those run embscale alone
(random rows quantized on the device) and record its time beside its int8 time of the same case
(embscale_int8_ms, when int8 ran first). Needs a CUDA build of fbgemm_gpu and of embscale; the script stops with
the reason otherwise.

One JSON record per case (date, device, build, ...); progress lines on stderr. A failed output check is recorded
(check FAILED, with the largest difference) and printed, and the script exits 1 after the run.
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
from embscale.tbe_quant import QuantizedTableBatchedEmbeddingBags  # noqa: E402

from fbgemm_tbe_cpu_peers import cpu_model  # noqa: E402
from build_info import build_id  # noqa: E402
from torch_tbe_peers import copy_gbps  # noqa: E402

MIXED_DIMS = [32, 64, 128, 256, 512, 64, 128, 32]


def zipf_ids(rng, rows, n, alpha):
    if alpha == 0:
        return rng.integers(0, rows, size=n)
    ranks = np.arange(1, rows + 1, dtype=np.float64)
    p = ranks ** -alpha
    p /= p.sum()
    perm = rng.permutation(rows)  # the hot rows spread over the table
    return perm[rng.choice(rows, size=n, p=p)]


def intn_pooled_reference(tables, dims, bits, ids, bag, half_values):
    """Pooled sums (float64, [B, sum(dims)]) of FBGEMM's row-wise int rows, decoded from the maths: each row is
    fp16 scale, fp16 bias, then D codes of `bits` bits, lowest bits first; a value is scale * code + bias. With
    `half_values` each value is rounded to fp16 before it is summed, as FBGEMM's CUDA forward dequantizes (one
    fused half multiply-add per value); FBGEMM's CPU forward, and embscale on both backends, keep it in fp32.
    `tables` are the [E, row bytes] uint8 rows, `ids` the T * B * bag ids, table after table, bags of `bag`."""
    import torch
    outs = []
    per = 8 // bits
    for t, (rows, d) in enumerate(zip(tables, dims)):
        n = ids.numel() // len(dims)
        sel = rows[ids[t * n:(t + 1) * n].long()]
        head = sel[:, :4].contiguous().view(torch.float16).double()
        scale, bias = head[:, :1], head[:, 1:2]
        packed = sel[:, 4:4 + (d + per - 1) // per].long()
        shifts = torch.arange(per, device=rows.device) * bits
        codes = ((packed.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)).reshape(len(sel), -1)[:, :d].double()
        values = scale * codes + bias
        if half_values:
            values = values.half().double()
        outs.append(values.reshape(-1, bag, d).sum(1))
    return torch.cat(outs, 1)


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


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--types", default="int8,int4")
    p.add_argument("--dims", default="32,64,128,256,512,mixed")
    p.add_argument("--batches", default="512,8192")
    p.add_argument("--alphas", default="0,1.15")
    p.add_argument("--tables", type=int, default=8)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--bag", type=int, default=20)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--warmup", type=int, default=3, help="calls before timing (cuda)")
    p.add_argument("--calls", type=int, default=20, help="back-to-back calls a timed train holds (cuda)")
    p.add_argument("--seed", type=int, default=20261206)
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def fail(msg):
    """Stops the run with the reason (no record is written for a setup that cannot run)."""
    print(f"tbe_quant_vs_fbgemm: {msg}", file=sys.stderr)
    sys.exit(2)


def import_fbgemm(cuda):
    try:
        from fbgemm_gpu.split_embedding_configs import SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import (BoundsCheckMode, EmbeddingLocation,
                                                                          PoolingMode)
        from fbgemm_gpu.split_table_batched_embeddings_ops_inference import IntNBitTableBatchedEmbeddingBagsCodegen
        import fbgemm_gpu
    except Exception as e:  # noqa: BLE001 (any import failure is the same missing peer)
        fail(f"fbgemm_gpu cannot be imported ({type(e).__name__}: {e}); install the peer first")
    if cuda:  # a CPU-only build imports fine and fails at the first CUDA call: try one
        try:
            m = IntNBitTableBatchedEmbeddingBagsCodegen([("t", 8, 8, SparseType.INT8, EmbeddingLocation.DEVICE)],
                                                        device=torch.device("cuda"))
            m.fill_random_weights()
            m(torch.zeros(1, dtype=torch.int32, device="cuda"), torch.tensor([0, 1], dtype=torch.int32, device="cuda"))
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            fail(f"FBGEMM's IntNBit TBE does not run on CUDA here ({type(e).__name__}: {e}); --device cuda needs "
                 "a CUDA build of fbgemm_gpu")
    return SparseType, BoundsCheckMode, EmbeddingLocation, PoolingMode, IntNBitTableBatchedEmbeddingBagsCodegen, \
        fbgemm_gpu


def main(argv):
    a = parse_args(argv)
    if a.device == "cuda":
        return main_cuda(a)
    SparseType, _, EmbeddingLocation, PoolingMode, IntNBitTableBatchedEmbeddingBagsCodegen, fbgemm_gpu = \
        import_fbgemm(False)
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


def records_out(a, rows_out):
    """write(rec): the record to --out (appended, flushed) or stdout, and kept for the exit status."""
    out = open(a.out, "a") if a.out else None

    def write(rec):
        rows_out.append(rec)
        line = json.dumps(rec)
        if out:
            out.write(line + "\n")
            out.flush()
        else:
            print(line, flush=True)
    return write, out


def median_event_ms(runs, reps, calls):
    """Per name, the ms a call: runs[name](r) issues rep r's `calls` calls; each rep is timed between two CUDA
    events, the names alternating rep by rep, and the median over reps is divided by `calls`."""
    ev = {n: [] for n in runs}
    for r in range(reps):
        for n, run in runs.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run(r)
            end.record()
            ev[n].append((start, end))
    torch.cuda.synchronize()
    return {n: float(np.median([s.elapsed_time(e) for s, e in v])) / calls for n, v in ev.items()}


def cuda_train_ms(fns, sets, warmup, reps, calls):
    """Per name, the ms a call of `calls` back-to-back calls takes (CUDA events around the train, the median
    of reps trains), the fns alternating train by train and cycling through the input sets (fn(i) runs set i).
    Where a call's host work outlasts its kernel the train is host-bound and this is the host's rate."""
    for _ in range(warmup):
        for fn in fns.values():
            for i in range(sets):
                fn(i)
    torch.cuda.synchronize()

    def train(fn):
        def run(r):
            for k in range(calls):
                fn((r * calls + k) % sets)
        return run
    return median_event_ms({n: train(fn) for n, fn in fns.items()}, reps, calls)


def cuda_graph_ms(fns, sets, reps, calls):
    """Per name, the device's ms a call: `calls` calls captured in one CUDA graph, replayed reps times between
    CUDA events (the median), so no host work lies between the kernels. A library whose call cannot be
    captured gets None, and the reason in the second dict."""
    graphs, why = {}, {}
    for n, fn in fns.items():
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # first calls off the capture (allocator and library set-up)
                for i in range(sets):
                    fn(i)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for k in range(calls):
                    fn(k % sets)
            g.replay()
            graphs[n] = g
        except Exception as e:  # noqa: BLE001 (recorded: the library's call is not capturable here)
            why[n] = f"{type(e).__name__}: {e}"
    torch.cuda.synchronize()
    ms = median_event_ms({n: (lambda r, g=g: g.replay()) for n, g in graphs.items()}, reps, calls)
    return {n: ms.get(n) for n in fns}, why


def main_cuda(a):
    if not torch.cuda.is_available():
        fail("--device cuda: torch sees no CUDA device")
    if not embscale.backend_available("cuda"):
        fail("--device cuda: this embscale library has no usable CUDA backend (build it with -DEMBSCALE_CUDA=ON "
             "and point EMBSCALE_LIBRARY at that build's libembscale_c.so)")
    SparseType, BoundsCheckMode, EmbeddingLocation, PoolingMode, IntNBit, fbgemm_gpu = import_fbgemm(True)
    dev = torch.device("cuda", torch.cuda.current_device())
    device_name = torch.cuda.get_device_name(dev)
    l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or (60 << 20)
    sparse = {"int8": SparseType.INT8, "int4": SparseType.INT4, "int2": SparseType.INT2}
    known = set(sparse) | {"fp8e4m3", "fp8e5m2"}
    types = a.types.split(",")
    if any(t not in known for t in types):
        fail(f"--types: {a.types}; expected names from {', '.join(sorted(known))}")
    copy_bw = copy_gbps(torch, dev, 1 << 30) * 1e9  # bytes read + written / s
    print(f"seed {a.seed}, {device_name}, copy {copy_bw / 1e9:.0f} GB/s (read + write)", file=sys.stderr)
    rows_out = []
    write, out = records_out(a, rows_out)
    start = time.strftime("%H:%M")
    int8_ms = {}  # (dims, B, alpha) -> embscale's int8 ms, for the fp8 records
    for wtype in types:
        for dims_name in a.dims.split(","):
            dims = MIXED_DIMS[:a.tables] if dims_name == "mixed" else [int(dims_name)] * a.tables
            torch.manual_seed(a.seed)
            es = QuantizedTableBatchedEmbeddingBags([(a.rows, d, wtype) for d in dims], row_alignment=16,
                                                    bounds_check="off", device=dev)
            fb = None
            if wtype in sparse:
                fb = IntNBit([(f"t{t}", a.rows, d, sparse[wtype], EmbeddingLocation.DEVICE) for t, d in enumerate(dims)],
                             device=dev, output_dtype=SparseType.FP32, pooling_mode=PoolingMode.SUM,
                             bounds_check_mode=BoundsCheckMode.NONE, row_alignment=16)
                fb.fill_random_weights()
                gen = torch.Generator(device=dev).manual_seed(a.seed)
                for (rows_u8, _), view in zip(fb.split_embedding_weights(split_scale_shifts=False),
                                              es.split_embedding_weights()):
                    if tuple(rows_u8.shape) != tuple(view.shape):
                        fail(f"{wtype} D={dims_name}: FBGEMM's rows are {tuple(rows_u8.shape)} bytes, embscale's "
                             f"{tuple(view.shape)}: the layouts differ, so the bytes cannot be shared")
                    header = torch.stack([torch.rand(a.rows, generator=gen, device=dev) * 0.01 + 1e-3,
                                          torch.randn(a.rows, generator=gen, device=dev) * 0.1], 1)
                    rows_u8[:, :4] = header.half().view(torch.uint8)
                    view.copy_(rows_u8)
            else:  # fp8: embscale alone, random rows quantized on the device
                es.load_float([torch.randn(a.rows, d, generator=None, device=dev) * 0.1 for d in dims])
            row_bytes = es.row_bytes
            for B in [int(b) for b in a.batches.split(",")]:
                for alpha in [float(x) for x in a.alphas.split(",")]:
                    rng = np.random.default_rng(a.seed)
                    read = sum(row_bytes[t] * B * a.bag for t in range(len(dims)))
                    nbytes = 4 * B * sum(dims) + read
                    sets = 1 if read >= 3 * l2 else min(16, -(-3 * l2 // read))
                    inputs = []
                    for _ in range(sets):
                        ids = np.concatenate([zipf_ids(rng, a.rows, B * a.bag, alpha) for _ in dims])
                        inputs.append(torch.from_numpy(ids.astype(np.int32)).to(dev))
                    offsets = torch.arange(0, len(dims) * B * a.bag + 1, a.bag, dtype=torch.int32, device=dev)
                    got = es(inputs[0], offsets)
                    check, err, fb_err = "ok", None, None
                    if fb is not None:
                        # Each against the sums of its own dequantizing rule (intn_pooled_reference): FBGEMM's
                        # CUDA forward rounds every value to fp16, embscale keeps fp32 (FBGEMM's CPU rule).
                        want = fb(inputs[0], offsets)
                        if float(want.abs().max()) == 0.0:
                            fail(f"{wtype} D={dims_name} B={B}: FBGEMM's output is all zeros; refusing to time zeros")
                        tables_u8 = [w for w, _ in fb.split_embedding_weights(split_scale_shifts=False)]
                        bits = {"int8": 8, "int4": 4, "int2": 2}[wtype]
                        exact = intn_pooled_reference(tables_u8, dims, bits, inputs[0], a.bag, False)
                        halves = intn_pooled_reference(tables_u8, dims, bits, inputs[0], a.bag, True)
                        err = float((got.double() - exact).abs().max())
                        fb_err = float((want.double() - halves).abs().max())
                        tol = 64 * 2.0 ** -23 * (float(exact.abs().max()) + 1.0) * a.bag
                        check = "ok" if err <= tol and fb_err <= tol else "FAILED"
                    elif float(got.abs().max()) == 0.0:
                        fail(f"{wtype} D={dims_name} B={B}: embscale's output is all zeros; refusing to time zeros")
                    fns = {"embscale": lambda i: es(inputs[i], offsets)}
                    if fb is not None and check == "ok":
                        fns["fbgemm"] = lambda i: fb(inputs[i], offsets)
                    med = cuda_train_ms(fns, sets, a.warmup, a.reps, a.calls)
                    graph, graph_why = cuda_graph_ms(fns, sets, a.reps, a.calls)
                    key = (dims_name, B, alpha)
                    if wtype == "int8":
                        int8_ms[key] = med["embscale"]
                    rec = dict(date=time.strftime("%Y-%m-%d"), time=start, harness="tbe_quant_vs_fbgemm",
                               build=build_id(), device=device_name, backend="cuda", row_alignment=16,
                               bounds_check="off/NONE", indices_dtype="int32", output_dtype="fp32", pooling="sum",
                               fbgemm_gpu=getattr(fbgemm_gpu, "__version__", "?"), torch=torch.__version__,
                               weight_type=wtype, dims=dims_name, embedding_dims=dims, tables=len(dims), rows=a.rows,
                               batch_size=B, bag_size=a.bag, alpha=alpha, input_sets=sets, warmup=a.warmup, reps=a.reps,
                               check=check if fb is not None else "no peer (embscale alone)",
                               embscale_max_abs_err=err, fbgemm_max_abs_err=fb_err,
                               fbgemm_dequant="fp16 values (its CUDA rule)" if fb is not None else None,
                               embscale_ms=med["embscale"], fbgemm_ms=med.get("fbgemm"),
                               fbgemm_over_embscale=med["fbgemm"] / med["embscale"] if "fbgemm" in med else None,
                               embscale_int8_ms=int8_ms.get(key) if wtype.startswith("fp8") else None,
                               bytes=nbytes, embscale_GBps=nbytes / (med["embscale"] * 1e-3) / 1e9,
                               fbgemm_GBps=nbytes / (med["fbgemm"] * 1e-3) / 1e9 if "fbgemm" in med else None,
                               copy_GBps=copy_bw / 1e9, floor_ms=nbytes / copy_bw * 1e3,
                               pct_of_floor=nbytes / copy_bw * 1e3 / med["embscale"],
                               fbgemm_pct_of_floor=nbytes / copy_bw * 1e3 / med["fbgemm"] if "fbgemm" in med else None,
                               timing=f"trains of {a.calls} back-to-back calls (host work included); graph: the "
                                      f"same {a.calls} calls captured in a CUDA graph and replayed (device only)",
                               calls_per_train=a.calls, embscale_graph_ms=graph["embscale"],
                               fbgemm_graph_ms=graph.get("fbgemm"),
                               fbgemm_over_embscale_graph=(graph["fbgemm"] / graph["embscale"]
                                                           if graph.get("fbgemm") and graph["embscale"] else None),
                               graph_not_captured=graph_why or None)
                    write(rec)
                    peer = (f"fbgemm {med['fbgemm']:8.3f} ms  x{rec['fbgemm_over_embscale']:.2f}" if "fbgemm" in med
                            else ("int8 " + (f"{int8_ms[key]:8.3f} ms" if key in int8_ms else "not run")
                                  if fb is None else "fbgemm NOT TIMED"))
                    graphs = (f"graph x{rec['fbgemm_over_embscale_graph']:.2f}" if rec["fbgemm_over_embscale_graph"]
                              else f"graph {graph_why or '-'}")
                    print(f"{wtype:7} D={dims_name:6} B={B:5} alpha={alpha:<4} embscale {med['embscale']:8.3f} ms "
                          f"({rec['embscale_GBps']:6.0f} GB/s, floor {100 * rec['pct_of_floor']:3.0f}%)  {peer}  {graphs}  "
                          f"check {rec['check']}"
                          + (f" (max error embscale {err:.3g}, fbgemm {fb_err:.3g})" if check == "FAILED" else ""),
                          file=sys.stderr)
    if out:
        out.close()
    failed = [r for r in rows_out if r["check"] == "FAILED"]
    if failed:
        print(f"tbe_quant_vs_fbgemm: {len(failed)} case(s) FAILED the output check: "
              + ", ".join(f"{r['weight_type']} D={r['dims']} B={r['batch_size']} alpha={r['alpha']}" for r in failed),
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
