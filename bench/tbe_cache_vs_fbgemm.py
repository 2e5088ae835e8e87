#!/usr/bin/env python3
"""Tables beyond HBM: embscale's host-resident tables and row cache against FBGEMM's UVM paths, same run.

Impls (the records' "impl"), each a training TBE with exact row-wise Adagrad, fp32 tables and output, pooled
SUM, no bounds checks, no stochastic rounding:
  embscale_cached  embscale.TableBatchedEmbeddingBags, every table "cached": tables in host memory, an HBM row
                   cache of cache_load_factor x the rows (the row-wise state moves with its row)
  fbgemm_cached    FBGEMM's SplitTableBatchedEmbeddingBagsCodegen, EmbeddingLocation.MANAGED_CACHING with the
                   same cache_load_factor (its cache holds that share of all rows, in 32-way sets: the same HBM
                   budget) and CacheAlgorithm.LRU (--cache-algorithm lfu: LFU for both)
  embscale_host    every table "host": each batch's rows staged into HBM and written back (no cache)
  fbgemm_managed   EmbeddingLocation.MANAGED: the tables in UVM, read and written over the host link in place
  embscale_device, fbgemm_device   every table in HBM (EmbeddingLocation.DEVICE): the all-HBM reference, run
                   where the tables fit in device memory
A case is one placement (cached at one load factor, host/managed, device) and one id distribution; its two
impls are compared on the same inputs. Run order: device, cached at the first of --load-factors, host, the
other load factors (what a short --time-budget leaves out comes last).

Workload: T tables (--num-tables) of E rows and D columns, E = --gb GiB / (4 * D * T); batches of B bags of
L lookups per table, FBGEMM's layout (offsets [T*B+1], table-major), indices uniform (alpha 0) or Zipf(alpha)
from bench/torch_tbe_peers.py's make_indices. Every index set of one alpha comes from one draw, so a Zipf
distribution keeps the same hot rows from batch to batch (a cache has something to hold); the sets are made
once on the device and every impl runs the same sequence: sets 0-2 (the check's steps), --warmup sets to
reach the cache's steady state, then --iters timed sets, each step a forward and a backward with the fused
update (grad_output uniform in [-0.5, 0.5], the same for every step). There are --index-sets distinct sets
(default warmup + iters + 3, so no timed set repeats; fewer rotate).

Same tables and the check: where both impls of a case are resident at once, FBGEMM's tables (initialised
uniformly in [-1, 1]; they start at zero) and its optimizer state are copied into embscale's (fp32, through
both modules' split_embedding_weights() / split_optimizer_states() views), both take the same three steps
(sets 0-2), and a random sample of the rows those steps touched (--check-rows per table) must agree: weights
and row-wise state each within --tolerance (max |a - b| / max |b|, default 1e-5). A case that disagrees is
reported and not timed (exit status 1). Later distributions check again from the states the earlier timed
steps left (identical steps on both, so still equal up to rounding). --one-impl-at-a-time (for table sets that
fit host memory once, e.g. 96 GiB on a 128 GiB host) builds, runs and frees one impl before the next: there
is no copy and no check against FBGEMM, each impl keeps its own initial tables (values do not change the work).
Instead (--replay-check, on by default) an embscale impl run alone is checked against itself in HBM: before
the check's three steps, the rows they touch (each table's unique rows, with their row-wise state) are copied
into an all-HBM module of those rows alone; the same steps, their ids remapped, run on it; afterwards the
touched rows must agree (--tolerance) and a random sample of untouched rows (--check-rows per table) must
not have changed at all.

Timing (CUDA): after the warm-up, CUDA events around each timed step give median_ms, p10_ms and p90_ms;
the same loop, the device synchronised only before and after it, gives loop_ms (wall time per step: what a
training loop runs at, the host's time included where it exceeds the device's). --prefetch (cached impls,
off by default): batch i+1 is planned on a side stream after step i's forward, TorchRec's prefetch pipeline
(embscale's prefetch(); FBGEMM built with prefetch_pipeline=True, prefetch(..., forward_stream=)); the check's
steps run without it.

Counters over the timed steps: embscale's cache_stats() deltas (hit_rate = hits / unique_lookups; misses,
conflict misses, evictions, rows fetched and written back per step); FBGEMM's own counters when
--fbgemm-cache-stats on (gather_uvm_cache_stats=True: get_uvm_cache_stats() deltas, hit_rate =
1 - unique_misses / unique_indices); FBGEMM's module has no counters without a cache (hit_rate null).
FBGEMM's periodic stats log (a host read-back at its steps 100, 200, ...) is switched off so no timed step
waits on it.

The host link, measured at the start of the run: a 1 GiB pinned host tensor copied to the device (H2D),
back (D2H) and both at once on two streams (GB/s = 1e9 bytes/s). The floor of a case that moves rows:
floor_ms = rows moved per step x the row's bytes (4 * D; the row-wise state need not cross: embscale keeps it in
device memory) / the both-ways bandwidth, and pct_of_floor = floor_ms / median_ms. Rows moved: embscale's rows_fetched +
rows_written_back per step (measured); fbgemm_cached 2 x its unique misses (each brings a row in and evicts
one; an estimate, "rows_moved_source" says so); fbgemm_managed 2 x the unique rows of the batch (the least
any placement must move).

Memory: per impl the device memory its construction took (cudaMemGetInfo before and after, device_bytes;
torch's allocator's share, allocated_bytes), the peak torch allocation during its steps (peak_allocated_bytes:
the whole process's, so in a paired case it includes the other impl) and, for the cached impls, the cache's
rows where the module tells them and the cache's device bytes after the timed steps (cache_device_bytes:
embscale's cache rows, their state, the staging rows and the plans, which it builds at the first batch, so
device_bytes misses them; FBGEMM's cache rows and cache state). FBGEMM's UVM tables are managed memory
(--fbgemm-uvm managed, the default and FBGEMM's: cudaMallocManaged advised to stay on the host), at every size:
96 GiB of it trains on an 80 GB H100. --fbgemm-uvm host_mapped (malloc + cudaHostRegister) is FBGEMM's other
option, 3.6x (uniform) to 4.2x (Zipf) slower there (bench/results/2026-12-06-nvidia-h100-tbe-cache-96gib-fbgemm-host-mapped.jsonl);
the records say which ("fbgemm_uvm").

Output: one JSON record per (impl, case) appended to --out (and printed when --out is not given), with
status "ok", "failed" (error), "check_failed" or "skipped" (time budget, memory); a summary record per
case (record "summary": fbgemm/embscale ratios, embscale's share of the link floor and its time over its own
all-HBM step, and the issue's goals met or not); a table on stdout at the end. --time-budget stops before
work its estimate says would not end in time, recording what was done. --dry-run runs the whole plan with
a simulated device and made-up numbers (records marked dry_run; refused under bench/results/).

On the GPU machine: scripts/tbe_cache_peers.sh (16 GiB in one call; 96 GiB one impl at a time, in its own
calls). CPU smoke test (FBGEMM's CPU TBE from fbgemm-gpu-cpu for the device pair; its cache and UVM paths
need CUDA and are skipped):
    EMBSCALE_LIBRARY=build/libembscale_c.so PYTHONPATH=python python3 bench/tbe_cache_vs_fbgemm.py --device cpu \\
        --gb 0.01 --num-tables 4 --batch-size 64 --warmup 2 --iters 3
"""
import argparse
import datetime
import gc
import json
import math
import os
import statistics
import sys
import time

PROCESS_START = time.monotonic()  # the time budget counts from here (torch's and FBGEMM's imports included)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from build_info import build_id  # noqa: E402
from torch_tbe_peers import make_indices, nonneg_int, parse_alphas, positive_int  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMPLS = ("embscale_cached", "fbgemm_cached", "embscale_host", "fbgemm_managed", "embscale_device", "fbgemm_device")
# Placement classes; each lists FBGEMM's impl first, since embscale's tables are copied from FBGEMM's.
GROUPS = (("device", ("fbgemm_device", "embscale_device")),
          ("cached", ("fbgemm_cached", "embscale_cached")),
          ("host", ("fbgemm_managed", "embscale_host")))
