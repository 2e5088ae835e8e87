"""TableBatchedEmbeddingBags with tables in host memory, on CUDA: the module a TableBatchedEmbeddingBags
becomes on a CUDA device when a table's placement is "host" or "cached" (FBGEMM's MANAGED and
MANAGED_CACHING).

The module's tables and optimizer state (``weights``, ``momentum1``, ``momentum2``) are CPU tensors, the
host store, in memory mapped for the GPU (_host_memory.host_store), which reads and writes them over the host link; a row cache in device
memory (_row_cache.RowCacheTables) holds each batch's rows. The tables' values are current in the host store
after ``flush()``, which ``state_dict()``, ``split_embedding_weights()`` and ``optimizer_state()`` call; after
``load_state_dict()`` or ``reset_parameters()`` the cache starts empty. The forward is eager (torch.compile
runs it outside the graph); dense-gradient mode and replicated tables are not offered here.
"""

import math
import weakref

import torch

from . import _bounds_warnings, _data_parallel, ops
from ._row_cache import RowCacheTables
from .tbe import TableBatchedEmbeddingBags

# What makes a lookup's output require grad (the tables do not: the fused optimizer updates them).
_ANCHOR = torch.zeros(0, requires_grad=True)

# Elements drawn on the device at a time by reset_parameters.
_DRAW_CHUNK = 1 << 26

# The default staging rows per batch: lookups of the largest batch seen, rounded up to a power of two.
_MIN_MAX_LOOKUPS = 1 << 16


class _CachedLookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchor, module, batch, offsets, per_sample_weights, batch_size):
        cache = module._cache
        counts = module.bounds_check in ("skip", "warn")
        out, num_skipped = ops.tbe_forward_eager(
            cache.cache_weights, batch.remapped, offsets, per_sample_weights, cache.handle.id, batch_size,
            module.pooling, module.bounds_check, module._output_cols, module.output_dtype, count_skipped=counts)
        ctx.module = weakref.ref(module)
        ctx.cache, ctx.batch = cache, batch
        ctx.batch_size = batch_size
        ctx.save_for_backward(offsets, per_sample_weights)
        ctx.set_materialize_grads(False)
        if num_skipped is not None:
            ctx.mark_non_differentiable(num_skipped)
        return out, num_skipped

    @staticmethod
    def backward(ctx, grad_output, _grad_num_skipped):
        module = ctx.module()
        offsets, psw = ctx.saved_tensors
        want_psw_grad = psw is not None and ctx.needs_input_grad[4]
        if module is None:
            return None, None, None, None, None, None
        cache, batch = ctx.cache, ctx.batch
        if grad_output is None:
            rows = batch.remapped.shape[0] if module.pooling == "none" else ctx.batch_size
            grad_output = torch.zeros((rows, module._output_cols), dtype=module.output_dtype,
                                      device=cache.device)
        m1, m2 = cache.cache_momentum
        grad_psw = ops.tbe_backward_eager(
            cache.cache_weights, m1, m2, module.hparams, grad_output, batch.remapped, offsets, psw, cache.handle.id,
            ctx.batch_size, module.pooling, module.bounds_check, module.optimizer, module.weight_decay_mode,
            module.stochastic_rounding, module.seed, want_psw_grad, rounding_bases=cache.rounding_bases)
        cache.finished(batch)
        return None, None, None, None, (grad_psw if want_psw_grad else None), None


def make_cached(module, placements, cache_load_factor, cache_algorithm, cache_max_lookups, device):
    """Turns a module built on the CPU (its tables the host store) into one that trains on `device` through
    a row cache (called by TableBatchedEmbeddingBags.__init__)."""
    module.__class__ = CachedTableBatchedEmbeddingBags
    module._placements = list(placements)
    module._cache_rows = [max(1, int(round(cache_load_factor * rows))) if p == "cached" else 0
                          for (rows, _), p in zip(module.embedding_specs, placements)]
    module._cache_device = device
    module._max_lookups = cache_max_lookups
    module._cache = None
    module._output_cols = module.feature_dims[0] if module.pooling == "none" else module.total_dim
    module.num_skipped = torch.zeros(1, dtype=torch.int64, device=device)
    if cache_max_lookups is not None:
        module._build_cache(cache_max_lookups)
    return module


