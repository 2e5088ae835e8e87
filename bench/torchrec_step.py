#!/usr/bin/env python3
"""A DLRM-style training step under TorchRec's DistributedModelParallel: embscale's sharder against TorchRec's
own FBGEMM FUSED kernel, the same model, tables and batches, in one process (one run, same card).

For each configuration (--configs), each impl builds the same model from the same seeds: a bottom MLP over 13
dense features, a TorchRec EmbeddingBagCollection of T tables (embscale.torchrec's, sharded by its sharder, or
torchrec's, sharded by TorchRec's EmbeddingBagCollectionSharder with FBGEMM's EXACT_ROWWISE_ADAGRAD), pairwise
dot interactions and a top MLP, trained with BCE; the dense layers by Adam, the tables by the fused row-wise
Adagrad in the backward. Tables are sharded table-wise (or --sharding row_wise) over the processes (one GPU per
process; world size 1 on one GPU). Ids are uniform or Zipf(--alpha) per table, L = --bag-size per bag.

Before timing, the first step's loss of the two impls must agree (same tables, same batch): |a - b| <= 1e-4.

Measurements, per impl (medians over --iters steps after --warmup, batches rotating over --sets):
  step_us      one whole training step (zero_grad, forward, loss, backward with the fused update, Adam step),
               the device synchronised before and after (CUDA events; the host clock on the CPU);
  emb_us       the sharded collection alone: its forward (input distribution, lookup, output distribution)
               and backward (gradient distribution, fused update) on the same KJT, synchronised around;
  outside_us   step_us - emb_us: the dense model, loss and Adam;
  host_us      the host's time to issue one step (the clock from the call until it returns, no
               synchronisation inside the measured span; each step then waits for the device before the next):
               where this is below step_us the host is not the limit, and the difference between impls is the
               host time each sharded module adds.
The ratio torchrec/embscale of each is in the record (above 1: embscale faster).

JSON records (one per configuration and impl, then one with the ratios) go to --out (appended) and stdout;
progress to stderr. Run under torchrun (--nproc_per_node GPUs), or plainly for world size 1 (it then starts a
one-process group itself). A CPU smoke run (gloo; TorchRec's CPU FBGEMM):
    EMBSCALE_LIBRARY=build/libembscale_c.so PYTHONPATH=python python3 bench/torchrec_step.py --device cpu \\
        --configs small --batch-size 256 --iters 3 --warmup 1
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from build_info import build_id  # noqa: E402

# name -> (tables, rows per table (min, max: spread evenly), D)
CONFIGS = {
    "small": (4, (10_000, 10_000), 32),
    "dlrm26_d32": (26, (100_000, 2_000_000), 32),
    "dlrm26_d128": (26, (100_000, 2_000_000), 128),
}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class Dlrm(nn.Module):
    def __init__(self, ebc, features, dim):
        super().__init__()
        self.ebc, self.features, self.dim = ebc, features, dim
        self.bottom = nn.Sequential(nn.Linear(13, 256), nn.ReLU(), nn.Linear(256, dim), nn.ReLU())
        n = len(features) + 1
        self.top = nn.Sequential(nn.Linear(dim + n * (n - 1) // 2, 256), nn.ReLU(), nn.Linear(256, 1))

    def forward(self, kjt, dense):
        x = self.bottom(dense)
        pooled = self.ebc(kjt).to_dict()
        feats = torch.stack([x] + [pooled[f] for f in self.features], 1)
        inter = feats @ feats.transpose(1, 2)
        i, j = torch.triu_indices(feats.shape[1], feats.shape[1], 1, device=feats.device)
        return self.top(torch.cat([x, inter[:, i, j]], 1)).squeeze(1)


def table_rows(cfg):
    T, (lo, hi), _ = CONFIGS[cfg]
    return [lo + (hi - lo) * t // max(T - 1, 1) for t in range(T)]


def make_batches(cfg, a, rank, world, device, seed):
    """--sets batches of this process's share of the global batch: (KJT, dense, labels)."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
    T = CONFIGS[cfg][0]
    rows = table_rows(cfg)
    B = a.batch_size // world
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(a.sets):
        values = []
        for t in range(T):
            if a.alpha > 0:
                # Zipf over the table's rows: rank k drawn with weight k^-alpha (inverse CDF on a table of ranks)
                ranks = torch.arange(1, min(rows[t], 1 << 20) + 1, dtype=torch.float64)
                cdf = torch.cumsum(ranks.pow(-a.alpha), 0)
                u = torch.rand(B * a.bag_size, generator=g, dtype=torch.float64) * cdf[-1]
                ids = torch.searchsorted(cdf, u).clamp_max(rows[t] - 1)
                # spread the hot ranks over the table (a fixed permutation-like multiplier)
                ids = (ids * 2654435761) % rows[t]
            else:
                ids = torch.randint(0, rows[t], (B * a.bag_size,), generator=g)
            values.append(ids)
        lengths = torch.full((T * B,), a.bag_size, dtype=torch.int64)
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=[f"f{t}" for t in range(T)], values=torch.cat(values),
                                                  lengths=lengths)
        dense = torch.randn(B, 13, generator=g)
        labels = (torch.rand(B, generator=g) < 0.3).float()
        out.append((kjt.to(device), dense.to(device), labels.to(device)))
    return out


