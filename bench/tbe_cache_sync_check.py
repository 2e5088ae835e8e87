#!/usr/bin/env python3
"""Does a cached training step wait for the device? A profile of embscale's cached path, on CUDA.

Builds embscale.TableBatchedEmbeddingBags with every table "cached" (exact row-wise Adagrad, fp32), trains
--warmup steps, then profiles --steps steps (forward, backward with the fused update; with --prefetch the next
batch planned on a side stream, TorchRec's prefetch pipeline) with torch.profiler, recording every CUDA
runtime and driver call the process makes, the library's own included. It counts the calls that block the
host until the device has caught up (stream, device and event synchronisation, synchronous memcpy and
memset, cudaMalloc/cudaFree and their host variants) and, as a second witness, runs the same steps under
torch.cuda.set_sync_debug_mode("error"), which raises on any synchronising call torch makes.

Prints one JSON record (and appends it to --out): the blocking calls per step by name, the runtime calls per
step, and "host_syncs_per_step" (their sum). Exit status 1 when a step synchronised.
"""
import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

BLOCKING = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpy2D",
            "cudaMemset", "cudaMalloc", "cudaFree", "cudaMallocHost", "cudaFreeHost", "cudaHostAlloc",
            "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize", "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2",
            "cuMemAlloc_v2", "cuMemFree_v2")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--num-tables", type=int, default=8)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8192)
    p.add_argument("--bag-size", type=int, default=20)
    p.add_argument("--cache-load-factor", type=float, default=0.1)
    p.add_argument("--alpha", type=float, default=1.15, help="Zipf exponent of the ids (0: uniform)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--prefetch", action="store_true")
    p.add_argument("--seed", type=int, default=20261206)
    p.add_argument("--out", default="")
    a = p.parse_args(argv)

    import torch
    from torch.profiler import ProfilerActivity, profile

    import embscale
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from torch_tbe_peers import make_indices

    print(f"seed {a.seed}", file=sys.stderr)
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev)
    gen.manual_seed(a.seed)
    T, B, L = a.num_tables, a.batch_size, a.bag_size
    m = embscale.TableBatchedEmbeddingBags([(a.rows, a.dim, "cached")] * T, optimizer="rowwise_adagrad",
                                           learning_rate=0.01, device=dev, cache_load_factor=a.cache_load_factor)
    n = a.warmup + a.steps + 1
    draw = make_indices(torch, T, B * n, L, a.rows, a.alpha, gen, dev)
    sets = [draw[:, s * B * L:(s + 1) * B * L].reshape(-1).clone() for s in range(n)]
    offsets = torch.arange(0, T * B * L + 1, L, device=dev, dtype=torch.int64)
    grad = torch.rand((B, T * a.dim), generator=gen, device=dev) - 0.5
    side = torch.cuda.Stream(dev) if a.prefetch else None

    def run(seq):
        main = torch.cuda.current_stream()
        if side is not None:
            side.wait_stream(main)
            with torch.cuda.stream(side):
                m.prefetch(sets[seq[0]], offsets)
        for i, s in enumerate(seq):
            if side is not None:
                main.wait_stream(side)
            out = m(sets[s], offsets)
            if side is not None and i + 1 < len(seq):
                with torch.cuda.stream(side):
                    m.prefetch(sets[seq[i + 1]], offsets)
            out.backward(grad)

    run(list(range(a.warmup)))
    torch.cuda.synchronize()
    timed = list(range(a.warmup, a.warmup + a.steps))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run(timed)
        torch.cuda.synchronize()  # outside the steps: the one wait at the end (subtracted below)
    names = {}
    for e in prof.events():
        names[e.name] = names.get(e.name, 0) + 1
    runtime = {k: v for k, v in names.items() if k.startswith(("cuda", "cu")) and not k.startswith("cudaGetLastError")}
    blocking = {k: v for k, v in runtime.items() if k in BLOCKING}
    # The profile's own closing synchronisation (torch.cuda.synchronize -> cudaDeviceSynchronize) is not a step's.
    if blocking.get("cudaDeviceSynchronize"):
        blocking["cudaDeviceSynchronize"] -= 1
        if not blocking["cudaDeviceSynchronize"]:
            del blocking["cudaDeviceSynchronize"]
    syncs = sum(blocking.values())

    torch.cuda.synchronize()
    debug_error = None
    torch.cuda.set_sync_debug_mode("error")
    try:
        run(list(range(a.warmup, a.warmup + a.steps)))
    except RuntimeError as e:
        debug_error = str(e).splitlines()[0]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()

    rec = dict(date=time.strftime("%Y-%m-%d"), harness="tbe_cache_sync_check", device=torch.cuda.get_device_name(dev),
               torch=torch.__version__, embscale=getattr(embscale, "__version__", None),
               config=dict(num_tables=T, rows=a.rows, dim=a.dim, batch_size=B, bag_size=L,
                           cache_load_factor=a.cache_load_factor, alpha=a.alpha, prefetch=a.prefetch),
               steps=a.steps, blocking_calls=blocking, host_syncs_per_step=syncs / a.steps,
               runtime_calls_per_step={k: v / a.steps for k, v in sorted(runtime.items())},
               torch_sync_debug_error=debug_error, seed=a.seed)
    line = json.dumps(rec)
    print(line)
    if a.out:
        with open(a.out, "a") as f:
            f.write(line + "\n")
    return 0 if syncs == 0 and debug_error is None else 1


if __name__ == "__main__":
    sys.exit(main())
