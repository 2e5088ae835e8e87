"""Quantized tables for serving: ``QuantizedTableBatchedEmbeddingBags``, a forward-only table-batched embedding
whose tables hold int8, int4 or int2 rows with a per-row fp16 scale and bias, fp8 (e4m3, e5m2) rows with a
per-row fp32 scale, or fp32, fp16 and bf16 rows, each table its own type (include/embscale/tbe_quant.h,
docs/tbe_quant.md). The rows are FBGEMM's IntNBit inference layout, so tables quantized by FBGEMM's
``IntNBitTableBatchedEmbeddingBagsCodegen`` load byte for byte (``row_alignment=1`` is its CPU layout, 16 its
GPU one).

The packed tables are one uint8 buffer, ``weights``; ``split_embedding_weights()`` gives each table's rows as
a [E, row_bytes] view of it. ``from_float()`` quantizes a trained ``TableBatchedEmbeddingBags``. On CPU and
CUDA; on CUDA the forward and the quantizing both run on the device.
"""

import ctypes
import threading
import weakref
from typing import List, Optional, Tuple

import torch
from torch import Tensor, nn

from . import _bounds_warnings, _capi, _fbgemm_names
from ._ops_common import _check_backend, _context, _desc, _optional_desc, _run, _workspace
from ._ops_tbe import eager_call
from ._tbe_args import fbgemm_alias, module_device, whole_number

WEIGHT_TYPES = tuple(_capi.QUANT_TYPE)
# FBGEMM's SparseType names of the same rows. FBGEMM's FP8 is another format (no per-row scale).
_FBGEMM_TYPES = {"FP32": "fp32", "FP16": "fp16", "BF16": "bf16", "INT8": "int8", "INT4": "int4", "INT2": "int2"}
_POOLINGS = ("sum", "mean", "none")
_OUTPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def weight_type(argument: str, value) -> str:
    """A table's weight type as embscale names it ("int8", ...), from that name, FBGEMM's SparseType member or
    its name ("INT8"); ValueError naming `argument` for anything else."""
    name = _fbgemm_names.member(value, "SparseType")
    if name is None and isinstance(value, str):
        if value in _capi.QUANT_TYPE:
            return value
        name = value
    if name in _FBGEMM_TYPES:
        return _FBGEMM_TYPES[name]
    fp8 = (" (FBGEMM's FP8 rows have no per-row scale and are not this layout; 'fp8e4m3' and 'fp8e5m2' are rows "
           "with a per-row scale)" if name == "FP8" else "")
    raise ValueError(f"{argument}: {value!r} is not a weight type{fp8}; expected one of {', '.join(WEIGHT_TYPES)} "
                     f"or FBGEMM's SparseType.{', SparseType.'.join(_FBGEMM_TYPES)}")


def _table_specs(specs):
    """(E, D, type) per table, from embscale's 3-tuples or FBGEMM's IntNBit 5-tuples (name, E, D, SparseType,
    EmbeddingLocation); ValueError naming embedding_specs[t]."""
    if not isinstance(specs, (list, tuple)) or len(specs) == 0:
        raise ValueError("embedding_specs: expected a non-empty list of (num_embeddings, embedding_dim, weight_type)")
    out = []
    for t, s in enumerate(specs):
        where = f"embedding_specs[{t}]"
        if isinstance(s, (tuple, list)) and len(s) == 5:
            location = _fbgemm_names.member(s[4], "EmbeddingLocation")
            if location not in (None, "DEVICE", "HOST"):
                raise ValueError(f"{where}: EmbeddingLocation.{location} is not supported for quantized tables; they "
                                 "live on the module's device (DEVICE or HOST)")
            s = s[1:4]
        if not isinstance(s, (tuple, list)) or len(s) != 3:
            raise ValueError(f"{where}: {s!r}; expected (num_embeddings, embedding_dim, weight_type) or FBGEMM's "
                             "(name, num_embeddings, embedding_dim, SparseType, EmbeddingLocation)")
        rows = whole_number(f"{where}: num_embeddings", s[0])
        dim = whole_number(f"{where}: embedding_dim", s[1])
        out.append((rows, dim, weight_type(f"{where}: weight_type", s[2])))
    return out


