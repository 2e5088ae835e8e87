"""QuantizedTableBatchedEmbeddingBags (quantized tables for serving) on the CPU: the forward against a float64
reference that decodes the same bytes from the layout's definition (docs/tbe_quant.md), the quantizing helpers'
round trip, saving and loading, bad input, and, where fbgemm_gpu is installed, FBGEMM's own CPU IntNBit TBE on
identical bytes and FBGEMM's row quantizer."""

import copy
import io
import pickle

import numpy as np
import pytest
import torch

import embscale
from conftest import requires_cuda
from embscale import QuantizedTableBatchedEmbeddingBags as QTBE

try:
    from fbgemm_gpu.split_embedding_configs import SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
    from fbgemm_gpu.split_table_batched_embeddings_ops_inference import IntNBitTableBatchedEmbeddingBagsCodegen
except Exception:  # fbgemm_gpu is not installed beside embscale (scripts/test_torchrec.sh's environment has it)
    IntNBitTableBatchedEmbeddingBagsCodegen = None

BITS = {"int8": 8, "int4": 4, "int2": 2}
FP8 = {"fp8e4m3": torch.float8_e4m3fn, "fp8e5m2": torch.float8_e5m2}
PLAIN = {"fp32": np.float32, "fp16": np.float16}


def decode_row(row: np.ndarray, wtype: str, dim: int) -> np.ndarray:
    """One row's values in float64, from the layout's definition: int rows are [fp16 scale][fp16 bias][codes,
    the lower column in the low bits], fp8 rows [fp32 scale_inv][one code a column], plain rows D elements."""
    if wtype in BITS:
        b = BITS[wtype]
        scale, bias = row[:4].view(np.float16).astype(np.float64)
        per_byte = 8 // b
        cols = np.arange(dim)
        q = (row[4 + cols // per_byte].astype(np.int64) >> ((cols % per_byte) * b)) & ((1 << b) - 1)
        return q * scale + bias
    if wtype in FP8:
        scale_inv = float(row[:4].view(np.float32)[0])
        codes = torch.from_numpy(row[4:4 + dim].copy()).view(FP8[wtype]).to(torch.float64).numpy()
        return codes * scale_inv
    if wtype == "bf16":
        bits = row[:2 * dim].view(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).astype(np.float64)
    return row[:np.dtype(PLAIN[wtype]).itemsize * dim].view(PLAIN[wtype]).astype(np.float64)


def reference(module, indices, offsets, psw):
    """The forward in float64 from the module's bytes; also the sum of each output's |terms| (for the bound)."""
    tables = [np.stack([decode_row(r, w, d) for r in v.cpu().numpy()]) if e else np.zeros((0, d))
              for v, (e, d, w) in zip(module.split_embedding_weights(), module.embedding_specs)]
    T = len(module.feature_table_map)
    B = (len(offsets) - 1) // T
    idx, off = indices.cpu().numpy(), offsets.cpu().numpy()
    w = None if psw is None else psw.cpu().numpy().astype(np.float64)
    pooled = module.pooling != "none"
    out = np.zeros((B, module.total_dim) if pooled else (len(idx), module.feature_dims[0]))
    mag = np.zeros_like(out)
    col = 0
    for f, t in enumerate(module.feature_table_map):
        e, d, _ = module.embedding_specs[t]
        for b in range(B):
            start, end = off[f * B + b], off[f * B + b + 1]
            valid = [i for i in range(start, end) if 0 <= idx[i] < e]
            for i in valid:
                term = tables[t][idx[i]] * (1.0 if w is None else w[i])
                if pooled:
                    out[b, col:col + d] += term
                    mag[b, col:col + d] += np.abs(term)
                else:
                    out[i] = term
                    mag[i] = np.abs(term)
            if module.pooling == "mean" and valid:
                out[b, col:col + d] /= len(valid)
                mag[b, col:col + d] /= len(valid)
        col += d
    return out, mag


def assert_close_to_reference(module, got, indices, offsets, psw=None, max_len=20):
    want, mag = reference(module, indices, offsets, psw)
    eps_out = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}[module.output_dtype]
    bound = (max_len + 4) * 2.0 ** -23 * mag + eps_out * np.abs(want) + 1e-30
    got = got.cpu()
    err = np.abs(got.to(torch.float64).numpy() - want)
    worst = np.unravel_index(np.argmax(err - bound), err.shape) if err.size else None
    assert np.all(err <= bound), f"at {worst}: got {got[worst].item()}, want {want[worst]}, bound {bound[worst]}"


def random_batch(rng, module, batch_size, max_len, bad_every=0):
    """Ids and offsets of a random batch, on the module's device."""
    indices, offsets = _random_batch(rng, module, batch_size, max_len, bad_every)
    return indices.to(module.weights.device), offsets.to(module.weights.device)


def _random_batch(rng, module, batch_size, max_len, bad_every=0):
    T = len(module.feature_table_map)
    lengths = rng.integers(0, max_len + 1, size=T * batch_size)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    indices = []
    for f in range(T):
        e = module.embedding_specs[module.feature_table_map[f]][0]
        n = int(lengths[f * batch_size:(f + 1) * batch_size].sum())
        indices.append(rng.integers(0, e, size=n))
    indices = np.concatenate(indices) if indices else np.zeros(0, np.int64)
    if bad_every:
        indices[::bad_every] = -1
    return torch.from_numpy(indices.astype(np.int64)), torch.from_numpy(offsets.astype(np.int64))


SPECS_MIXED = [(97, 64, "int8"), (50, 33, "int4"), (40, 7, "int2"), (30, 16, "fp8e4m3"), (20, 24, "fp8e5m2"),
               (25, 12, "fp16"), (15, 9, "bf16"), (12, 5, "fp32")]


def quantized(specs, seed, **kw):
    torch.manual_seed(seed)
    m = QTBE(specs, **kw)
    m.load_float([torch.randn(e, d) * 0.5 + 0.1 * torch.randn(e, 1) for e, d, _ in m.embedding_specs])
    return m


@pytest.mark.parametrize("pooling", ["sum", "mean"])
@pytest.mark.parametrize("output_dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("row_alignment", [1, 16])
def test_pooled_forward_matches_float64_reference(pooling, output_dtype, row_alignment, device):
    seed = 1000 + ["sum", "mean"].index(pooling) * 10 + row_alignment
    print("seed", seed)
    m = quantized(SPECS_MIXED, seed, pooling=pooling, output_dtype=output_dtype, row_alignment=row_alignment,
                  device=device)
    rng = np.random.default_rng(seed)
    for batch_size in (1, 7):
        indices, offsets = random_batch(rng, m, batch_size, 20)
        out = m(indices, offsets)
        assert out.shape == (batch_size, m.total_dim) and out.dtype == output_dtype and out.device == m.weights.device
        assert_close_to_reference(m, out.float() if output_dtype == torch.float32 else out, indices, offsets)


def test_per_sample_weights_and_int32_lookups(device):
    seed = 2001
    print("seed", seed)
    m = quantized(SPECS_MIXED, seed, device=device)
    rng = np.random.default_rng(seed)
    indices, offsets = random_batch(rng, m, 5, 12)
    psw = torch.from_numpy(rng.standard_normal(indices.numel()).astype(np.float32)).to(device)
    out = m(indices.int(), offsets.int(), psw)
    assert_close_to_reference(m, out, indices, offsets, psw)


def test_sequence_output_and_shared_tables(device):
    seed = 2002
    print("seed", seed)
    specs = [(60, 16, "int4"), (40, 16, "fp8e4m3"), (30, 16, "int8")]
    m = quantized(specs, seed, pooling="none", feature_table_map=[0, 1, 2, 0], device=device)
    rng = np.random.default_rng(seed)
    indices, offsets = random_batch(rng, m, 4, 6)
    out = m(indices, offsets)
    assert out.shape == (indices.numel(), 16)
    assert_close_to_reference(m, out, indices, offsets)


@pytest.mark.parametrize("mode", ["skip", "off", "warn"])
def test_bad_indices_are_dropped_and_counted(mode, device):
    seed = 2003
    print("seed", seed)
    m = quantized(SPECS_MIXED[:4], seed, bounds_check=mode, pooling="mean", device=device)
    rng = np.random.default_rng(seed)
    indices, offsets = random_batch(rng, m, 6, 10, bad_every=5)
    bad = int((indices < 0).sum())
    assert bad > 0
    if mode == "warn":
        with pytest.warns(embscale.BoundsCheckWarning):
            out = m(indices, offsets)
            m.check_bounds()  # (a CUDA call's count is read by a later call, or here)
    else:
        out = m(indices, offsets)
    assert_close_to_reference(m, out, indices, offsets)
    assert int(m.num_skipped) == (bad if mode != "off" else 0)


def test_error_mode_names_the_bad_lookup_and_broken_offsets_fail(device):
    """Broken offsets fail in every mode on the CPU; on CUDA in error and skip modes, as the training module's."""
    m = quantized(SPECS_MIXED[:2], 2004, device=device)
    with pytest.raises(IndexError, match="index"):
        m(torch.tensor([0, 200, 1], device=device), torch.tensor([0, 2, 3], device=device))
    for mode in ("error", "skip", "off") if device.type == "cpu" else ("error", "skip"):
        m.bounds_check = mode
        with pytest.raises(IndexError, match="offsets"):
            m(torch.tensor([0, 1, 1], device=device), torch.tensor([0, 2, 1], device=device))


def test_round_trip_error_is_within_each_types_bound():
    seed = 2005
    print("seed", seed)
    torch.manual_seed(seed)
    specs = [(64, 32, w) for w in ("int8", "int4", "int2", "fp8e4m3", "fp8e5m2", "fp16", "bf16", "fp32")]
    m = QTBE(specs)
    tables = [torch.randn(e, d, dtype=torch.float32) for e, d, _ in specs]
    m.load_float(tables)
    for (e, d, w), x, y in zip(specs, tables, m.dequantized_tables()):
        err = (x.double() - y.double()).abs()
        if w in BITS:
            lo, hi = x.min(1).values.double(), x.max(1).values.double()
            step = (hi - lo) / (2 ** BITS[w] - 1)
            # half a step, plus the fp16 roundings of the bias and of the scale (times the largest code)
            bound = step / 2 + lo.abs() * 2.0 ** -11 + step * 2.0 ** -11 * (2 ** BITS[w] - 1) + 1e-6
            assert torch.all(err <= bound[:, None]), w
        else:
            rel = {"fp8e4m3": 2.0 ** -4, "fp8e5m2": 2.0 ** -3, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8,
                   "fp32": 0.0}[w]
            tiny = {"fp8e4m3": 2.0 ** -9, "fp8e5m2": 2.0 ** -16}.get(w, 0.0) * x.abs().amax(1, keepdim=True).double()
            assert torch.all(err <= rel * x.double().abs() + tiny + 1e-12), w


def test_saves_loads_pickles_and_copies_bytes_exactly():
    m = quantized(SPECS_MIXED, 2006)
    indices, offsets = random_batch(np.random.default_rng(2006), m, 3, 8)
    want = m(indices, offsets)
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    fresh = QTBE(m.embedding_specs)
    buf.seek(0)
    fresh.load_state_dict(torch.load(buf))
    assert torch.equal(fresh.weights, m.weights)
    assert torch.equal(fresh(indices, offsets), want)
    for clone in (pickle.loads(pickle.dumps(m)), copy.deepcopy(m)):
        assert torch.equal(clone.weights, m.weights)
        assert torch.equal(clone(indices, offsets), want)


def test_from_float_quantizes_a_trained_module(device):
    torch.manual_seed(2007)
    trained = embscale.TableBatchedEmbeddingBags([(80, 32), (60, 16)], feature_table_map=[0, 1, 1], pooling="mean",
                                                 device=device)
    q = QTBE.from_float(trained, ["int8", "fp8e4m3"])
    assert q.feature_table_map == [0, 1, 1] and q.pooling == "mean" and q.weights.device == trained.weights.device
    for x, y, w in zip(trained.split_embedding_weights(), q.dequantized_tables(), ("int8", "fp8e4m3")):
        x = x.detach()
        assert (x - y).abs().max() <= (x.max() - x.min()) / 255 + 1e-6 if w == "int8" else \
            torch.all((x - y).abs() <= x.abs() * 2.0 ** -4 + 1e-6)
    indices, offsets = random_batch(np.random.default_rng(2007), q, 4, 10)
    assert_close_to_reference(q, q(indices, offsets), indices, offsets)
    with torch.no_grad():
        dense = trained(indices, offsets)
    assert torch.allclose(q(indices, offsets), dense, atol=0.02)


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match=r"embedding_specs\[1\]: weight_type"):
        QTBE([(10, 4, "int8"), (10, 4, "int3")])
    with pytest.raises(ValueError, match="FBGEMM's FP8"):
        QTBE([(10, 4, "FP8")])
    with pytest.raises(ValueError, match=r"cfg.tables\[0\].dim|dim"):
        QTBE([(10, 0, "int8")])
    with pytest.raises(ValueError, match="row_alignment"):
        QTBE([(10, 4, "int8")], row_alignment=3)
    with pytest.raises(ValueError, match="pooling"):
        QTBE([(10, 4, "int8")], pooling="max")
    with pytest.raises(TypeError, match="output_dtype"):
        QTBE([(10, 4, "int8")], output_dtype=torch.float64)
    m = quantized([(10, 4, "int8"), (12, 4, "int4")], 2008)
    before = m.weights.clone()
    with pytest.raises(ValueError, match=r"tables\[1\]"):
        m.load_float([torch.randn(10, 4), torch.randn(11, 4)])
    with pytest.raises(ValueError, match=r"tables\[0\].*row 2"):
        m.load_float([torch.randn(10, 4).index_fill_(0, torch.tensor([2]), float("nan")), torch.randn(12, 4)])
    assert torch.equal(m.weights, before)  # a refused call changes nothing
    with pytest.raises(TypeError, match="indices"):
        m(torch.tensor([0.0]), torch.tensor([0, 1, 1]))
    with pytest.raises(ValueError, match="offsets"):
        m(torch.tensor([0]), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="per_sample_weights"):
        m(torch.tensor([0]), torch.tensor([0, 1, 1]), torch.tensor([1.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="per_sample_weights"):
        QTBE([(10, 4, "int8")], pooling="mean")(torch.tensor([0]), torch.tensor([0, 1]), torch.tensor([1.0]))


# ---- FBGEMM's own CPU IntNBit TBE, on identical bytes --------------------------------------------------------
def _fbgemm_inference_loaded():
    """Whether FBGEMM's inference library is loaded, not only its Python module (a training-only install of
    fbgemm_gpu imports the module but lacks the operators it calls)."""
    if IntNBitTableBatchedEmbeddingBagsCodegen is None:
        return False
    try:
        torch.ops.fbgemm.int_nbit_split_embedding_codegen_lookup_function
        return True
    except (AttributeError, RuntimeError):
        return False


needs_fbgemm = pytest.mark.skipif(not _fbgemm_inference_loaded(),
                                  reason="fbgemm_gpu's inference library (IntNBit TBE) is not installed")
FBGEMM_SPECS = [(100, 64, "int8"), (50, 32, "int4"), (40, 8, "int2"), (30, 16, "fp16"), (20, 12, "fp32"),
                (70, 128, "int8"), (33, 48, "int4")]


def fbgemm_module(specs, pooling):
    types = {"int8": SparseType.INT8, "int4": SparseType.INT4, "int2": SparseType.INT2, "fp16": SparseType.FP16,
             "fp32": SparseType.FP32}
    m = IntNBitTableBatchedEmbeddingBagsCodegen(
        [(f"t{t}", e, d, types[w], EmbeddingLocation.HOST) for t, (e, d, w) in enumerate(specs)], device="cpu",
        output_dtype=SparseType.FP32, pooling_mode={"sum": PoolingMode.SUM, "mean": PoolingMode.MEAN}[pooling])
    m.fill_random_weights()  # random bytes: headers and float rows get finite values below
    gen = torch.Generator().manual_seed(len(specs))
    for (rows, _), (e, d, w) in zip(m.split_embedding_weights(split_scale_shifts=False), specs):
        if w in BITS:
            header = torch.stack([torch.rand(e, generator=gen) * 0.1 + 1e-3, torch.randn(e, generator=gen)], 1)
            rows[:, :4] = header.half().view(torch.uint8)
        else:
            values = torch.randn(e, d, generator=gen).to({"fp16": torch.float16, "fp32": torch.float32}[w])
            rows.copy_(values.view(torch.uint8))
    return m


@needs_fbgemm
@pytest.mark.parametrize("pooling", ["sum", "mean"])
def test_fbgemm_cpu_tables_load_as_they_are_and_give_fbgemms_outputs(pooling):
    seed = 3001
    print("seed", seed)
    torch.manual_seed(seed)
    fb = fbgemm_module(FBGEMM_SPECS, pooling)
    ours = QTBE(FBGEMM_SPECS, pooling=pooling, row_alignment=1)
    fb_rows = [w for w, _ in fb.split_embedding_weights(split_scale_shifts=False)]
    assert [tuple(r.shape) for r in fb_rows] == [tuple(v.shape) for v in ours.split_embedding_weights()]
    assert ours.table_offsets == fb.weights_offsets.tolist()  # the same packed layout, byte for byte
    for view, rows in zip(ours.split_embedding_weights(), fb_rows):
        view.copy_(rows)
    rng = np.random.default_rng(seed)
    for batch_size in (1, 9):
        indices, offsets = random_batch(rng, ours, batch_size, 20)
        want = fb(indices.int(), offsets.int())
        got = ours(indices, offsets)
        assert_close_to_reference(ours, got, indices, offsets)
        # FBGEMM fuses q * scale + bias into one rounding, embscale rounds twice: a few ulps of each term
        w64, mag = reference(ours, indices, offsets, None)
        assert torch.all((got.double() - want.double()).abs() <= torch.from_numpy(24 * 2.0 ** -23 * mag + 1e-30))


@needs_fbgemm
@pytest.mark.parametrize("bits", [8, 4, 2])
def test_quantizing_matches_fbgemms_row_quantizer(bits):
    seed = 3002 + bits
    print("seed", seed)
    torch.manual_seed(seed)
    x = torch.randn(200, 48) * torch.rand(200, 1) * 4 + torch.randn(200, 1)
    x[0] = 0.5  # a constant row
    fb = torch.ops.fbgemm.FloatToFusedNBitRowwiseQuantizedSBHalf(x, bits)  # [codes][fp16 scale][fp16 bias]
    want = torch.cat([fb[:, -4:], fb[:, :-4]], dim=1)  # the TBE's rows carry the header first
    m = QTBE([(200, 48, f"int{bits}")], row_alignment=1)
    m.load_float([x])
    assert torch.equal(m.split_embedding_weights()[0], want)


@requires_cuda
@pytest.mark.parametrize("wtype", ["int8", "int4", "int2", "fp8e4m3", "fp8e5m2", "fp16", "bf16", "fp32"])
@pytest.mark.parametrize("row_alignment", [1, 16])
def test_cuda_quantizes_to_the_cpus_bytes(wtype, row_alignment):
    """load_float on a CUDA module quantizes on the device, to the bytes the CPU quantizer writes (rows of
    several shapes: wide, narrow, constant, a zero minimum of either sign first)."""
    gen = torch.Generator().manual_seed(2011)
    specs = [(37, d, wtype) for d in (1, 3, 16, 129)]
    tables = []
    for e, d, _ in specs:
        x = torch.randn(e, d, generator=gen)
        x[0] *= 1000
        x[1] *= 1e-3
        x[2] = 0.375
        x[3] = x[3].abs()
        x[3, 0] = 0.0
        x[4] = x[4].abs()
        x[4, 0] = -0.0
        tables.append(x)
    cpu, cuda = (QTBE(specs, row_alignment=row_alignment, device=dev) for dev in ("cpu", "cuda"))
    cpu.load_float(tables)
    cuda.load_float([t.cuda() for t in tables])
    assert torch.equal(cuda.weights.cpu(), cpu.weights)
    bad = [t.clone() for t in tables]
    bad[2][5, 1] = float("nan")
    before = cuda.weights.clone()
    with pytest.raises(ValueError, match=r"tables\[2\]: rows: row 5, column 1 is not finite"):
        cuda.load_float([t.cuda() for t in bad])
    assert torch.equal(cuda.weights, before)


@requires_cuda
def test_cuda_operator_matches_its_fake_and_compiles():
    """The operator on CUDA tensors: torch.library.opcheck (the fake's shapes and dtypes against the real call),
    and the module under torch.compile(fullgraph=True) equal to eager."""
    m = quantized(SPECS_MIXED, 2012, pooling="sum", bounds_check="skip", output_dtype=torch.bfloat16, device="cuda")
    indices, offsets = random_batch(np.random.default_rng(2012), m, 6, 9, bad_every=7)
    args = (m.weights, indices, offsets, None, *m._op_tables[:4], m.row_alignment, m.table_alignment, m.pooling,
            m.bounds_check, m.output_dtype)
    torch.library.opcheck(torch.ops.embscale.quant_tbe_forward.default, args,
                          test_utils=("test_schema", "test_faketensor"))
    out, skipped = torch.ops.embscale.quant_tbe_forward(*args)
    assert out.device.type == "cuda" and out.dtype == torch.bfloat16 and int(skipped) == int((indices < 0).sum())
    with torch.no_grad():
        want = m(indices, offsets)
        assert torch.equal(torch.compile(m, fullgraph=True)(indices, offsets), want)
    assert_close_to_reference(m, want, indices, offsets)


def test_torch_export_runs_the_operator_and_matches_eager():
    """The module in a model torch.export exports (the operator's fake implementation gives the shapes); the
    exported program, saved and loaded, runs the library's forward and gives eager's output."""
    m = quantized(SPECS_MIXED[:5], 2009, pooling="mean", bounds_check="skip")

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = m
            self.top = torch.nn.Linear(m.total_dim, 3)

        def forward(self, indices, offsets):
            return self.top(self.emb(indices, offsets))

    model = Model().eval()
    indices, offsets = random_batch(np.random.default_rng(2009), m, 4, 9, bad_every=7)
    with torch.no_grad():
        want = model(indices, offsets)
        program = torch.export.export(model, (indices, offsets))
    assert any("embscale.quant_tbe_forward" in str(n.target) for n in program.graph.nodes)
    buf = io.BytesIO()
    torch.export.save(program, buf)
    buf.seek(0)
    loaded = torch.export.load(buf)
    with torch.no_grad():
        assert torch.equal(loaded.module()(indices, offsets), want)
        assert torch.equal(torch.compile(model, fullgraph=True)(indices, offsets), want)


def test_error_report_against_the_float_module():
    """Per table, the relative error of the pooled rows against the fp32 module: computed here from the
    definition on the same outputs, and ordered as the types' precisions are (fp32 exact, int2 worst)."""
    torch.manual_seed(2010)
    types = ["fp32", "bf16", "int8", "fp8e4m3", "int4", "int2"]
    trained = embscale.TableBatchedEmbeddingBags([(200, 32)] * len(types), pooling="sum")
    q = QTBE.from_float(trained, types)
    indices, offsets = random_batch(np.random.default_rng(2010), q, 64, 12)
    report = q.error_report(trained, indices, offsets)
    assert [r["weight_type"] for r in report] == types
    with torch.no_grad():
        got, want = q(indices, offsets).double(), trained(indices, offsets).double()
    lengths = (offsets[1:] - offsets[:-1]).view(len(types), 64)
    for t, r in enumerate(report):
        g, w = got[:, 32 * t:32 * (t + 1)], want[:, 32 * t:32 * (t + 1)]
        keep = lengths[t] > 0
        rel = ((g - w).norm(dim=1) / w.norm(dim=1))[keep]
        assert r["bags"] == int(keep.sum())
        assert r["max_rel_err"] == pytest.approx(float(rel.max()), rel=1e-12)
        assert r["mean_rel_err"] == pytest.approx(float(rel.mean()), rel=1e-12)
    means = [r["mean_rel_err"] for r in report]
    assert means[0] == 0.0 and means[1] < means[3] < means[4] < means[5] and means[2] < means[4]
    with pytest.raises(ValueError, match="module"):
        q.error_report(embscale.TableBatchedEmbeddingBags([(200, 32)]), indices, offsets)