GROUP_OF = {impl: g for g, pair in GROUPS for impl in pair}
ES_PLACEMENT = {"embscale_cached": "cached", "embscale_host": "host", "embscale_device": "device"}
FB_LOCATION = {"fbgemm_cached": "MANAGED_CACHING", "fbgemm_managed": "MANAGED", "fbgemm_device": "DEVICE"}
CHECK_STEPS = 3
GIB = 1 << 30
# Time-budget estimates until the run has measured its own (seconds per GiB of tables, seconds per step).
BUILD_S_PER_GIB = {"host": 2.0, "uvm": 0.6, "device": 0.1}
STEP_S = {"cached": 0.12, "host": 0.15, "device": 0.01}


# ---- arguments -----------------------------------------------------------------------------------------
def parse_floats(text):
    out = []
    for s in text.split(","):
        if not s.strip():
            continue
        v = float(s)
        if not (0 < v <= 1):
            raise argparse.ArgumentTypeError(f"load factor '{s}' is not in (0, 1]")
        out.append(v)
    if not out:
        raise argparse.ArgumentTypeError("no load factor given")
    return out


def parse_impls(text):
    out = [s.strip() for s in text.split(",") if s.strip()]
    for s in out:
        if s not in IMPLS:
            raise argparse.ArgumentTypeError(f"'{s}' is not one of {', '.join(IMPLS)}")
    if not out:
        raise argparse.ArgumentTypeError("no impl given")
    return out


def positive_float(text):
    v = float(text)
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"'{text}' is not a finite value > 0")
    return v


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gb", type=positive_float, default=16.0, help="GiB of fp32 tables in all (default 16)")
    p.add_argument("--num-tables", type=positive_int, default=26)
    p.add_argument("--dim", type=positive_int, default=128, help="D of every table (a multiple of 4)")
    p.add_argument("--batch-size", type=positive_int, default=8192)
    p.add_argument("--bag-size", type=positive_int, default=20)
    p.add_argument("--alphas", type=parse_alphas, default=[0.0, 1.15], help="0 = uniform (default 0,1.15)")
    p.add_argument("--load-factors", type=parse_floats, default=[0.05, 0.1, 0.2],
                   help="cache_load_factor of the cached impls (default 0.05,0.1,0.2)")
    p.add_argument("--impls", type=parse_impls, default=None,
                   help=f"subset of {','.join(IMPLS)} (default: all that fit the device)")
    p.add_argument("--cache-algorithm", choices=("lru", "lfu"), default="lru")
    p.add_argument("--warmup", type=nonneg_int, default=30, help="untimed steps after the check's (default 30)")
    p.add_argument("--iters", type=positive_int, default=20, help="timed steps (default 20)")
    p.add_argument("--index-sets", type=positive_int, default=None,
                   help="distinct index sets per alpha (default warmup + iters + 3, at most 64)")
    p.add_argument("--check-rows", type=positive_int, default=64, help="touched rows compared per table")
    p.add_argument("--tolerance", type=positive_float, default=1e-5)
    p.add_argument("--learning-rate", type=positive_float, default=0.01)
    p.add_argument("--eps", type=positive_float, default=1e-8)
    p.add_argument("--prefetch", action="store_true",
                   help="cached impls: plan batch i+1 on a side stream during step i (TorchRec's prefetch "
                        "pipeline; FBGEMM with prefetch_pipeline=True)")
    p.add_argument("--fbgemm-uvm", choices=("managed", "host_mapped"), default="managed")
    p.add_argument("--fbgemm-cache-stats", choices=("on", "off"), default="on")
    p.add_argument("--one-impl-at-a-time", action="store_true",
                   help="build, run and free one impl before the next (no copy, no check)")
    p.add_argument("--replay-check", choices=("on", "off"), default="on",
                   help="an embscale impl run alone: replay the check's steps on an all-HBM module of the rows "
                        "they touch and compare those rows; untouched rows sampled must not change (default on)")
    p.add_argument("--link-gib", type=positive_float, default=1.0, help="pinned buffer of the link test (GiB)")
    p.add_argument("--time-budget", type=float, default=0.0, help="seconds for the whole run (0: no limit)")
    p.add_argument("--seed", type=int, default=20261206)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--out", default="", help="append the JSON records to this file")
    p.add_argument("--dry-run", action="store_true", help="simulated device, made-up numbers (never in bench/results)")
    a = p.parse_args(argv)
    a.replay_check = a.replay_check == "on"
    if a.dim % 4:
        p.error(f"--dim {a.dim}: FBGEMM needs a multiple of 4")
    if a.index_sets is None:
        a.index_sets = min(64, CHECK_STEPS + a.warmup + a.iters)
    a.index_sets = max(a.index_sets, CHECK_STEPS)
    if a.dry_run and a.out:
        results = os.path.realpath(os.path.join(ROOT, "bench", "results"))
        if os.path.realpath(a.out).startswith(results + os.sep):
            p.error("--dry-run: its numbers are made up; --out must not be under bench/results/")
    return a


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def percentile(values, q):
    """Linear interpolation between the closest ranks (numpy's default)."""
    v = sorted(values)
    if not v:
        return None
    pos = (len(v) - 1) * q
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def max_rel_err(got, ref):
    """max |got - ref| / max |ref| in fp64 (0 for equal tensors; inf when only ref is all zeros)."""
    if got.numel() == 0:
        return 0.0
    diff = float((got.double() - ref.double()).abs().max())
    if diff == 0.0:
        return 0.0
    scale = float(ref.double().abs().max())
    return diff / scale if scale > 0 else math.inf


def host_available_bytes():
    """MemAvailable from /proc/meminfo, or None where there is none."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


class Built:
    """One impl's module and what its construction cost."""

    def __init__(self, impl, module, build_s, lf=None):
        self.impl, self.module, self.build_s, self.lf = impl, module, build_s, lf
        self.lib = impl.split("_")[0]
        self.group = GROUP_OF[impl]
        self.info = {}          # record fields: memory, cache rows, FBGEMM's UVM kind
        self.pf_stream = None   # the prefetch stream (--prefetch), one per module (FBGEMM keeps the first it sees)


class Inputs:
    """One alpha's index sets (on the device), offsets, grad_output and what the records need of them."""

    def __init__(self, alpha, sets, offsets, grad, picks, unique_rows_per_step):
        self.alpha, self.sets, self.offsets, self.grad = alpha, sets, offsets, grad
        self.picks = picks                                # per table, a CPU int64 sample of rows sets 0-2 touch
        self.unique_rows_per_step = unique_rows_per_step  # mean over the timed sets

    def schedule(self, warmup, iters):
        """Set numbers of the check's steps, the warm-up and the timed steps."""
        n = len(self.sets)
        seq = [i % n for i in range(CHECK_STEPS + warmup + iters)]
        return seq[:CHECK_STEPS], seq[CHECK_STEPS:CHECK_STEPS + warmup], seq[CHECK_STEPS + warmup:]


