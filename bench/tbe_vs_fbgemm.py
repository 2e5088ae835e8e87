#!/usr/bin/env python3
"""FBGEMM's TBE and embscale's torch module, same-run peers on identical tables, inputs and gradients.

In one process, for each case, FBGEMM's SplitTableBatchedEmbeddingBagsCodegen (impl "fbgemm") and
embscale.TableBatchedEmbeddingBags (impl "embscale_torch") hold the same tables: FBGEMM's, initialised
uniformly in [-1, 1], are copied into embscale's, and before each input distribution the weights and the
optimizer state are copied again, so both start every check from the same state. Both run exact
optimizers (no stochastic rounding), pooled SUM, fp32 output, without bounds checks (--bounds-check off) or
each in its default checked mode (--bounds-check warn: FBGEMM's WARNING, a bounds-check kernel before the lookup
that replaces an invalid index with row 0 and counts it; embscale's warn, which drops it and counts it; neither
stops the step).

Cases: T tables of one D (or "mixed": each table's D a multiple of 4 in [16, 256], seeded), B bags of L
lookups per table, rows per table E from the --gb budget of fp32 tables (E = gb GiB / (4 * sum of D)), so
an fp16 case has the same rows in half the bytes; indices uniform (alpha 0) or Zipf(alpha), from
bench/torch_tbe_peers.py's generator; grad_output uniform in [-0.5, 0.5].

Before timing a case, the forward outputs, and after one forward + backward step the updated tables and
the optimizer state, must agree: max |a - b| / max |b| over each tensor at most 1e-5 for fp32
tables (sums of the same terms in another order) and 2^-9 for fp16 (two fp16 roundings of the largest
value). The errors go into the records; a case that disagrees is reported and not timed (exit status 1).

Measurements (op names as `embscale bench tbe-forward` / `tbe-train` write them):
  tbe_forward             the forward under torch.no_grad() (measured once per D, dtype and alpha).
  tbe_train_<optimizer>   forward + backward with the fused update (--optimizers; rowwise_adagrad and sgd by default).
Wall time: events around each step (CUDA events on the GPU, the host clock on the CPU), the two impls
alternating step by step after warm-up; median_us is the median step. Kernel time (GPU only):
torch.profiler over --profile-steps steps of one impl, the CUDA kernels' durations summed per step
(kernel_us; copies and memsets are left out), and the time at least one kernel ran (busy_us, the union of
their intervals: below kernel_us where kernels overlap, as embscale's do under programmatic dependent
launch); --kernel-breakdown adds each kernel's share (kernels). Loop time (GPU only): --iters steps of one impl back to
back, the device synchronised only before and after, per step (loop_us): a training loop's pace, where
the host's time per step shows only where it exceeds the kernels'; loop_us / kernel_us is what the
host path costs there. Input sets rotate when one set's bytes are under three
times the L2, as in the other peer scripts. Bytes as FBGEMM counts them: 4*B*sum(D) (fp32 output) +
w_bytes*B*sum(D)*L for the forward, 3 times that for a training step.

JSON records go to --out (appended) and stdout; progress lines to stderr. On the GPU machine:
scripts/h200_peers.sh. A CPU smoke test (FBGEMM's CPU TBE from fbgemm-gpu-cpu):
    EMBSCALE_LIBRARY=build/libembscale_c.so PYTHONPATH=python python3 bench/tbe_vs_fbgemm.py --device cpu \\
        --gb 0.01 --num-tables 4 --batch-size 64 --dims 8,mixed --iters 3 --warmup 1
"""
import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from build_info import build_id  # noqa: E402
from torch_tbe_peers import make_indices, nonneg_int, parse_alphas, positive_int  # noqa: E402

ALL_DIMS = "8,16,32,64,128,160,192,256,320,512,mixed"
QUICK_DIMS = "32,128,mixed"
# embscale's optimizer -> FBGEMM's EmbOptimType member; the default run measures the first two.
FBGEMM_OPTIMIZERS = {"rowwise_adagrad": "EXACT_ROWWISE_ADAGRAD", "sgd": "EXACT_SGD", "adam": "ADAM",
                     "partial_rowwise_adam": "PARTIAL_ROWWISE_ADAM", "adagrad": "EXACT_ADAGRAD", "lamb": "LAMB",
                     "partial_rowwise_lamb": "PARTIAL_ROWWISE_LAMB", "lars_sgd": "LARS_SGD"}
