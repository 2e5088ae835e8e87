"""A small DLRM-style click model trained twice on the same synthetic data: once with embscale's
TableBatchedEmbeddingBags (fused row-wise Adagrad or SGD) and once with a list of nn.EmbeddingBag and
the same optimizer rule applied to their sparse gradients. The two loss curves should agree; they are
drawn into a PNG and each variant's step time is printed.

    python examples/train_dlrm.py                       # CPU, a couple of minutes
    python examples/train_dlrm.py --device cuda --steps 400
    torchrun --nproc_per_node 2 examples/train_dlrm.py --distributed   # TorchRec, gloo on the CPU

Distributed (--distributed, under torchrun): the tables are embscale.torchrec's EmbeddingBagCollection
sharded by TorchRec's DistributedModelParallel (--sharding table_wise, row_wise, column_wise or
data_parallel; gloo on the CPU, NCCL with --device cuda), each process training on its share of the same
global batch; the loss drawn is the mean over all processes.

Data: 13 dense features and one categorical feature per table (bags of 1-4 ids, Zipf-distributed ids).
The label is Bernoulli(sigmoid(score)) with score = a dense linear term + a hidden per-row value of each
looked-up id, so the model can learn it and the loss falls from log(2) towards the noise floor.
"""

import argparse
import json
import math
import os
import time

import torch
from torch import nn

import embscale


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=512)
    p.add_argument("--num-tables", type=int, default=8)
    p.add_argument("--num-embeddings", type=int, default=20000)
    p.add_argument("--embedding-dim", type=int, default=16)
    p.add_argument("--optimizer", choices=["rowwise_adagrad", "sgd"], default="rowwise_adagrad")
    p.add_argument("--lr", type=float, default=0.05, help="embedding learning rate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=50, help="print the mean loss every N steps (a line per N)")
    p.add_argument("--out", default="train_dlrm.png", help="plot of the loss curves (a .json with the data beside it: "
                                                             "the same path with .json for its extension)")
    p.add_argument("--replot", metavar="JSON", help="only draw --out from the JSON of an earlier run")
    p.add_argument("--distributed", action="store_true", help="TorchRec's DistributedModelParallel (torchrun)")
    p.add_argument("--sharding", choices=["table_wise", "row_wise", "column_wise", "data_parallel"],
                   default="table_wise", help="how --distributed shards the tables")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="--distributed --device cuda: after training, profile this many steps and print the share "
                        "of the step spent in NCCL kernels (the all-to-alls and reductions)")
    args = p.parse_args()
    for flag in ("steps", "batch_size", "num_tables", "num_embeddings", "embedding_dim", "log_every"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')}: {getattr(args, flag)} is not a positive number")
    if not math.isfinite(args.lr) or args.lr < 0:
        p.error(f"--lr: {args.lr} is not a finite number >= 0")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)  # --out may name a new folder
    return args


