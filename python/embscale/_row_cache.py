"""Tables beyond the GPU's memory, for TableBatchedEmbeddingBags on CUDA: the module's tables and optimizer
state stay in host memory (the host store: CPU tensors in memory mapped for the GPU, which reads and writes
them over the host link: _host_memory.host_store), and each batch's rows are brought into device memory by the library's row cache
(include/embscale/tbe_cache.h): a set-associative cache per "cached" table, staging rows for "host" tables
and for rows whose set is full of rows in use.

A batch goes through four calls, all on CUDA streams without host synchronisation: prefetch (plan: remapped
indices, evictions), fetch (the missing rows come in), the forward and backward of the cache's own tables
with the remapped indices (the library's ordinary TBE kernels), and write_back (the staged rows go home).
``prefetch()`` may run ahead on a stream of its own while the previous batch trains; its rows are locked
until its backward, and the staging rows have two halves, so at most two batches are in flight: one between
its forward and its backward, one prefetched.

Training through the cache gives the tables of training with every table in device memory, bit for bit:
each batch maps its rows one to one, the backward sums each row's gradient in lookup order, and stochastic
rounding hashes each weight by its place in the host store (the library's rounding bases).
"""

import ctypes
import threading
import weakref
from collections import deque

import torch

from . import _capi, _host_memory
from ._ops_common import _DTYPE_CODE, _context, _desc, _optional_desc, _run
from ._ops_tbe import _TBE_HANDLES, _TBE_IDS


class LentTbeHandle:
    """The operators' view (a TbeHandle's fields) of a row cache's own tables, which the cache owns."""

    def __init__(self, ptr, device, weights_dtype, feature_table_map, dims):
        layout = _capi.TbeLayout()
        _capi.check(_capi.lib.embscale_tbe_layout_get(ptr, ctypes.byref(layout)))
        self.ptr, self.device, self.weights_dtype = ptr, device, weights_dtype
        self.table_dims = list(dims)
        self.feature_dims = [dims[t] for t in feature_table_map]
        self.num_features = len(self.feature_dims)
        self.num_weights, self.total_rows = layout.num_weights, layout.total_rows
        self.total_dim, self.max_dim = layout.total_dim, layout.max_dim
        self.lock = threading.Lock()
        self.workspace_bytes = 0
        self.cpu_workspace = torch.empty(0, dtype=torch.uint8)
        self.id = next(_TBE_IDS)
        _TBE_HANDLES[self.id] = self


def register_host(t: torch.Tensor):
    """Makes a CPU tensor's memory one that kernels read and write: the module's own host store already is
    (_host_memory.host_store); other memory (tables loaded by assignment, an unpickled module) is registered
    with CUDA (mapped at the same address), which is slower for scattered rows but leaves the memory where it
    is, however large. Returns an object that holds the tensor alive and unregisters it when freed."""
    return t if _host_memory.is_host_store(t) else _Registered(t)


class _Registered:
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, t):
        self.tensor = t
        if t.numel() > 0:
            rc = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), 3)  # portable|mapped
            if int(rc) != 0:
                raise RuntimeError(f"cudaHostRegister of {t.numel() * t.element_size()} bytes failed (error {int(rc)}); "
                                   "the host may not have this much memory to pin")
            weakref.finalize(self, _unregister, t.data_ptr())


def _unregister(ptr):
    try:
        torch.cuda.cudart().cudaHostUnregister(ptr)
    except Exception:  # at interpreter exit CUDA may be gone
        pass


class _Batch:
    """A planned batch: its step, plan index, remapped indices, and what it was planned from."""
    __slots__ = ("step", "plan", "remapped", "key", "event", "training", "node", "stream")

    def __init__(self, step, plan, remapped, key, event, training):
        self.step, self.plan, self.remapped, self.key, self.event = step, plan, remapped, key, event
        self.training = training
        self.node = None  # a weak reference to the autograd node of its lookup, once looked up for training
        self.stream = None  # the stream of its lookup


def _batch_key(indices, offsets):
    return (indices.data_ptr(), indices._version, indices.numel(), offsets.data_ptr(), offsets._version,
            offsets.numel())