# ---- the operator -----------------------------------------------------------------------------------------------
# The library's object of one table layout on one device, made on first use and kept for the process: the
# operator's arguments describe the tables themselves (no handle), so an exported program carries them.
_HANDLES = {}
_HANDLES_LOCK = threading.Lock()


class _Handle:
    def __init__(self, device, rows, dims, types, fmap, row_alignment, table_alignment):
        T = len(rows)
        out = ctypes.c_void_p()
        _run(device, _capi.lib.embscale_quant_tbe_create, ctypes.byref(_context(device)), T,
             (ctypes.c_int64 * T)(*rows), (ctypes.c_int32 * T)(*dims), (ctypes.c_int32 * T)(*types), len(fmap),
             (ctypes.c_int32 * len(fmap))(*fmap), row_alignment, table_alignment, ctypes.byref(out))
        self.ptr = out  # c_void_p: the C calls take it as it is
        self._finalizer = weakref.finalize(self, _capi.lib.embscale_quant_tbe_destroy, out.value)
        self.layout = _capi.QuantTbeLayout()
        row_bytes, table_offsets = (ctypes.c_int64 * T)(), (ctypes.c_int64 * T)()
        _capi.check(_capi.lib.embscale_quant_tbe_layout_get(self.ptr, ctypes.byref(self.layout), row_bytes,
                                                            table_offsets))
        self.row_bytes, self.table_offsets = list(row_bytes), list(table_offsets)
        self.num_features = len(fmap)
        self.sequence_dim = dims[fmap[0]] if fmap else 0  # pooling "none": every feature has this D


def _handle_key(rows, dims, types, fmap, row_alignment, table_alignment):
    return (tuple(rows), tuple(dims), tuple(types), tuple(fmap), row_alignment, table_alignment)


def _handle_of(device, key) -> _Handle:
    """The library's object of the tables `key` names (_handle_key) on `device` (its checks name each bad
    argument), made once."""
    h = _HANDLES.get((device.type, key))  # made already: no lock
    if h is None:
        with _HANDLES_LOCK:
            h = _HANDLES.get((device.type, key))
            if h is None:
                h = _HANDLES[(device.type, key)] = _Handle(device, *key)
    return h