class SyntheticClicks:
    """Seeded batches in TBE layout: indices [N], offsets [T*B+1] (table-major), dense [B, 13], labels [B]."""

    def __init__(self, args):
        self.args = args
        g = torch.Generator().manual_seed(args.seed + 1)
        self.dense_w = torch.randn(13, generator=g) * 0.5
        self.row_value = torch.randn(args.num_tables, args.num_embeddings, generator=g)  # the hidden signal
        ranks = torch.arange(1, args.num_embeddings + 1, dtype=torch.float64)
        self.zipf = (ranks ** -1.05) / (ranks ** -1.05).sum()
        self.gen = torch.Generator().manual_seed(args.seed + 2)

    def batch(self):
        a, g = self.args, self.gen
        B, T = a.batch_size, a.num_tables
        lengths = torch.randint(1, 5, (T * B,), generator=g)
        offsets = torch.zeros(T * B + 1, dtype=torch.int64)
        offsets[1:] = lengths.cumsum(0)
        indices = torch.multinomial(self.zipf, int(offsets[-1]), replacement=True, generator=g)
        table_of = torch.repeat_interleave(torch.arange(T * B) // B, lengths)
        bag_of = torch.repeat_interleave(torch.arange(T * B) % B, lengths)
        dense = torch.randn(B, 13, generator=g)
        score = dense @ self.dense_w
        score = score.index_add(0, bag_of, self.row_value[table_of, indices] / lengths.repeat_interleave(lengths).sqrt())
        labels = torch.bernoulli(torch.sigmoid(score * 0.8), generator=g)
        return indices, offsets, dense, labels


class Dlrm(nn.Module):
    """Bottom MLP on the dense features, pooled embeddings, pairwise dot interactions, top MLP."""

    def __init__(self, embeddings, num_tables, dim):
        super().__init__()
        self.embeddings = embeddings
        self.num_tables, self.dim = num_tables, dim
        self.bottom = nn.Sequential(nn.Linear(13, 64), nn.ReLU(), nn.Linear(64, dim), nn.ReLU())
        n = num_tables + 1
        self.top = nn.Sequential(nn.Linear(dim + n * (n - 1) // 2, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, sparse, dense):
        x = self.bottom(dense)
        pooled = self.embeddings(*sparse)  # [B, T*D]
        feats = torch.cat([x.unsqueeze(1), pooled.view(-1, self.num_tables, self.dim)], 1)
        inter = feats @ feats.transpose(1, 2)
        i, j = torch.triu_indices(feats.shape[1], feats.shape[1], 1)
        return self.top(torch.cat([x, inter[:, i, j]], 1)).squeeze(1)


class BagList(nn.Module):
    """The baseline: one nn.EmbeddingBag (sparse gradients) per table, fed from the TBE layout."""

    def __init__(self, bags):
        super().__init__()
        self.bags = nn.ModuleList(bags)

    def forward(self, indices, offsets):
        B = (offsets.numel() - 1) // len(self.bags)
        outs = []
        for t, bag in enumerate(self.bags):
            start, end = offsets[t * B], offsets[(t + 1) * B]
            outs.append(bag(indices[start:end], offsets[t * B:(t + 1) * B] - start))
        return torch.cat(outs, 1)


@torch.no_grad()
def sparse_embedding_step(bags, state, optimizer, lr, eps=1e-8):
    """The embedding optimizer for the baseline, applied to each touched row (as the fused one does)."""
    for bag, acc in zip(bags, state):
        grad = bag.weight.grad.coalesce()
        rows, g = grad.indices()[0], grad.values()
        if optimizer == "sgd":
            bag.weight.index_add_(0, rows, -lr * g)
        else:  # row-wise Adagrad: one accumulator per row, the mean of the squared gradient
            acc[rows] += g.pow(2).mean(1)
            bag.weight[rows] -= (lr / (acc[rows].sqrt() + eps)).unsqueeze(1) * g
        bag.weight.grad = None


def train(variant, args, device):
    torch.manual_seed(args.seed)  # same initial tables for both variants
    T, E, D = args.num_tables, args.num_embeddings, args.embedding_dim
    tbe = embscale.TableBatchedEmbeddingBags([(E, D)] * T, optimizer=args.optimizer, learning_rate=args.lr,
                                             eps=1e-8, device=device)
    if variant == "embscale":
        embeddings = tbe
    else:
        bags = [nn.EmbeddingBag(E, D, mode="sum", sparse=True).to(device) for _ in range(T)]
        with torch.no_grad():
            for bag, w in zip(bags, tbe.split_embedding_weights()):
                bag.weight.copy_(w)  # same initial tables
        embeddings = BagList(bags)
        state = [torch.zeros(E, device=device) for _ in range(T)]
    torch.manual_seed(args.seed + 1)  # the MLPs start equal too
    model = Dlrm(embeddings, T, D).to(device)
    dense_params = list(model.bottom.parameters()) + list(model.top.parameters())
    opt = torch.optim.Adam(dense_params, lr=1e-3)
    data = SyntheticClicks(args)
    losses, times = [], []
    for step in range(args.steps):
        indices, offsets, dense, labels = (t.to(device) for t in data.batch())
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = nn.functional.binary_cross_entropy_with_logits(model((indices, offsets), dense), labels)
        loss.backward()  # embscale: the tables are updated here
        opt.step()
        if variant == "baseline":
            sparse_embedding_step(embeddings.bags, state, args.optimizer, args.lr)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            recent = losses[-args.log_every:]
            print(f"{variant:9s} step {step + 1:5d}/{args.steps}: loss {sum(recent) / len(recent):.4f}, "
                  f"{1e3 * sum(times) / len(times):.2f} ms a step", flush=True)
    return losses, times


class KeyedPooled(nn.Module):
    """embscale.torchrec's EmbeddingBagCollection seen as [B, T*D] (features in table order)."""

    def __init__(self, ebc, features):
        super().__init__()
        self.ebc, self.features = ebc, features

    def forward(self, kjt):
        pooled = self.ebc(kjt).to_dict()
        return torch.cat([pooled[f] for f in self.features], 1)


def train_distributed(args):
    """Each process trains on its share of every global batch, the tables sharded by TorchRec."""
    import torch.distributed as dist
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed import sharding_plan
    from torchrec.distributed.types import ShardingEnv, ShardingPlan
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from embscale.torchrec import EmbeddingBagCollection, EmbeddingBagCollectionSharder

    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch_size % world:
        raise SystemExit(f"--batch-size: {args.batch_size} is not a multiple of the {world} processes")
    T, E, D = args.num_tables, args.num_embeddings, args.embedding_dim
    features = [f"f{t}" for t in range(T)]
    tables = [EmbeddingBagConfig(name=f"t{t}", num_embeddings=E, embedding_dim=D, feature_names=[features[t]])
              for t in range(T)]
    torch.manual_seed(args.seed)  # the same tables on every process; the shards are cut from them
    ebc = EmbeddingBagCollection(tables, optimizer=args.optimizer, learning_rate=args.lr, eps=1e-8, device=device)
    torch.manual_seed(args.seed + 1)
    model = Dlrm(KeyedPooled(ebc, features), T, D).to(device)
    per_table = {"table_wise": lambda t: sharding_plan.table_wise(rank=t % world),
                 "row_wise": lambda t: sharding_plan.row_wise(),
                 "column_wise": lambda t: sharding_plan.column_wise(ranks=[(t + i) % world for i in range(2)]),
                 "data_parallel": lambda t: sharding_plan.data_parallel()}[args.sharding]
    sharder = EmbeddingBagCollectionSharder()
    plan = sharding_plan.construct_module_sharding_plan(
        ebc, per_param_sharding={f"t{t}": per_table(t) for t in range(T)}, local_size=world, world_size=world,
        device_type=device.type, sharder=sharder)
    dmp = DistributedModelParallel(model, env=ShardingEnv.from_process_group(dist.group.WORLD), device=device,
                                   plan=ShardingPlan({"embeddings.ebc": plan}), sharders=[sharder])
    dense_params = [p for n, p in dmp.named_parameters() if ".ebc." not in n and p.requires_grad]
    opt = torch.optim.Adam(dense_params, lr=1e-3)
    data = SyntheticClicks(args)
    B = args.batch_size // world
    mine = slice(rank * B, (rank + 1) * B)
    def step_inputs():
        indices, offsets, dense, labels = data.batch()  # the global batch; this process takes its share
        lengths = (offsets[1:] - offsets[:-1]).view(T, args.batch_size)
        starts = offsets[:-1].view(T, args.batch_size)
        values = torch.cat([indices[starts[t, mine.start]:starts[t, mine.start] + lengths[t, mine].sum()]
                            for t in range(T)])
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=features, values=values, lengths=lengths[:, mine].reshape(-1))
        return kjt.to(device), dense[mine].to(device), labels[mine].to(device)

    def train_step(kjt, dense, labels):
        opt.zero_grad()
        loss = nn.functional.binary_cross_entropy_with_logits(dmp((kjt,), dense), labels)
        loss.backward()  # the shards are updated here
        opt.step()
        return loss

    losses, times = [], []
    for _ in range(args.steps):
        kjt, dense, labels = step_inputs()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = train_step(kjt, dense, labels)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        losses.append(mean_loss.item() / world)
    if args.profile_steps and device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        inputs = [step_inputs() for _ in range(args.profile_steps)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for step in inputs:
                train_step(*step)
            torch.cuda.synchronize()
        step_us = 1e6 * (time.perf_counter() - t0) / args.profile_steps
        nccl_us = sum(e.device_time_total for e in prof.key_averages() if "nccl" in e.key.lower()) / args.profile_steps
        print(f"rank {rank}: {step_us:.0f} us a step under the profiler, NCCL kernels {nccl_us:.0f} us "
              f"({100 * nccl_us / step_us:.0f}%)")
    dist.destroy_process_group()
    return rank, world, losses, times


def smooth(xs, k=20):
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x - (xs[i - k] if i >= k else 0.0)
        out.append(acc / min(i + 1, k))
    return out


def plot(results, optimizer, device, out):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: the curves are in the JSON file only (draw them later with --replot)")
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    label = {"embscale": "embscale TableBatchedEmbeddingBags (fused)", "baseline": "nn.EmbeddingBag + sparse step",
             "distributed": "embscale under TorchRec DistributedModelParallel"}
    for variant, style in (("embscale", "-"), ("baseline", "--"), ("distributed", "-")):
        if variant not in results:
            continue
        ms = results[variant]["step_ms_median"]
        ax.plot(smooth(results[variant]["loss"]), style, label=f"{label[variant]}, {ms:.2f} ms/step")
    ax.axhline(math.log(2), color="grey", lw=0.5)
    ax.set_xlabel("step")
    ax.set_ylabel("BCE loss (moving average of 20)")
    ax.set_title(f"DLRM-style model, {optimizer} embeddings, {device}")
    ax.legend(loc="upper right")
    fig.tight_layout()
    if not os.path.splitext(str(out))[1]:
        out = f"{out}.png"  # what savefig writes for a name without an extension
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


def _mean(values):
    return sum(values) / len(values)


def main():
    args = parse_args()
    if args.replot:  # draw the PNG of an earlier run from its JSON
        with open(args.replot) as f:
            saved = json.load(f)
        plot(saved["results"], saved["args"]["optimizer"], saved["args"]["device"], args.out)
        return
    if args.distributed:
        rank, world, losses, times = train_distributed(args)
        steady = sorted(times[len(times) // 5:])
        results = {"distributed": {"loss": losses, "step_ms_median": 1e3 * steady[len(steady) // 2]}}
        if rank == 0:
            print(f"distributed ({world} processes, {args.sharding}): loss {_mean(losses[:20]):.4f} -> "
                  f"{_mean(losses[-20:]):.4f}, median step {results['distributed']['step_ms_median']:.2f} ms "
                  f"on rank 0 ({args.device})")
            with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
                json.dump({"args": vars(args), "results": results}, f)
            plot(results, args.optimizer, f"{args.device}, {world} processes ({args.sharding})", args.out)
        return
    device = torch.device(args.device)
    results = {}
    for variant in ("embscale", "baseline"):
        losses, times = train(variant, args, device)
        steady = sorted(times[len(times) // 5:])
        results[variant] = {"loss": losses, "step_ms_median": 1e3 * steady[len(steady) // 2]}
        print(f"{variant:9s}: loss {_mean(losses[:20]):.4f} -> {_mean(losses[-20:]):.4f}, "
              f"median step {results[variant]['step_ms_median']:.2f} ms on {device}")
    a, b = smooth(results["embscale"]["loss"]), smooth(results["baseline"]["loss"])
    gap = max(abs(x - y) for x, y in zip(a, b))
    print(f"max |difference| of the smoothed loss curves: {gap:.2e}")
    with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
        json.dump({"args": vars(args), "results": results, "max_smoothed_gap": gap}, f)
    plot(results, args.optimizer, device, args.out)


if __name__ == "__main__":
    main()
