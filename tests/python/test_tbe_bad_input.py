"""Bad inputs to TableBatchedEmbeddingBags, its raw operators (torch.ops.embscale.tbe_forward, tbe_backward)
and TbeHandle are refused with the documented exception (TypeError for a dtype, ValueError for a shape, size,
device or value, IndexError for an index or offset) and a message naming the argument, and leave the tables,
the optimizer state and the step counter as they were: per-sample weights and optimizer state of the wrong
size, unknown, freed or foreign handles, sizes checked before anything is allocated, meta tensors among real
ones, what the raw backward writes in place, tables beyond the C API's integers, and bad offsets with bounds
checking off. (Bad hyper-parameters: test_tbe_hyperparameters.py; bad checkpoints: test_tbe_state_dict.py.)"""
import gc

import pytest
import torch

import embscale
from embscale import ops
from conftest import requires_cuda
from two_tables import (SPECS, B, TOTAL_DIM, make, lookups, snapshot, assert_unchanged, refused, raw_forward,
                        raw_backward, train_step)


# ---- per-sample weights of the wrong length or shape ----------------------------------------------------------
@pytest.mark.parametrize("n", [4, 0, 9])
def test_per_sample_weights_of_the_wrong_length_are_refused(device, n):
    m = make(device, optimizer="sgd")
    i, o = lookups(device)
    with refused(m, ValueError, f"per_sample_weights: {n} elements; expected N .* = 8"):
        m(i, o, torch.ones(n, device=device))
    # the backward checks them too (the raw operator, whose forward was not run)
    with refused(m, ValueError, f"per_sample_weights: {n} elements"):
        raw_backward(m, torch.ones(B, TOTAL_DIM, device=device), i, o, torch.ones(n, device=device))
    assert m.step == 0


def test_per_sample_weights_of_two_dimensions_are_refused(device):
    m = make(device, optimizer="sgd")
    i, o = lookups(device)
    for shape in [(8, 1), (1, 8), (2, 4)]:
        with refused(m, ValueError, "per_sample_weights: has 2 dimensions, expected 1"):
            m(i, o, torch.ones(shape, device=device))
        with refused(m, ValueError, "per_sample_weights: has 2 dimensions, expected 1"):
            raw_backward(m, torch.ones(B, TOTAL_DIM, device=device), i, o, torch.ones(shape, device=device))


# ---- optimizer state of the wrong length or dtype -------------------------------------------------------------
@pytest.mark.parametrize("optimizer,name,size", [
    ("rowwise_adagrad", "momentum1", 16),     # 17 rows
    ("rowwise_adagrad", "momentum1", 18),
    ("rowwise_adagrad", "momentum1", 61),     # element-wise instead of row-wise
    ("adam", "momentum1", 60),                # 61 elements
    ("adam", "momentum2", 17),
    ("partial_rowwise_adam", "momentum2", 61),
    ("sgd", "momentum1", 17),                 # sgd keeps none
])
def test_raw_backward_refuses_optimizer_state_of_the_wrong_length_or_dtype(device, optimizer, name, size):
    m = make(device, optimizer=optimizer)
    i, o = lookups(device)
    with refused(m, ValueError, f"{name}: "):
        raw_backward(m, torch.ones(B, TOTAL_DIM, device=device), i, o,
                     **{name: torch.zeros(size, dtype=torch.float32, device=device)})
    with refused(m, TypeError, f"{name}: dtype float64"):
        raw_backward(m, torch.ones(B, TOTAL_DIM, device=device), i, o,
                     **{name: torch.zeros(size, dtype=torch.float64, device=device)})


# ---- handles: the raw operators trust no integer --------------------------------------------------------------
@pytest.mark.parametrize("handle", [12345, 0, -1, 2**62])
def test_raw_operators_refuse_an_unknown_handle(device, handle):
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


def test_raw_operators_refuse_the_handle_of_a_freed_module(device):
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


def test_raw_operators_refuse_the_handle_of_another_module_or_device(device):
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
def test_raw_operators_refuse_a_cpu_handle_with_cuda_tensors():
    cpu, gpu = make("cpu"), make("cuda")
    i, o = lookups("cuda")
    with refused(gpu, ValueError, "handle: .* is a TableBatchedEmbedding on cpu; the tensors are on cuda"):
        raw_forward(gpu, i, o, handle=cpu._handle_id)
    with refused(gpu, ValueError, "handle: .* is a TableBatchedEmbedding on cpu"):
        raw_backward(gpu, torch.ones(B, TOTAL_DIM, device="cuda"), i, o, handle=cpu._handle_id)


# ---- sizes of the raw operators, checked before anything is allocated -----------------------------------------
@pytest.mark.parametrize("on_meta", [False, True])
def test_raw_forward_checks_sizes_before_allocating(device, on_meta):
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


def test_raw_backward_checks_sizes_before_allocating(device):
    m = make(device, optimizer="rowwise_adagrad")
    i, o = lookups(device)
    g = torch.ones(B, TOTAL_DIM, device=device)
    with refused(m, ValueError, "batch_size: -1 is negative"):
        raw_backward(m, g, i, o, batch_size=-1)
    with refused(m, ValueError, "batch_size: 1099511627776 needs offsets"):
        raw_backward(m, g, i, o, batch_size=2**40)
    with refused(m, ValueError, "grad_output: shape"):
        raw_backward(m, torch.ones(B, TOTAL_DIM + 1, device=device), i, o)


def test_a_grad_output_that_is_not_2d_is_named_with_its_own_shape():
    m = make("cpu", optimizer="sgd")
    i, o = lookups("cpu")
    with refused(m, ValueError, r"grad_output: shape \[2, 1, 7\] is not 2-D"):
        raw_backward(m, torch.ones(B, 1, TOTAL_DIM), i, o)


