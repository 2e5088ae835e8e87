#!/usr/bin/env python3
"""Host overhead of a TableBatchedEmbeddingBags step: what the Python path adds to the C call.

For each config, one thread (torch.set_num_threads(1); the library takes torch's thread count), times:

  capi      the raw C API through ctypes with descriptors, context and workspace built once
            (embscale_tbe_forward; embscale_tbe_backward with the optimizer's fused update)
  op        torch.ops.embscale.tbe_forward / tbe_backward (argument checks, descriptors, dispatch)
  module    TableBatchedEmbeddingBags forward (no_grad and with autograd) and forward + backward
            (a fixed output gradient; the backward applies the fused update)

median and min of --reps calls (wall clock, time.perf_counter) after --warmup calls, the variants
interleaved rep by rep so the load of a shared machine falls on all of them, and the overhead of each
against the C call. --profile prints a cProfile of the module's step (cumulative time, top entries):
where module - capi goes.

--device cuda: the same on the GPU, where each call only enqueues work: the host time of a call is timed
with the device idle before it (synchronised outside the timed region), and a last column gives the
device time of the step (CUDA events around it, the queue drained before: kernels plus any wait for the
host). Then the capi and module steps run --reps times back to back, synchronised at the end, as in a
training loop: the module's time per step against the C calls' is the host path's cost where it is not
hidden behind the kernels. The "bench" and "bench-zipf" configs are the GPU benchmarks' shape (T=32
tables of 2^22 rows, D=32, B=8192, L=20: 16 GiB of fp32 tables), uniform and Zipf(1.15) indices.
--bounds-check sets the mode of every path (default off; warn shows what the module's warn-mode reports
cost the host).

Needs embscale importable (PYTHONPATH=python, EMBSCALE_LIBRARY=<build>/libembscale_c.so).
"""
import argparse
import cProfile
import ctypes
import os
import pstats
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import embscale  # noqa: E402
from torch_tbe_peers import make_indices  # noqa: E402
from embscale import _capi, ops  # noqa: E402
from embscale._ops_common import _context, _desc, _optional_desc  # noqa: E402

# name -> (T, E, D, B, L, alpha); alpha 0: uniform indices, else Zipf(alpha) (bench/torch_tbe_peers.py's generator)
CONFIGS = {"tiny": (2, 100, 16, 8, 2, 0.0), "medium": (8, 10_000, 64, 256, 20, 0.0),
           "bench": (32, 1 << 22, 32, 8192, 20, 0.0), "bench-zipf": (32, 1 << 22, 32, 8192, 20, 1.15)}


def make_inputs(T, E, D, B, L, alpha, seed, device):
    """Indices (uniform or Zipf), bags of exactly L, and an output gradient [B, T*D], all from `seed`."""
    g = torch.Generator().manual_seed(seed)
    indices = make_indices(torch, T, B, L, E, alpha, g, torch.device("cpu")).reshape(-1)
    offsets = torch.arange(0, T * B * L + 1, L, dtype=torch.int64)
    return indices.to(device), offsets.to(device), torch.randn(B, T * D, generator=g).to(device)


def capi_calls(tbe, indices, offsets, grad_output, check):
    """The forward and the backward as bare ctypes calls, everything prebuilt (bounds-check mode `check`)."""
    h = ops.tbe_handle(tbe._handle_id)
    dev = grad_output.device
    ptr, ctx = ctypes.c_void_p(h.ptr), _context(dev)
    out = torch.empty(grad_output.shape, device=dev)
    skipped = torch.zeros(1, dtype=torch.int64, device=dev)
    f = _capi.TbeForwardArgs()
    f.weights, f.indices, f.offsets = _desc(tbe.weights), _desc(indices), _desc(offsets)
    f.batch_size, f.pooling, f.bounds_check = grad_output.shape[0], _capi.POOLING["sum"], _capi.BOUNDS_CHECK[check]
    f.output, f.num_skipped = _desc(out, tuple(out.shape)), skipped.data_ptr()
    b = _capi.TbeBackwardArgs()
    b.weights, b.indices, b.offsets = _desc(tbe.weights), _desc(indices), _desc(offsets)
    b.batch_size, b.pooling, b.bounds_check = f.batch_size, f.pooling, f.bounds_check
    b.grad_output = _desc(grad_output, tuple(grad_output.shape))
    b.momentum1, b.momentum2 = _optional_desc(None), _optional_desc(None)
    b.optimizer.type, b.optimizer.learning_rate, b.optimizer.step = _capi.OPTIMIZER["sgd"], 1e-6, 1
    nbytes = ctypes.c_size_t(0)
    _capi.check(_capi.lib.embscale_tbe_backward_workspace_size(ptr, ctypes.byref(ctx), ctypes.byref(b),
                                                               ctypes.byref(nbytes)))
    ws = torch.empty(nbytes.value, dtype=torch.uint8, device=dev)
    ws_ptr = ws.data_ptr() if nbytes.value else None
    fwd_fn, bwd_fn = _capi.lib.embscale_tbe_forward, _capi.lib.embscale_tbe_backward
    ctx_ref, f_ref, b_ref = ctypes.byref(ctx), ctypes.byref(f), ctypes.byref(b)

    def forward():
        _capi.check(fwd_fn(ptr, ctx_ref, f_ref))

    def step():
        _capi.check(fwd_fn(ptr, ctx_ref, f_ref))
        _capi.check(bwd_fn(ptr, ctx_ref, b_ref, ws_ptr, nbytes.value))

    keep = (out, skipped, ws)  # the descriptors point into these
    return forward, step, keep


