"""TableBatchedEmbeddingBags across devices and dtypes: on the meta device it has no C object and gives
shapes only; materialised with to_empty (or moved to meta and back) it trains as a module built on the device;
a move to a dtype or device it does not support is refused and leaves the module as it was."""
import pytest
import torch

import embscale
from two_tables import SPECS, B, TOTAL_DIM, make, lookups, refused, train_step, assert_same_state


@pytest.mark.filterwarnings("ignore:Complex modules")
@pytest.mark.parametrize("move", ["double", "to_float64", "to_complex", "type_float64"])
def test_a_move_to_an_unsupported_dtype_leaves_the_module_as_it_was(device, move):
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


def test_an_unsupported_device_is_refused():
    with pytest.raises(ValueError, match="device: xpu"):
        embscale.TableBatchedEmbeddingBags(SPECS, device="xpu")
    if not torch.cuda.is_available():
        m = make("cpu")
        with refused(m, Exception, None):  # torch's own error: no CUDA here
            m.cuda()
        assert m.weights.device.type == "cpu"


def test_a_module_on_meta_gives_shapes_only():
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


def test_a_meta_module_materialised_with_to_empty_trains_as_one_built_on_the_device(device):
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


def test_a_module_moved_to_meta_and_back_trains(device):
    m = make(device, optimizer="sgd")
    m.to("meta")
    assert m.weights.device.type == "meta" and m.hparams.device.type == "cpu"
    i, o = lookups("meta")
    assert m(i, o).shape == (B, TOTAL_DIM)
    m.to_empty(device=device)
    m.reset_parameters()
    train_step(m, *lookups(device))
    assert m.step == 1