# ---- the real device -----------------------------------------------------------------------------------
class RealEngine:
    """Builds, checks and times the modules with torch, embscale and FBGEMM."""

    def __init__(self, a):
        import torch
        import embscale
        import fbgemm_gpu
        self.torch, self.embscale, self.fbgemm_gpu, self.a = torch, embscale, fbgemm_gpu, a
        self.cuda = a.device == "cuda"
        self.dev = torch.device(a.device)
        self.gen = torch.Generator(device=self.dev)

    def now(self):
        return time.monotonic()

    def start_time(self):
        return PROCESS_START

    def info(self):
        torch = self.torch
        return dict(device=torch.cuda.get_device_name(self.dev) if self.cuda else "cpu", backend=self.a.device,
                    torch=torch.__version__, fbgemm_gpu=getattr(self.fbgemm_gpu, "__version__", None),
                    embscale=getattr(self.embscale, "__version__", None), embscale_build=build_id())

    def gpu_memory(self):
        """(free, total) device bytes, or (None, None) on the CPU."""
        if not self.cuda:
            return None, None
        return self.torch.cuda.mem_get_info(self.dev)

    def host_available(self):
        return host_available_bytes()

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize(self.dev)

    def release(self):
        gc.collect()
        if self.cuda:
            self.torch.cuda.synchronize(self.dev)
            self.torch.cuda.empty_cache()

    # -- the host link
    def measure_link(self, nbytes, reps=5):
        """Pinned host <-> device copy bandwidth, GB/s: H2D, D2H, and both at once on two streams."""
        if not self.cuda:
            return {}
        torch = self.torch
        n = int(nbytes) // 4
        h_in = torch.ones(n, dtype=torch.float32, pin_memory=True)
        h_out = torch.empty(n, dtype=torch.float32, pin_memory=True)
        d_in = torch.empty(n, dtype=torch.float32, device=self.dev)
        d_out = torch.ones(n, dtype=torch.float32, device=self.dev)
        s1, s2 = torch.cuda.Stream(self.dev), torch.cuda.Stream(self.dev)

        def timed(h2d, d2h):
            times = []
            for r in range(reps + 1):
                main = torch.cuda.current_stream(self.dev)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(main)
                s1.wait_stream(main)
                s2.wait_stream(main)
                if h2d:
                    with torch.cuda.stream(s1):
                        d_in.copy_(h_in, non_blocking=True)
                if d2h:
                    with torch.cuda.stream(s2):
                        h_out.copy_(d_out, non_blocking=True)
                main.wait_stream(s1)
                main.wait_stream(s2)
                end.record(main)
                end.synchronize()
                if r:  # the first is a warm-up
                    times.append(start.elapsed_time(end) * 1e-3)
            return (int(h2d) + int(d2h)) * n * 4 / statistics.median(times) / 1e9

        out = dict(link_h2d_GBps=timed(True, False), link_d2h_GBps=timed(False, True),
                   link_GBps=timed(True, True), link_bytes=n * 4)
        del h_in, h_out, d_in, d_out
        self.release()
        if hasattr(torch._C, "_host_emptyCache"):  # give the pinned buffers back (host memory is needed later)
            torch._C._host_emptyCache()
        return out

    # -- inputs
    def make_inputs(self, alpha, E):
        """The alpha's index sets from one draw (the same hot rows in every set), seeded by --seed."""
        torch, a = self.torch, self.a
        T, B, L = a.num_tables, a.batch_size, a.bag_size
        n = a.index_sets
        self.E = E
        self.gen.manual_seed(a.seed)
        draw = make_indices(torch, T, B * n, L, E, alpha, self.gen, self.dev)  # [T, n*B*L]
        sets = [draw[:, s * B * L:(s + 1) * B * L].reshape(-1).clone() for s in range(n)]  # each [T*B*L]
        del draw
        offsets = torch.arange(0, T * B * L + 1, L, device=self.dev, dtype=torch.int64)
        grad = torch.rand((B, T * a.dim), generator=self.gen, device=self.dev, dtype=torch.float32) - 0.5
        shift = torch.arange(T, device=self.dev, dtype=torch.int64).unsqueeze(1) * E
        inputs = Inputs(alpha, sets, offsets, grad, None, None)
        check_sets, _, timed_sets = inputs.schedule(a.warmup, a.iters)
        inputs.unique_rows_per_step = statistics.mean(
            int(torch.unique(sets[s].view(T, -1) + shift).numel()) for s in timed_sets)
        touched = torch.cat([sets[s].view(T, -1) for s in check_sets], dim=1)  # [T, 3*B*L]
        picks = []
        for t in range(T):
            rows = torch.unique(touched[t])
            order = torch.randperm(rows.numel(), generator=self.gen, device=self.dev)[:a.check_rows]
            picks.append(rows[order].cpu())
        inputs.picks = picks
        self.release()
        return inputs

    # -- modules
    def build(self, impl, E, lf):
        torch, a = self.torch, self.a
        self.release()
        free0, _ = self.gpu_memory()
        alloc0 = torch.cuda.memory_allocated(self.dev) if self.cuda else 0
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.dev)
        t0 = time.monotonic()
        extra = {}
        if impl.startswith("fbgemm"):
            module = self._build_fbgemm(impl, E, lf, extra)
        else:
            module = self._build_embscale(impl, E, lf, extra)
        self.sync()
        built = Built(impl, module, time.monotonic() - t0, lf)
        self.release()
        if self.cuda:
            free1, _ = self.gpu_memory()
            built.info.update(device_bytes=free0 - free1,
                              allocated_bytes=torch.cuda.memory_allocated(self.dev) - alloc0,
                              build_peak_allocated_bytes=torch.cuda.max_memory_allocated(self.dev) - alloc0)
            if a.prefetch and built.group == "cached":
                built.pf_stream = torch.cuda.Stream(self.dev)
        built.info.update(extra)
        return built

    def _build_fbgemm(self, impl, E, lf, extra):
        from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import (BoundsCheckMode, CacheAlgorithm,
                                                                          ComputeDevice, EmbeddingLocation,
                                                                          PoolingMode)
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen
        a = self.a
        if not self.cuda and impl != "fbgemm_device":
            raise RuntimeError(f"{impl}: FBGEMM's CPU TBE has no cache or UVM placement")
        loc = getattr(EmbeddingLocation, FB_LOCATION[impl]) if self.cuda else EmbeddingLocation.HOST
        cdev = ComputeDevice.CUDA if self.cuda else ComputeDevice.CPU
        kw = dict(optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, weights_precision=SparseType.FP32,
                  output_dtype=SparseType.FP32, stochastic_rounding=False, learning_rate=a.learning_rate,
                  eps=a.eps, pooling_mode=PoolingMode.SUM, bounds_check_mode=BoundsCheckMode.NONE,
                  device=self.dev)
        if impl == "fbgemm_cached":
            kw.update(cache_load_factor=lf, gather_uvm_cache_stats=a.fbgemm_cache_stats == "on",
                      cache_algorithm=CacheAlgorithm.LRU if a.cache_algorithm == "lru" else CacheAlgorithm.LFU,
                      prefetch_pipeline=a.prefetch)
        if impl in ("fbgemm_cached", "fbgemm_managed"):
            uvm = a.fbgemm_uvm
            kw["uvm_host_mapped"] = uvm == "host_mapped"
            extra["fbgemm_uvm"] = uvm
        fb = SplitTableBatchedEmbeddingBagsCodegen([(E, a.dim, loc, cdev)] * a.num_tables, **kw)
        fb.init_embedding_weights_uniform(-1.0, 1.0)  # FBGEMM's tables start at zero
        if impl == "fbgemm_cached":
            extra["cache_rows"] = int(fb.lxu_cache_weights.shape[0])
            if a.fbgemm_cache_stats == "on":
                # Its stats log reads the counters back to the host at steps 100, 200, ...: not inside timing.
                fb.should_log = lambda: False
        return fb

    def _build_embscale(self, impl, E, lf, extra):
        a = self.a
        placement = ES_PLACEMENT[impl]
        kw = dict(optimizer="rowwise_adagrad", learning_rate=a.learning_rate, eps=a.eps, stochastic_rounding=False,
                  device=self.dev, bounds_check="off", data_parallel_group=None)
        if placement == "cached":
            kw.update(cache_load_factor=lf, cache_algorithm=a.cache_algorithm)
        TBE = self.embscale.TableBatchedEmbeddingBags
        try:
            es = TBE([(E, a.dim, placement)] * a.num_tables, **kw)
        except (TypeError, ValueError):
            if placement != "device":
                raise
            es = TBE([(E, a.dim)] * a.num_tables, **kw)  # a constructor without placements: device it is
        rows = getattr(es, "_cache_rows", None)
        if placement == "cached" and rows:
            extra["cache_rows"] = int(sum(rows))
        return es

    def free(self, built):
        built.module = None
        built.pf_stream = None
        self.release()

    # -- state, the check
    def copy_state(self, fb_built, es_built):
        """embscale's tables and row-wise state := FBGEMM's."""
        torch = self.torch
        fb, es = fb_built.module, es_built.module
        fb.flush()
        with torch.no_grad():
            for mine, theirs in zip(es.split_embedding_weights(), fb.split_embedding_weights()):
                mine.copy_(theirs)
            for mine, theirs in zip(es.split_optimizer_states(), fb.split_optimizer_states()):
                for m, t in zip(mine, theirs):
                    m.copy_(t.reshape(m.shape))
        if hasattr(es, "load_cache"):  # the cache drops its copies of rows written through the views
            es.load_cache()
        self.sync()

    def sampled_rows(self, built, picks):
        """(weights [rows, D], row-wise state [rows]) of the picked rows, fp64 on the CPU."""
        torch, m = self.torch, built.module
        if built.lib == "fbgemm":
            m.flush()  # its cache's rows back in its UVM tables (no-op without a cache)
        with torch.no_grad():
            ws = m.split_embedding_weights()
            ss = m.split_optimizer_states()
            w = torch.cat([ws[t][p.to(ws[t].device)].double().cpu() for t, p in enumerate(picks)])
            s = torch.cat([ss[t][0].reshape(-1)[p.to(ss[t][0].device)].double().cpu() for t, p in enumerate(picks)])
        return w, s

    def steps(self, built, inputs, seq):
        """Untimed steps on the listed sets, no prefetch (the check's)."""
        stepper = Stepper(self.torch, built, inputs, prefetch=False)
        for s in seq:
            stepper.step(s, None)
        self.sync()

    def compare(self, fb_built, es_built, inputs):
        fw, fs = self.sampled_rows(fb_built, inputs.picks)
        ew, es = self.sampled_rows(es_built, inputs.picks)
        return dict(weights_max_rel_err=max_rel_err(ew, fw), state_max_rel_err=max_rel_err(es, fs),
                    check_rows=int(fw.shape[0]))

    def replay_start(self, built, inputs, seq):
        """Before the check's steps of an embscale impl run alone: an all-HBM module holding only the rows the
        steps touch (each table's sorted unique rows, with their row-wise state), the steps' index sets remapped
        to it, and a sample of untouched rows (--check-rows per table) with their values."""
        torch, a = self.torch, self.a
        m, T = built.module, a.num_tables
        touched, untouched = [], []
        for t in range(T):
            touched.append(torch.unique(torch.cat([inputs.sets[s].view(T, -1)[t] for s in seq])))
            cand = torch.randint(0, self.E, (4 * a.check_rows,), generator=self.gen, device=self.dev)
            cand = cand[~torch.isin(cand, touched[t])][:a.check_rows]
            untouched.append(cand.cpu())
        ref = self.embscale.TableBatchedEmbeddingBags(
            [(int(r.numel()), a.dim, "device") for r in touched], optimizer="rowwise_adagrad",
            learning_rate=a.learning_rate, eps=a.eps, stochastic_rounding=False, device=self.dev,
            bounds_check="off", data_parallel_group=None)
        with torch.no_grad():
            ws, ss = m.split_embedding_weights(), m.split_optimizer_states()
            rws, rss = ref.split_embedding_weights(), ref.split_optimizer_states()
            before = []
            for t in range(T):
                rows = touched[t].to(ws[t].device)
                rws[t].copy_(ws[t][rows])
                rss[t][0].reshape(-1).copy_(ss[t][0].reshape(-1)[rows.to(ss[t][0].device)])
                u = untouched[t].to(ws[t].device)
                before.append((ws[t][u].double().cpu(), ss[t][0].reshape(-1)[u.to(ss[t][0].device)].double().cpu()))
        sets = [None] * len(inputs.sets)
        for s in seq:
            idx = inputs.sets[s].view(T, -1)
            sets[s] = torch.stack([torch.searchsorted(touched[t], idx[t]) for t in range(T)]).reshape(-1)
        ref_inputs = Inputs(inputs.alpha, sets, inputs.offsets, inputs.grad, None, None)
        ref_built = Built("embscale_device", ref, 0.0)
        self.sync()
        return dict(ref=ref_built, inputs=ref_inputs, touched=touched, untouched=untouched, before=before)

    def replay_finish(self, built, replay, seq):
        """The same steps on the reference; the touched rows compared with it, the untouched sample with its
        values before the steps. Returns the check's record fields."""
        torch = self.torch
        self.steps(replay["ref"], replay["inputs"], seq)
        m, ref = built.module, replay["ref"].module
        werr = serr = 0.0
        changed = 0
        with torch.no_grad():
            ws, ss = m.split_embedding_weights(), m.split_optimizer_states()
            rws, rss = ref.split_embedding_weights(), ref.split_optimizer_states()
            for t, rows in enumerate(replay["touched"]):
                r = rows.to(ws[t].device)
                werr = max(werr, max_rel_err(ws[t][r].double().cpu(), rws[t].double().cpu()))
                serr = max(serr, max_rel_err(ss[t][0].reshape(-1)[r.to(ss[t][0].device)].double().cpu(),
                                             rss[t][0].reshape(-1).double().cpu()))
                u = replay["untouched"][t].to(ws[t].device)
                w0, s0 = replay["before"][t]
                changed += int((ws[t][u].double().cpu() != w0).any(dim=1).sum())
                changed += int((ss[t][0].reshape(-1)[u.to(ss[t][0].device)].double().cpu() != s0).sum())
        touched = sum(int(r.numel()) for r in replay["touched"])
        replay["ref"].module = None
        self.release()
        return dict(replay_weights_max_rel_err=werr, replay_state_max_rel_err=serr, replay_touched_rows=touched,
                    untouched_rows_checked=sum(int(u.numel()) for u in replay["untouched"]),
                    untouched_rows_changed=changed)

    # -- timing
    def read_counters(self, built):
        """The impl's cumulative cache counters as a dict of ints, or None (reading waits for the device)."""
        m = built.module
        if built.lib == "embscale":
            if not hasattr(m, "cache_stats"):
                return None
            return {k: int(v) for k, v in m.cache_stats().items()}
        if built.impl == "fbgemm_cached" and self.a.fbgemm_cache_stats == "on":
            names = ("calls", "requested_indices", "unique_indices", "unique_misses", "conflict_unique_misses",
                     "conflict_misses")  # FBGEMM's UVMCacheStatsIndex order
            return dict(zip(names, (int(v) for v in m.get_uvm_cache_stats().tolist())))
        return None

    def measure(self, built, inputs):
        """Warm-up, then the timed steps: per-step times (ms), loop time (ms/step), counter deltas, peak memory."""
        torch, a = self.torch, self.a
        _, warm, timed = inputs.schedule(a.warmup, a.iters)
        stepper = Stepper(torch, built, inputs, prefetch=built.pf_stream is not None)
        stepper.run(warm)
        self.sync()
        c0 = self.read_counters(built)
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.dev)
        alloc_start = torch.cuda.memory_allocated(self.dev) if self.cuda else 0
        timer = Timer(torch, self.cuda)
        self.sync()
        t0 = time.perf_counter()
        stepper.run(timed, timer)
        self.sync()
        loop_ms = (time.perf_counter() - t0) * 1e3 / len(timed)
        times = timer.take_ms()
        c1 = self.read_counters(built)
        out = dict(times_ms=times, loop_ms=loop_ms)
        if c0 is not None and c1 is not None:
            out["counters"] = {k: c1[k] - c0.get(k, 0) for k in c1}
        if self.cuda:
            out.update(peak_allocated_bytes=torch.cuda.max_memory_allocated(self.dev),
                       allocated_at_start_bytes=alloc_start)
        cache = self.cache_device_bytes(built)
        if cache is not None:
            out["cache_device_bytes"] = cache
        return out

    def cache_device_bytes(self, built):
        """Device bytes of the impl's cache as it stands after its steps (the GPU memory a placement costs
        beyond the tables it keeps in HBM): embscale's cache rows, their state, the staging rows and the plans
        (built at the first batch, so not in device_bytes); FBGEMM's cache rows and its cache state."""
        m = built.module
        if built.lib == "embscale":
            c = getattr(m, "_cache", None)
            if c is None:
                return None
            parts = [c.cache_weights, c.state, *c.cache_momentum, *c.plans]
        elif built.impl == "fbgemm_cached":
            parts = [getattr(m, n) for n in ("lxu_cache_weights", "lxu_cache_state", "lxu_state")
                     if isinstance(getattr(m, n, None), self.torch.Tensor)]
        else:
            return None
        return int(sum(t.numel() * t.element_size() for t in parts if t.is_cuda))