OPTIMIZERS = tuple(FBGEMM_OPTIMIZERS)
DTYPES = ("fp32", "fp16")
TOLERANCE = {"fp32": 1e-5, "fp16": 2.0**-9}
IMPLS = ("fbgemm", "embscale_torch")


def parse_dims(text):
    out = []
    for s in text.split(","):
        s = s.strip()
        if not s:
            continue
        if s == "mixed":
            out.append(s)
            continue
        try:
            d = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"D '{s}' is not an integer or 'mixed'") from None
        if d < 4 or d % 4:
            raise argparse.ArgumentTypeError(f"D {d}: FBGEMM needs a multiple of 4 (>= 4)")
        out.append(d)
    if not out:
        raise argparse.ArgumentTypeError("no D given")
    return out


def parse_choices(allowed):
    def parse(text):
        out = [s.strip() for s in text.split(",") if s.strip()]
        for s in out:
            if s not in allowed:
                raise argparse.ArgumentTypeError(f"'{s}' is not one of {', '.join(allowed)}")
        if not out:
            raise argparse.ArgumentTypeError("empty list")
        return out
    return parse


def positive_float(text):
    v = float(text)
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"'{text}' is not a finite value > 0")
    return v


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gb", type=positive_float, default=16.0, help="GiB of fp32 tables per impl (default 16)")
    p.add_argument("--num-tables", type=positive_int, default=32)
    p.add_argument("--batch-size", type=positive_int, default=8192)
    p.add_argument("--bag-size", type=positive_int, default=20)
    p.add_argument("--dims", type=parse_dims, default=None, help=f"comma-separated D or 'mixed' (default {ALL_DIMS})")
    p.add_argument("--alphas", type=parse_alphas, default=[0.0, 1.15], help="0 = uniform (default 0,1.15)")
    p.add_argument("--optimizers", type=parse_choices(OPTIMIZERS), default=list(OPTIMIZERS[:2]),
                   help=f"of {', '.join(OPTIMIZERS)} (default {','.join(OPTIMIZERS[:2])})")
    p.add_argument("--dtypes", type=parse_choices(DTYPES), default=list(DTYPES), help="weights: fp32, fp16")
    p.add_argument("--learning-rate", type=positive_float, default=0.01)
    p.add_argument("--eps", type=positive_float, default=1e-8)
    p.add_argument("--iters", type=positive_int, default=None, help="timed steps per impl (default 20; quick 8)")
    p.add_argument("--warmup", type=nonneg_int, default=None, help="untimed steps per impl (default 5; quick 2)")
    p.add_argument("--profile-steps", type=positive_int, default=None,
                   help="steps per impl under torch.profiler for kernel_us (default 5; quick 3)")
    p.add_argument("--kernel-breakdown", action="store_true",
                   help="also record each kernel's time per step (kernels: {name: us}, templates summed)")
    p.add_argument("--quick", action="store_true", help=f"D {QUICK_DIMS} and fewer steps (unless given)")
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--bounds-check", choices=("off", "warn"), default="off",
                   help="off: no bounds checks (default); warn: FBGEMM's WARNING mode and embscale's warn mode")
    p.add_argument("--out", default="", help="also append the JSON lines to this file")
    a = p.parse_args(argv)
    if a.dims is None:
        a.dims = parse_dims(QUICK_DIMS if a.quick else ALL_DIMS)
    for name, full, quick in (("iters", 20, 8), ("warmup", 5, 2), ("profile_steps", 5, 3)):
        if getattr(a, name) is None:
            setattr(a, name, quick if a.quick else full)
    return a


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def table_dims(d, T, seed):
    """Each table's D: d for all, or for "mixed" multiples of 4 in [16, 256] drawn from the seed."""
    if d != "mixed":
        return [d] * T
    import random
    rng = random.Random(seed)
    return [4 * rng.randint(4, 64) for _ in range(T)]


