"""Regression tests for the defects found by fuzzing the Python package: bad inputs refused with the
documented exception and a message naming the argument, the tables, optimizer state and step left as
they were — per-sample weights and optimizer state of the wrong size (defects 1, 2), unknown or foreign
handles (4), the step counter (7), an empty feature_table_map (10), raw operator sizes (12), the
exception types and bad offsets with bounds checking off."""
import gc

import pytest
import torch

import embscale
from embscale import ops
from conftest import requires_cuda
from hostile_module import (SPECS, B, TOTAL_DIM, make, lookups, snapshot, assert_unchanged, refused, raw_forward,
                            raw_backward, train_step)


# ---- defect 1: per-sample weights of the wrong length or shape --------------------------------------------
@pytest.mark.parametrize("n", [4, 0, 9])
def test_defect1_per_sample_weights_wrong_length(device, n):
    m = make(device, optimizer="sgd")
    i, o = lookups(device)
    with refused(m, ValueError, f"per_sample_weights: {n} elements; expected N .* = 8"):
        m(i, o, torch.ones(n, device=device))
    # the backward checks them too (the raw operator, whose forward was not run)
    with refused(m, ValueError, f"per_sample_weights: {n} elements"):
        raw_backward(m, torch.ones(B, TOTAL_DIM, device=device), i, o, torch.ones(n, device=device))
    assert m.step == 0


def test_defect1_per_sample_weights_2d_refused(device):
    m = make(device, optimizer="sgd")
    i, o = lookups(device)
    for shape in [(8, 1), (1, 8), (2, 4)]:
        with refused(m, ValueError, "per_sample_weights: has 2 dimensions, expected 1"):
            m(i, o, torch.ones(shape, device=device))
        with refused(m, ValueError, "per_sample_weights: has 2 dimensions, expected 1"):
            raw_backward(m, torch.ones(B, TOTAL_DIM, device=device), i, o, torch.ones(shape, device=device))


# ---- defect 2: optimizer state of the wrong length --------------------------------------------------------
@pytest.mark.parametrize("optimizer,name,size", [
    ("rowwise_adagrad", "momentum1", 16),     # 17 rows
    ("rowwise_adagrad", "momentum1", 18),
    ("rowwise_adagrad", "momentum1", 61),     # element-wise instead of row-wise
    ("adam", "momentum1", 60),                # 61 elements
    ("adam", "momentum2", 17),
    ("partial_rowwise_adam", "momentum2", 61),
    ("sgd", "momentum1", 17),                 # sgd keeps none
])
def test_defect2_raw_backward_momentum_wrong_length(device, optimizer, name, size):
    m = make(device, optimizer=optimizer)
    i, o = lookups(device)
    with refused(m, ValueError, f"{name}: "):
        raw_backward(m, torch.ones(B, TOTAL_DIM, device=device), i, o,
                     **{name: torch.zeros(size, dtype=torch.float32, device=device)})
    with refused(m, TypeError, f"{name}: dtype float64"):
        raw_backward(m, torch.ones(B, TOTAL_DIM, device=device), i, o,
                     **{name: torch.zeros(size, dtype=torch.float64, device=device)})


# ---- defect 4: the raw operators trusted an integer handle ------------------------------------------------
@pytest.mark.parametrize("handle", [12345, 0, -1, 2**62])
def test_defect4_raw_ops_refuse_unknown_handle(device, handle):
    m = make(device, optimizer="rowwise_adagrad")
    i, o = lookups(device)
    with refused(m, ValueError, "handle: "):
        raw_forward(m, i, o, handle=handle)
    with refused(m, ValueError, "handle: "):
        raw_backward(m, torch.ones(B, TOTAL_DIM, device=device), i, o, handle=handle)
    # the fake implementations look the handle up too
    meta = dict(indices=i.to("meta"), offsets=o.to("meta"))
    with pytest.raises(ValueError, match="handle: "):
        torch.ops.embscale.tbe_forward(m.weights.to("meta"), meta["indices"], meta["offsets"], None, handle, B,
                                       "sum", "error", TOTAL_DIM, torch.float32)