class Stepper:
    """Forward + backward steps of one module on an Inputs' sets; with a prefetch stream, batch i+1 is planned
    on it during step i (after step i's forward, as TorchRec's prefetch pipeline does) and step i+1 waits for
    it. run() primes the first batch and drains at the end, so its counters cover exactly its steps."""

    def __init__(self, torch, built, inputs, prefetch):
        self.torch, self.built, self.inputs = torch, built, inputs
        self.pf = built.pf_stream if prefetch else None

    def _prefetch(self, s, main):
        with self.torch.cuda.stream(self.pf):
            if self.built.lib == "fbgemm":
                self.built.module.prefetch(self.inputs.sets[s], self.inputs.offsets, forward_stream=main)
            else:
                self.built.module.prefetch(self.inputs.sets[s], self.inputs.offsets)

    def step(self, s, nxt):
        m, inputs = self.built.module, self.inputs
        main = self.torch.cuda.current_stream() if self.pf is not None else None
        if self.pf is not None:
            main.wait_stream(self.pf)
        out = m(inputs.sets[s], inputs.offsets)
        if self.pf is not None and nxt is not None:
            self._prefetch(nxt, main)
        out.backward(inputs.grad)

    def run(self, seq, timer=None):
        if not seq:
            return
        if self.pf is not None:
            main = self.torch.cuda.current_stream()
            self.pf.wait_stream(main)
            self._prefetch(seq[0], main)
        for i, s in enumerate(seq):
            nxt = seq[i + 1] if i + 1 < len(seq) else None
            if timer is None:
                self.step(s, nxt)
            else:
                timer.run(lambda s=s, nxt=nxt: self.step(s, nxt))