class RowCacheTables:
    """One module's row cache on one CUDA device: the C object, its lent tables, the cache's device buffers,
    the state, two plans, and the batches in flight."""

    def __init__(self, device, specs, feature_table_map, weights_dtype, optimizer, placements, cache_rows, algorithm,
                 max_lookups, host_weights, host_momentum1, host_momentum2):
        self.device = device
        T = len(specs)
        ctx = _context(device)
        out = ctypes.c_void_p()
        with torch.cuda.device(device):
            _run(device, _capi.lib.embscale_row_cache_create, ctypes.byref(ctx), T,
                 (ctypes.c_int64 * T)(*[e for e, _ in specs]), (ctypes.c_int32 * T)(*[d for _, d in specs]),
                 len(feature_table_map), (ctypes.c_int32 * len(feature_table_map))(*feature_table_map),
                 _DTYPE_CODE[weights_dtype], (ctypes.c_int32 * T)(*[_capi.PLACEMENT[p] for p in placements]),
                 (ctypes.c_int64 * T)(*cache_rows), _capi.CACHE_ALGORITHM[algorithm], _capi.OPTIMIZER[optimizer],
                 max_lookups, ctypes.byref(out))
        self.ptr = out.value
        self._finalizer = weakref.finalize(self, _capi.lib.embscale_row_cache_destroy, out.value)
        info = _capi.RowCacheInfo()
        slots = (ctypes.c_int64 * T)()
        _capi.check(_capi.lib.embscale_row_cache_info_get(self.ptr, ctypes.byref(info), slots))
        self.cache_slots = list(slots)
        self.max_lookups = max_lookups
        tables_ptr = _capi.lib.embscale_row_cache_tbe(self.ptr)
        cache_dims, cache_fmap = self._cache_geometry(tables_ptr, specs, feature_table_map, placements)
        self.handle = LentTbeHandle(tables_ptr, device, weights_dtype, cache_fmap, cache_dims)
        self.host = [register_host(t) for t in (host_weights, host_momentum1, host_momentum2)]
        self.host_tensors = (host_weights, host_momentum1, host_momentum2)
        layouts = _capi.OPTIMIZER_STATES[optimizer]
        n = {"rows": self.handle.total_rows, "elements": self.handle.num_weights}
        self.cache_weights = torch.empty(self.handle.num_weights, dtype=weights_dtype, device=device)
        self.cache_momentum = [torch.zeros(n[s[0]] if s else 0, dtype=torch.float32, device=device) for s in layouts]
        self.state = torch.empty(info.state_bytes, dtype=torch.uint8, device=device)
        self.rounding_bases = self.state[info.rounding_bases_offset:
                                         info.rounding_bases_offset + 8 * self.handle.total_rows].view(torch.int64)
        self.plans = [torch.empty(info.plan_bytes, dtype=torch.uint8, device=device) for _ in range(2)]
        self.buffers = _capi.RowCacheBuffers()
        b = self.buffers
        b.host_weights = _desc(host_weights)
        b.host_momentum1 = _optional_desc(host_momentum1 if host_momentum1.numel() else None)
        b.host_momentum2 = _optional_desc(host_momentum2 if host_momentum2.numel() else None)
        b.cache_weights = _desc(self.cache_weights)
        b.cache_momentum1 = _optional_desc(self.cache_momentum[0] if self.cache_momentum[0].numel() else None)
        b.cache_momentum2 = _optional_desc(self.cache_momentum[1] if self.cache_momentum[1].numel() else None)
        b.state, b.state_bytes = self.state.data_ptr(), info.state_bytes
        self.step = 0
        self.pending = deque()  # planned batches not yet looked up, oldest first
        self.running = []  # looked-up batches whose rows stay locked (training: until their backward)
        # Recorded where the last batch left `running`: a plan waits for it, so a row it evicts has been
        # written by every batch that used it (the plan may run on another stream than the batches).
        self.unlocked = None
        self.lock = threading.Lock()
        self.load()

    @staticmethod
    def _cache_geometry(tables_ptr, specs, feature_table_map, placements):
        """The cache tables' dims and each feature's cache table, as the library builds them (tbe_cache.h:
        each device table, then one pool per dimension of the others, in order of first appearance)."""
        dims, table_of = [], []
        pool = {}
        for (_, d), p in zip(specs, placements):
            if p == "device":
                table_of.append(len(dims))
                dims.append(d)
            else:
                if d not in pool:
                    pool[d] = len(dims)
                    dims.append(d)
                table_of.append(pool[d])
        return dims, [table_of[t] for t in feature_table_map]

    def _call(self, fn, *args):
        with torch.cuda.device(self.device):
            _run(self.device, fn, ctypes.c_void_p(self.ptr), ctypes.byref(_context(self.device)),
                 ctypes.byref(self.buffers), *args)

    def load(self):
        """Empties the cache and copies the device tables from the host store (after the host store changed)."""
        self.wait_all()
        self._call(_capi.lib.embscale_row_cache_load)

    def flush(self):
        """Writes every dirty cached row and every device table to the host store, and waits for it, so the
        host store holds the current tables (state_dict, split_embedding_weights)."""
        self.wait_all()
        self._call(_capi.lib.embscale_row_cache_flush)
        torch.cuda.synchronize(self.device)

    def wait_all(self):
        """Finishes what is planned: every pending batch is fetched (a planned batch must be, even if dropped)."""
        while self.pending:
            self._fetch(self.pending.popleft())

    def _live(self):
        """The batches whose rows stay locked: training batches whose backward may still come (their autograd
        node is alive) and evaluation batches until the next lookup."""
        for b in [b for b in self.running if b.node is not None and b.node() is None]:
            self._unlock(b)  # its graph is gone without a backward
        return self.running

    def in_flight(self):
        with self.lock:
            return bool(self._live()) or bool(self.pending)

    def prefetch(self, indices, offsets, batch_size, training):
        """Plans a batch on the current stream (TorchRec's prefetch stream, say): its rows locked, its
        evictions done; the forward given the same indices and offsets tensors fetches and uses it."""
        with self.lock:
            # One batch is planned ahead (the staging rows hold two: one training, one planned): a plan still
            # waiting for its lookup is fetched (as every plan must be) and dropped, its number reused.
            self._drop_pending()
            self._plan(indices, offsets, batch_size, training)

    def _drop_pending(self):
        while self.pending:
            b = self.pending.popleft()
            self._fetch(b)
            if b.step == self.step:
                self.step -= 1

    def _plan(self, indices, offsets, batch_size, training):
        if indices.numel() > self.max_lookups:
            raise ValueError(f"indices: {indices.numel()} lookups; this module's cache stages at most "
                             f"{self.max_lookups} a batch (cache_max_lookups)")
        step = self.step + 1
        live = self._live()
        if any(b.step % 2 == step % 2 for b in live):
            raise RuntimeError("forward: two batches already wait for their backward; a cached module holds at most "
                               "one batch between its forward and backward while the next is planned (its staging "
                               "rows have two halves): run the backward first")
        plan = self.plans[step % 2]
        remapped = torch.empty_like(indices)
        a = _capi.RowCachePrefetchArgs()
        a.indices, a.offsets, a.remapped = _desc(indices), _desc(offsets), _desc(remapped)
        a.batch_size, a.step = batch_size, step
        a.lock_from = min([b.step for b in live] + [step])
        a.training = 1 if training else 0
        a.plan, a.plan_bytes = plan.data_ptr(), plan.numel()
        stream = torch.cuda.current_stream(self.device)
        if self.unlocked is not None:
            stream.wait_event(self.unlocked)
        self._call(_capi.lib.embscale_row_cache_prefetch, ctypes.byref(a))
        event = torch.cuda.Event()
        event.record(stream)
        self.step = step
        batch = _Batch(step, plan, remapped, _batch_key(indices, offsets), event, training)
        self.pending.append(batch)
        return batch

    def _fetch(self, batch):
        torch.cuda.current_stream(self.device).wait_event(batch.event)
        self._call(_capi.lib.embscale_row_cache_fetch, ctypes.c_void_p(batch.plan.data_ptr()),
                   ctypes.c_size_t(batch.plan.numel()))

    def _unlock(self, batch):
        """batch leaves the locked set: an event after its last work (on its lookup's stream, or the current
        one: its backward's) is what the next plan waits for."""
        self.running = [b for b in self.running if b is not batch]
        self.unlocked = torch.cuda.Event()
        self.unlocked.record(batch.stream or torch.cuda.current_stream(self.device))

    def batch_for(self, indices, offsets, batch_size, training):
        """The planned batch of these lookups, fetched on the current stream (planned now when none was; a
        planned batch of other lookups is fetched, as every plan must be, and dropped, its number reused)."""
        with self.lock:
            for b in [b for b in self._live() if not b.training]:
                self._unlock(b)  # an evaluation batch's forward is enqueued before this lookup's
            key = _batch_key(indices, offsets)
            batch = None
            while self.pending and batch is None:
                b = self.pending.popleft()
                self._fetch(b)
                if b.key == key and b.training == training:
                    batch = b
                elif b.step == self.step:
                    self.step -= 1
            if batch is None:
                batch = self._plan(indices, offsets, batch_size, training)
                self.pending.popleft()
                self._fetch(batch)
            batch.stream = torch.cuda.current_stream(self.device)
            self.running.append(batch)
            return batch

    def finished(self, batch):
        """After a training batch's backward (enqueued on the current stream): its staged rows go home, its
        rows unlock."""
        with self.lock:
            self._call(_capi.lib.embscale_row_cache_write_back, ctypes.c_void_p(batch.plan.data_ptr()),
                       ctypes.c_size_t(batch.plan.numel()))
            batch.stream = None  # (the write-back is on the current stream)
            self._unlock(batch)

    def stats(self):
        """The library's counters (tbe_cache.h's RowCacheStat order), read now (one copy from the device)."""
        counts = self.state[:64].view(torch.int64).tolist()
        names = ("unique_lookups", "hits", "misses", "conflict_misses", "evictions", "rows_fetched",
                 "rows_written_back", "bytes_moved")
        return dict(zip(names, counts))

    def reset_stats(self):
        self.state[:64].zero_()
