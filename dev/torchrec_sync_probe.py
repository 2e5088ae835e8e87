#!/usr/bin/env python3
"""Where a TorchRec training step's host waits for the GPU: bench/torchrec_step.py's DLRM-style model under
DistributedModelParallel (NCCL, world size 1), embscale's sharder and TorchRec's own FBGEMM kernel in turn.

For each impl, after a few steps:
  1. torch's sync debug mode over one step: every torch operation that waits for the device (item(), a
     device-to-host copy, nonzero, ...), counted by message, then the stack of the first one;
  2. torch.profiler over three steps: the CUDA runtime and driver calls the host made, with their count
     and host time (a cudaStreamSynchronize or a blocking copy made inside a C library shows here, where
     torch's debug mode cannot see it).

Where bench/torchrec_step.py's host_us of one impl follows its step_us and the other's does not, the first
waits for the device inside the step; this says where. Needs a GPU, TorchRec and FBGEMM_GPU importable and
embscale's CUDA library (EMBSCALE_LIBRARY, PYTHONPATH=python):

    python3 dev/torchrec_sync_probe.py --config dlrm26_d128 --impls embscale,torchrec
"""
import argparse
import collections
import os
import sys
import traceback
import warnings

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import torchrec_step as ts  # noqa: E402


def probe(impl, cfg, a, dev):
    dmp, opt = ts.build(impl, cfg, a, 0, 1, dev)
    batches = ts.make_batches(cfg, a, 0, 1, dev, a.seed + 7)
    loss_fn = nn.functional.binary_cross_entropy_with_logits

    def step(i):
        kjt, dense, labels = batches[i % len(batches)]
        opt.zero_grad()
        loss_fn(dmp(kjt, dense), labels).backward()
        opt.step()

    for i in range(5):
        step(i)
    torch.cuda.synchronize()

    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step(0)
        torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("default")
    sites = collections.Counter(str(w.message)[:120] for w in caught)
    print(f"[{impl}] torch operations that waited for the device in one step: {len(caught)}")
    for message, n in sites.most_common(10):
        print(f"   {n} x {message}")
    if caught:
        torch.cuda.set_sync_debug_mode("error")
        try:
            step(1)
        except RuntimeError:
            print(f"[{impl}] the first one:")
            print("\n".join(traceback.format_exc().splitlines()[-30:]))
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()

    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(3):
            step(i)
        torch.cuda.synchronize()
    calls = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.name.startswith("cu"):  # runtime (cuda*) and driver (cu*) calls
            calls[e.name][0] += 1
            calls[e.name][1] += e.cpu_time_total
    print(f"[{impl}] CUDA runtime and driver calls over 3 steps: count, host µs")
    for name, (n, us) in sorted(calls.items(), key=lambda kv: -kv[1][1])[:18]:
        print(f"   {name:42s} {n:6d} {us:10.0f}")
    del dmp, opt
    torch.cuda.empty_cache()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="dlrm26_d128", choices=sorted(ts.CONFIGS))
    p.add_argument("--impls", default="embscale,torchrec")
    p.add_argument("--batch-size", type=int, default=8192)
    p.add_argument("--alpha", type=float, default=0.0)
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("needs a GPU")
    a = argparse.Namespace(batch_size=args.batch_size, bag_size=20, alpha=args.alpha, sharding="table_wise",
                           lr=0.01, sets=2, seed=20261206)
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=os.environ.get("MASTER_PORT", "29541"))
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl")
    try:
        for impl in args.impls.split(","):
            probe(impl, args.config, a, dev)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