def max_rel_err(got, ref):
    """max |got - ref| / max |ref|, in fp64 (0 for equal tensors, also all-zero ones; inf when only ref is zero)."""
    if got.numel() == 0:
        return 0.0
    diff = float((got.double() - ref.double()).abs().max())
    if diff == 0.0:
        return 0.0
    scale = float(ref.double().abs().max())
    return diff / scale if scale > 0 else math.inf


class Case:
    """Both impls on one table configuration (dims, dtype, optimizer)."""

    def __init__(self, torch, a, dims, E, dtype, optimizer, dev):
        import embscale
        from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import (BoundsCheckMode, EmbeddingLocation,
                                                                          PoolingMode)
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (ComputeDevice,
                                                                            SplitTableBatchedEmbeddingBagsCodegen)
        cuda = dev.type == "cuda"
        loc = EmbeddingLocation.DEVICE if cuda else EmbeddingLocation.HOST
        cdev = ComputeDevice.CUDA if cuda else ComputeDevice.CPU
        self.torch = torch
        self.fb = SplitTableBatchedEmbeddingBagsCodegen(
            [(E, d, loc, cdev) for d in dims],
            optimizer=EmbOptimType[FBGEMM_OPTIMIZERS[optimizer]],
            weights_precision={"fp32": SparseType.FP32, "fp16": SparseType.FP16}[dtype], output_dtype=SparseType.FP32,
            stochastic_rounding=False, learning_rate=a.learning_rate, eps=a.eps, pooling_mode=PoolingMode.SUM,
            bounds_check_mode=BoundsCheckMode.WARNING if a.bounds_check == "warn" else BoundsCheckMode.NONE, device=dev)
        self.fb.init_embedding_weights_uniform(-1.0, 1.0)  # FBGEMM's tables start at zero
        self.es = embscale.TableBatchedEmbeddingBags(
            [(E, d) for d in dims], optimizer=optimizer, learning_rate=a.learning_rate, eps=a.eps,
            weights_dtype={"fp32": torch.float32, "fp16": torch.float16}[dtype], output_dtype=torch.float32,
            bounds_check=a.bounds_check, stochastic_rounding=False, device=dev, data_parallel_group=None)
        self.modules = {"fbgemm": self.fb, "embscale_torch": self.es}

    def copy_fbgemm_state(self):
        """embscale's tables and optimizer state := FBGEMM's."""
        with self.torch.no_grad():
            for mine, theirs in zip(self.es.split_embedding_weights(), self.fb.split_embedding_weights()):
                mine.copy_(theirs)
            for mine, theirs in zip(self.es.split_optimizer_states(), self.fb.split_optimizer_states()):
                for m, t in zip(mine, theirs):
                    m.copy_(t.reshape(m.shape))
        self.sync_step()

    def sync_step(self):
        """embscale's optimizer step := the one FBGEMM's next forward counts from. FBGEMM counts a step in every
        forward of an optimizer with bias corrections, no-grad ones included, from iter_cpu (which it takes from
        iter only while iter_cpu is 0); embscale counts one in each backward."""
        iteration, host = getattr(self.fb, "iter", None), getattr(self.fb, "iter_cpu", None)
        if iteration is None:
            return
        step = int(host.item()) if host is not None and int(host.item()) != 0 else int(iteration.item())
        self.es.set_optimizer_step(step)

    def compare_state(self):
        """(max rel error of the tables, of the optimizer state) over all tables."""
        w = max(max_rel_err(m, t) for m, t in zip(self.es.split_embedding_weights(), self.fb.split_embedding_weights()))
        s = 0.0
        for mine, theirs in zip(self.es.split_optimizer_states(), self.fb.split_optimizer_states()):
            for m, t in zip(mine, theirs):
                s = max(s, max_rel_err(m, t.reshape(m.shape)))
        return w, s

    def close(self):
        self.fb = self.es = self.modules = None


