#!/usr/bin/env python3
"""FBGEMM's CPU TBE (fbgemm_gpu, ComputeDevice.CPU) and embscale's CPU TBE in one process, one thread each,
on identical tables, indices and offsets: forward, SGD step and row-wise Adagrad step.

Both run through their PyTorch modules: fbgemm_gpu's SplitTableBatchedEmbeddingBagsCodegen (EmbeddingLocation
.HOST, BoundsCheckMode.NONE, EmbOptimType.EXACT_SGD / EXACT_ROWWISE_ADAGRAD) and embscale's
TableBatchedEmbeddingBags (bounds_check "off", optimizer "sgd" / "rowwise_adagrad"). A step is forward +
backward with a fixed output gradient (the backward applies the fused update). torch.set_num_threads(1)
makes both single-threaded (embscale passes torch's thread count to the library).

Inputs: --num-tables tables of --num-embeddings rows and D columns, the same uniform [-1, 1] weights copied
into both (FBGEMM's tables start at zero); bags of exactly L lookups; indices uniform (alpha 0) or Zipf(alpha)
ranks spread over the table as bench/torch_tbe_peers.py makes them (the same generator as the CLI bench);
--input-sets index sets rotated call by call.

Checks before timing: forward outputs equal to fp32 rounding; after one step of each optimizer the tables
(and the Adagrad state) equal to fp32 rounding. A disagreement is reported and that case is not timed.

Memory: embscale's module places CPU tables and optimizer state of 2 MiB or more on transparent huge pages
(python/embscale/_host_memory.py); FBGEMM's stay where torch allocated them unless --fbgemm-huge-pages
collapses them onto huge pages too (the kernels then compare on equal memory). Each record says which
("huge_page_share": the share of that implementation's tables on huge pages; "fbgemm_huge_pages": the run's
option).

Timing: wall clock (time.perf_counter) around each call after --warmup calls; the two implementations'
calls interleave (A B, then B A, ...) so the load of a shared machine falls on both; median and min
reported. One JSON record per implementation and case (impl "fbgemm_cpu" or "embscale") goes to stdout
and, when given, is appended to --out, in the format bench/summarize.py reads.

Needs torch and fbgemm_gpu (CPU) in the running Python, and embscale importable (PYTHONPATH=python,
EMBSCALE_LIBRARY=<build>/libembscale_c.so).
"""
import argparse
import datetime
import errno
import json
import platform
import statistics
import sys
import time

from torch_tbe_peers import make_indices, nonneg_int, parse_alphas, positive_int

