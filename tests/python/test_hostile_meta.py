"""Regression tests for the defects found by fuzzing the Python package: meta tensors among real ones
(defect 8), and dtype or device moves and the meta device (defect 11)."""
import pytest
import torch

import embscale
from hostile_module import SPECS, B, TOTAL_DIM, make, lookups, refused, raw_backward, train_step, assert_same_state


# ---- defect 8: meta tensors among real ones ran the fake implementation -----------------------------------
def test_defect8_meta_input_among_real_ones(device):
    m = make(device, optimizer="sgd")
    i, o = lookups(device)
    psw = torch.ones(8, device=device)
    meta = torch.device("meta")
    with refused(m, ValueError, "indices: is on meta"):
        m(i.to(meta), o)
    with refused(m, ValueError, "offsets: is on meta"):
        m(i, o.to(meta))
    with refused(m, ValueError, "per_sample_weights: is on meta"):
        m(i, o, psw.to(meta))
    g = torch.ones(B, TOTAL_DIM, device=device)
    with refused(m, ValueError, "grad_output: is on meta"):
        raw_backward(m, g.to(meta), i, o)
    with refused(m, ValueError, "indices: is on meta"):
        raw_backward(m, g, i.to(meta), o)
    with refused(m, ValueError, "momentum1: is on meta"):
        raw_backward(m, g, i, o, momentum1=torch.zeros(0, device=meta))


def test_defect8_fp8_ops_meta_scale(device):
    x = torch.ones(3, 4, device=device)
    one = torch.tensor(1.0, device=device)
    meta = torch.device("meta")
    with pytest.raises(ValueError, match="scale: is on meta"):
        embscale.quantize(x, one.to(meta))
    with pytest.raises(ValueError, match=f"scale: is on {device.type}.*, expected meta"):
        embscale.quantize(x.to(meta), one)  # the first argument sets the device
    y = embscale.quantize(x, one)
    with pytest.raises(ValueError, match="scale_inv: is on meta"):
        embscale.dequantize(y, one.to(meta))
    with pytest.raises(ValueError, match="scale: is on meta"):
        embscale.cast_transpose(x, one.to(meta))


def test_defect8_all_meta_still_works():
    x, s = torch.empty(3, 4, device="meta"), torch.empty((), device="meta")
    assert embscale.quantize(x, s).device.type == "meta"
    y, yt = embscale.cast_transpose(x, s)
    assert y.shape == (3, 4) and yt.shape == (4, 3) and yt.device.type == "meta"
    assert embscale.dequantize(embscale.quantize(x, s), s).shape == (3, 4)
    y, scale_inv = embscale.quantize_current_scaling(x)
    assert y.device.type == "meta" and scale_inv.shape == ()
    # and the fake implementations still check dtypes like the real ones
    with pytest.raises(TypeError, match="x: dtype int32"):
        embscale.quantize(x.int(), s)


# ---- defect 11: unsupported dtype or device moves; the meta device ------------------------------------------
@pytest.mark.filterwarnings("ignore:Complex modules")
@pytest.mark.parametrize("move", ["double", "to_float64", "to_complex", "type_float64"])
def test_defect11_unsupported_dtype_leaves_module_as_it_was(device, move):
    m = make(device, optimizer="adam")
    i, o = lookups(device)
    train_step(m, i, o)
    weights, handle_id = m.weights, m._handle_id
    apply = {"double": lambda: m.double(), "to_float64": lambda: m.to(torch.float64),
             "to_complex": lambda: m.to(torch.complex64), "type_float64": lambda: m.type(torch.float64)}[move]
    with refused(m, TypeError, "weights_dtype: torch.(float64|complex64) is not supported"):
        apply()
    assert m.weights is weights and m._handle_id == handle_id
    assert m.num_skipped.dtype == torch.int64
    train_step(m, i, o)
    assert m.step == 2


def test_defect11_unsupported_device():
    with pytest.raises(ValueError, match="device: xpu"):
        embscale.TableBatchedEmbeddingBags(SPECS, device="xpu")
    if not torch.cuda.is_available():
        m = make("cpu")
        with refused(m, Exception, None):  # torch's own error: no CUDA here
            m.cuda()
        assert m.weights.device.type == "cpu"


def test_defect11_module_on_meta():
    m = embscale.TableBatchedEmbeddingBags(SPECS, optimizer="rowwise_adagrad", device="meta")
    assert m.weights.device.type == "meta" and m._layout.ptr is None  # no C object on meta
    assert m.momentum1.shape == (17,) and m.hparams.device.type == "cpu"
    i, o = lookups("meta")
    out = m(i, o)
    assert out.device.type == "meta" and out.shape == (B, TOTAL_DIM)
    out.sum().backward()  # shapes only: nothing is trained
    assert m.step == 0
    seq = embscale.TableBatchedEmbeddingBags([(10, 4), (7, 4)], pooling="none", device="meta")
    assert seq(i, o).shape == (8, 4)
    with pytest.raises(ValueError, match="indices: is on cpu"):
        m(*lookups("cpu"))


def test_defect11_meta_materialised_with_to_empty(device):
    torch.manual_seed(3)
    want = make(device, optimizer="rowwise_adagrad")
    torch.manual_seed(3)
    m = embscale.TableBatchedEmbeddingBags(SPECS, optimizer="rowwise_adagrad", device="meta")
    with pytest.raises(NotImplementedError, match="to_empty"):
        m.to(device)  # torch refuses: meta tensors have no data to copy
    assert m.weights.device.type == "meta"
    m.to_empty(device=device)
    assert m.weights.device.type == device.type and m._layout.ptr is not None
    torch.manual_seed(3)
    m.reset_parameters()
    assert_same_state(m, want)
    i, o = lookups(device)
    train_step(m, i, o)
    train_step(want, i, o)
    assert_same_state(m, want)


def test_defect11_to_meta_and_back(device):
    m = make(device, optimizer="sgd")
    m.to("meta")
    assert m.weights.device.type == "meta" and m.hparams.device.type == "cpu"
    i, o = lookups("meta")
    assert m(i, o).shape == (B, TOTAL_DIM)
    m.to_empty(device=device)
    m.reset_parameters()
    train_step(m, *lookups(device))
    assert m.step == 1