class Timer:
    """Wall time of one step: CUDA events on the GPU (read after one synchronize), the host clock on the CPU."""

    def __init__(self, torch, cuda):
        self.torch, self.cuda, self.pending = torch, cuda, []

    def run(self, fn):
        if self.cuda:
            s, e = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            self.pending.append((s, e))
        else:
            t0 = time.perf_counter()
            fn()
            self.pending.append(time.perf_counter() - t0)

    def take_us(self):
        if self.cuda:
            self.torch.cuda.synchronize()
            out = [s.elapsed_time(e) * 1000.0 for s, e in self.pending]
        else:
            out = [t * 1e6 for t in self.pending]
        self.pending = []
        return out


def wall_us(torch, cuda, steps, n_sets, warmup, iters):
    """Median wall time per impl, the impls alternating step by step (the first one changes every step)."""
    names = list(steps)
    timers = {n: Timer(torch, cuda) for n in names}
    for i in range(warmup + iters):
        order = names if i % 2 == 0 else names[::-1]
        for n in order:
            if i < warmup:
                steps[n](i % n_sets)
            else:
                timers[n].run(lambda n=n, i=i: steps[n](i % n_sets))
    if cuda:
        torch.cuda.synchronize()
    return {n: statistics.median(timers[n].take_us()) for n in names}


def loop_us(torch, step, n_sets, iters):
    """Time per step of `iters` steps back to back, the device synchronised before and after only (a training
    loop: the host enqueues ahead, and its time shows only where it exceeds the kernels')."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(iters):
        step(i % n_sets)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6 / iters


def kernel_us(torch, step, n_sets, n_steps):
    """CUDA kernel time per step from torch.profiler (copies and memsets left out): the kernels' durations
    summed, the time at least one of them ran (busy: the union of their intervals; below the sum where
    kernels overlap, as under programmatic dependent launch) and the sum per kernel name."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    step(0)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(n_steps):
            step(i % n_sets)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events()
               if e.device_type == DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))]
    per_name = {}
    for e in kernels:
        per_name[e.name] = per_name.get(e.name, 0.0) + e.time_range.elapsed_us() / n_steps
    busy = busy_time((e.time_range.start, e.time_range.end) for e in kernels)
    return sum(per_name.values()), busy / n_steps, per_name


def busy_time(intervals):
    """The length of the union of (start, end) intervals."""
    busy, end = 0.0, -math.inf
    for start, stop in sorted(intervals):
        if stop > end:
            busy += stop - max(start, end)
            end = stop
    return busy