def build(impl, cfg, a, rank, world, device):
    """The DMP-wrapped model of `impl` and its optimizer (TorchRec's usual CombinedOptimizer setup)."""
    import torch.distributed as dist
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed import DistributedModelParallel, sharding_plan
    from torchrec.distributed.embedding_types import EmbeddingComputeKernel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder as TorchrecSharder
    from torchrec.distributed.types import ShardingEnv, ShardingPlan
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection as TorchrecEBC
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    import embscale.torchrec as es

    T, _, D = CONFIGS[cfg]
    features = [f"f{t}" for t in range(T)]
    configs = [EmbeddingBagConfig(name=f"t{t}", num_embeddings=e, embedding_dim=D, feature_names=[features[t]])
               for t, e in enumerate(table_rows(cfg))]
    hyper = {"learning_rate": a.lr, "eps": 1e-8}
    if impl == "torchrec":
        ebc = TorchrecEBC(tables=configs, device=torch.device("meta"))
        sharder = TorchrecSharder(fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, **hyper})
    else:
        ebc = es.EmbeddingBagCollection(configs, optimizer="rowwise_adagrad", device="meta", **hyper)
        sharder = es.EmbeddingBagCollectionSharder()
    torch.manual_seed(a.seed)
    model = Dlrm(ebc, features, D)
    fused = EmbeddingComputeKernel.FUSED.value  # (TorchRec's default on the CPU is its DENSE kernel)
    per_table = {"table_wise": lambda t: sharding_plan.table_wise(rank=t % world, compute_kernel=fused),
                 "row_wise": lambda t: sharding_plan.row_wise(compute_kernel=fused)}[a.sharding]
    plan = sharding_plan.construct_module_sharding_plan(
        ebc, per_param_sharding={f"t{t}": per_table(t) for t in range(T)}, local_size=world, world_size=world,
        device_type=device.type, sharder=sharder)
    dmp = DistributedModelParallel(model, env=ShardingEnv.from_process_group(dist.group.WORLD), device=device,
                                   plan=ShardingPlan({"ebc": plan}), sharders=[sharder])
    # The same starting tables in both impls: drawn from the seed, row by row of each table (the shards hold
    # their rows; a table-wise or row-wise shard is whole rows).
    with torch.no_grad():
        for name, t in dmp.state_dict().items():
            parts = name.split(".")
            if name.endswith(".weight") and "embedding_bags" in parts and hasattr(t, "local_shards"):
                table = int(parts[-2][1:])
                rows_total = table_rows(cfg)[table]
                for shard in t.local_shards():
                    r0, n = shard.metadata.shard_offsets[0], shard.metadata.shard_sizes[0]
                    gen = torch.Generator().manual_seed(a.seed * 1000 + table)
                    full = torch.empty(rows_total, D).uniform_(-0.05, 0.05, generator=gen)
                    shard.tensor.copy_(full[r0:r0 + n])
    dense = dict(in_backward_optimizer_filter(dmp.named_parameters()))
    opt = CombinedOptimizer([dmp.fused_optimizer,
                             KeyedOptimizerWrapper(dense, lambda params: torch.optim.Adam(params, lr=1e-3))])
    return dmp, opt


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device, fn, n, warmup):
    """Median µs of fn(i) over n calls after warmup, the device synchronised around each."""
    for i in range(warmup):
        fn(i)
    times = []
    for i in range(n):
        sync(device)
        t0 = time.perf_counter()
        fn(warmup + i)
        sync(device)
        times.append(1e6 * (time.perf_counter() - t0))
    return statistics.median(times)