class Timer:
    """Per-step time: CUDA events on the GPU (read after the loop), the host clock on the CPU."""

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
            self.pending.append((time.perf_counter() - t0) * 1e3)

    def take_ms(self):
        if self.cuda:
            self.torch.cuda.synchronize()
            out = [s.elapsed_time(e) for s, e in self.pending]
        else:
            out = list(self.pending)
        self.pending = []
        return out


# ---- the simulated device (--dry-run) -------------------------------------------------------------------
class DryRunEngine:
    """The RealEngine's interface on an imaginary 80 GiB GPU with a 128 GiB host, 55 GB/s each way and 100 GB/s
    both ways: made-up times and counters from a crude model, a virtual clock for the time budget. Tests the
    plan, the budget, the records and the summary without torch."""

    GPU_TOTAL = 80 * GIB
    HOST_TOTAL = 126 * GIB

    def __init__(self, a):
        self.a = a
        self.clock = 0.0
        self.gpu_used = 2 * GIB
        self.host_used = 0
        self.resident = {}

    def now(self):
        return self.clock

    def start_time(self):
        return 0.0

    def info(self):
        return dict(device="dry-run (no device)", backend=self.a.device, torch=None, fbgemm_gpu=None,
                    embscale=None, embscale_build=build_id())

    def gpu_memory(self):
        return self.GPU_TOTAL - self.gpu_used, self.GPU_TOTAL

    def host_available(self):
        return self.HOST_TOTAL - self.host_used

    def measure_link(self, nbytes):
        self.clock += 3
        return dict(link_h2d_GBps=55.0, link_d2h_GBps=55.0, link_GBps=100.0, link_bytes=int(nbytes))

    def make_inputs(self, alpha, E):
        a = self.a
        self.clock += 2
        lookups = a.num_tables * a.batch_size * a.bag_size
        unique = lookups * (0.94 if alpha == 0 else 0.17)
        return Inputs(alpha, [None] * a.index_sets, None, None, [[0]] * a.num_tables, unique)

    def _sizes(self, impl, E, lf):
        a = self.a
        tables = a.num_tables * E * (4 * a.dim + 4)
        group = GROUP_OF[impl]
        if group == "device":
            return tables, 0
        return (int(lf * tables) if group == "cached" else GIB), tables

    def build(self, impl, E, lf):
        gpu, host = self._sizes(impl, E, lf)
        if gpu > self.gpu_memory()[0]:
            raise RuntimeError(f"CUDA out of memory (simulated): {gpu / GIB:.1f} GiB")
        if host > self.host_available():
            raise RuntimeError(f"host out of memory (simulated): {host / GIB:.1f} GiB")
        self.gpu_used += gpu
        self.host_used += host
        kind = "device" if GROUP_OF[impl] == "device" else ("host" if impl.startswith("embscale") else "uvm")
        build_s = BUILD_S_PER_GIB[kind] * self.a.gb * 0.8
        self.clock += build_s
        built = Built(impl, object(), build_s, lf)
        built.info.update(device_bytes=gpu, allocated_bytes=gpu, build_peak_allocated_bytes=gpu)
        if GROUP_OF[impl] == "cached":
            built.info["cache_rows"] = int(lf * self.a.num_tables * E)
        if impl in ("fbgemm_cached", "fbgemm_managed"):
            built.info["fbgemm_uvm"] = self.a.fbgemm_uvm
        self.resident[id(built)] = (gpu, host)
        return built

    def free(self, built):
        gpu, host = self.resident.pop(id(built), (0, 0))
        self.gpu_used -= gpu
        self.host_used -= host
        self.clock += 0.1 * self.a.gb
        built.module = None

    def release(self):
        pass

    def copy_state(self, fb_built, es_built):
        self.clock += 0.3 * self.a.gb

    def steps(self, built, inputs, seq):
        self.clock += len(seq) * self._step_ms(built, inputs.alpha) / 1e3

    def compare(self, fb_built, es_built, inputs):
        return dict(weights_max_rel_err=0.0, state_max_rel_err=0.0, check_rows=self.a.num_tables * self.a.check_rows)

    def replay_start(self, built, inputs, seq):
        self.clock += 0.05 * self.a.gb
        return {}

    def replay_finish(self, built, replay, seq):
        self.steps(built, Inputs(0.0, [], None, None, None, None), seq)
        return dict(replay_weights_max_rel_err=0.0, replay_state_max_rel_err=0.0,
                    replay_touched_rows=self.a.num_tables * self.a.batch_size * self.a.bag_size,
                    untouched_rows_checked=self.a.num_tables * self.a.check_rows, untouched_rows_changed=0)

    def _hit_rate(self, built, alpha):
        return min(0.99, 0.8 + 0.5 * built.lf) if alpha > 0 else built.lf

    def _step_ms(self, built, alpha):
        a = self.a
        lookups = a.num_tables * a.batch_size * a.bag_size
        hbm = (4.0 if alpha == 0 else 1.7) * lookups / 4.26e6
        if built.group == "device":
            return hbm * (1.0 if built.lib == "embscale" else 1.5)
        unique = lookups * (0.94 if alpha == 0 else 0.17)
        miss = unique * (1 - (self._hit_rate(built, alpha) if built.group == "cached" else 0))
        bus = 2 * miss * (4 * a.dim + 4) / 100e9 * 1e3
        return (hbm + bus) * (1.05 if built.lib == "embscale" else 1.6)

    def measure(self, built, inputs):
        a = self.a
        ms = self._step_ms(built, inputs.alpha)
        times = [ms * (1 + 0.01 * ((7 * i) % 5 - 2)) for i in range(a.iters)]
        self.clock += (a.warmup + a.iters) * ms / 1e3
        out = dict(times_ms=times, loop_ms=ms * 1.02, peak_allocated_bytes=self.gpu_used,
                   allocated_at_start_bytes=self.gpu_used)
        unique = int(inputs.unique_rows_per_step)
        if built.group != "device":
            hits = int(unique * self._hit_rate(built, inputs.alpha)) if built.group == "cached" else 0
            n = a.iters
            if built.lib == "embscale":
                misses = unique - hits
                out["counters"] = dict(unique_lookups=unique * n if built.group == "cached" else 0, hits=hits * n,
                                       misses=misses * n, conflict_misses=0, evictions=misses * n,
                                       rows_fetched=misses * n, rows_written_back=misses * n,
                                       bytes_moved=2 * misses * n * 4 * a.dim)  # row-wise state stays on the device
            elif built.impl == "fbgemm_cached" and a.fbgemm_cache_stats == "on":
                out["counters"] = dict(calls=n, requested_indices=n * a.num_tables * a.batch_size * a.bag_size,
                                       unique_indices=unique * n, unique_misses=(unique - hits) * n,
                                       conflict_unique_misses=0, conflict_misses=0)
        return out


