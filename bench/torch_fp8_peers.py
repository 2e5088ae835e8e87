#!/usr/bin/env python3
"""torch's peers for `embscale bench fp8`, measured on the GPU with the same method and record format.

What is measured (each eager, and compiled where a user would compile it):
  amax                      torch.linalg.vector_norm(x, inf)  (impl torch_vector_norm)
                            x.abs().amax()                    (impl torch_abs_amax)
                            fp32 and bf16, the 1-D sizes.
  quantize_current_scaling  torchao's tensorwise recipe: amax = vector_norm(x, inf),
                            scale = 448 / clamp(amax, min=1e-12), y = (x.float() * scale)
                            .clamp(-448, 448).to(float8_e4m3fn); eager and torch.compile; bf16, 1-D sizes.
  activation_amax           y = gelu(x, approximate="tanh"); amax = vector_norm(y, inf); at --shape, bf16.
  cast_transpose            y = cast to e4m3 given a scale; yt = y.t().contiguous(); at --shape, bf16.

Method (as tools/bench_fp8.cpp): seeded random inputs, cloned into enough copies that together they
exceed three times the L2 when one copy would fit in it, rotated call by call; CUDA events around
batches of back-to-back calls (enough for ~300 us), median batch per call after warm-up. Bytes are the
ones an op must move (docs/bench.md), and pct_of_copy relates GB/s to a device copy measured at the
start of the same run (emitted as op "copy", impl "torch_copy").

One JSON record per line goes to --out (flushed as it is measured, so a cut-short run keeps what it
measured); readable lines go to stdout. Exit status 1 when any measurement failed.
"""
import argparse
import datetime
import json
import math
import sys


def parse_count(text):
    """'65536', '2^16', '1<<16', '64K' -> a positive int; ValueError otherwise."""
    t = text.strip()
    try:
        if "^" in t:
            base, exp = t.split("^", 1)
            if int(base) != 2:
                raise ValueError
            n = 1 << int(exp)
        elif "<<" in t:
            base, exp = t.split("<<", 1)
            n = int(base) << int(exp)
        else:
            mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(t[-1:].lower(), 1)
            n = int(t[:-1] if mult > 1 else t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a positive element count (use e.g. 65536, 2^16, 64K)")
    if n <= 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not a positive element count")
    return n


def parse_sizes(text):
    return [parse_count(s) for s in text.split(",") if s.strip()]


def parse_shape(text):
    parts = text.lower().split("x")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"'{text}' is not ROWSxCOLS (e.g. 8192x8192)")
    return parse_count(parts[0]), parse_count(parts[1])