def variants(T, E, D, B, L, alpha, seed, device, check):
    tbe = embscale.TableBatchedEmbeddingBags([(E, D)] * T, optimizer="sgd", learning_rate=1e-6, bounds_check=check,
                                             data_parallel_group=None, device=device)
    indices, offsets, grad_output = make_inputs(T, E, D, B, L, alpha, seed, device)
    capi_forward, capi_step, keep = capi_calls(tbe, indices, offsets, grad_output, check)
    cfg = (tbe._handle_id, B, "sum", check, T * D, torch.float32)

    def op_forward():
        return torch.ops.embscale.tbe_forward(tbe.weights, indices, offsets, None, *cfg)

    def op_step():
        torch.ops.embscale.tbe_forward(tbe.weights, indices, offsets, None, *cfg)
        torch.ops.embscale.tbe_backward(tbe.weights, tbe.momentum1, tbe.momentum2, tbe.hparams, grad_output, indices,
                                        offsets, None, tbe._handle_id, B, "sum", check, "sgd", "none", False, 0,
                                        False)

    def module_forward_no_grad():
        with torch.no_grad():
            return tbe(indices, offsets)

    def module_forward():
        return tbe(indices, offsets)

    def module_step():
        tbe(indices, offsets).backward(grad_output)

    return {"capi forward": capi_forward, "op forward": op_forward, "module forward (no_grad)": module_forward_no_grad,
            "module forward": module_forward, "capi step": capi_step, "op step": op_step,
            "module step": module_step}, keep


def time_variants(fns, reps, warmup, cuda):
    """name -> (median, min) host µs, and on CUDA name -> median device µs (events, queue drained first)."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples = {name: [] for name in fns}
    events = {name: [] for name in fns}
    names = list(fns)
    for r in range(reps):
        order = names if r % 2 == 0 else names[::-1]
        for name in order:
            if cuda:
                torch.cuda.synchronize()
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
            t0 = time.perf_counter()
            fns[name]()
            samples[name].append(time.perf_counter() - t0)
            if cuda:
                e1.record()
                events[name].append((e0, e1))
    if cuda:
        torch.cuda.synchronize()
    host = {name: (statistics.median(s) * 1e6, min(s) * 1e6) for name, s in samples.items()}
    dev = {name: statistics.median(a.elapsed_time(b) * 1e3 for a, b in ev) for name, ev in events.items() if ev}
    return host, dev


def back_to_back(fns, names, reps):
    """µs per call of each fn called `reps` times in a row, the device synchronised only at the end: the
    time of a training loop, where the host path is hidden as long as it is shorter than the kernels."""
    out = {}
    for name in names:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fns[name]()
        torch.cuda.synchronize()
        out[name] = (time.perf_counter() - t0) * 1e6 / reps
    return out


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated subset of {', '.join(CONFIGS)}")
    p.add_argument("--reps", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--seed", type=int, default=20261201)
    p.add_argument("--profile", action="store_true", help="also print a cProfile of the module step")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--bounds-check", choices=("off", "warn", "skip", "error"), default="off",
                   help="the bounds-check mode of every path (default off)")
    a = p.parse_args(argv)
    device = torch.device(a.device)
    torch.set_num_threads(1)
    print(f"embscale {_capi.version()}, torch "
          f"{torch.__version__}, seed {a.seed}, reps {a.reps}, load average {os.getloadavg()[0]:.2f}")
    for name in a.configs.split(","):
        T, E, D, B, L, alpha = CONFIGS[name]
        fns, keep = variants(T, E, D, B, L, alpha, a.seed, device, a.bounds_check)
        res, dev = time_variants(fns, a.reps, a.warmup, device.type == "cuda")
        print(f"\n{name}: T={T} E={E} D={D} B={B} L={L} alpha={alpha:g} (sgd, bounds_check {a.bounds_check}, {a.device})")
        print(f"{'':28s} {'median us':>10s} {'min us':>10s} {'+median vs capi':>16s}"
              + (f" {'device us':>10s}" if dev else ""))
        for v, (med, mn) in res.items():
            base = res["capi step" if "step" in v else "capi forward"][0]
            print(f"{v:28s} {med:10.1f} {mn:10.1f} {med - base:16.1f}" + (f" {dev[v]:10.1f}" if dev else ""))
        if device.type == "cuda":
            back = back_to_back(fns, ("capi step", "module step"), a.reps)
            print(f"steps back to back (host never waits): capi {back['capi step']:.1f} us/step, module "
                  f"{back['module step']:.1f} us/step ({back['module step'] / back['capi step']:.3f}x)")
        if a.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(a.reps):
                fns["module step"]()
                if device.type == "cuda":
                    torch.cuda.synchronize()
            prof.disable()
            print(f"\ncProfile of {a.reps} module steps ({name}), by own time:")
            pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(25)
        del keep
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
