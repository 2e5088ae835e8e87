"""TableBatchedEmbeddingBags' lookup as an autograd Function: the forward through the operators
(torch.ops.embscale.tbe_forward, or its eager body outside autograd's and compile's view), the backward as
the fused optimizer's update of the rows the lookup touched (tbe_backward) or, in dense-gradient mode, the
tables' gradient (tbe_dense_grad). _data_parallel.ReplicatedLookup is the same lookup for replicated tables.
"""

from dataclasses import dataclass

import torch

from . import ops


@dataclass(frozen=True)
class LookupConfig:
    """What a lookup takes besides its tensors: the module's settings at its forward call."""
    handle: int  # the id of the handle of the tables' device and dtype (ops.TbeHandle), never a pointer
    batch_size: int
    pooling: str
    bounds_check: str
    output_cols: int  # the output's columns: every feature's dim side by side (pooling "none": one's)
    output_dtype: torch.dtype
    optimizer: str
    weight_decay_mode: str
    stochastic_rounding: bool
    seed: int
    sparse: bool  # dense-gradient mode (optimizer "none"): a sparse COO gradient of the tables, else a dense one

    def forward_args(self, weights, indices, offsets, per_sample_weights):
        """tbe_forward's arguments."""
        return (weights, indices, offsets, per_sample_weights, self.handle, self.batch_size, self.pooling,
                self.bounds_check, self.output_cols, self.output_dtype)


# An empty leaf that requires grad, given to every lookup as its first input so that the lookup's output
# requires grad (and its backward, the fused update, runs) even when no other input does: the tables do not
# require grad. It is no module's Parameter, so named_parameters(), state_dict() and optimizers never see it;
# the lookup gives it no gradient.
GRAD_ANCHOR = torch.empty(0, requires_grad=True)


class Lookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchor, weights, momentum1, momentum2, hparams, indices, offsets, per_sample_weights, cfg,
                counts=None, owner=None):
        """cfg: a LookupConfig; counts: where an eager skip- or warn-mode call stores its count
        (_bounds_warnings.CountTargets), or None; owner: a weak reference to the module, or None (backward_state)."""
        args = cfg.forward_args(weights, indices, offsets, per_sample_weights)
        if not ops.eager_call(weights, indices, offsets, per_sample_weights):
            out, num_skipped = torch.ops.embscale.tbe_forward(*args)
        else:
            # The count's gradient (never used) is passed as None, not as a zero tensor made per step.
            ctx.set_materialize_grads(False)
            if counts is None:  # no count where the module reads none (bounds_check off, error)
                out, num_skipped = ops.tbe_forward_eager(*args, count_skipped=False)
            else:
                try:
                    out, counts.tensor = ops.tbe_forward_eager(
                        *args, num_skipped_out=counts.buffer,
                        num_skipped_host=None if counts.word is None else counts.word.address)
                except ValueError as e:  # (checked before anything is written: the call can be made again)
                    if counts.word is None or not str(e).startswith("num_skipped_host"):
                        raise
                    counts.refuse_word()
                    out, counts.tensor = ops.tbe_forward_eager(*args)
                counts.written = True
                num_skipped = None
        # The tables, the optimizer state and the hyper-parameters are held, not saved: the backward updates
        # them as they are when it runs (saved tensors would make autograd refuse a learning rate set after
        # the forward, and the second of two lookups of one module once the first one's backward has
        # updated the tables); see backward_state.
        ctx.state = (cfg.handle, weights, momentum1, momentum2, hparams)
        ctx.owner = owner
        ctx.save_for_backward(indices, offsets, per_sample_weights)
        ctx.cfg = cfg
        if num_skipped is not None:
            ctx.mark_non_differentiable(num_skipped)
        return out, num_skipped

    @staticmethod
    def backward(ctx, grad_output, _grad_num_skipped):
        handle, weights, momentum1, momentum2, hparams = backward_state(ctx)
        indices, offsets, psw = ctx.saved_tensors
        cfg = ctx.cfg
        if grad_output is None:  # (grads are not materialised) a zero gradient, as autograd would have made
            rows = indices.shape[0] if cfg.pooling == "none" else cfg.batch_size
            grad_output = torch.zeros((rows, cfg.output_cols), dtype=cfg.output_dtype, device=weights.device)
        want_psw_grad = psw is not None and ctx.needs_input_grad[7]
        grad_weights = None
        eager = ops.eager_call(weights, momentum1, momentum2, hparams, grad_output, indices, offsets, psw)
        if cfg.optimizer == "none":
            dense_grad = ops.tbe_dense_grad_eager if eager else torch.ops.embscale.tbe_dense_grad
            rows, num_unique, grads, grad_psw = dense_grad(
                weights, grad_output, indices, offsets, psw, handle, cfg.batch_size, cfg.pooling, cfg.bounds_check,
                want_psw_grad)
            if weights.device.type != "meta":  # meta holds shapes only: no rows to give a gradient
                grad_weights = sparse_weight_grad(ops.tbe_handle(handle), rows, num_unique, grads, weights.dtype)
                if not cfg.sparse:  # the layout DistributedDataParallel reduces (as nn.EmbeddingBag(sparse=False))
                    grad_weights = grad_weights.to_dense()
        else:
            if eager:  # before the update, as the operator's dispatch does
                ops.bump_versions(weights, momentum1, momentum2, hparams)
            backward = ops.tbe_backward_eager if eager else torch.ops.embscale.tbe_backward
            grad_psw = backward(weights, momentum1, momentum2, hparams, grad_output, indices, offsets, psw, handle,
                                cfg.batch_size, cfg.pooling, cfg.bounds_check, cfg.optimizer, cfg.weight_decay_mode,
                                cfg.stochastic_rounding, cfg.seed, want_psw_grad)
        return (None, grad_weights, None, None, None, None, None, (grad_psw if want_psw_grad else None), None, None,
                None)