def test_defect4_freed_modules_handle_is_refused(device):
    i, o = lookups(device)
    # A handle owned by nothing but this test (a module may be kept alive by references outside the
    # test's control, e.g. a traceback), freed, then looked up.
    gone = ops.TbeHandle(device, [r for r, _ in SPECS], [d for _, d in SPECS], [0, 1], torch.float32)
    stale = gone.id
    del gone
    gc.collect()
    m = make(device, optimizer="sgd")
    assert m._handle_id != stale  # ids are never reused
    with refused(m, ValueError, f"handle: {stale} is not the id of a live"):
        raw_forward(m, i, o, handle=stale)
    with refused(m, ValueError, f"handle: {stale} is not the id of a live"):
        raw_backward(m, torch.ones(B, TOTAL_DIM, device=device), i, o, handle=stale)


def test_defect4_handle_of_another_module_or_device(device):
    i, o = lookups(device)
    m = make(device, optimizer="sgd")
    other = embscale.TableBatchedEmbeddingBags([(5, 2)], device=device)
    # another module's handle: its layout does not fit (one feature, total_dim 2) - refused before any call
    with refused(m, ValueError, "batch_size: 2 needs offsets of T\\*B\\+1 = 3 entries"):
        raw_forward(m, i, o, handle=other._handle_id)
    with refused(m, ValueError, "weights: 61 elements; expected num_weights"):
        raw_backward(m, torch.ones(1, 2, device=device), i, torch.tensor([0, 8], device=device), batch_size=1,
                     handle=other._handle_id)
    # a handle made for the meta device has no C object: refused for real tensors
    meta = make("meta")
    with refused(m, ValueError, "handle: .* is a TableBatchedEmbedding on meta"):
        raw_forward(m, i, o, handle=meta._handle_id)
    with refused(m, ValueError, "handle: .* is a TableBatchedEmbedding on meta"):
        raw_backward(m, torch.ones(B, TOTAL_DIM, device=device), i, o, handle=meta._handle_id)


@requires_cuda
def test_defect4_cpu_handle_with_cuda_tensors():
    cpu, gpu = make("cpu"), make("cuda")
    i, o = lookups("cuda")
    with refused(gpu, ValueError, "handle: .* is a TableBatchedEmbedding on cpu; the tensors are on cuda"):
        raw_forward(gpu, i, o, handle=cpu._handle_id)
    with refused(gpu, ValueError, "handle: .* is a TableBatchedEmbedding on cpu"):
        raw_backward(gpu, torch.ones(B, TOTAL_DIM, device="cuda"), i, o, handle=cpu._handle_id)


# ---- defect 7: the step counter ---------------------------------------------------------------------------
@pytest.mark.parametrize("step", [2.0**64 + 4096, 2.0**63, 2.0**63 - 1024, 2.0**53, -2.0**64, float("nan"),
                                  float("inf"), float("-inf"), 1.5, 0.0, -5.0])
def test_defect7_step_out_of_range(device, step):
    m = make(device, optimizer="adam")
    i, o = lookups(device)
    m.hparams[7] = step
    out = m(i, o)
    with refused(m, ValueError, "step"):
        out.sum().backward()
    with refused(m, ValueError, "step"):
        raw_backward(m, torch.ones(B, TOTAL_DIM, device=device), i, o)


def test_defect7_large_steps_accepted(device):
    m = make(device, optimizer="adam")
    i, o = lookups(device)
    m.hparams[7] = 2.0**40
    train_step(m, i, o)
    assert m.step == 2**40
    m.hparams[7] = 2.0**53 - 1  # the last step the float64 counter can count past (to 2^53)
    before = m.weights.detach().clone()
    train_step(m, i, o)
    assert not torch.equal(m.weights.detach(), before) and m.step == 2**53 - 1


# ---- defect 10: an empty feature_table_map ------------------------------------------------------------------
def test_defect10_empty_feature_table_map():
    with pytest.raises(ValueError, match="feature_table_map: empty"):
        embscale.TableBatchedEmbeddingBags(SPECS, feature_table_map=[])
    m = embscale.TableBatchedEmbeddingBags(SPECS, feature_table_map=None)
    assert m.feature_table_map == [0, 1]


