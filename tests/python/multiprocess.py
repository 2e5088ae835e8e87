"""Runs a function in several processes joined by a process group on this machine, for the tests of
data-parallel and sharded training: every process calls worker(rank, world, *args) and its return value
comes back (torch.save'd, tensors moved to the CPU) to the caller. The group is gloo on the CPU, or NCCL
with one GPU a process where EMBSCALE_TEST_DIST_DEVICE=cuda (``device()`` says which); ``worlds()`` gives
the world sizes the tests take (2 and 3, or 1 on a machine of one GPU). A process that
raises makes run() raise with its traceback; a run that does not finish within `timeout` seconds is
ended (no hang). ``run_cases()`` is the run a module's sharded-training tests share: every case's batches drawn
from one seeded generator and trained in one set of processes."""
import datetime
import os
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def device(rank=0):
    """The device the processes of run() compute on: cpu, or cuda:<rank> with EMBSCALE_TEST_DIST_DEVICE=cuda."""
    if os.environ.get("EMBSCALE_TEST_DIST_DEVICE", "cpu") == "cuda":
        return torch.device("cuda", rank)
    return torch.device("cpu")


def worlds(on_cpu=(2, 3)):
    """The world sizes the distributed tests run at: EMBSCALE_TEST_WORLDS (comma-separated, e.g. "1" or
    "1,2,3") where set; [1] on a machine of one GPU with EMBSCALE_TEST_DIST_DEVICE=cuda (NCCL at world size
    1: scripts/gpu_run.sh's nccl stage); [2, 3] on more GPUs (a size beyond the GPUs present skips);
    `on_cpu` on gloo."""
    given = os.environ.get("EMBSCALE_TEST_WORLDS", "").strip()
    if given:
        sizes = [int(w) for w in given.split(",") if w.strip()]
        if not sizes or min(sizes) < 1:
            raise ValueError(f"EMBSCALE_TEST_WORLDS: {given!r} is not a list of world sizes >= 1")
        return sizes
    if device().type == "cuda":
        return [1] if torch.cuda.device_count() == 1 else [2, 3]
    return list(on_cpu)


def skip_unless_enough_devices(world):
    """Skips the calling test where the processes need more GPUs than there are."""
    import pytest

    if device().type == "cuda" and torch.cuda.device_count() < world:
        pytest.skip(f"{world} processes need {world} GPUs; {torch.cuda.device_count()} present")


def _to_cpu(x):
    if isinstance(x, torch.Tensor):
        return x.cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(_to_cpu(v) for v in x)
    if isinstance(x, dict):
        return {k: _to_cpu(v) for k, v in x.items()}
    return x


def _entry(worker, rank, world, folder, timeout, cuda_backend, args):
    try:
        dev = device(rank)
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group(cuda_backend if dev.type == "cuda" else "gloo", init_method=f"file://{folder}/store",
                                rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout))
        result = worker(rank, world, *args)
        torch.save(_to_cpu(result), os.path.join(folder, f"{rank}.pt"))
        dist.barrier()  # no process tears its connections down while another still uses them
        dist.destroy_process_group()
    except BaseException:
        with open(os.path.join(folder, f"{rank}.err"), "w") as f:
            f.write(traceback.format_exc())
        raise SystemExit(1)
    # The result is written and the group is gone: leave without the interpreter's teardown. There a
    # thread of torch's distributed stack still running at exit once aborted a rank after a successful
    # torch.distributed.checkpoint save ("terminate called without an active exception", exit status -6),
    # which is nothing the worker did.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run(worker, world, *args, timeout=180, cuda_backend="nccl"):
    """[worker's result on rank r for r in range(world)]; RuntimeError with the first failing process's
    traceback, TimeoutError when the processes have not all finished after `timeout` seconds. On GPUs the
    group's backend is `cuda_backend`."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as folder:
        procs = [ctx.Process(target=_entry, args=(worker, r, world, folder, timeout, cuda_backend, args))
                 for r in range(world)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for r in hung:
            procs[r].kill()
            procs[r].join()
        errors = []
        for r in range(world):
            path = os.path.join(folder, f"{r}.err")
            if os.path.exists(path):
                with open(path) as f:
                    errors.append(f"rank {r}:\n{f.read()}")
        if errors:
            raise RuntimeError("\n".join(errors))
        if hung:
            raise TimeoutError(f"ranks {hung} did not finish within {timeout} s")
        for r, p in enumerate(procs):
            if p.exitcode != 0:
                raise RuntimeError(f"rank {r} exited with status {p.exitcode}")
        return [torch.load(os.path.join(folder, f"{r}.pt"), weights_only=False) for r in range(world)]


def run_cases(worker, world, seed, cases, draw, *args, timeout=600):
    """Skips where the processes need more GPUs than there are; draws each case's batches in turn,
    draw(generator, case), from one generator seeded `seed`, and runs worker(rank, world, *args, cases,
    batches) in `world` processes: (the batches, every rank's result)."""
    skip_unless_enough_devices(world)
    gen = torch.Generator().manual_seed(seed)
    batches = [draw(gen, case) for case in cases]
    return batches, run(worker, world, *args, cases, batches, timeout=timeout)
