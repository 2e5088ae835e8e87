"""Regression tests for the defects an adversarial review of 2026-12-03 found through the Python package
(the C++ side of each is in the C++ suite: Fp8Errors.OverlappingBuffersAreRefused,
TbeForwardErrors.NumSkippedOverlappingAnotherBufferIsRefused, TbeBackwardContract): outputs of the FP8
operators aliasing another argument (defect 18), table sizes beyond the C API's integers (19), hostile
checkpoints (20), a TBE handle with an empty feature map (21) and nn.EmbeddingBag options that
from_embedding_bags would drop (24); what the raw operators write in place: hparams sharing memory with
a table or expanded (25, 26), inference tensors and tensors that require grad (27, 28); the DLRM
example's arguments (29), a grad_output that is not 2-D, named with its own shape (30), and
hyper-parameters the backward refuses, accepted by the module until its first backward (31). Each refused
call leaves every buffer as it was. (Defects 22-23, in the FP8 training layer, are in
test_fp8_training.py; the data-parallel and TorchRec ones in test_data_parallel.py and test_torchrec.py;
the fake layouts in test_compile.py.)"""
import os
import subprocess
import sys

import pytest
import torch

import embscale
from embscale import ops
from hostile_module import (SPECS, B, TOTAL_DIM, make, lookups, raw_backward, refused, snapshot, assert_unchanged,
                            train_step)

E4 = torch.float8_e4m3fn


# ---- defect 18: FP8 outputs aliasing another argument ------------------------------------------------------
def _cast_transpose_same_output(device):
    x = torch.arange(16.0, device=device).view(4, 4)
    buf = torch.zeros(4, 4, dtype=E4, device=device)
    return (lambda: torch.ops.embscale.cast_transpose_out(x, torch.ones(1, device=device), buf, buf, None),
            "y: overlaps yt", [buf])


def _scale_is_scale_inv(device):
    s = torch.full((1,), 5.0, device=device)
    return (lambda: torch.ops.embscale.compute_scale_out(torch.ones(1, device=device), s, s, E4, None),
            "scale: overlaps scale_inv", [s])


def _amax_into_x(device):
    x = torch.arange(1.0, 9.0, device=device)
    return (lambda: torch.ops.embscale.amax_out(x, x[0:1], None, None), "amax: overlaps x", [x])


def _quantize_into_x(device):
    x = torch.arange(1.0, 17.0, device=device)
    y = x.view(torch.uint8)[:16].view(E4)  # x's first 16 bytes as the fp8 output
    return (lambda: torch.ops.embscale.quantize_out(x, torch.ones(1, device=device), y, None), "y: overlaps x", [x])


@pytest.mark.parametrize("case", [_cast_transpose_same_output, _scale_is_scale_inv, _amax_into_x, _quantize_into_x])
def test_defect18_fp8_outputs_aliasing_an_argument_are_refused(device, case):
    call, message, buffers = case(device)
    before = [b.clone() for b in buffers]
    with pytest.raises(ValueError, match=message):
        call()
    for b, was in zip(buffers, before):
        assert torch.equal(b.view(torch.uint8), was.view(torch.uint8)), f"{message}: a refused call wrote"


# ---- defect 19: table sizes beyond the C API's int64 rows and int32 dims ------------------------------------
@pytest.mark.parametrize("spec", [(10, 2**32 + 4), (10, 2**31), (2**63, 1), (2**64 + 10, 4)])
def test_defect19_huge_embedding_specs_are_refused_by_name(spec):
    with pytest.raises(ValueError, match=r"embedding_specs\[1\]: .* 1 <= num_embeddings < 2\^63 and "
                                         r"1 <= embedding_dim < 2\^31"):
        embscale.TableBatchedEmbeddingBags([(5, 4), spec])


@pytest.mark.parametrize("rows, dims, fmap, message", [
    ([10, 5], [4, 2**32 + 4], [0, 1], r"dims\[1\]: 4294967300 does not fit in the C API's int32"),
    ([2**64, 5], [4, 4], [0, 1], r"num_rows\[0\]: 18446744073709551616 does not fit in the C API's int64"),
    ([10, 5], [4, 4], [0, 2**32 + 1], r"feature_table_map\[1\]: 4294967297 does not fit"),
])
def test_defect19_tbe_handle_values_beyond_the_c_integers(rows, dims, fmap, message):
    with pytest.raises(ValueError, match=message):
        ops.TbeHandle("cpu", rows, dims, fmap, torch.float32)


# ---- defect 20: hostile checkpoints ---------------------------------------------------------------------------
def test_defect20_non_tensor_entry_is_refused_by_name():
    m = make("cpu")
    snap = snapshot(m)
    with pytest.raises(ValueError, match=r"state_dict: table_0.weight is a float, not a tensor"):
        m.load_state_dict({"table_0.weight": 3.0}, strict=False)
    assert_unchanged(m, snap)