OPS = ("forward", "sgd", "rowwise_adagrad")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch-size", type=positive_int, default=512)
    p.add_argument("--num-tables", type=positive_int, default=8)
    p.add_argument("--dims", default="32,128,512", help="comma-separated embedding dims (default: 32,128,512)")
    p.add_argument("--bag-size", type=nonneg_int, default=20)
    p.add_argument("--num-embeddings", type=positive_int, default=100_000)
    p.add_argument("--alphas", type=parse_alphas, default=[0.0, 1.15],
                   help="comma-separated; 0 = uniform (default: 0,1.15)")
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {', '.join(OPS)} (default: all)")
    p.add_argument("--learning-rate", type=float, default=0.01)
    p.add_argument("--input-sets", type=positive_int, default=3)
    p.add_argument("--iters", type=positive_int, default=30)
    p.add_argument("--warmup", type=nonneg_int, default=3)
    p.add_argument("--seed", type=int, default=20261201)
    p.add_argument("--label", default="", help="recorded as the embscale records' \"build\" field (e.g. before)")
    p.add_argument("--experiment", default="",
                   help="recorded as every record's \"experiment\" field (an A/B of builds; the README's tables "
                        "leave such records out)")
    p.add_argument("--fbgemm-huge-pages", action="store_true",
                   help="also put FBGEMM's host tables and optimizer state on transparent huge pages (embscale's "
                        "module places its own there; MADV_COLLAPSE, Linux 6.1 or later)")
    p.add_argument("--out", default="", help="also append the JSON lines to this file")
    a = p.parse_args(argv)
    try:
        a.dims = [positive_int(s) for s in a.dims.split(",") if s.strip()]
    except argparse.ArgumentTypeError as e:
        p.error(f"--dims: {e}")
    a.ops = [o.strip() for o in a.ops.split(",") if o.strip()]
    for o in a.ops:
        if o not in OPS:
            p.error(f"--ops: unknown op '{o}' (expected {', '.join(OPS)})")
    return a


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def build_pair(torch, fb, embscale, op, T, E, D, lr, init):
    """(fbgemm module, embscale module), both holding the tables `init` [T][E, D]."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode, EmbeddingLocation
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import ComputeDevice

    opt = {"rowwise_adagrad": (EmbOptimType.EXACT_ROWWISE_ADAGRAD, "rowwise_adagrad")}.get(
        op, (EmbOptimType.EXACT_SGD, "sgd"))
    ref = fb.SplitTableBatchedEmbeddingBagsCodegen(
        [(E, D, EmbeddingLocation.HOST, ComputeDevice.CPU) for _ in range(T)], optimizer=opt[0], learning_rate=lr,
        eps=1e-8, bounds_check_mode=BoundsCheckMode.NONE)
    ours = embscale.TableBatchedEmbeddingBags([(E, D)] * T, optimizer=opt[1], learning_rate=lr, eps=1e-8,
                                              bounds_check="off", device="cpu")
    with torch.no_grad():
        for t, (w_ref, w_ours) in enumerate(zip(ref.split_embedding_weights(), ours.split_embedding_weights())):
            w_ref.copy_(init[t])
            w_ours.copy_(init[t])
    return ref, ours


def huge_page_share(t):
    """The share of the mapping holding tensor t's memory that is backed by transparent huge pages (the
    AnonHugePages / Size of its /proc/self/smaps entry; 0.0 when unknown). Read at the tensor's first 2 MiB
    boundary: advising only the aligned interior splits the mapping there."""
    ptr = -(-t.data_ptr() // (2 << 20)) * (2 << 20)
    inside, size = False, 0
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(" ", 1)[0]
                if "-" in head and not head.endswith(":"):
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    inside = lo <= ptr < hi
                elif inside and line.startswith("Size:"):
                    size = int(line.split()[1])
                elif inside and line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) / size if size else 0.0
    except OSError:
        pass
    return 0.0


def collapse_onto_huge_pages(t):
    """Advises the 2 MiB-aligned interior of CPU tensor t for huge pages and collapses it onto them now."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    huge = 2 << 20
    ptr, nbytes = t.data_ptr(), t.numel() * t.element_size()
    lo, hi = -(-ptr // huge) * huge, (ptr + nbytes) // huge * huge
    if hi <= lo:
        return
    if libc.madvise(lo, hi - lo, 14) != 0:  # MADV_HUGEPAGE
        raise OSError(ctypes.get_errno(), "madvise(MADV_HUGEPAGE) of FBGEMM's host tensor failed")
    for attempt in range(5):  # MADV_COLLAPSE may find no free huge page for a while (EAGAIN)
        if libc.madvise(lo, hi - lo, 25) == 0 or ctypes.get_errno() != errno.EAGAIN:
            return
        time.sleep(0.5)
    print("warning: MADV_COLLAPSE of FBGEMM's host tensor found too few free huge pages; the records' "
          "huge_page_share says how much it got", file=sys.stderr)


def agree(torch, name, x, y):
    """None when x and y agree to fp32 rounding, else a message naming the largest difference."""
    if x.shape != y.shape:
        return f"{name}: shapes {tuple(x.shape)} and {tuple(y.shape)}"
    if torch.allclose(x, y, rtol=1e-5, atol=1e-6):
        return None
    d = (x - y).abs()
    i = int(d.argmax())
    return f"{name}: largest difference {float(d.flatten()[i]):.3g} at flat index {i}"


def check_pair(torch, op, ref, ours, idx, off, grad):
    """Runs one call (op forward) or step of each and compares outputs, tables and optimizer state."""
    out_ref, out_ours = ref(idx, off), ours(idx, off)
    msg = agree(torch, "forward output", out_ref.detach(), out_ours.detach())
    if msg or op == "forward":
        return msg
    out_ref.backward(grad)
    out_ours.backward(grad)
    for t, (w_ref, w_ours) in enumerate(zip(ref.split_embedding_weights(), ours.split_embedding_weights())):
        msg = agree(torch, f"table {t} after one step", w_ref.detach(), w_ours.detach())
        if msg:
            return msg
    if op == "rowwise_adagrad":
        for t, (s_ref, s_ours) in enumerate(zip(ref.split_optimizer_states(), ours.split_optimizer_states())):
            msg = agree(torch, f"table {t} Adagrad state", s_ref[0].flatten(), s_ours[0].flatten())
            if msg:
                return msg
    return None


def timed(fn):
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e6


def main(argv):
    a = parse_args(argv)
    try:
        import torch
        import fbgemm_gpu.split_table_batched_embeddings_ops_training as fb
    except ImportError as e:
        print(f"error: torch and fbgemm_gpu are needed: {e}", file=sys.stderr)
        return 1
    import embscale

    torch.set_num_threads(1)
    T, B, L, E = a.num_tables, a.batch_size, a.bag_size, a.num_embeddings
    print(f"seed {a.seed}; {cpu_model()}; torch {torch.__version__}, fbgemm_gpu "
          f"{getattr(sys.modules.get('fbgemm_gpu'), '__version__', '?')}, embscale {embscale.__version__}",
          file=sys.stderr)
    out_file = open(a.out, "a") if a.out else None
    started = datetime.datetime.now(datetime.timezone.utc)  # the run's UTC start: its records' date and time
    gen = torch.Generator()
    status = 0
    for D in a.dims:
        gen.manual_seed(a.seed + D)
        init = [torch.empty(E, D).uniform_(-1.0, 1.0, generator=gen) for _ in range(T)]
        grad = torch.empty(B, T * D).uniform_(-1.0, 1.0, generator=gen)
        for alpha in a.alphas:
            gen.manual_seed(a.seed)
            sets = [make_indices(torch, T, B, L, E, alpha, gen, "cpu").reshape(-1).contiguous()
                    for _ in range(a.input_sets)]
            unique_rows = int(torch.unique(sets[0] + torch.arange(T).repeat_interleave(B * L) * E).numel())
            off = torch.arange(0, T * B * L + 1, L, dtype=torch.int64)
            for op in a.ops:
                ref, ours = build_pair(torch, fb, embscale, op, T, E, D, a.learning_rate, init)
                if a.fbgemm_huge_pages:
                    for name in ("weights_host", "momentum1_host"):
                        if getattr(ref, name, None) is not None and getattr(ref, name).numel() > 0:
                            collapse_onto_huge_pages(getattr(ref, name))
                share = {"fbgemm_cpu": huge_page_share(ref.weights_host), "embscale": huge_page_share(ours.weights)}
                msg = check_pair(torch, op, ref, ours, sets[0], off, grad)
                if msg:
                    print(f"error: D={D} alpha={alpha} {op}: FBGEMM and embscale disagree: {msg}", file=sys.stderr)
                    status = 1
                    continue

                def call(mod, i):
                    if op == "forward":
                        return lambda: mod(sets[i % len(sets)], off)
                    return lambda: mod(sets[i % len(sets)], off).backward(grad)

                impls = (("fbgemm_cpu", ref), ("embscale", ours))
                times = {name: [] for name, _ in impls}
                for i in range(a.warmup + a.iters):
                    order = impls if i % 2 == 0 else impls[::-1]
                    for name, mod in order:
                        if op == "forward":
                            with torch.no_grad():
                                us = timed(call(mod, i))
                        else:
                            us = timed(call(mod, i))
                        if i >= a.warmup:
                            times[name].append(us)
                nbytes = 4 * B * T * D + 4 * B * T * D * L
                for name, _ in impls:
                    med, lo = statistics.median(times[name]), min(times[name])
                    rec = {
                        "date": started.strftime("%Y-%m-%d"), "time": started.strftime("%H:%M"),
                        "device": cpu_model(), "backend": "cpu",
                        "op": "tbe_forward" if op == "forward" else f"tbe_train_{op}", "impl": name,
                        "num_tables": T, "batch_size": B, "embedding_dim": D, "bag_size": L, "num_embeddings": E,
                        "alpha": alpha, "weights_precision": "fp32", "output_dtype": "fp32", "pooling": "sum",
                        "weighted": False, "indices_dtype": "int64", "bounds_check": "off",
                        "num_lookups": T * B * L, "unique_rows": unique_rows, "input_sets": len(sets),
                        "threads": 1, "iters": a.iters, "median_us": med, "min_us": lo,
                        "huge_page_share": round(share[name], 3), "fbgemm_huge_pages": a.fbgemm_huge_pages,
                    }
                    if a.experiment:
                        rec["experiment"] = a.experiment
                    if op == "forward":
                        rec.update(bytes=nbytes, GBps=nbytes / (med * 1e-6) / 1e9)
                    else:
                        rec.update(optimizer=op, learning_rate=a.learning_rate)
                    if name == "fbgemm_cpu":
                        rec.update(torch=torch.__version__, fbgemm_gpu=sys.modules["fbgemm_gpu"].__version__)
                    elif a.label:
                        rec["build"] = a.label
                    line = json.dumps(rec, sort_keys=True)
                    print(line, flush=True)
                    if out_file:
                        out_file.write(line + "\n")
                        out_file.flush()
                r = statistics.median(times["fbgemm_cpu"]) / statistics.median(times["embscale"])
                rmin = min(times["fbgemm_cpu"]) / min(times["embscale"])
                print(f"D={D} alpha={alpha:g} {op}: fbgemm/embscale median {r:.2f}, min {rmin:.2f}", file=sys.stderr)
                del ref, ours
    if out_file:
        out_file.close()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