def backward_state(ctx):
    """(handle id, weights, momentum1, momentum2, hparams) that a lookup's backward updates: its module's as
    they are now (ctx.owner: a weak reference, given by a forward outside compiled code), which
    load_state_dict(assign=True), .to() or an assignment may have replaced since the forward; else (compiled
    code, or a module that is gone) those the forward was given (ctx.state). ReplicatedLookup's too."""
    module = None if ctx.owner is None else ctx.owner()
    if module is None:
        return ctx.state
    return module._handle_id, module.weights, module.momentum1, module.momentum2, module.hparams


def sparse_weight_grad(h, rows, num_unique, grads, dtype):
    """The gradient of the flat weights buffer as a sparse COO tensor [num_weights] holding the touched rows'
    elements: unique row u (linearised row_offset(t) + r) gives the D_t elements from weight_offset(t) + r D_t.
    Reading num_unique synchronises a CUDA stream (as FBGEMM's dense mode takes the count from the host)."""
    n = int(num_unique[0])
    rows, grads = rows[:n], grads[:n]
    dev = rows.device
    row_offsets = torch.tensor(h.row_offsets, dtype=torch.int64, device=dev)
    table = torch.searchsorted(row_offsets, rows, right=True) - 1
    dims = torch.tensor(h.table_dims, dtype=torch.int64, device=dev)[table]
    first = torch.tensor(h.weight_offsets, dtype=torch.int64, device=dev)[table] + (rows - row_offsets[table]) * dims
    cols = torch.arange(h.max_dim, dtype=torch.int64, device=dev)
    keep = cols[None, :] < dims[:, None]
    index = (first[:, None] + cols[None, :])[keep]
    # Rows ascend and tables lie in order, so the element indices ascend without repeats: coalesced.
    return torch.sparse_coo_tensor(index[None], grads[keep].to(dtype), (h.num_weights,), is_coalesced=True,
                                   check_invariants=False)