def test_defect20_a_refused_checkpoint_changes_no_table():
    """A checkpoint whose tables fit but whose own buffers (hparams) do not is refused before any table is
    written."""
    m = make("cpu", optimizer="rowwise_adagrad")
    sd = {k: v.clone() + 1 if isinstance(v, torch.Tensor) and v.is_floating_point() else v
          for k, v in m.state_dict().items()}
    sd["hparams"] = torch.zeros(7, dtype=m.hparams.dtype)
    snap = snapshot(m)
    with pytest.raises(ValueError, match=r"state_dict: hparams has shape \[7\]; this module's is"):
        m.load_state_dict(sd)
    assert_unchanged(m, snap)


def test_defect20_malformed_extra_state_is_refused_by_name():
    m = make("cpu")
    sd = m.state_dict()
    sd["_extra_state"] = {"optimizer": m.optimizer, "weight_decay_mode": m.weight_decay_mode, "embedding_specs": 5}
    snap = snapshot(m)
    with pytest.raises(ValueError, match=r"_extra_state's embedding_specs 5 is not a list"):
        m.load_state_dict(sd)
    assert_unchanged(m, snap)


# ---- defect 21: a TBE handle with an empty feature map ---------------------------------------------------
def test_defect21_tbe_handle_with_an_empty_feature_map_is_refused():
    with pytest.raises(ValueError, match=r"num_features: 0 with a feature_table_map; at least one feature"):
        ops.TbeHandle("cpu", [r for r, _ in SPECS], [d for _, d in SPECS], [], torch.float32)


# ---- defect 24: nn.EmbeddingBag options from_embedding_bags would drop ----------------------------------
@pytest.mark.parametrize("option", [dict(padding_idx=0), dict(max_norm=0.01), dict(scale_grad_by_freq=True)])
def test_defect24_embedding_bag_options_the_tbe_lacks_are_refused(option):
    bag = torch.nn.EmbeddingBag(10, 4, mode="mean", **option)
    name = next(iter(option))
    with pytest.raises(ValueError, match=rf"bags\[1\]: {name}=.* is not supported"):
        embscale.TableBatchedEmbeddingBags.from_embedding_bags([torch.nn.EmbeddingBag(5, 4, mode="mean"), bag])
    with pytest.raises(ValueError, match="bags: empty"):
        embscale.TableBatchedEmbeddingBags.from_embedding_bags([])


# ---- defects 25-28 (third round): what the raw operators write in place ----------------------------------
def test_defect25_hparams_sharing_memory_with_a_table_is_refused():
    m = make("cpu", optimizer="rowwise_adagrad")
    i, o = lookups("cpu")
    n = m.weights.numel()
    storage = torch.zeros(n + 16)  # hparams (8 float64) in the first 16 floats, the weights after: apart
    storage[16:] = m.weights
    hp = storage[:16].view(torch.float64)
    hp.copy_(m.hparams)
    raw_backward(m, torch.ones(B, TOTAL_DIM), i, o, weights=storage[16:], hparams=hp)  # apart: runs
    assert hp[7].item() == m.hparams[7].item() + 1  # the step advanced
    with refused(m, ValueError, "hparams: overlaps weights"):
        raw_backward(m, torch.ones(B, TOTAL_DIM), i, o, weights=storage[:n], hparams=hp)
    m1 = torch.zeros(m.momentum1.numel() + 16)
    with refused(m, ValueError, "hparams: overlaps momentum1"):
        raw_backward(m, torch.ones(B, TOTAL_DIM), i, o, momentum1=m1[:m.momentum1.numel()],
                     hparams=m1[:16].view(torch.float64))


def test_defect26_expanded_hparams_are_refused():
    m = make("cpu", optimizer="sgd")
    i, o = lookups("cpu")
    hp = torch.tensor([0.5], dtype=torch.float64).expand(8)
    with refused(m, ValueError, "hparams: must be contiguous"):
        raw_backward(m, torch.ones(B, TOTAL_DIM), i, o, hparams=hp)
    assert hp[0].item() == 0.5


def test_defect27_inference_tensors_written_outside_inference_mode_are_refused():
    m = make("cpu", optimizer="sgd")
    i, o = lookups("cpu")
    with torch.inference_mode():
        w, a = m.weights.clone(), torch.zeros(1)
    with refused(m, RuntimeError, "weights: an inference tensor cannot be updated in place"):
        raw_backward(m, torch.ones(B, TOTAL_DIM), i, o, weights=w)
    with pytest.raises(RuntimeError, match="amax: an inference tensor cannot be updated in place"):
        torch.ops.embscale.amax_out(torch.randn(4, 8), a, None, None)
    assert a.item() == 0.0