def _output_shape(indices, offsets, pooling, num_features, sequence_dim, total_dim):
    if pooling == "none":
        return (indices.shape[0], sequence_dim)
    return ((offsets.shape[0] - 1) // num_features, total_dim)


@torch.library.custom_op("embscale::quant_tbe_forward", mutates_args=())
def quant_tbe_forward(weights: Tensor, indices: Tensor, offsets: Tensor, per_sample_weights: Optional[Tensor],
                      rows: List[int], dims: List[int], types: List[int], feature_table_map: List[int],
                      row_alignment: int, table_alignment: int, pooling: str, bounds_check: str,
                      output_dtype: torch.dtype) -> Tuple[Tensor, Tensor]:
    """The pooled ([B, total_dim]) or sequence ([N, D]) lookup of quantized tables packed in `weights` (uint8,
    tbe_quant.h's layout of tables rows x dims of weight type codes `types`), and the count of indices
    dropped in skip and warn modes (int64 [1]; 0 in the others)."""
    return quant_tbe_forward_eager(weights, indices, offsets, per_sample_weights, rows, dims, types,
                                   feature_table_map, row_alignment, table_alignment, pooling, bounds_check,
                                   output_dtype)


def quant_tbe_forward_eager(weights, indices, offsets, per_sample_weights, rows, dims, types, feature_table_map,
                            row_alignment, table_alignment, pooling, bounds_check, output_dtype):
    """quant_tbe_forward's body."""
    _check_backend(weights.device)
    h = _handle_of(weights.device, _handle_key(rows, dims, types, feature_table_map, row_alignment, table_alignment))
    num_skipped = torch.zeros(1, dtype=torch.int64, device=weights.device)
    out = _forward(h, weights, indices.contiguous(), offsets.contiguous(),
                   None if per_sample_weights is None else per_sample_weights.contiguous(), pooling, bounds_check,
                   output_dtype, num_skipped)
    return out, num_skipped


def _forward(h, weights, indices, offsets, per_sample_weights, pooling, bounds_check, output_dtype, num_skipped):
    """The C call of the forward on handle h's tables (contiguous indices and offsets of one dtype; the library
    checks the rest), the count of dropped lookups written to num_skipped in skip and warn modes (unused, and
    may be None, in the others). The module calls it directly in eager mode with the handle it holds: the
    whole host path of its call is this function and the module's own checks."""
    device = weights.device
    shape = _output_shape(indices, offsets, pooling, h.num_features, h.sequence_dim, h.layout.total_dim)
    out = torch.empty(shape, dtype=output_dtype, device=device)
    a = _capi.QuantTbeForwardArgs()
    a.weights, a.weights_bytes = weights.data_ptr(), weights.numel()
    a.indices, a.offsets = _desc(indices), _desc(offsets)
    if per_sample_weights is not None:  # else absent: the struct starts zeroed
        a.per_sample_weights = _optional_desc(per_sample_weights)
    a.batch_size = (offsets.shape[0] - 1) // h.num_features
    a.pooling = _capi.POOLING[pooling]
    a.bounds_check = _capi.BOUNDS_CHECK[bounds_check]
    a.output = _desc(out, shape)
    if bounds_check in ("skip", "warn"):
        a.num_skipped = num_skipped.data_ptr()
    _run(device, _capi.lib.embscale_quant_tbe_forward, h.ptr, ctypes.byref(_context(device)), ctypes.byref(a))
    return out


@quant_tbe_forward.register_fake
def _(weights, indices, offsets, per_sample_weights, rows, dims, types, feature_table_map, row_alignment,
      table_alignment, pooling, bounds_check, output_dtype):
    fmap = feature_table_map
    shape = _output_shape(indices, offsets, pooling, len(fmap), dims[fmap[0]] if fmap else 0,
                          sum(dims[t] for t in fmap))
    return weights.new_empty(shape, dtype=output_dtype), weights.new_empty((1,), dtype=torch.int64)


class QuantizedTableBatchedEmbeddingBags(nn.Module):
    """Many quantized tables looked up and pooled in one call, for inference.

    Args:
        embedding_specs: per table (num_embeddings, embedding_dim, weight_type), weight_type one of
            WEIGHT_TYPES or FBGEMM's SparseType; FBGEMM's (name, E, D, SparseType, EmbeddingLocation) too.
        feature_table_map: table of each feature (several features may share a table); default one each.
        pooling: "sum", "mean" or "none" (sequence output [N, D]); FBGEMM's PoolingMode as pooling_mode.
        output_dtype: torch.float32, float16 or bfloat16 (or FBGEMM's SparseType FP32, FP16, BF16).
        bounds_check: "error", "skip", "warn" or "off"; FBGEMM's BoundsCheckMode as bounds_check_mode.
        row_alignment: each row's bytes rounded up to this power of two (1 to 256): FBGEMM's CPU tables use 1,
            its GPU tables 16 (the default).
        table_alignment: each table starts at a multiple of this power of two (1 to 4096; default 128).
        device: cpu or cuda (the forward and load_float's quantizing run there).
    """

    def __init__(self, embedding_specs, feature_table_map=None, pooling="sum", output_dtype=torch.float32,
                 bounds_check="error", row_alignment=16, table_alignment=128, device=None, *, pooling_mode=None,
                 bounds_check_mode=None):
        super().__init__()
        specs = _table_specs(embedding_specs)
        pooling = fbgemm_alias("pooling", pooling, "sum", "pooling_mode", pooling_mode, _fbgemm_names.pooling)
        bounds_check = fbgemm_alias("bounds_check", bounds_check, "error", "bounds_check_mode", bounds_check_mode,
                                    _fbgemm_names.bounds_check)
        if pooling not in _POOLINGS:
            raise ValueError(f"pooling: {pooling!r}; expected one of {', '.join(_POOLINGS)}")
        if bounds_check not in _capi.BOUNDS_CHECK:
            raise ValueError(f"bounds_check: {bounds_check!r}; expected one of {', '.join(_capi.BOUNDS_CHECK)}")
        output_dtype = _fbgemm_names.dtype("output_dtype", output_dtype)
        if output_dtype not in _OUTPUT_DTYPES:
            raise TypeError(f"output_dtype: {output_dtype!r}; expected torch.float32, float16 or bfloat16")
        device = module_device(device)
        if device.type == "meta":
            raise ValueError("device: meta is not supported for quantized tables (they are loaded, not initialised)")
        T = len(specs)
        fmap = list(range(T)) if feature_table_map is None else [
            whole_number(f"feature_table_map[{f}]", v) for f, v in enumerate(feature_table_map)]
        self.embedding_specs = specs
        self.feature_table_map = fmap
        self.pooling, self.output_dtype, self.bounds_check = pooling, output_dtype, bounds_check
        self.row_alignment = whole_number("row_alignment", row_alignment)
        self.table_alignment = whole_number("table_alignment", table_alignment)
        # The operator's description of the tables (it takes them as arguments, not a handle).
        self._op_tables = ([e for e, _, _ in specs], [d for _, d, _ in specs],
                           [_capi.QUANT_TYPE[w] for _, _, w in specs], fmap, self.row_alignment, self.table_alignment)
        self._handle_key = _handle_key(*self._op_tables)
        h = _handle_of(device, self._handle_key)
        self.row_bytes, self.table_offsets = h.row_bytes, h.table_offsets
        self.total_dim, self.total_bytes = h.layout.total_dim, h.layout.total_bytes
        self.feature_dims = [specs[t][1] for t in fmap]
        self.register_buffer("weights", torch.zeros(self.total_bytes, dtype=torch.uint8, device=device))
        self.register_buffer("num_skipped", torch.zeros(1, dtype=torch.int64, device=device))

    # ---- the tables ------------------------------------------------------------------------------------
    def split_embedding_weights(self):
        """Per table, its rows as a uint8 view [E_t, row_bytes_t] of ``weights`` (the layout of
        docs/tbe_quant.md; writing into it changes the table)."""
        return [self.weights[o:o + e * rb].view(e, rb)
                for (e, _, _), o, rb in zip(self.embedding_specs, self.table_offsets, self.row_bytes)]

    def load_float(self, tables):
        """Quantizes fp32 tables (one [E_t, D_t] tensor per table, any device) into this module's rows, each to
        its table's type (tbe_quant.h's quantize_rows), on the module's device: a CUDA module's tables are
        quantized by the device, to the bytes the CPU would write. Nothing is written unless every table is
        taken."""
        if len(tables) != len(self.embedding_specs):
            raise ValueError(f"tables: {len(tables)} given for {len(self.embedding_specs)} tables")
        device = self.weights.device
        packed = []
        for t, (x, (e, d, w), rb) in enumerate(zip(tables, self.embedding_specs, self.row_bytes)):
            if not isinstance(x, torch.Tensor) or tuple(x.shape) != (e, d):
                shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise ValueError(f"tables[{t}]: {shape}; expected a tensor of shape {(e, d)}")
            rows = x.detach().to(device, torch.float32).contiguous()
            buf = torch.empty(e * rb, dtype=torch.uint8, device=device)
            desc, code = _desc(rows, (e, d)), _capi.QUANT_TYPE[w]
            try:
                ws, ws_bytes = _workspace(device, _capi.lib.embscale_quantize_rows_workspace_size,
                                          ctypes.byref(_context(device)), code, ctypes.byref(desc), self.row_alignment)
                _run(device, _capi.lib.embscale_quantize_rows, ctypes.byref(_context(device)), code,
                     ctypes.byref(desc), self.row_alignment, buf.data_ptr(), buf.numel(),
                     ws.data_ptr() if ws_bytes else None, ws_bytes)
            except ValueError as err:
                raise ValueError(f"tables[{t}]: {err}") from None
            packed.append(buf)
        with torch.no_grad():
            for view, buf in zip(self.split_embedding_weights(), packed):
                view.copy_(buf.view(view.shape))

    def dequantized_tables(self):
        """Per table, the fp32 values [E_t, D_t] its rows hold, as the forward reads them."""
        out = []
        for view, (e, d, w) in zip(self.split_embedding_weights(), self.embedding_specs):
            rows = torch.empty(e, d, dtype=torch.float32)
            src = view.contiguous().cpu()
            _capi.check(_capi.lib.embscale_dequantize_rows(_capi.QUANT_TYPE[w], src.data_ptr(), src.numel(),
                                                           self.row_alignment, ctypes.byref(_desc(rows, (e, d)))))
            out.append(rows.to(self.weights.device))
        return out

    @classmethod
    def from_float(cls, module, weight_types, output_dtype=torch.float32, row_alignment=16, table_alignment=128):
        """The quantized module of a trained embscale.TableBatchedEmbeddingBags: its tables, features, pooling
        and bounds check, each table quantized to weight_types (one type for all, or one per table), on the
        module's device."""
        from .tbe import TableBatchedEmbeddingBags

        if not isinstance(module, TableBatchedEmbeddingBags):
            raise TypeError(f"module: {type(module).__name__} is not an embscale.TableBatchedEmbeddingBags")
        T = len(module.embedding_specs)
        types = list(weight_types) if isinstance(weight_types, (list, tuple)) else [weight_types] * T
        if len(types) != T:
            raise ValueError(f"weight_types: {len(types)} given for {T} tables")
        device = getattr(module, "_cache_device", None) or module.weights.device
        q = cls([(e, d, w) for (e, d), w in zip(module.embedding_specs, types)], module.feature_table_map,
                pooling=module.pooling, output_dtype=output_dtype, bounds_check=module.bounds_check,
                row_alignment=row_alignment, table_alignment=table_alignment, device=device)
        q.load_float(module.split_embedding_weights())
        return q

    def error_report(self, module, indices, offsets, per_sample_weights=None):
        """How far this module's pooled outputs are from those of the fp32 module it was quantized from (an
        embscale.TableBatchedEmbeddingBags with the same tables and features), on a batch (a held-out one).
        Per table, over the bags of its features that hold a valid lookup: the relative error of each pooled
        row, |q - f|_2 / |f|_2 (q this module's, f the module's, in float64), its max and mean. Returns one dict
        per table: table, weight_type, bags, max_rel_err, mean_rel_err."""
        if getattr(module, "embedding_specs", None) is None or \
                [tuple(s) for s in module.embedding_specs] != [(e, d) for e, d, _ in self.embedding_specs] or \
                list(module.feature_table_map) != self.feature_table_map or module.pooling != self.pooling:
            raise ValueError("module: expected the fp32 TableBatchedEmbeddingBags this module was quantized from "
                             "(the same tables, features and pooling)")
        if self.pooling == "none":
            raise ValueError("pooling: the report compares pooled rows; this module's pooling is 'none'")
        with torch.no_grad():
            q = self(indices, offsets, per_sample_weights).double().cpu()
            f = module(indices.to(module.weights.device), offsets.to(module.weights.device),
                       None if per_sample_weights is None else per_sample_weights.to(module.weights.device))
            f = f.double().cpu()
        B = q.shape[0]
        lengths = (offsets[1:] - offsets[:-1]).cpu().view(len(self.feature_table_map), B)
        per_table = [[] for _ in self.embedding_specs]
        col = 0
        for feat, t in enumerate(self.feature_table_map):
            d = self.embedding_specs[t][1]
            qf, ff = q[:, col:col + d], f[:, col:col + d]
            norm = ff.norm(dim=1)
            keep = (lengths[feat] > 0) & (norm > 0)
            per_table[t].append(((qf - ff).norm(dim=1) / norm.clamp_min(1e-300))[keep])
            col += d
        report = []
        for t, ((_, _, w), errs) in enumerate(zip(self.embedding_specs, per_table)):
            e = torch.cat(errs) if errs else torch.zeros(0, dtype=torch.float64)
            report.append(dict(table=t, weight_type=w, bags=int(e.numel()),
                               max_rel_err=float(e.max()) if e.numel() else 0.0,
                               mean_rel_err=float(e.mean()) if e.numel() else 0.0))
        return report

    # ---- the lookup --------------------------------------------------------------------------------------
    def forward(self, indices, offsets, per_sample_weights=None):
        weights = self.weights
        device = weights.device
        T = len(self.feature_table_map)
        for name, t in (("indices", indices), ("offsets", offsets)):
            if not isinstance(t, torch.Tensor) or t.device != device:
                raise ValueError(f"{name}: expected a tensor on {device}")
            if t.dtype not in (torch.int32, torch.int64):
                raise TypeError(f"{name}: dtype {t.dtype} is not supported; expected torch.int32 or torch.int64")
            if t.dim() != 1:
                raise ValueError(f"{name}: has {t.dim()} dimensions, expected 1")
        if offsets.numel() < 1 or (offsets.numel() - 1) % T != 0:
            raise ValueError(f"offsets: shape {tuple(offsets.shape)}; expected [T*B+1] with T = {T} features")
        if indices.dtype != offsets.dtype:
            indices, offsets = indices.long(), offsets.long()
        indices, offsets = indices.contiguous(), offsets.contiguous()
        if per_sample_weights is not None:
            if not isinstance(per_sample_weights, torch.Tensor) or per_sample_weights.device != device or \
                    per_sample_weights.dtype != torch.float32:
                raise ValueError(f"per_sample_weights: expected a float32 tensor on {device}")
            per_sample_weights = per_sample_weights.contiguous()
        if self.pooling == "none" and len(set(self.feature_dims)) > 1:
            raise ValueError(f"pooling: 'none' (sequence) needs all features of one dimension; the features have "
                             f"{self.feature_dims}")
        counts = self.bounds_check in ("skip", "warn")
        if eager_call(weights, indices, offsets, per_sample_weights):
            _check_backend(device)
            out = _forward(_handle_of(device, self._handle_key), weights, indices, offsets, per_sample_weights,
                           self.pooling, self.bounds_check, self.output_dtype, self.num_skipped if counts else None)
        else:  # traced (torch.export, torch.compile): the operator, whose fake gives the shapes
            out, num_skipped = torch.ops.embscale.quant_tbe_forward(
                weights, indices, offsets, per_sample_weights, *self._op_tables[:4], self.row_alignment,
                self.table_alignment, self.pooling, self.bounds_check, self.output_dtype)
            if counts:
                self.num_skipped.copy_(num_skipped)
        if self.bounds_check == "warn":
            _bounds_warnings.note_bounds(self, self.num_skipped)
        return out

    def check_bounds(self):
        """Waits for the bounds reports of this module's earlier warn-mode calls on CUDA and issues their warnings
        now (without it they come at later calls, as the device finishes)."""
        _bounds_warnings.read_bounds_reports(self, wait=True, stacklevel=4)

    def extra_repr(self):
        types = ", ".join(f"({e}, {d}, {w})" for e, d, w in self.embedding_specs)
        return (f"tables=[{types}], features={len(self.feature_table_map)}, pooling={self.pooling}, "
                f"output_dtype={self.output_dtype}, row_alignment={self.row_alignment}")



__all__ = ["QuantizedTableBatchedEmbeddingBags", "WEIGHT_TYPES", "weight_type"]
