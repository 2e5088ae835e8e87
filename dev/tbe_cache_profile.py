"""Where a cached training step's GPU time goes: per-kernel time of embscale's row cache and FBGEMM's
MANAGED_CACHING side by side (torch.profiler, CUDA activity), on the tables and index sets of
bench/tbe_cache_vs_fbgemm.py. A laboratory tool: its output guides the cache's kernels, the benchmark's
records are what the project states.

  python3 dev/tbe_cache_profile.py [--gb 16] [--alphas 0,1.15] [--load-factors 0.1]
      [--impls embscale_cached,fbgemm_cached] [--steps 5] [--prefetch] [--top 14]

Prints, per case, each kernel's GPU time per step (ms, summed over its launches) and the step's wall time;
one JSON line per case as well.
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "bench"))

import tbe_cache_vs_fbgemm as bench  # noqa: E402


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=5, help="profiled steps per case")
    p.add_argument("--top", type=int, default=14, help="kernels listed per case")
    mine, rest = p.parse_known_args(argv)
    a = bench.parse_args(rest + ["--warmup", "6", "--iters", "1"])
    import torch
    from torch.profiler import ProfilerActivity, profile

    eng = bench.RealEngine(a)
    E = int(a.gb * bench.GIB // (4 * a.dim * a.num_tables))
    impls = list(a.impls) if a.impls else ["embscale_cached", "fbgemm_cached"]
    for alpha in a.alphas:
        inputs = eng.make_inputs(alpha, E)
        for lf in a.load_factors:
            for impl in impls:
                group = bench.GROUP_OF[impl]
                built = eng.build(impl, E, lf if group == "cached" else None)
                if a.prefetch and group == "cached":
                    built.pf_stream = torch.cuda.Stream()
                stepper = bench.Stepper(torch, built, inputs, prefetch=built.pf_stream is not None)
                seq = [i % len(inputs.sets) for i in range(a.warmup + mine.steps)]
                stepper.run(seq[:a.warmup])
                eng.sync()
                t0 = time.perf_counter()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    stepper.run(seq[a.warmup:])
                    eng.sync()
                wall_ms = (time.perf_counter() - t0) * 1e3 / mine.steps
                rows = []
                for ev in prof.key_averages():
                    t = getattr(ev, "device_time_total", None)
                    if t is None:
                        t = ev.cuda_time_total
                    if t > 0:
                        rows.append((t / 1e3 / mine.steps, ev.count / mine.steps, ev.key))
                rows.sort(reverse=True)
                total = sum(r[0] for r in rows)
                head = f"{impl} alpha={alpha:g} lf={lf if group == 'cached' else '-'}"
                print(f"== {head}: wall {wall_ms:.2f} ms/step (profiled), kernels+copies {total:.2f} ms/step")
                for ms, n, name in rows[:mine.top]:
                    print(f"   {ms:8.3f} ms  x{n:5.1f}  {name[:110]}")
                print(json.dumps(dict(impl=impl, alpha=alpha, load_factor=lf, device=torch.cuda.get_device_name(),
                                      wall_ms=wall_ms, kernels=[dict(name=k, ms=m, launches=c)
                                                                for m, c, k in rows[:mine.top]])), flush=True)
                eng.free(built)
        del inputs
        eng.release()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