def test_defect28_written_buffers_that_require_grad_are_refused():
    a = torch.zeros(1, requires_grad=True)
    for grad_mode in (True, False):  # the operators run below autograd: they cannot tell the two apart
        with torch.set_grad_enabled(grad_mode), pytest.raises(RuntimeError, match="amax: requires grad"):
            torch.ops.embscale.amax_out(torch.randn(4, 8), a, None, None)
    assert a.item() == 0.0
    torch.ops.embscale.amax_out(torch.ones(4, 8), a.detach(), None, None)
    assert a.item() == 1.0
    m = make("cpu", optimizer="sgd")
    i, o = lookups("cpu")
    w = m.weights.detach().clone().requires_grad_()
    with refused(m, RuntimeError, "weights: requires grad"):
        torch.ops.embscale.tbe_backward(w, m.momentum1, m.momentum2, m.hparams, torch.ones(B, TOTAL_DIM), i, o, None,
                                        m._handle_id, B, m.pooling, m.bounds_check, m.optimizer, m.weight_decay_mode,
                                        m.stochastic_rounding, m.seed, False)


# ---- defect 29: the DLRM example's arguments ------------------------------------------------------------------
@pytest.mark.parametrize("flag, value", [("--steps", "0"), ("--batch-size", "0"), ("--embedding-dim", "-1"),
                                         ("--lr", "nan")])
def test_defect29_train_dlrm_refuses_bad_arguments_by_flag(flag, value):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, os.path.join(root, "examples", "train_dlrm.py"), flag, value],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and f"error: {flag}: {value}" in r.stderr, r.stderr


def test_defect30_a_grad_output_that_is_not_2d_is_named_with_its_own_shape():
    m = make("cpu", optimizer="sgd")
    i, o = lookups("cpu")
    with refused(m, ValueError, r"grad_output: shape \[2, 1, 7\] is not 2-D"):
        raw_backward(m, torch.ones(B, 1, TOTAL_DIM), i, o)


# ---- defect 31: hyper-parameters the backward refuses were accepted until the first backward -----------------
@pytest.mark.parametrize("kw, message", [
    (dict(learning_rate=float("nan")), r"^learning_rate: nan; expected a finite value >= 0"),
    (dict(learning_rate=-0.5), r"^learning_rate: -0.5; expected a finite value >= 0$"),
    (dict(eps=0.0), r"^eps: 0; rowwise_adagrad needs a finite eps > 0$"),
    (dict(optimizer="adam", beta1=1.0), r"^beta1: 1 is outside \[0, 1\)$"),
    (dict(optimizer="sgd", max_norm=1.0), r"^max_norm: sgd does not support it"),
    (dict(optimizer="sgd", weight_decay=0.1, weight_decay_mode="l2"), r"^weight_decay: sgd applies no weight decay"),
    (dict(gradient_clipping=-1.0), r"^gradient_clipping: -1; expected a finite value >= 0$"),
    # The value as the optimizer computes with it (float32), and the value given when they differ:
    (dict(learning_rate=1e39), r"^learning_rate: inf; expected a finite value >= 0 \(the float32 the optimizer "
                               r"computes with; given 1e\+39\)$"),
    (dict(learning_rate=-1e-9), r"^learning_rate: -1e-09; expected a finite value >= 0$"),
    (dict(optimizer="adam", beta2=0.99999999), r"^beta2: 1 is outside \[0, 1\) \(the float32 the optimizer "
                                               r"computes with; given 0.99999999\)$"),
    (dict(learning_rate=10**400), r"^learning_rate: 1000.* is not a finite number$"),
])
def test_defect31_the_constructor_refuses_bad_hyper_parameters_by_name(kw, message):
    with pytest.raises(ValueError, match=message):
        make("cpu", **kw)


def test_defect31_a_bad_hyper_parameter_set_later_is_refused_and_changes_nothing():
    m = make("cpu", optimizer="rowwise_adagrad", learning_rate=0.25)
    i, o = lookups("cpu")
    with refused(m, ValueError, r"^lr: inf; expected a finite value >= 0"):
        m.set_learning_rate(float("inf"))
    with refused(m, TypeError, r"^lr: None is not a number"):
        m.set_learning_rate(None)
    # update_hyper_parameters checks the whole set first: the good lr given with the bad eps is not kept.
    with refused(m, ValueError, r"^params_dict\['eps'\]: 0; rowwise_adagrad needs a finite eps > 0$"):
        m.update_hyper_parameters({"lr": 0.5, "eps": 0.0})
    with refused(m, ValueError, r"^params_dict\['lr'\]: -1; expected a finite value >= 0$"):
        m.update_hyper_parameters({"lr": -1.0})
    assert m.learning_rate == 0.25
    m.set_learning_rate(0.5)
    train_step(m, i, o)
    assert m.learning_rate == 0.5 and m.step == 1


