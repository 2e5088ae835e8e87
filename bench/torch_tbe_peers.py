#!/usr/bin/env python3
"""torch's peer for `embscale bench tbe-forward`: nn.EmbeddingBag(mode="sum") forward on the same
configuration, measured the same way and written in the same record format.

Variants (impl field):
  torch_embeddingbag         one nn.EmbeddingBag per table, as a user writes it: T calls per step,
                             each on that table's [B*L] indices and [B] offsets; the T outputs [B, D]
                             are left as a list (the torch.cat to [B, T*D] is not timed).
  torch_embeddingbag_concat  one nn.EmbeddingBag over the T tables stacked ([T*E, D]), indices shifted by
                             t*E, offsets over all T*B bags; output [T*B, D] table-major (the transpose
                             to [B, T*D] is not timed).

Inputs are built in torch on the device from --seed: uniform rows (alpha 0), or Zipf(alpha) ranks by
inverse CDF (torch.searchsorted over the exact cumulative k^-alpha) spread over the table by the same
rank -> row map as embscale's generator ((k-1)*m + r) mod E with m coprime to E. Bags have exactly L
lookups, as in FBGEMM's benchmark. Weights are uniform in [-1, 1] (never zeros).

Method (as tools/bench_tbe.cpp): CUDA events around each call after warm-up, median reported; input
sets rotate call by call when one set touches less than three times the L2; bytes as FBGEMM counts
them: out_bytes*B*T*D + w_bytes*B*T*D*L; pct_of_floor relates the time to the byte floor at the copy
bandwidth (read + write) measured at the start of the same run.

One JSON record per line goes to stdout and, when given, to --out.
"""
import argparse
import datetime
import json
import math
import statistics
import sys


def positive_int(text):
    v = int(float(text))
    if v <= 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not a positive integer")
    return v


def nonneg_int(text):
    v = int(float(text))
    if v < 0:
        raise argparse.ArgumentTypeError(f"'{text}' is negative")
    return v


def parse_alphas(text):
    out = []
    for s in text.split(","):
        if not s.strip():
            continue
        a = float(s)
        if not (a >= 0 and math.isfinite(a)):
            raise argparse.ArgumentTypeError(f"alpha '{s}' must be 0 (uniform) or a finite value > 0")
        out.append(a)
    return out


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
    p.add_argument("--variants", default="per_table,concat", help="per_table, concat or both (default)")
    p.add_argument("--iters", type=positive_int, default=50)
    p.add_argument("--warmup", type=nonneg_int, default=10)
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default="", help="also append the JSON lines to this file")
    a = p.parse_args(argv)
    a.variants = [v.strip() for v in a.variants.split(",") if v.strip()]
    for v in a.variants:
        if v not in ("per_table", "concat"):
            p.error(f"--variants: unknown variant '{v}' (expected per_table or concat)")
    return a


def spread_multiplier(E):
    """A multiplier coprime to E (the rule of embscale's generator), so rank -> row is a bijection."""
    if E <= 2:
        return 1
    m = 0x9E3779B97F4A7C15 % E
    if m < 2:
        m = 2
    while math.gcd(m, E) != 1:
        m += 1
    return m


def make_indices(torch, T, B, L, E, alpha, gen, device):
    """[T, B*L] int64 rows of each table."""
    n = B * L
    if alpha == 0:
        return torch.randint(0, E, (T, n), generator=gen, device=device, dtype=torch.int64)
    k = torch.arange(1, E + 1, device=device, dtype=torch.float64)
    cdf = torch.cumsum(k.pow(-alpha), 0)
    cdf /= cdf[-1].clone()
    u = torch.rand((T, n), generator=gen, device=device, dtype=torch.float64)
    rank0 = torch.searchsorted(cdf, u, right=True).clamp_(max=E - 1)  # rank - 1
    m = spread_multiplier(E)
    rot = torch.randint(0, E, (T, 1), generator=gen, device=device, dtype=torch.int64)
    return (rank0 * m + rot) % E  # rank0 * m < E^2 fits in int64 for E < 2^31


def time_calls(torch, fn, n_sets, warmup, iters):
    for i in range(warmup):
        fn(i % n_sets)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        fn(i % n_sets)
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends))  # us


def copy_gbps(torch, device, nbytes):
    a = torch.ones(nbytes // 4, device=device, dtype=torch.float32)
    b = torch.empty_like(a)
    us = time_calls(torch, lambda i: b.copy_(a) if i % 2 == 0 else a.copy_(b), 2, 3, 20)
    del a, b
    return 2.0 * nbytes / (us * 1e-6) / 1e9


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
    copy = copy_gbps(torch, dev, max(4 * l2, 1 << 30))
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
        for variant in a.variants:
            bags = idx_sets = step = None
            try:
                if variant == "per_table":
                    bags = []
                    for _ in range(T):
                        eb = torch.nn.EmbeddingBag(E, D, mode="sum", dtype=wdt, device=dev)
                        with torch.no_grad():
                            eb.weight.uniform_(-1.0, 1.0, generator=gen)
                        bags.append(eb)
                    idx_sets = [[s[t].to(idt).contiguous() for t in range(T)] for s in sets]

                    def step(i, bags=bags, idx_sets=idx_sets):
                        with torch.no_grad():
                            return [bags[t](idx_sets[i][t], bag_offsets) for t in range(T)]
                else:
                    eb = torch.nn.EmbeddingBag(T * E, D, mode="sum", dtype=wdt, device=dev)
                    with torch.no_grad():
                        eb.weight.uniform_(-1.0, 1.0, generator=gen)
                    shift = torch.arange(T, device=dev, dtype=torch.int64).unsqueeze(1) * E
                    idx_sets = [(s + shift).reshape(-1).to(idt).contiguous() for s in sets]
                    all_offsets = torch.arange(0, T * B * L, L, device=dev, dtype=idt)  # [T*B]
                    bags = [eb]

                    def step(i, eb=eb, idx_sets=idx_sets, all_offsets=all_offsets):
                        with torch.no_grad():
                            return eb(idx_sets[i], all_offsets)
                us = time_calls(torch, step, n_sets, a.warmup, a.iters)
                gbps = nbytes / (us * 1e-6) / 1e9
                floor_us = nbytes / (copy * 1e9) * 1e6
                rec = {
                    "date": datetime.date.today().isoformat(),
                    "device": torch.cuda.get_device_name(dev),
                    "backend": "cuda",
                    "op": "tbe_forward",
                    "impl": "torch_embeddingbag" if variant == "per_table" else "torch_embeddingbag_concat",
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
                    "num_lookups": T * B * L,
                    "unique_rows": unique_rows,
                    "input_sets": n_sets,
                    "bytes": nbytes,
                    "median_us": us,
                    "GBps": gbps,
                    "copy_GBps": copy,
                    "floor_us": floor_us,
                    "pct_of_floor": 100.0 * floor_us / us if us > 0 else 0.0,
                    "torch": torch.__version__,
                }
                line = json.dumps(rec)
                print(line, flush=True)
                if out_file:
                    out_file.write(line + "\n")
                    out_file.flush()
            except Exception as e:  # report and continue with the next variant (e.g. out of memory)
                print(f"error: {variant} alpha={alpha}: {type(e).__name__}: {e}", file=sys.stderr)
                status = 1
            finally:
                bags = idx_sets = step = None
                torch.cuda.empty_cache()
        del sets
    if out_file:
        out_file.close()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