def measure(impl, cfg, a, rank, world, device):
    dmp, opt = build(impl, cfg, a, rank, world, device)
    batches = make_batches(cfg, a, rank, world, device, a.seed + 7)
    loss_fn = nn.functional.binary_cross_entropy_with_logits

    def step(i):
        kjt, dense, labels = batches[i % len(batches)]
        opt.zero_grad()
        loss = loss_fn(dmp(kjt, dense), labels)
        loss.backward()
        opt.step()
        return loss

    first_loss = float(step(0).detach())
    step_us = timed(device, step, a.iters, a.warmup)
    ebc = dmp.module.ebc

    def embedding(i):
        kjt = batches[i % len(batches)][0]
        pooled = ebc(kjt)
        values = pooled.values() if hasattr(pooled, "values") else pooled.wait().values()
        values.backward(torch.ones_like(values) * 1e-3)

    emb_us = timed(device, embedding, a.iters, a.warmup)
    hosts = []
    for i in range(a.iters):
        sync(device)
        t0 = time.perf_counter()
        step(i)
        hosts.append(1e6 * (time.perf_counter() - t0))
        sync(device)
    return first_loss, {"step_us": step_us, "emb_us": emb_us, "outside_us": step_us - emb_us,
                        "host_us": statistics.median(hosts)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default="small,dlrm26_d32,dlrm26_d128", help=f"of {', '.join(CONFIGS)}")
    p.add_argument("--batch-size", type=int, default=8192, help="global batch")
    p.add_argument("--bag-size", type=int, default=20)
    p.add_argument("--alpha", type=float, default=0.0, help="Zipf exponent of the ids (0: uniform)")
    p.add_argument("--sharding", choices=("table_wise", "row_wise"), default="table_wise")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--sets", type=int, default=4, help="batches rotated through")
    p.add_argument("--seed", type=int, default=20261206)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--out", default="")
    a = p.parse_args()
    for cfg in a.configs.split(","):
        if cfg not in CONFIGS:
            p.error(f"--configs: {cfg!r} is not one of {', '.join(CONFIGS)}")

    import torch.distributed as dist
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("MASTER_PORT", "29533"))
    device = torch.device(a.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    status = 0
    for cfg in a.configs.split(","):
        T, (lo, hi), D = CONFIGS[cfg]
        results = {}
        losses = {}
        for impl in ("torchrec", "embscale"):
            losses[impl], results[impl] = measure(impl, cfg, a, rank, world, device)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        agree = abs(losses["torchrec"] - losses["embscale"]) <= 1e-4
        if not agree:
            status = 1
        base = {"bench": "torchrec_step", "config": cfg, "tables": T, "rows": [lo, hi], "dim": D,
                "batch_size": a.batch_size, "bag_size": a.bag_size, "alpha": a.alpha, "sharding": a.sharding,
                "world_size": world, "rank": rank, "device": card,
                "date": datetime.date.today().isoformat(), "build": build_id(),
                "first_loss": losses, "losses_agree": agree}
        records = [dict(base, impl=impl, **m) for impl, m in results.items()]
        ratios = {k: results["torchrec"][k] / results["embscale"][k] for k in ("step_us", "emb_us", "outside_us",
                                                                               "host_us")}
        records.append(dict(base, impl="torchrec/embscale", **ratios))
        if rank == 0:
            for r in records:
                line = json.dumps(r)
                print(line, flush=True)
                if a.out:
                    with open(a.out, "a") as f:
                        f.write(line + "\n")
            e, t = results["embscale"], results["torchrec"]
            log(f"{cfg} ({card}, world {world}): step {t['step_us']:.0f} / {e['step_us']:.0f} us "
                f"({ratios['step_us']:.2f}x), embedding {t['emb_us']:.0f} / {e['emb_us']:.0f} us "
                f"({ratios['emb_us']:.2f}x), outside {t['outside_us']:.0f} / {e['outside_us']:.0f} us, host "
                f"{t['host_us']:.0f} / {e['host_us']:.0f} us (torchrec / embscale); first losses "
                f"{losses['torchrec']:.6f} / {losses['embscale']:.6f}{'' if agree else ' DISAGREE'}")
    dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