def test_defect31_a_checkpoint_with_bad_hyper_parameters_is_refused_before_any_table_is_written():
    m = make("cpu", optimizer="rowwise_adagrad")
    sd = {k: v.clone() + 1 if isinstance(v, torch.Tensor) and v.is_floating_point() else v
          for k, v in m.state_dict().items()}
    sd["hparams"][ops.HPARAM["eps"]] = -1.0
    snap = snapshot(m)
    with pytest.raises(ValueError, match=r"^state_dict: hparams: eps: -1; rowwise_adagrad needs a finite eps > 0$"):
        m.load_state_dict(sd)
    assert_unchanged(m, snap)


@pytest.mark.parametrize("value", ["0.1", b"0.1", True, torch.tensor(True), torch.ones(2), None])
def test_defect31_a_hyper_parameter_that_is_not_a_number_is_refused_by_type(value):
    with pytest.raises(TypeError, match=r"^learning_rate: .* is not a number$"):
        make("cpu", learning_rate=value)
    m = make("cpu")
    with refused(m, TypeError, r"^lr: .* is not a number$"):
        m.set_learning_rate(value)
    with refused(m, TypeError, r"^params_dict\['lr'\]: .* is not a number$"):
        m.update_hyper_parameters({"lr": value})


def test_defect31_numbers_of_every_kind_are_taken_alike():
    m = make("cpu", learning_rate=torch.tensor(0.25))
    assert m.learning_rate == 0.25
    m.update_hyper_parameters({"lr": torch.tensor([0.5], dtype=torch.float64), "eps": 1})
    assert m.learning_rate == 0.5 and float(m.hparams[ops.HPARAM["eps"]]) == 1.0
    m.set_learning_rate(3)
    assert m.learning_rate == 3.0


def test_defect31_dense_gradient_mode_reads_no_hyper_parameter_and_checks_none():
    """optimizer "none" returns the plain summed gradient: its hyper-parameters are not read, as before."""
    m = make("cpu", optimizer="none", learning_rate=-1.0, gradient_clipping=1.0, max_norm=1.0)
    m.set_learning_rate(float("nan"))
    i, o = lookups("cpu")
    m(i, o).sum().backward()
    assert m.weights.grad is not None


def test_defect31_the_hyper_parameters_stay_on_the_cpu_under_another_default_device():
    with torch.device("meta"):
        m = make("cpu", learning_rate=0.125)
    assert m.hparams.device.type == "cpu" and m.learning_rate == 0.125
    m.set_learning_rate(0.25)
    assert m.learning_rate == 0.25


def test_defect31_a_pickled_module_with_a_bad_hyper_parameter_is_refused_when_loaded():
    import io
    m = make("cpu", optimizer="rowwise_adagrad")
    m.hparams[ops.HPARAM["learning_rate"]] = float("nan")  # written directly, past set_learning_rate's check
    buf = io.BytesIO()
    torch.save(m, buf)
    buf.seek(0)
    with pytest.raises(ValueError, match=r"^pickle: hparams: learning_rate: nan; expected a finite value >= 0$"):
        torch.load(buf, weights_only=False)


def test_defect31_set_learning_rate_still_traces_in_a_full_graph():
    """Inside torch.compile the value is written as before (the library's check is not traceable); the
    backward checks it."""
    m = make("cpu", optimizer="sgd", learning_rate=0.1)
    ref = make("cpu", optimizer="sgd", learning_rate=0.1)
    ref.load_state_dict(m.state_dict())
    i, o = lookups("cpu")

    def step(mod, lr):
        mod.set_learning_rate(lr)
        mod.update_hyper_parameters({"lr": lr})
        return mod(i, o).sum()

    torch._dynamo.reset()
    torch.compile(step, backend="aot_eager", fullgraph=True)(m, 0.5).backward()
    step(ref, 0.5).backward()
    assert m.learning_rate == ref.learning_rate == 0.5 and m.step == ref.step == 1
    assert torch.equal(m.weights, ref.weights)


@pytest.mark.parametrize("hp", ["float32", "strided"])
def test_defect31_hparams_loaded_with_assign_are_kept_as_the_module_keeps_them(hp):
    m = make("cpu", optimizer="sgd")
    sd = m.state_dict()
    good = sd["hparams"].clone()
    sd["hparams"] = good.float() if hp == "float32" else torch.stack([good, good], 1)[:, 0]
    assert hp == "float32" or not sd["hparams"].is_contiguous()
    m.load_state_dict(sd, assign=True)
    assert m.hparams.dtype == torch.float64 and m.hparams.device.type == "cpu" and m.hparams.is_contiguous()
    assert torch.equal(m.hparams, sd["hparams"].double())  # the checkpoint's values (float32's, for float32)
    i, o = lookups("cpu")
    train_step(m, i, o)
    assert m.step == 1
