"""Replicated tables (data parallelism) for TableBatchedEmbeddingBags.

When every process of a job holds the same tables and looks up its own part of the global batch (the
module wrapped in DistributedDataParallel, or a table TorchRec shards as data-parallel), a fused update
from the local gradients alone would train each replica on a different batch and the tables would drift
apart. The backward here gathers every process's lookups and output gradients first and applies the
update of the global batch on every process, so the replicas stay identical and equal to one process
trained on the global batch:

- The global batch is the processes' batches side by side in rank order (rank 0's samples first), each
  feature's bags of rank 0, then rank 1's, ... as one process would lay out that batch, so the rows'
  gradients are summed in the same order as there.
- The output gradients are divided by the world size, as DDP averages the dense gradients: a loss that
  is a mean over the local batch trains like its mean over the global batch.

Two collectives per backward over the group: the sizes (a few integers per process), then the lookups
and gradients, padded to the largest process's bytes.
"""

import hashlib

import torch
import torch.distributed as dist

from . import ops
from ._tbe_autograd import backward_state

# Per process: batch size, number of indices, payload bytes, then what must agree across processes.
_HEADER = ("batch_size", "num_indices", "payload_bytes", "num_features", "output_cols", "grad_dtype",
           "per_sample_weights", "pooling", "total_rows", "tables (each table's num_embeddings and embedding_dim, "
           "the feature map, the weights dtype)", "optimizer and its settings (optimizer, weight decay mode, "
           "hyper-parameters and step, bounds check, stochastic rounding, seed)")
_DTYPE_CODES = {dt: i for i, dt in enumerate(ops.FLOAT_DTYPES)}


def resolve_group(spec):
    """The process group a module's replicas train over, or None when its tables are its own: `spec` is
    "auto" (the default group when torch.distributed is initialized with more than one process), None
    (never) or a ProcessGroup."""
    if spec is None:
        return None
    initialized = dist.is_available() and dist.is_initialized()
    if isinstance(spec, str):
        if spec != "auto":
            raise ValueError(f"data_parallel_group: {spec!r}; expected 'auto', None or a ProcessGroup")
        if not initialized:
            return None
        spec = dist.group.WORLD
    elif not initialized:
        raise ValueError("data_parallel_group: a process group was given but torch.distributed is not initialized")
    return spec if dist.get_world_size(spec) > 1 else None


def check_group_spec(spec):
    """ValueError naming data_parallel_group unless it is "auto", None or a ProcessGroup."""
    if spec is None or spec == "auto":
        return
    if not (dist.is_available() and isinstance(spec, dist.ProcessGroup)):
        raise ValueError(f"data_parallel_group: {spec!r}; expected 'auto', None or a ProcessGroup")


def _as_bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8)


def _fingerprint(value) -> int:
    """A stable int64 of a configuration's repr (the same on every process, unlike hash())."""
    return int.from_bytes(hashlib.blake2b(repr(value).encode(), digest_size=8).digest(), "little", signed=True)


def _gather(group, grad_output, indices, offsets, psw, batch_size, pooling, num_features, total_rows, tables,
            settings):
    """Every process's (batch size, indices as int64, bag lengths [T*B], per-sample weights, output
    gradients) in rank order, on grad_output's device. `tables` and `settings` (any repr-able values) must be
    equal on every process, as the sizes in the header."""
    dev = grad_output.device
    world = dist.get_world_size(group)
    # Lookups before offsets[0] belong to no bag (as in one process): only the bags' indices travel.
    start = int(offsets[0])
    if start:
        indices = indices[start:]
        psw = None if psw is None else psw[start:]
        if pooling == "none":
            grad_output = grad_output[start:]
    lengths = (offsets[1:] - offsets[:-1]).to(torch.int64)
    indices = indices.to(torch.int64)
    parts = [lengths, indices] + ([psw.to(torch.float32)] if psw is not None else []) + [grad_output]
    payload = torch.cat([_as_bytes(p.to(dev)) for p in parts])
    header = torch.tensor([batch_size, indices.numel(), payload.numel(), num_features,
                           grad_output.shape[1], _DTYPE_CODES[grad_output.dtype], psw is not None,
                           ("sum", "mean", "none").index(pooling), total_rows, _fingerprint(tables),
                           _fingerprint(settings)], dtype=torch.int64, device=dev)
    headers = [torch.empty_like(header) for _ in range(world)]
    dist.all_gather(headers, header, group=group)
    headers = torch.stack(headers).cpu()
    for col, name in list(enumerate(_HEADER))[3:]:
        values = {int(v) for v in headers[:, col]}
        if len(values) > 1:
            shown = "" if col >= 9 else f" ({sorted(values)})"  # fingerprints say nothing to the reader
            raise RuntimeError(f"data_parallel_group: the processes' lookups disagree on {name}{shown}; "
                               "replicas need the same tables, features, pooling, gradient dtype and per-sample "
                               "weights on every process (pass data_parallel_group=None for tables that are not "
                               "replicas)")
    width = int(headers[:, 2].max())
    padded = torch.zeros(width, dtype=torch.uint8, device=dev)
    padded[:payload.numel()] = payload
    received = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(received, padded, group=group)
    out = []
    for r in range(world):
        B, N = int(headers[r, 0]), int(headers[r, 1])
        buf, pos = received[r], 0

        def take(count, dtype):
            nonlocal pos
            nbytes = count * torch.empty(0, dtype=dtype).element_size()
            t = buf[pos:pos + nbytes].view(dtype)
            pos += nbytes
            return t

        lens = take(num_features * B, torch.int64)
        idx = take(N, torch.int64)
        w = take(N, torch.float32) if psw is not None else None
        rows = N if pooling == "none" else B
        g = take(rows * grad_output.shape[1], grad_output.dtype).view(rows, grad_output.shape[1])
        out.append((B, idx, lens, w, g))
    return out