class CachedTableBatchedEmbeddingBags(TableBatchedEmbeddingBags):
    """A TableBatchedEmbeddingBags whose tables live in host memory and train on CUDA through a row cache
    (this module's notes); TableBatchedEmbeddingBags becomes one when a table's placement asks for it."""

    # ---- the cache ------------------------------------------------------------------------------
    def _build_cache(self, max_lookups):
        old = self._cache
        if old is not None:
            old.flush()
        self._cache = RowCacheTables(
            self._cache_device, self.embedding_specs, self.feature_table_map, self.weights.dtype, self.optimizer,
            self._placements, self._cache_rows, self.cache_algorithm, max_lookups, self.weights.data,
            self.momentum1, self.momentum2)
        self._max_lookups = max_lookups

    def _cache_for(self, num_indices):
        """The cache, built (or rebuilt larger, after a flush) for batches of num_indices lookups."""
        if self._cache is None or num_indices > self._cache.max_lookups:
            if self._cache is not None and self._cache.in_flight():
                raise ValueError(f"indices: {num_indices} lookups, more than this module's cache stages "
                                 f"({self._cache.max_lookups}), while a batch waits for its backward; build the "
                                 "module with cache_max_lookups of its largest batch")
            want = max(_MIN_MAX_LOOKUPS, 1 << max(0, int(num_indices) - 1).bit_length())
            self._build_cache(max(want, self._max_lookups or 0))
        return self._cache

    def _lookups(self, indices, offsets):
        T = len(self.feature_table_map)
        for name, t in (("indices", indices), ("offsets", offsets)):
            if not isinstance(t, torch.Tensor) or t.device != self._cache_device:
                raise ValueError(f"{name}: expected a tensor on {self._cache_device} (the module's tables live in "
                                 f"host memory and train there through its row cache)")
            if t.dtype not in ops.INDEX_DTYPES:
                raise TypeError(f"{name}: dtype {t.dtype} is not supported; expected torch.int32 or torch.int64")
            if t.dim() != 1:
                raise ValueError(f"{name}: has {t.dim()} dimensions, expected 1")
        if (offsets.shape[0] - 1) % T != 0 or offsets.shape[0] < 1:
            raise ValueError(f"offsets: shape {tuple(offsets.shape)}; expected [T*B+1] with T = {T} features")
        if indices.dtype != offsets.dtype:
            indices, offsets = indices.long(), offsets.long()
        return indices.contiguous(), offsets.contiguous(), (offsets.shape[0] - 1) // T

    def prefetch(self, indices, offsets):
        """Plans the next batch on the current stream (FBGEMM's and TorchRec's prefetch): its rows are
        locked and the evictions it needs are done, so the forward of the same indices and offsets tensors
        finds them planned. The module plans one batch ahead: a second prefetch before that batch's forward
        replaces the first (whose forward then plans it again)."""
        indices, offsets, batch_size = self._lookups(indices, offsets)
        cache = self._cache_for(indices.numel())
        cache.prefetch(indices, offsets, batch_size, torch.is_grad_enabled())

    def flush(self):
        """Writes every changed cached row (and the device tables) to the host store and waits for it."""
        if self._cache is not None:
            self._cache.flush()

    def cache_stats(self):
        """Counters since the cache was built or reset_cache_stats(): unique_lookups and their hits and
        misses (cached tables), conflict_misses (staged: every way of the row's set held a row in use),
        evictions, rows_fetched, rows_written_back, bytes_moved (over the host link, both ways). Reading
        them waits for the device."""
        names = ("unique_lookups", "hits", "misses", "conflict_misses", "evictions", "rows_fetched",
                 "rows_written_back", "bytes_moved")
        return self._cache.stats() if self._cache is not None else dict.fromkeys(names, 0)

    def reset_cache_stats(self):
        if self._cache is not None:
            self._cache.reset_stats()

    # ---- lookups ----------------------------------------------------------------------------------
    @torch.compiler.disable
    def forward(self, indices, offsets, per_sample_weights=None):
        indices, offsets, batch_size = self._lookups(indices, offsets)
        if per_sample_weights is not None:
            if per_sample_weights.device != self._cache_device or per_sample_weights.dtype != torch.float32:
                raise ValueError(f"per_sample_weights: expected float32 on {self._cache_device}")
            per_sample_weights = per_sample_weights.contiguous()
        group = _data_parallel.resolve_group(self.data_parallel_group)
        if group is not None:
            raise NotImplementedError("data_parallel_group: tables in host memory are not replicated across "
                                      "processes; shard them (embscale.torchrec) or pass data_parallel_group=None")
        cache = self._cache_for(indices.numel())
        training = torch.is_grad_enabled()
        batch = cache.batch_for(indices, offsets, batch_size, training)
        anchor = _ANCHOR if training else _ANCHOR.detach()
        out, num_skipped = _CachedLookup.apply(anchor, self, batch, offsets, per_sample_weights, batch_size)
        try:  # the batch stays locked while its backward may still come
            batch.node = weakref.ref(out.grad_fn) if training else None
        except TypeError:  # (a node without weak references: locked until its backward)
            batch.node = None
        if num_skipped is not None:
            self.num_skipped.copy_(num_skipped)
            if self.bounds_check == "warn":
                _bounds_warnings.note_bounds(self, num_skipped)
        return out

    # ---- the host store's views -------------------------------------------------------------------
    def split_embedding_weights(self):
        """Per table, a view [E_t, D_t] of the host store, flushed first (writes through to the host store;
        call ``load_cache()`` after writing, so the cache drops its copies)."""
        self.flush()
        return super().split_embedding_weights()

    def optimizer_state(self):
        self.flush()
        return super().optimizer_state()

    def load_cache(self):
        """Empties the cache and reloads the device tables from the host store (after it was written)."""
        if self._cache is not None:
            self._cache.load()

    def reset_parameters(self):
        if getattr(self, "_cache", None) is not None:
            self._cache.wait_all()
        super().reset_parameters()
        self.load_cache()

    def _draw_tables(self):
        """Each table uniform in [-sqrt(1/E_t), sqrt(1/E_t)], drawn on the cache's device in chunks and copied
        to host memory: torch's CPU generator draws on one thread, minutes for tens of GiB of tables."""
        for t, (rows, _) in enumerate(self.embedding_specs):
            bound = math.sqrt(1.0 / rows)
            flat = self._table_view(self.weights, t).view(-1)
            for start in range(0, flat.numel(), _DRAW_CHUNK):
                part = flat[start:start + _DRAW_CHUNK]
                part.copy_(torch.empty(part.numel(), dtype=part.dtype, device=self._cache_device).uniform_(-bound, bound))

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        self.flush()
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(self, *args, **kwargs):
        if self._cache is not None:
            self._cache.wait_all()
        super()._load_from_state_dict(*args, **kwargs)
        self.load_cache()

    def _apply(self, fn, recurse=True):
        probe = fn(torch.empty(0, dtype=self.weights.dtype))
        if probe.dtype == self.weights.dtype and probe.device in (self._cache_device, torch.device("cpu")) or (
                probe.device.type == "cuda" and probe.device.index is None
                and self._cache_device.index == torch.cuda.current_device()):
            return self  # its tables stay in host memory, its cache on its device
        raise ValueError(f"device: a module whose tables live in host memory (placements {self._placements}) "
                         f"trains on {self._cache_device} through its cache and does not move or change dtype; "
                         "build it again with the device and weights_dtype wanted")

    def __getstate__(self):
        self.flush()
        state = super().__getstate__()
        state.pop("_cache", None)
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self._cache = None

    def extra_repr(self):
        return (super().extra_repr() + f", placements={self._placements}, cache_load_factor={self.cache_load_factor}, "
                f"cache_algorithm={self.cache_algorithm}, device={self._cache_device}")

