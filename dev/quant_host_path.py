#!/usr/bin/env python3
"""Where a small quantized forward's host time goes: QuantizedTableBatchedEmbeddingBags at B = 512 (T = 8
tables of 100,000 int4 rows, D = 32, L = 20, the case bench/tbe_quant_vs_fbgemm.py finds host-bound), each
piece of its call timed on its own as µs a call over back-to-back calls (the device drained at the end):

  module call   the module's forward, as a caller makes it
  _forward      the module's C call path without its checks (descriptors, output allocation, C call)
  raw C call    embscale_quant_tbe_forward through ctypes with everything built once
  _context      the C context (the current stream)
  torch.empty   the output's allocation
  torch.add     one torch kernel launch, for scale

then a cProfile of module calls (internal time, top entries). On the CPU backend the C call includes the
lookup itself. Needs embscale importable (PYTHONPATH=python, EMBSCALE_LIBRARY=<build>/libembscale_c.so):

    python3 dev/quant_host_path.py cuda
"""
import cProfile
import ctypes
import pstats
import sys
import time

import torch

import embscale
from embscale import _capi
from embscale import tbe_quant as tq
from embscale._ops_common import _context, _desc

T, E, D, B, L = 8, 100_000, 32, 512, 20


def main():
    dev = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cuda")
    torch.manual_seed(0)
    trained = embscale.TableBatchedEmbeddingBags([(E, D)] * T, optimizer="sgd", device=dev)
    q = embscale.QuantizedTableBatchedEmbeddingBags.from_float(trained, ["int4"] * T)
    idx = torch.randint(0, E, (T * B * L,), device=dev, dtype=torch.int32)
    off = torch.arange(0, T * B * L + 1, L, device=dev, dtype=torch.int32)

    def drain():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def per_call(fn, n=3000):
        for _ in range(200):
            fn()
        drain()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        drain()
        return (time.perf_counter() - t0) / n * 1e6

    h = tq._handle_of(dev, q._handle_key)
    out = torch.empty((B, T * D), device=dev)
    a = _capi.QuantTbeForwardArgs()
    a.weights, a.weights_bytes = q.weights.data_ptr(), q.weights.numel()
    a.indices, a.offsets = _desc(idx), _desc(off)
    a.batch_size = B
    a.pooling = _capi.POOLING["sum"]
    a.bounds_check = _capi.BOUNDS_CHECK["off"]
    a.output = _desc(out, (B, T * D))
    ctx = _context(dev)
    forward_c = _capi.lib.embscale_quant_tbe_forward
    with torch.no_grad():
        pieces = {
            "module call": lambda: q(idx, off),
            "_forward": lambda: tq._forward(h, q.weights, idx, off, None, "sum", "off", torch.float32, None),
            "raw C call": lambda: forward_c(h.ptr, ctypes.byref(ctx), ctypes.byref(a)),
            "_context": lambda: _context(dev),
            "torch.empty": lambda: torch.empty((B, T * D), device=dev),
            "torch.add": lambda: torch.add(out, 1.0),
        }
        for name, fn in pieces.items():
            print(f"{name:14s} {per_call(fn):8.1f} µs")
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(3000):
            q(idx, off)
        profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(16)


if __name__ == "__main__":
    main()