# ---- the run --------------------------------------------------------------------------------------------
class Run:
    """Plans the cases, keeps the time budget, writes the records and the summary."""

    def __init__(self, engine, a):
        self.engine, self.a = engine, a
        self.t_start = engine.start_time()
        self.E = int(a.gb * GIB // (4 * a.dim * a.num_tables))
        self.bytes_per_row = 4 * a.dim + 4  # a row and its row-wise state: what the tables take in memory
        self.link_bytes_per_row = 4 * a.dim  # what must cross the link for a row moved (the floor)
        self.out_file = open(a.out, "a") if a.out else None
        self.status = 0
        self.records = []
        self.build_rate = dict(BUILD_S_PER_GIB)   # learnt from this run's builds
        self.step_s = {}                          # impl -> seconds per step measured in this run
        self.info = engine.info()
        self.link = {}
        self.inputs = {}

    # -- records
    def emit(self, rec):
        self.records.append(rec)
        line = json.dumps(rec)
        if self.out_file:
            self.out_file.write(line + "\n")
            self.out_file.flush()
        else:
            print(line, flush=True)

    def base(self, impl, group, lf, alpha):
        a = self.a
        now = datetime.datetime.now(datetime.timezone.utc)
        rec = dict(date=now.date().isoformat(), time=now.strftime("%H:%M"), harness="tbe_cache_vs_fbgemm",
                   op="tbe_train_rowwise_adagrad", impl=impl, placement=group, **self.info,
                   config=dict(placement=group, cache_load_factor=lf, alpha=alpha, tables_gib=a.gb,
                               num_tables=a.num_tables, embedding_dim=a.dim, batch_size=a.batch_size,
                               bag_size=a.bag_size, cache_algorithm=a.cache_algorithm, prefetch=a.prefetch),
                   num_tables=a.num_tables, batch_size=a.batch_size, embedding_dim=a.dim, bag_size=a.bag_size,
                   num_embeddings=self.E, tables_gib=a.gb, alpha=alpha, cache_load_factor=lf,
                   cache_algorithm=a.cache_algorithm if group == "cached" else None,
                   prefetch=bool(a.prefetch and group == "cached"), weights_precision="fp32", output_dtype="fp32",
                   pooling="sum", optimizer="rowwise_adagrad", learning_rate=a.learning_rate, eps=a.eps,
                   stochastic_rounding=False, bounds_check="off", indices_dtype="int64", seed=a.seed,
                   warmup=a.warmup, iters=a.iters, index_sets=a.index_sets, one_impl_at_a_time=None,
                   bytes_per_row=self.bytes_per_row, link_bytes_per_row=self.link_bytes_per_row,
                   lookups_per_step=a.num_tables * a.batch_size * a.bag_size)
        rec.update(self.link)
        if a.dry_run:
            rec["dry_run"] = True
        return rec

    def note(self, impl, group, lf, alpha, status, reason, paired=None):
        """A record of a case not timed: failed, check_failed or skipped, with the reason."""
        rec = self.base(impl, group, lf, alpha)
        rec.update(status=status, error=reason, one_impl_at_a_time=None if paired is None else not paired)
        self.emit(rec)
        log(f"{impl} {self.case_text(group, lf, alpha)}: {status}: {reason}")
        if status != "skipped":
            self.status = 1

    @staticmethod
    def case_text(group, lf, alpha):
        return f"{group}{'' if lf is None else f' lf={lf:g}'} alpha={alpha:g}"

    def timing_record(self, built, inputs, m, paired, check):
        a = self.a
        rec = self.base(built.impl, built.group, built.lf, inputs.alpha)
        times = m["times_ms"]
        med = statistics.median(times)
        rec.update(status="ok", one_impl_at_a_time=not paired, median_ms=med, p10_ms=percentile(times, 0.1),
                   p90_ms=percentile(times, 0.9), median_us=med * 1e3, loop_ms=m["loop_ms"], loop_us=m["loop_ms"] * 1e3,
                   build_s=round(built.build_s, 2), unique_rows_per_step=inputs.unique_rows_per_step, **built.info)
        for k in ("peak_allocated_bytes", "allocated_at_start_bytes", "cache_device_bytes"):
            if k in m:
                rec[k] = m[k]
        rec.update(check or dict(check="not_run (one impl at a time)" if not paired else "not_run (no peer)"))
        c = m.get("counters") if built.group != "device" else None
        n = len(times)
        hit_rate = rows_moved = None
        source = None
        if c is not None:
            rec["counters_per_step"] = {k: v / n for k, v in c.items()}
            if built.lib == "embscale":
                if c.get("unique_lookups") and built.group == "cached":
                    hit_rate = c["hits"] / c["unique_lookups"]
                rows_moved = (c["rows_fetched"] + c["rows_written_back"]) / n
                source = "embscale: rows_fetched + rows_written_back"
                rec["bytes_moved_per_step"] = c.get("bytes_moved", 0) / n
            else:
                if c.get("unique_indices"):
                    hit_rate = 1.0 - c["unique_misses"] / c["unique_indices"]
                rows_moved = 2.0 * c["unique_misses"] / n
                source = "fbgemm: 2 x unique misses (estimate)"
        elif built.impl == "fbgemm_managed":
            rows_moved = 2.0 * inputs.unique_rows_per_step
            source = "2 x unique rows (the least any placement moves)"
        elif built.group == "device":
            rows_moved, source = 0.0, "none (tables in HBM)"
        rec.update(hit_rate=hit_rate, rows_moved_per_step=rows_moved, rows_moved_source=source)
        floor = None
        if rows_moved and self.link.get("link_GBps"):
            floor = rows_moved * self.link_bytes_per_row / (self.link["link_GBps"] * 1e9) * 1e3
        rec.update(floor_ms=floor, pct_of_floor=floor / med if floor else None)
        return rec

    # -- the budget
    def elapsed(self):
        return self.engine.now() - self.t_start

    def remaining(self):
        return math.inf if self.a.time_budget <= 0 else self.a.time_budget - self.elapsed()

    def kind(self, impl):
        if GROUP_OF[impl] == "device":
            return "device"
        return "host" if impl.startswith("embscale") else "uvm"

    def est_build(self, impl):
        return self.build_rate[self.kind(impl)] * self.a.gb + 0.1 * self.a.gb  # + freeing

    def est_steps(self, impl, alphas):
        per = self.step_s.get(impl, STEP_S[GROUP_OF[impl]] * self.a.batch_size * self.a.num_tables / (8192 * 26))
        return per * len(alphas) * (CHECK_STEPS + self.a.warmup + self.a.iters) + 1.0 * len(alphas)

    def learn_build(self, built):
        self.build_rate[self.kind(built.impl)] = built.build_s / self.a.gb

    def learn_step(self, impl, m):
        s = max(statistics.median(m["times_ms"]), m["loop_ms"]) / 1e3
        self.step_s[impl] = max(s, self.step_s.get(impl, 0.0))

    # -- the plan
    def select(self):
        """[(group, lf, [impls])] in run order, dropping what cannot run here (logged)."""
        a = self.a
        chosen = list(a.impls) if a.impls else list(IMPLS)
        cuda = a.device == "cuda"
        if not cuda:
            for impl in ("fbgemm_cached", "fbgemm_managed"):
                if impl in chosen:
                    chosen.remove(impl)
                    log(f"{impl}: FBGEMM's CPU TBE has no cache or UVM placement; left out on the CPU")
        table_bytes = a.num_tables * self.E * self.bytes_per_row
        free, _ = self.engine.gpu_memory()
        if cuda and free is not None:
            inputs_bytes = len(a.alphas) * a.index_sets * a.num_tables * a.batch_size * a.bag_size * 8
            room = free - inputs_bytes - 2 * GIB
            for impl in ("embscale_device", "fbgemm_device"):
                if impl in chosen and table_bytes > room:
                    log(f"{impl}: {table_bytes / GIB:.1f} GiB of tables and state do not fit the device's "
                        f"{room / GIB:.1f} GiB free after the inputs; left out")
                    chosen.remove(impl)
        # Run order: the all-HBM reference, the first load factor, host, the other load factors (what a short
        # budget leaves out comes last).
        plan = []
        for group, pair in GROUPS:
            impls = [i for i in pair if i in chosen]
            if impls:
                plan += [(group, lf, impls) for lf in (a.load_factors if group == "cached" else [None])]
        first_cached = [c for c in plan if c[0] == "cached"][:1]
        return ([c for c in plan if c[0] == "device"] + first_cached + [c for c in plan if c[0] == "host"]
                + [c for c in plan if c[0] == "cached" and c not in first_cached])

    def can_pair(self, group, impls):
        """Both impls of a case resident at once: asked for, and room for both (else one at a time)."""
        a = self.a
        if len(impls) < 2 or a.one_impl_at_a_time:
            return False
        table_bytes = a.num_tables * self.E * self.bytes_per_row
        if group == "device":
            free, _ = self.engine.gpu_memory()
            if free is not None and 2 * table_bytes > free - 2 * GIB:
                log(f"{group}: two sets of {table_bytes / GIB:.1f} GiB do not fit the device at once; "
                    "one impl at a time")
                return False
        else:
            avail = self.engine.host_available()
            if avail is not None and 2 * table_bytes > avail - 8 * GIB:
                log(f"{group}: two sets of {table_bytes / GIB:.1f} GiB do not fit host memory "
                    f"({avail / GIB:.0f} GiB available) at once; one impl at a time")
                return False
        return True

    def room_for(self, impl):
        """None, or why building impl would exhaust host memory (the OOM killer would end the whole run)."""
        if self.kind(impl) == "device" or self.a.device != "cuda":
            return None
        need = self.a.num_tables * self.E * self.bytes_per_row + 4 * GIB
        avail = self.engine.host_available()
        if avail is not None and need > avail:
            return f"needs {need / GIB:.1f} GiB of host memory, {avail / GIB:.1f} GiB available"
        return None

    def run(self):
        a = self.a
        log(f"tbe_cache_vs_fbgemm: {self.info['device']}, torch {self.info['torch']}, fbgemm_gpu "
            f"{self.info['fbgemm_gpu']}, embscale {self.info['embscale']} ({self.info['embscale_build']}); "
            f"{a.gb:g} GiB of fp32 tables: T={a.num_tables} E={self.E} D={a.dim}, B={a.batch_size} L={a.bag_size}; "
            f"{a.warmup} warm-up + {a.iters} timed steps, {a.index_sets} index sets"
            + (f"; time budget {a.time_budget:.0f}s" if a.time_budget > 0 else ""))
        if self.E < 1:
            log(f"error: --gb {a.gb:g} holds no row")
            return 1
        plan = self.select()
        if a.device == "cuda":
            try:
                self.link = self.engine.measure_link(a.link_gib * GIB)
                log(f"host link: H2D {self.link['link_h2d_GBps']:.1f} GB/s, D2H {self.link['link_d2h_GBps']:.1f} "
                    f"GB/s, both at once {self.link['link_GBps']:.1f} GB/s  [{self.elapsed():.0f}s]")
            except Exception as e:  # noqa: BLE001 (the cases run without a floor)
                log(f"error: the link test failed ({type(e).__name__}: {e}); no floors in this run")
                self.status = 1
                self.engine.release()
        for alpha in a.alphas:
            self.inputs[alpha] = self.engine.make_inputs(alpha, self.E)
            log(f"alpha={alpha:g}: {a.index_sets} index sets, {self.inputs[alpha].unique_rows_per_step:.0f} unique "
                f"rows per step  [{self.elapsed():.0f}s]")
        for group, lf, impls in plan:
            try:
                if self.can_pair(group, impls):
                    self.run_paired(group, lf, impls)
                elif self.fits_budget(impls, group, lf, a.alphas, f"{group}{'' if lf is None else f' lf={lf:g}'}"):
                    # One at a time: the budget is asked for both first (one impl's time alone has no ratio).
                    for impl in impls:
                        self.run_alone(group, lf, impl, paired_asked=len(impls) > 1)
            except Exception as e:  # noqa: BLE001 (one case's failure must not end the run)
                for impl in impls:
                    for alpha in a.alphas:
                        self.note(impl, group, lf, alpha, "failed", f"{type(e).__name__}: {e}")
            finally:
                self.engine.release()
        self.summary()
        if self.out_file:
            self.out_file.close()
        return self.status

    def fits_budget(self, impls, group, lf, alphas, what, paired=False):
        need = sum(self.est_build(i) + self.est_steps(i, alphas) for i in impls)
        if paired:
            need += 0.3 * self.a.gb  # the copy
        if need > self.remaining():
            for impl in impls:
                for alpha in alphas:
                    self.note(impl, group, lf, alpha, "skipped",
                              f"time budget: {what} needs ~{need:.0f}s, {self.remaining():.0f}s left")
            return False
        return True

    def build(self, impl, group, lf, alphas):
        """The built impl, or None after recording why not."""
        why = self.room_for(impl)
        if why is not None:
            for alpha in alphas:
                self.note(impl, group, lf, alpha, "skipped", why)
            return None
        try:
            built = self.engine.build(impl, self.E, lf)
        except Exception as e:  # noqa: BLE001
            for alpha in alphas:
                self.note(impl, group, lf, alpha, "failed", f"build: {type(e).__name__}: {e}")
            self.engine.release()
            return None
        self.learn_build(built)
        mem = built.info.get("device_bytes")
        log(f"{impl}{'' if lf is None else f' lf={lf:g}'}: built in {built.build_s:.1f}s"
            + (f", {mem / GIB:.2f} GiB of device memory" if mem is not None else "")
            + (f", FBGEMM UVM {built.info['fbgemm_uvm']}" if "fbgemm_uvm" in built.info else "")
            + f"  [{self.elapsed():.0f}s]")
        return built

    def time_one(self, built, inputs, paired, check):
        m = self.engine.measure(built, inputs)
        self.learn_step(built.impl, m)
        rec = self.timing_record(built, inputs, m, paired, check)
        self.emit(rec)
        hr = rec["hit_rate"]
        log(f"{built.impl} {self.case_text(built.group, built.lf, inputs.alpha)}: median {rec['median_ms']:.2f} ms "
            f"(p10 {rec['p10_ms']:.2f}, p90 {rec['p90_ms']:.2f}), loop {rec['loop_ms']:.2f} ms"
            + (f", hit rate {hr:.3f}" if hr is not None else "")
            + (f", floor {rec['floor_ms']:.2f} ms ({rec['pct_of_floor']:.0%})" if rec["floor_ms"] else "")
            + f"  [{self.elapsed():.0f}s]")
        return rec

    def run_paired(self, group, lf, impls):
        a = self.a
        if not self.fits_budget(impls, group, lf, a.alphas, f"{group}{'' if lf is None else f' lf={lf:g}'}",
                                paired=True):
            return
        built = {}
        try:
            for impl in impls:
                b = self.build(impl, group, lf, a.alphas)
                if b is None:
                    break
                built[impl] = b
            if len(built) < len(impls):
                for impl in built:
                    for alpha in a.alphas:
                        self.note(impl, group, lf, alpha, "failed", "its peer could not be built; not timed alone")
                return
            fb, es = (built[i] for i in impls)
            self.engine.copy_state(fb, es)
            for alpha in a.alphas:
                inputs = self.inputs[alpha]
                if self.est_steps(fb.impl, [alpha]) + self.est_steps(es.impl, [alpha]) > self.remaining():
                    for impl in impls:
                        self.note(impl, group, lf, alpha, "skipped", "time budget")
                    continue
                try:
                    check_sets, _, _ = inputs.schedule(a.warmup, a.iters)
                    self.engine.steps(fb, inputs, check_sets)
                    self.engine.steps(es, inputs, check_sets)
                    errs = self.engine.compare(fb, es, inputs)
                except Exception as e:  # noqa: BLE001
                    for impl in impls:
                        self.note(impl, group, lf, alpha, "failed", f"check: {type(e).__name__}: {e}", paired=True)
                    continue
                ok = errs["weights_max_rel_err"] <= a.tolerance and errs["state_max_rel_err"] <= a.tolerance
                log(f"{self.case_text(group, lf, alpha)}: after {CHECK_STEPS} steps, {errs['check_rows']} touched "
                    f"rows: max rel error weights {errs['weights_max_rel_err']:.2e}, row-wise state "
                    f"{errs['state_max_rel_err']:.2e} (tolerance {a.tolerance:g})")
                check = dict(check="ok" if ok else "failed", check_tolerance=a.tolerance, **errs)
                if not ok:
                    for impl in impls:
                        self.note(impl, group, lf, alpha, "check_failed", f"embscale and FBGEMM disagree after "
                                  f"{CHECK_STEPS} steps: {errs}; not timed", paired=True)
                    continue
                for impl in impls:
                    try:
                        self.time_one(built[impl], inputs, True, check)
                    except Exception as e:  # noqa: BLE001
                        self.note(impl, group, lf, alpha, "failed", f"timing: {type(e).__name__}: {e}", paired=True)
        finally:
            for b in built.values():
                self.engine.free(b)

    def run_alone(self, group, lf, impl, paired_asked):
        a = self.a
        if not self.fits_budget([impl], group, lf, a.alphas, impl + ('' if lf is None else f' lf={lf:g}')):
            return
        b = self.build(impl, group, lf, a.alphas)
        if b is None:
            return
        try:
            for alpha in a.alphas:
                inputs = self.inputs[alpha]
                if self.est_steps(impl, [alpha]) > self.remaining():
                    self.note(impl, group, lf, alpha, "skipped", "time budget")
                    continue
                try:
                    check_sets, _, _ = inputs.schedule(a.warmup, a.iters)
                    replay = (self.engine.replay_start(b, inputs, check_sets)
                              if a.replay_check and b.lib == "embscale" else None)
                    self.engine.steps(b, inputs, check_sets)  # the same sequence as a checked case
                    check = dict(check="not_run (one impl at a time)" if paired_asked else "not_run (no peer)")
                    if replay is not None:
                        r = self.engine.replay_finish(b, replay, check_sets)
                        ok = (r["replay_weights_max_rel_err"] <= a.tolerance
                              and r["replay_state_max_rel_err"] <= a.tolerance and r["untouched_rows_changed"] == 0)
                        log(f"{impl} {self.case_text(group, lf, alpha)}: replay check after {CHECK_STEPS} steps, "
                            f"{r['replay_touched_rows']} touched rows against an all-HBM module of those rows "
                            f"alone: max rel error weights {r['replay_weights_max_rel_err']:.2e}, row-wise state "
                            f"{r['replay_state_max_rel_err']:.2e}; {r['untouched_rows_changed']} of "
                            f"{r['untouched_rows_checked']} sampled untouched rows changed")
                        check = dict(check="ok (replay)" if ok else "failed (replay)", check_tolerance=a.tolerance,
                                     **r)
                        if not ok:
                            self.note(impl, group, lf, alpha, "check_failed",
                                      f"the replay check failed: {r}; not timed", paired=False)
                            continue
                    self.time_one(b, inputs, False, check)
                except Exception as e:  # noqa: BLE001
                    self.note(impl, group, lf, alpha, "failed", f"timing: {type(e).__name__}: {e}", paired=False)
        finally:
            self.engine.free(b)

    # -- the summary
    def summary(self):
        ok = [r for r in self.records if r.get("status") == "ok"]
        device_ref = {(r["impl"], r["alpha"]): r for r in ok if r["placement"] == "device"}
        cases = {}
        for r in ok:
            cases.setdefault((r["placement"], r["cache_load_factor"], r["alpha"]), {})[r["impl"]] = r
        rows = []
        order = {g: i for i, (g, _) in enumerate(GROUPS)}
        for (group, lf, alpha) in sorted(cases, key=lambda k: (k[2], order[k[0]], k[1] or 0)):
            recs = cases[(group, lf, alpha)]
            fb_impl, es_impl = dict(GROUPS)[group]
            fb, es = recs.get(fb_impl), recs.get(es_impl)
            s = dict(record="summary", harness="tbe_cache_vs_fbgemm", date=(es or fb)["date"],
                     device=self.info["device"], placement=group, cache_load_factor=lf, alpha=alpha,
                     tables_gib=self.a.gb, num_tables=self.a.num_tables, embedding_dim=self.a.dim,
                     batch_size=self.a.batch_size,
                     bag_size=self.a.bag_size, embscale_build=self.info["embscale_build"],
                     embscale_ms=es and es["median_ms"], fbgemm_ms=fb and fb["median_ms"],
                     embscale_loop_ms=es and es["loop_ms"], fbgemm_loop_ms=fb and fb["loop_ms"],
                     embscale_hit_rate=es and es["hit_rate"], fbgemm_hit_rate=fb and fb["hit_rate"],
                     embscale_pct_of_floor=es and es["pct_of_floor"], floor_ms=es and es["floor_ms"],
                     link_bytes_per_row=self.link_bytes_per_row)
            if self.a.dry_run:
                s["dry_run"] = True
            s["ratio_fbgemm_over_embscale"] = fb["median_ms"] / es["median_ms"] if fb and es else None
            s["loop_ratio_fbgemm_over_embscale"] = fb["loop_ms"] / es["loop_ms"] if fb and es else None
            own = device_ref.get(("embscale_device", alpha))
            s["embscale_over_own_hbm"] = (es["median_ms"] / own["median_ms"]
                                          if es and own and group != "device" else None)
            goals = {}
            ratio = s["ratio_fbgemm_over_embscale"]
            if group == "cached" and alpha > 0 and ratio is not None:
                goals["zipf_cached_ge_1.5x_fbgemm"] = ratio >= 1.5
            if group == "cached" and lf is not None and abs(lf - 0.1) < 1e-9 and s["embscale_over_own_hbm"] is not None:
                goals["lf0.1_within_2x_own_hbm"] = s["embscale_over_own_hbm"] <= 2.0
            if group in ("cached", "host") and alpha == 0:
                if ratio is not None:
                    goals["uniform_ge_fbgemm"] = ratio >= 1.0
                if s["embscale_pct_of_floor"] is not None:
                    goals["uniform_ge_85pct_of_link_floor"] = s["embscale_pct_of_floor"] >= 0.85
            s["goals"] = goals
            self.emit(s)
            rows.append(s)
        self.print_table(rows)

    def print_table(self, rows):
        a = self.a
        link = self.link
        print(f"\ntbe_cache_vs_fbgemm on {self.info['device']}: {a.gb:g} GiB, T={a.num_tables} E={self.E} D={a.dim} "
              f"B={a.batch_size} L={a.bag_size}, {a.cache_algorithm.upper()}"
              + (f"; link H2D {link['link_h2d_GBps']:.1f}, D2H {link['link_d2h_GBps']:.1f}, "
                 f"both {link['link_GBps']:.1f} GB/s" if link else "")
              + (" [DRY RUN: made-up numbers]" if a.dry_run else ""))
        head = (f"{'alpha':>5} {'placement':<10}{'lf':>5} {'embscale ms':>12}{'fbgemm ms':>11}{'fb/es':>7}"
                f"{'loop fb/es':>11}{'hit es':>8}{'hit fb':>8}{'floor ms':>9}{'%floor':>7}{'es/HBM':>7}  goals")
        print(head)
        print("-" * len(head))

        def f(v, spec):
            return format(v, spec) if isinstance(v, (int, float)) else "-"

        for s in rows:
            goals = " ".join(f"{k}={'yes' if v else 'NO'}" for k, v in s["goals"].items())
            print(f"{s['alpha']:>5g} {s['placement']:<10}{f(s['cache_load_factor'], 'g'):>5} "
                  f"{f(s['embscale_ms'], '.2f'):>12}{f(s['fbgemm_ms'], '.2f'):>11}"
                  f"{f(s['ratio_fbgemm_over_embscale'], '.2f'):>7}"
                  f"{f(s['loop_ratio_fbgemm_over_embscale'], '.2f'):>11}{f(s['embscale_hit_rate'], '.3f'):>8}"
                  f"{f(s['fbgemm_hit_rate'], '.3f'):>8}{f(s['floor_ms'], '.2f'):>9}"
                  f"{f(s['embscale_pct_of_floor'] and 100 * s['embscale_pct_of_floor'], '.0f'):>7}"
                  f"{f(s['embscale_over_own_hbm'], '.2f'):>7}  {goals}")
        not_timed = [r for r in self.records if r.get("status") in ("failed", "check_failed", "skipped")]
        if not_timed:
            print("not timed:")
            for r in not_timed:
                print(f"  {r['impl']} {self.case_text(r['placement'], r['cache_load_factor'], r['alpha'])}: "
                      f"{r['status']}: {r['error']}")
        print(f"({self.elapsed():.0f}s)")


def main(argv):
    a = parse_args(argv)
    if a.dry_run:
        engine = DryRunEngine(a)
    else:
        try:
            import torch
            engine = RealEngine(a)
        except ImportError as e:
            log(f"error: {e} (needs torch, fbgemm_gpu and embscale on PYTHONPATH with EMBSCALE_LIBRARY set)")
            return 1
        if a.device == "cuda" and not torch.cuda.is_available():
            log("error: --device cuda: no CUDA device")
            return 1
    return Run(engine, a).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