def kernel_breakdown(per_name):
    """{short kernel name: us per step}, the longest first (instantiations of one template summed)."""
    out = {}
    for name, us in per_name.items():
        key = short_kernel_name(name)
        out[key] = out.get(key, 0.0) + us
    return {k: round(v, 1) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def short_kernel_name(name, width=90):
    """A kernel's name without its template arguments and parameter list, cut to width."""
    out, depth = [], 0
    for ch in name:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    text = "".join(out).strip() or name
    return text[:width]


class Run:
    """What every case of one invocation shares: arguments, device, records out."""

    def __init__(self, torch, fbgemm_gpu, a):
        self.torch, self.a = torch, a
        self.cuda = a.device == "cuda"
        self.dev = torch.device(a.device)
        self.l2 = (getattr(torch.cuda.get_device_properties(self.dev), "L2_cache_size", 0) if self.cuda else 0) or (60 << 20)
        self.device_name = torch.cuda.get_device_name(self.dev) if self.cuda else "cpu"
        self.fbgemm_version = getattr(fbgemm_gpu, "__version__", "?")
        self.gen = torch.Generator(device=self.dev)
        self.out_file = open(a.out, "a") if a.out else None
        self.t_start = time.time()
        self.status = 0

    def emit(self, rec):
        line = json.dumps(rec)
        print(line, flush=True)
        if self.out_file:
            self.out_file.write(line + "\n")
            self.out_file.flush()

    def fail(self, msg):
        log(f"error: {msg}")
        self.status = 1

    def inputs(self, dims, E, alpha, n_sets):
        """n_sets (indices, offsets) pairs and grad_output, from the seed."""
        torch, a = self.torch, self.a
        T, B, L = a.num_tables, a.batch_size, a.bag_size
        self.gen.manual_seed(a.seed)
        offsets = torch.arange(0, T * B * L + 1, L, device=self.dev, dtype=torch.int64)
        sets = [(make_indices(torch, T, B, L, E, alpha, self.gen, self.dev).reshape(-1), offsets) for _ in range(n_sets)]
        grad = torch.rand((B, sum(dims)), generator=self.gen, device=self.dev, dtype=torch.float32) - 0.5
        return sets, grad

    def check(self, case, sets, grad, dtype, what):
        """The forward outputs, then the tables and optimizer state after one training step, compared from the
        same state; the errors (a dict for the records), or None when they disagree."""
        torch = self.torch
        case.copy_fbgemm_state()
        with torch.no_grad():
            out = {n: m(*sets[0]) for n, m in case.modules.items()}
        fwd_err = max_rel_err(out["embscale_torch"], out["fbgemm"])
        del out
        case.sync_step()  # FBGEMM counted a step in that forward
        for m in case.modules.values():
            m(*sets[0]).backward(grad)
        w_err, s_err = case.compare_state()
        tol = TOLERANCE[dtype]
        log(f"{what}: max rel error forward {fwd_err:.2e}, tables after one step {w_err:.2e}, optimizer state "
            f"{s_err:.2e} (tolerance {tol:g})")
        if not (fwd_err <= tol and w_err <= tol and s_err <= tol):
            self.fail(f"{what}: embscale and FBGEMM disagree; not timed")
            return None
        return dict(check_tolerance=tol, fwd_max_rel_err=fwd_err, weights_max_rel_err=w_err, state_max_rel_err=s_err)

    def measure(self, case, op, sets, grad):
        """(wall us, kernel us) per impl for one op: "tbe_forward" or a training step."""
        torch, a = self.torch, self.a

        def make_step(m):
            if op == "tbe_forward":
                def step(i):
                    with torch.no_grad():
                        m(*sets[i])
            else:
                def step(i):
                    m(*sets[i]).backward(grad)
            return step

        steps = {n: make_step(m) for n, m in case.modules.items()}
        wall = wall_us(torch, self.cuda, steps, len(sets), a.warmup, a.iters)
        kern = {n: kernel_us(torch, s, len(sets), a.profile_steps) for n, s in steps.items()} if self.cuda else {}
        loop = {n: loop_us(torch, s, len(sets), a.iters) for n, s in steps.items()} if self.cuda else {}
        return wall, kern, loop

    def run_alpha(self, case, d, dims, E, dtype, optimizer, alpha):
        torch, a = self.torch, self.a
        T, B, L = a.num_tables, a.batch_size, a.bag_size
        what = f"{dtype} D={d} E={E} {optimizer} alpha={alpha:g}" + (" bounds checks warn" if a.bounds_check == "warn" else "")
        nbytes = 4 * B * sum(dims) + (4 if dtype == "fp32" else 2) * B * sum(dims) * L
        n_sets = 1 if (not self.cuda or nbytes >= 3 * self.l2) else min(16, math.ceil(3 * self.l2 / nbytes))
        sets, grad = self.inputs(dims, E, alpha, n_sets)
        checks = self.check(case, sets, grad, dtype, what)
        if checks is None:
            return
        keys = sets[0][0].view(T, -1) + torch.arange(T, device=self.dev).unsqueeze(1) * E
        now = datetime.datetime.now(datetime.timezone.utc)
        base = dict(date=now.date().isoformat(), time=now.strftime("%H:%M"), build=build_id(),
                    device=self.device_name,
                    backend=a.device, harness="tbe_vs_fbgemm", num_tables=T, batch_size=B, embedding_dim=d,
                    bag_size=L, num_embeddings=E, tables_gib=a.gb, alpha=alpha, weights_precision=dtype,
                    output_dtype="fp32", pooling="sum", weighted=False, indices_dtype="int64", bounds_check=a.bounds_check,
                    num_lookups=T * B * L, unique_rows=int(torch.unique(keys).numel()), input_sets=n_sets,
                    torch=torch.__version__, fbgemm_gpu=self.fbgemm_version, seed=a.seed, **checks)
        del keys
        if d == "mixed":
            base["embedding_dims"] = dims
        # The forward does not depend on the optimizer: measured with the first one only.
        ops = (["tbe_forward"] if optimizer == a.optimizers[0] else []) + [f"tbe_train_{optimizer}"]
        for op in ops:
            wall, kern, loop = self.measure(case, op, sets, grad)
            factor = 1.0 if op == "tbe_forward" else 3.0
            for n in IMPLS:
                rec = dict(base, op=op, impl=n)
                if op != "tbe_forward":
                    rec.update(optimizer=optimizer, learning_rate=a.learning_rate, eps=a.eps)
                rec.update(bytes=factor * nbytes, median_us=wall[n], GBps=factor * nbytes / (wall[n] * 1e-6) / 1e9,
                           iters=a.iters, warmup=a.warmup)
                if n in kern:
                    k_sum, k_busy, k_names = kern[n]
                    rec.update(kernel_us=k_sum, busy_us=k_busy, profile_steps=a.profile_steps)
                    if a.kernel_breakdown:
                        rec.update(kernels=kernel_breakdown(k_names))
                if n in loop:
                    rec.update(loop_us=loop[n])
                self.emit(rec)
            kern_text = (f"; kernels fbgemm {kern['fbgemm'][0]:.1f} us (busy {kern['fbgemm'][1]:.1f}), embscale "
                         f"{kern['embscale_torch'][0]:.1f} us (busy {kern['embscale_torch'][1]:.1f}); back to "
                         f"back fbgemm {loop['fbgemm']:.1f} us, embscale {loop['embscale_torch']:.1f} us") if kern else ""
            log(f"{what} {op}: fbgemm {wall['fbgemm']:.1f} us, embscale {wall['embscale_torch']:.1f} us "
                f"(fbgemm/embscale {wall['fbgemm'] / wall['embscale_torch']:.2f}){kern_text}  "
                f"[{time.time() - self.t_start:.0f}s]")

    def run_case(self, d, dtype, optimizer):
        """Both impls on one table configuration, every alpha; the tables are freed on return."""
        torch, a = self.torch, self.a
        dims = table_dims(d, a.num_tables, a.seed)
        E = int(a.gb * (1 << 30) // (4 * sum(dims)))
        if E < 1:
            self.fail(f"--gb: {a.gb:g} GiB holds no row of {a.num_tables} tables at D={d}")
            return
        case = None
        try:
            t0 = time.time()
            torch.manual_seed(a.seed)
            case = Case(torch, a, dims, E, dtype, optimizer, self.dev)
            log(f"{dtype} D={d} E={E} {optimizer}: tables built in {time.time() - t0:.1f}s")
            for alpha in a.alphas:
                self.run_alpha(case, d, dims, E, dtype, optimizer, alpha)
        except Exception as e:  # report and go on with the next case (e.g. out of memory)
            self.fail(f"{dtype} D={d} E={E} {optimizer}: {type(e).__name__}: {e}")
        finally:
            if case is not None:
                case.close()
            if self.cuda:
                torch.cuda.empty_cache()


def main(argv):
    a = parse_args(argv)
    try:
        import torch
        import embscale  # noqa: F401
        import fbgemm_gpu
    except ImportError as e:
        log(f"error: {e} (needs torch, fbgemm_gpu and embscale on PYTHONPATH with EMBSCALE_LIBRARY set)")
        return 1
    if a.device == "cuda" and not torch.cuda.is_available():
        log("error: --device cuda: no CUDA device")
        return 1
    run = Run(torch, fbgemm_gpu, a)
    log(f"tbe_vs_fbgemm: {run.device_name}, torch {torch.__version__}, fbgemm_gpu {run.fbgemm_version}, seed {a.seed}, "
        f"{a.gb:g} GiB of fp32 tables, T={a.num_tables} B={a.batch_size} L={a.bag_size}, {a.iters} timed steps after "
        f"{a.warmup}, {a.profile_steps} profiled")
    for dtype in a.dtypes:
        for d in a.dims:
            for optimizer in a.optimizers:
                run.run_case(d, dtype, optimizer)
    if run.out_file:
        run.out_file.close()
    return run.status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