# ---- meta tensors among real ones -----------------------------------------------------------------------------
def test_a_meta_tensor_among_real_ones_is_refused(device):
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


# ---- what the raw backward writes in place --------------------------------------------------------------------
def test_hparams_sharing_memory_with_a_table_are_refused():
    m = make("cpu", optimizer="rowwise_adagrad")
    i, o = lookups("cpu")
    n = m.weights.numel()
    k = 2 * len(embscale.ops.HPARAM_FIELDS)  # hparams (float64) in the first k floats, the weights after: apart
    storage = torch.zeros(n + k)
    storage[k:] = m.weights
    hp = storage[:k].view(torch.float64)
    hp.copy_(m.hparams)
    raw_backward(m, torch.ones(B, TOTAL_DIM), i, o, weights=storage[k:], hparams=hp)  # apart: runs
    assert hp[7].item() == m.hparams[7].item() + 1  # the step advanced
    with refused(m, ValueError, "hparams: overlaps weights"):
        raw_backward(m, torch.ones(B, TOTAL_DIM), i, o, weights=storage[:n], hparams=hp)
    m1 = torch.zeros(m.momentum1.numel() + k)
    with refused(m, ValueError, "hparams: overlaps momentum1"):
        raw_backward(m, torch.ones(B, TOTAL_DIM), i, o, momentum1=m1[:m.momentum1.numel()],
                     hparams=m1[:k].view(torch.float64))


def test_expanded_hparams_are_refused():
    m = make("cpu", optimizer="sgd")
    i, o = lookups("cpu")
    hp = torch.tensor([0.5], dtype=torch.float64).expand(len(embscale.ops.HPARAM_FIELDS))
    with refused(m, ValueError, "hparams: must be contiguous"):
        raw_backward(m, torch.ones(B, TOTAL_DIM), i, o, hparams=hp)
    assert hp[0].item() == 0.5


def test_inference_tensors_written_outside_inference_mode_are_refused():
    m = make("cpu", optimizer="sgd")
    i, o = lookups("cpu")
    with torch.inference_mode():
        w = m.weights.clone()
    with refused(m, RuntimeError, "weights: an inference tensor cannot be updated in place"):
        raw_backward(m, torch.ones(B, TOTAL_DIM), i, o, weights=w)


def test_written_buffers_that_require_grad_are_refused():
    m = make("cpu", optimizer="sgd")
    i, o = lookups("cpu")
    w = m.weights.detach().clone().requires_grad_()
    with refused(m, RuntimeError, "weights: requires grad"):
        torch.ops.embscale.tbe_backward(w, m.momentum1, m.momentum2, m.hparams, torch.ones(B, TOTAL_DIM), i, o, None,
                                        m._handle_id, B, m.pooling, m.bounds_check, m.optimizer, m.weight_decay_mode,
                                        m.stochastic_rounding, m.seed, False)


# ---- construction: feature maps, tables beyond the C API's integers, nn.EmbeddingBag options ------------------
def test_an_empty_feature_table_map_is_refused():
    with pytest.raises(ValueError, match="feature_table_map: empty"):
        embscale.TableBatchedEmbeddingBags(SPECS, feature_table_map=[])
    m = embscale.TableBatchedEmbeddingBags(SPECS, feature_table_map=None)
    assert m.feature_table_map == [0, 1]


def test_a_tbe_handle_with_an_empty_feature_map_is_refused():
    with pytest.raises(ValueError, match=r"num_features: 0 with a feature_table_map; at least one feature"):
        ops.TbeHandle("cpu", [r for r, _ in SPECS], [d for _, d in SPECS], [], torch.float32)


@pytest.mark.parametrize("spec", [(10, 2**32 + 4), (10, 2**31), (2**63, 1), (2**64 + 10, 4)])
def test_embedding_specs_beyond_the_c_integers_are_refused_by_name(spec):
    with pytest.raises(ValueError, match=r"embedding_specs\[1\]: .* 1 <= num_embeddings < 2\^63 and "
                                         r"1 <= embedding_dim < 2\^31"):
        embscale.TableBatchedEmbeddingBags([(5, 4), spec])


@pytest.mark.parametrize("rows, dims, fmap, message", [
    ([10, 5], [4, 2**32 + 4], [0, 1], r"dims\[1\]: 4294967300 does not fit in the C API's int32"),
    ([2**64, 5], [4, 4], [0, 1], r"num_rows\[0\]: 18446744073709551616 does not fit in the C API's int64"),
    ([10, 5], [4, 4], [0, 2**32 + 1], r"feature_table_map\[1\]: 4294967297 does not fit"),
])
def test_a_tbe_handle_refuses_values_beyond_the_c_integers(rows, dims, fmap, message):
    with pytest.raises(ValueError, match=message):
        ops.TbeHandle("cpu", rows, dims, fmap, torch.float32)


@pytest.mark.parametrize("option", [dict(padding_idx=0), dict(max_norm=0.01), dict(scale_grad_by_freq=True)])
def test_from_embedding_bags_refuses_options_the_tbe_lacks(option):
    bag = torch.nn.EmbeddingBag(10, 4, mode="mean", **option)
    name = next(iter(option))
    with pytest.raises(ValueError, match=rf"bags\[1\]: {name}=.* is not supported"):
        embscale.TableBatchedEmbeddingBags.from_embedding_bags([torch.nn.EmbeddingBag(5, 4, mode="mean"), bag])
    with pytest.raises(ValueError, match="bags: empty"):
        embscale.TableBatchedEmbeddingBags.from_embedding_bags([])


# ---- exception types, bad offsets in off mode -----------------------------------------------------------------
def test_each_bad_input_raises_its_documented_exception_type(device):
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