def _global_batch(parts, num_features, pooling):
    """The global batch's (batch size, indices, offsets, per-sample weights, output gradients): feature
    f's bags of rank 0, rank 1, ... in turn (table-major, as one process would hold them)."""
    B = sum(p[0] for p in parts)
    lengths = torch.cat([p[2].view(num_features, p[0]) for p in parts], 1)
    offsets = torch.zeros(num_features * B + 1, dtype=torch.int64, device=parts[0][1].device)
    offsets[1:] = lengths.reshape(-1).cumsum(0)
    per_feature = [p[2].view(num_features, p[0]).sum(1).tolist() for p in parts]
    split = [(p[1].split(n), None if p[3] is None else p[3].split(n), p[4].split(n) if pooling == "none" else None)
             for p, n in zip(parts, per_feature)]
    order = [(r, f) for f in range(num_features) for r in range(len(parts))]
    indices = torch.cat([split[r][0][f] for r, f in order])
    psw = None if parts[0][3] is None else torch.cat([split[r][1][f] for r, f in order])
    grad = torch.cat([split[r][2][f] for r, f in order]) if pooling == "none" else torch.cat([p[4] for p in parts])
    return B, indices, offsets, psw, grad


class ReplicatedLookup(torch.autograd.Function):
    """The lookup of a module whose tables are replicas over `group`: a local forward, and a backward that
    applies the global batch's update (this file's notes)."""

    @staticmethod
    def forward(ctx, anchor, weights, momentum1, momentum2, hparams, indices, offsets, per_sample_weights, cfg,
                group, owner=None):
        out, num_skipped = torch.ops.embscale.tbe_forward(*cfg.forward_args(weights, indices, offsets,
                                                                            per_sample_weights))
        ctx.state, ctx.owner = (cfg.handle, weights, momentum1, momentum2, hparams), owner
        ctx.save_for_backward(indices, offsets, per_sample_weights)
        ctx.cfg, ctx.group = cfg, group
        ctx.mark_non_differentiable(num_skipped)
        return out, num_skipped

    @staticmethod
    def backward(ctx, grad_output, _grad_num_skipped):
        handle, weights, momentum1, momentum2, hparams = backward_state(ctx)
        indices, offsets, psw = ctx.saved_tensors
        cfg = ctx.cfg
        h = ops.tbe_handle(handle)
        grad = grad_output.contiguous() / dist.get_world_size(ctx.group)
        tables = h.args[1:]  # rows, dims, feature map, weights dtype (not the device: each process has its own)
        settings = (cfg.optimizer, cfg.weight_decay_mode, cfg.bounds_check, cfg.stochastic_rounding, cfg.seed,
                    hparams.tolist())
        parts = _gather(ctx.group, grad, indices, offsets, psw, cfg.batch_size, cfg.pooling, h.num_features,
                        h.total_rows, tables, settings)
        B, g_indices, g_offsets, g_psw, g_grad = _global_batch(parts, h.num_features, cfg.pooling)
        dev = weights.device
        torch.ops.embscale.tbe_backward(weights, momentum1, momentum2, hparams, g_grad.to(dev), g_indices.to(dev),
                                        g_offsets.to(dev), None if g_psw is None else g_psw.to(dev), handle, B,
                                        cfg.pooling, cfg.bounds_check, cfg.optimizer, cfg.weight_decay_mode,
                                        cfg.stochastic_rounding, cfg.seed, False)
        return None, None, None, None, None, None, None, None, None, None, None