ALL_OPS = ("amax", "quantize_current_scaling", "activation_amax", "cast_transpose")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="torch_fp8_peers.jsonl", help="JSON-lines output file (default: %(default)s)")
    p.add_argument("--sizes", type=parse_sizes, default=parse_sizes("2^16,2^20,2^24,2^26,2^28"),
                   help="1-D element counts, comma-separated (default: 2^16,2^20,2^24,2^26,2^28)")
    p.add_argument("--shape", type=parse_shape, default=(8192, 8192), help="ROWSxCOLS of the 2-D ops (default: 8192x8192)")
    p.add_argument("--device", default="cuda", help="torch device (default: %(default)s)")
    p.add_argument("--ops", default=",".join(ALL_OPS), help="comma-separated subset of " + ", ".join(ALL_OPS))
    p.add_argument("--amax-dtypes", default="fp32,bf16", help="dtypes for amax (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=3, help="untimed batches (default: %(default)s)")
    p.add_argument("--iters", type=int, default=30, help="timed batches; the median is reported (default: %(default)s)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile variants")
    p.add_argument("--seed", type=int, default=20261130)
    a = p.parse_args(argv)
    ops = [o.strip() for o in a.ops.split(",") if o.strip()]
    bad = [o for o in ops if o not in ALL_OPS]
    if bad:
        p.error(f"--ops: unknown op(s) {', '.join(bad)} (expected {', '.join(ALL_OPS)})")
    a.ops = ops
    a.amax_dtypes = [d.strip() for d in a.amax_dtypes.split(",") if d.strip()]
    bad = [d for d in a.amax_dtypes if d not in ("fp32", "bf16", "fp16")]
    if bad:
        p.error(f"--amax-dtypes: unknown dtype(s) {', '.join(bad)} (expected fp32, bf16 or fp16)")
    if a.iters < 1:
        p.error(f"--iters: {a.iters} is not allowed; expected >= 1")
    if a.warmup < 0:
        p.error(f"--warmup: {a.warmup} is negative; expected >= 0")
    return a


class Bench:
    def __init__(self, torch, args):
        self.torch = torch
        self.args = args
        self.dev = torch.device(args.device)
        props = torch.cuda.get_device_properties(self.dev)
        self.device_name = props.name
        self.l2 = int(getattr(props, "L2_cache_size", 0) or (60 << 20))
        self.copy_gbps = None
        self.failures = 0
        self.out = open(args.out, "a")  # appended, as the other peer scripts: one results file per run
        self.date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")

    # ---- inputs ----
    def copies_for(self, nbytes):
        target = 3 * self.l2
        return 1 if nbytes >= target else math.ceil(target / nbytes)

    def make_inputs(self, shape, dtype, seed):
        """Seeded normal values (never zeros), cloned into rotating copies."""
        torch = self.torch
        g = torch.Generator(device=self.dev)
        g.manual_seed(seed)
        x = torch.randn(shape, generator=g, device=self.dev, dtype=torch.float32).to(dtype)
        copies = self.copies_for(x.numel() * x.element_size())
        return [x] + [x.clone() for _ in range(copies - 1)]

    # ---- timing ----
    def time(self, fn, inputs):
        """Median per-call microseconds over timed batches; and calls per batch."""
        torch = self.torch
        k = len(inputs)
        idx = 0

        def call():
            nonlocal idx
            r = fn(inputs[idx % k])
            idx += 1
            return r

        call()  # first call (compiles, allocates) outside any timing
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        probe = []
        for _ in range(3):
            s.record()
            call()
            e.record()
            e.synchronize()
            probe.append(s.elapsed_time(e) * 1000.0)
        probe_us = sorted(probe)[1]
        calls = int(max(1, min(200, math.ceil(300.0 / max(probe_us, 0.5)))))
        for _ in range(self.args.warmup * calls):
            call()
        evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(self.args.iters)]
        for a, b in evs:
            a.record()
            for _ in range(calls):
                call()
            b.record()
        torch.cuda.synchronize()
        per_call = sorted(a.elapsed_time(b) * 1000.0 / calls for a, b in evs)
        m = len(per_call)
        median = per_call[m // 2] if m % 2 else 0.5 * (per_call[m // 2 - 1] + per_call[m // 2])
        return median, per_call[0], per_call[-1], calls

    # ---- records ----
    def emit(self, rec, line):
        self.out.write(json.dumps(rec, sort_keys=True) + "\n")
        self.out.flush()
        print(line, flush=True)

    def record(self, op, impl, dtype, n, nbytes, timing, copies, rows=None, cols=None, **extra):
        median, lo, hi, calls = timing
        gbps = nbytes / (median * 1e-6) / 1e9
        rec = {
            "date": self.date, "device": self.device_name, "backend": "cuda", "op": op, "impl": impl,
            "dtype": dtype, "n": n, "median_us": median, "min_us": lo, "max_us": hi, "bytes": float(nbytes),
            "GBps": gbps, "pct_of_copy": 100.0 * gbps / self.copy_gbps, "calls_per_batch": calls,
            "repeats": self.args.iters, "copies": copies, "torch": self.torch.__version__,
        }
        if rows is not None:
            rec["rows"], rec["cols"] = rows, cols
        rec.update(extra)
        size = f"{rows}x{cols}" if rows is not None else f"n={n}"
        self.emit(rec, f"{op:<24} {impl:<17} {dtype:<5} {size:<13} {median:10.2f} us {gbps:9.1f} GB/s "
                       f"{100.0 * gbps / self.copy_gbps:6.1f}% of copy")

    def guarded(self, what, fn):
        try:
            fn()
        except Exception as ex:  # one failed measurement must not stop the others
            self.failures += 1
            print(f"error: {what}: {type(ex).__name__}: {ex}", file=sys.stderr, flush=True)
            self.torch.cuda.synchronize()

    # ---- measurements ----
    def measure_copy(self):
        torch = self.torch
        nbytes = max(512 << 20, 4 * self.l2)
        a = torch.empty(nbytes, dtype=torch.uint8, device=self.dev).fill_(1)
        b = torch.empty_like(a).fill_(2)
        bufs = [(a, b), (b, a)]
        self.copy_gbps = 1.0  # placeholder until measured (the record needs a ceiling)
        timing = self.time(lambda ab: ab[1].copy_(ab[0]), bufs)
        self.copy_gbps = 2.0 * nbytes / (timing[0] * 1e-6) / 1e9
        self.record("copy", "torch_copy", "u8", nbytes, 2 * nbytes, timing, 1)
        del a, b

    def run(self):
        torch = self.torch
        F = torch.nn.functional
        dt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
        es = {"fp32": 4, "bf16": 2, "fp16": 2}
        e4m3 = torch.float8_e4m3fn
        fp8_max = 448.0
        inf = float("inf")
        compile_ok = not self.args.no_compile

        def amax_vector_norm(x):
            return torch.linalg.vector_norm(x, inf)

        def amax_abs_amax(x):
            return x.abs().amax()

        def tensorwise_quantize(x):
            amax = torch.linalg.vector_norm(x, inf).to(torch.float32)
            scale = fp8_max / torch.clamp(amax, min=1e-12)
            y = (x.to(torch.float32) * scale).clamp(-fp8_max, fp8_max).to(e4m3)
            return y, amax, scale

        def gelu_amax(x):
            y = F.gelu(x, approximate="tanh")
            return y, torch.linalg.vector_norm(y, inf)

        scale_holder = {}

        def cast_transpose(x):
            scale = scale_holder["scale"]
            y = (x.to(torch.float32) * scale).clamp(-fp8_max, fp8_max).to(e4m3)
            return y, y.t().contiguous()

        variants = lambda f: [("torch_eager", f)] + ([("torch_compile", torch.compile(f, dynamic=False))] if compile_ok else [])

        self.guarded("copy", self.measure_copy)
        if self.copy_gbps is None or self.copy_gbps <= 1.0:
            print("error: copy bandwidth could not be measured; stopping", file=sys.stderr)
            return 1

        for n in self.args.sizes:
            for dname in self.args.amax_dtypes if "amax" in self.args.ops else []:
                def one():
                    xs = self.make_inputs((n,), dt[dname], self.args.seed)
                    for impl, f in (("torch_vector_norm", amax_vector_norm), ("torch_abs_amax", amax_abs_amax)):
                        self.guarded(f"amax {impl} {dname} n={n}",
                                     lambda: self.record("amax", impl, dname, n, n * es[dname], self.time(f, xs), len(xs)))
                    del xs
                self.guarded(f"amax inputs {dname} n={n}", one)
            if "quantize_current_scaling" in self.args.ops:
                def one():
                    xs = self.make_inputs((n,), torch.bfloat16, self.args.seed)
                    for impl, f in variants(tensorwise_quantize):
                        self.guarded(f"quantize_current_scaling {impl} bf16 n={n}",
                                     lambda: self.record("quantize_current_scaling", impl, "bf16", n, n * 5,
                                                         self.time(f, xs), len(xs), fp8="fp8e4m3"))
                    del xs
                self.guarded(f"quantize_current_scaling inputs n={n}", one)
            torch.cuda.empty_cache()

        rows, cols = self.args.shape
        n = rows * cols
        if "activation_amax" in self.args.ops or "cast_transpose" in self.args.ops:
            def two_d():
                xs = self.make_inputs((rows, cols), torch.bfloat16, self.args.seed)
                if "activation_amax" in self.args.ops:
                    for impl, f in variants(gelu_amax):
                        self.guarded(f"activation_amax {impl}",
                                     lambda: self.record("activation_amax", impl, "bf16", n, n * 4, self.time(f, xs),
                                                         len(xs), rows, cols, activation="gelu_tanh"))
                if "cast_transpose" in self.args.ops:
                    amax = torch.linalg.vector_norm(xs[0], inf).to(torch.float32)
                    scale_holder["scale"] = fp8_max / torch.clamp(amax, min=1e-12)
                    for impl, f in variants(cast_transpose):
                        self.guarded(f"cast_transpose {impl}",
                                     lambda: self.record("cast_transpose", impl, "bf16", n, n * 4, self.time(f, xs),
                                                         len(xs), rows, cols, fp8="fp8e4m3"))
            self.guarded("2-D ops", two_d)
        if self.failures:
            print(f"torch_fp8_peers: {self.failures} measurement(s) failed", file=sys.stderr)
        return 1 if self.failures else 0


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        import torch
    except ImportError as ex:
        print(f"error: torch is not importable here: {ex}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: --device: no CUDA device is visible to torch", file=sys.stderr)
        return 2
    bench = Bench(torch, args)
    print(f"torch {torch.__version__} on {bench.device_name}; results to {args.out}", flush=True)
    return bench.run()


if __name__ == "__main__":
    sys.exit(main())