# ---- defect 12: raw operator sizes validated before allocating -------------------------------------------
@pytest.mark.parametrize("on_meta", [False, True])
def test_defect12_raw_forward_sizes(device, on_meta):
    m = make(device)
    i, o = lookups(device)
    if on_meta:  # the fake implementation checks the same
        i, o = i.to("meta"), o.to("meta")
        m.to("meta")
    snap = snapshot(m)
    cases = [
        (dict(batch_size=-1), "batch_size: -1 is negative"),
        (dict(batch_size=2**40), "batch_size: 1099511627776 needs offsets of T\\*B\\+1"),
        (dict(batch_size=3), "batch_size: 3 needs offsets"),
        (dict(output_cols=-7), "output_cols: -7; expected total_dim \\(pooled\\) = 7"),
        (dict(output_cols=2**40), "output_cols: 1099511627776; expected total_dim"),
        (dict(output_cols=4, pooling="none"), "pooling: 'none' \\(sequence\\) needs all features of one dimension"),
        (dict(pooling="max"), "pooling: 'max' is not one of"),
        (dict(bounds_check="maybe"), "bounds_check: 'maybe' is not one of"),
    ]
    for over, match in cases:
        with pytest.raises(ValueError, match=match):
            raw_forward(m, i, o, **over)
    assert_unchanged(m, snap)
    seq = embscale.TableBatchedEmbeddingBags([(10, 4), (7, 4)], pooling="none", device=m.weights.device)
    with pytest.raises(ValueError, match="output_cols: 8; expected D \\(sequence\\) = 4"):
        raw_forward(seq, i, o, output_cols=8)
    assert raw_forward(seq, i, o, output_cols=4)[0].shape == (8, 4)


def test_defect12_raw_backward_sizes(device):
    m = make(device, optimizer="rowwise_adagrad")
    i, o = lookups(device)
    g = torch.ones(B, TOTAL_DIM, device=device)
    with refused(m, ValueError, "batch_size: -1 is negative"):
        raw_backward(m, g, i, o, batch_size=-1)
    with refused(m, ValueError, "batch_size: 1099511627776 needs offsets"):
        raw_backward(m, g, i, o, batch_size=2**40)
    with refused(m, ValueError, "grad_output: shape"):
        raw_backward(m, torch.ones(B, TOTAL_DIM + 1, device=device), i, o)


# ---- exception types, bad offsets in off mode ---------------------------------------------------------------
def test_exception_types(device):
    m = make(device, optimizer="sgd", bounds_check="error")
    i, o = lookups(device)
    # The raw operators take one index dtype; the module runs int32 and int64 mixed as int64, as FBGEMM.
    with refused(m, TypeError, "offsets: dtype int32 differs from the indices' dtype int64"):
        raw_forward(m, i, o.int())
    with refused(m, TypeError, "offsets: dtype int64 differs from the indices' dtype int32"):
        raw_forward(m, i.int(), o)
    with refused(m, TypeError, "indices: dtype float32 is not supported"):
        m(i.float(), o)
    with refused(m, TypeError, "per_sample_weights: dtype float64 is not supported"):
        m(i, o, torch.ones(8, dtype=torch.float64, device=device))
    with refused(m, TypeError, "grad_output: dtype int64"):
        raw_backward(m, torch.ones(B, TOTAL_DIM, dtype=torch.int64, device=device), i, o)
    with refused(m, TypeError, "offsets: dtype int32 differs"):
        raw_backward(m, torch.ones(B, TOTAL_DIM, device=device), i, o.int())
    with refused(m, ValueError, "indices: has 2 dimensions"):
        m(i.view(2, 4), o)
    bad = i.clone()
    bad[5] = 7  # feature 1 (table 1, 7 rows), bag 0
    with refused(m, IndexError, "feature 1, bag 0"):
        m(bad, o)
    with refused(m, IndexError, "feature 1, bag 0"):
        raw_backward(m, torch.ones(B, TOTAL_DIM, device=device), bad, o)
    with refused(m, ValueError, r"lr: nan; expected a finite value >= 0"):
        m.set_learning_rate(float("nan"))
    with refused(m, ValueError, "optimizer.learning_rate"):
        m.hparams[0] = float("nan")  # past the module's check: the backward refuses it too
        try:
            train_step(m, i, o)
        finally:
            m.hparams[0] = 0.01  # restores the snapshot's value (refused() compares after this)


@pytest.mark.parametrize("case", ["last_huge", "decreasing", "first_negative"])
def test_bad_offsets_with_bounds_check_off_on_cpu(case):
    m = make("cpu", optimizer="rowwise_adagrad", bounds_check="off")
    i, o = lookups("cpu")
    if case == "last_huge":
        o[-1] = 1 << 40
    elif case == "decreasing":
        o[2] = 2
    else:
        o[0] = -2**40
    with refused(m, IndexError, "offsets: "):
        m(i, o)
    with refused(m, IndexError, "offsets: "):
        raw_backward(m, torch.ones(B, TOTAL_DIM), i, o)
