"""The FBGEMM-named API against FBGEMM's own CPU TBE (fbgemm-gpu-cpu), where it is installed: the same
tables and lookups give the same forward, the same tables and optimizer state after a row-wise Adagrad or
SGD step, and the same get_learning_rate / split_optimizer_states. Skipped when fbgemm_gpu is not
importable (scripts/test_torchrec.sh runs it in an environment that has it).

Where a table's features are not one contiguous run of feature_table_map (SHARED: table 0's features are 0 and
2) and a row is looked up by features of both runs, FBGEMM's CPU backward applies row-wise Adagrad once per run,
while embscale (as the maths of one step on the batch's summed gradient, and FBGEMM's GPU backward) applies it
once to the row: those rows differ, so the Adagrad step is compared on tables of one feature each (SGD, being
linear, is the same either way and is compared on a shared table). tests/python/test_fbgemm_migration.py
compares every optimizer, weight decay mode and weights dtype, on contiguous shared tables too."""
import pytest
import torch

import embscale
import tbe_reference as ref

fbgemm_training = pytest.importorskip("fbgemm_gpu.split_table_batched_embeddings_ops_training")
fbgemm_common = pytest.importorskip("fbgemm_gpu.split_table_batched_embeddings_ops_common")
fbgemm_configs = pytest.importorskip("fbgemm_gpu.split_embedding_configs")

SPECS = [(30, 8), (17, 4), (25, 12)]  # FBGEMM's CPU TBE takes dims that are multiples of 4
SHARED, ONE_EACH = [0, 1, 0, 2], [0, 1, 2]
OPTIMIZERS = {"rowwise_adagrad": "EXACT_ROWWISE_ADAGRAD", "sgd": "EXACT_SGD"}
LR, EPS = 0.1, 0.01


def rows_and_dim(fmap):
    return [SPECS[t][0] for t in fmap], sum(SPECS[t][1] for t in fmap)


def pair(optimizer, gen, fmap):
    """An embscale module and an FBGEMM one with the same tables."""
    ours = embscale.TableBatchedEmbeddingBags(SPECS, feature_table_map=fmap, optimizer=optimizer, learning_rate=LR,
                                              eps=EPS)
    cpu = (fbgemm_common.EmbeddingLocation.HOST, fbgemm_training.ComputeDevice.CPU)
    theirs = fbgemm_training.SplitTableBatchedEmbeddingBagsCodegen(
        [(rows, dim) + cpu for rows, dim in SPECS], feature_table_map=fmap,
        optimizer=getattr(fbgemm_configs.EmbOptimType, OPTIMIZERS[optimizer]), learning_rate=LR, eps=EPS,
        pooling_mode=fbgemm_common.PoolingMode.SUM)
    with torch.no_grad():
        for w_ours, w_theirs in zip(ours.split_embedding_weights(), theirs.split_embedding_weights()):
            w_ours.copy_(torch.randn(w_ours.shape, generator=gen))
            w_theirs.copy_(w_ours)
    return ours, theirs


@pytest.mark.parametrize("optimizer, fmap", [("rowwise_adagrad", ONE_EACH), ("sgd", SHARED)])
def test_forward_and_one_step_match_fbgemm(gen, optimizer, fmap):
    ours, theirs = pair(optimizer, gen, fmap)
    rows, total_dim = rows_and_dim(fmap)
    indices, offsets, _ = ref.make_lookups(gen, rows, 6, 4, hot_row=2, hot_share=0.3)
    out_ours, out_theirs = ours(indices, offsets), theirs(indices, offsets)
    torch.testing.assert_close(out_ours, out_theirs, rtol=1e-6, atol=1e-6)
    g = torch.randn(6, total_dim, generator=gen)
    out_ours.backward(g)
    out_theirs.backward(g)
    for w_ours, w_theirs in zip(ours.split_embedding_weights(), theirs.split_embedding_weights()):
        torch.testing.assert_close(w_ours, w_theirs.detach(), rtol=1e-5, atol=1e-6)
    if optimizer == "rowwise_adagrad":  # FBGEMM's split_optimizer_states fails on the CPU for SGD
        for s_ours, s_theirs in zip(ours.split_optimizer_states(), theirs.split_optimizer_states()):
            assert [t.shape for t in s_ours] == [t.shape for t in s_theirs]
            for a, b in zip(s_ours, s_theirs):
                torch.testing.assert_close(a, b.view(a.shape), rtol=1e-5, atol=1e-7)
        assert [list(s) for s in ours.optimizer_state()] == [list(s) for s in theirs.get_optimizer_state()]


def test_shared_table_forward_matches_fbgemm(gen):
    ours, theirs = pair("rowwise_adagrad", gen, SHARED)
    rows, _ = rows_and_dim(SHARED)
    indices, offsets, _ = ref.make_lookups(gen, rows, 6, 4)
    torch.testing.assert_close(ours(indices, offsets), theirs(indices, offsets), rtol=1e-6, atol=1e-6)


def test_learning_rate_matches_fbgemm(gen):
    ours, theirs = pair("rowwise_adagrad", gen, SHARED)
    # FBGEMM keeps the learning rate in fp32; embscale in float64 (rounded to fp32 when the step runs).
    assert torch.tensor(ours.get_learning_rate(), dtype=torch.float32).item() == theirs.get_learning_rate()
    ours.set_learning_rate(0.03)
    theirs.set_learning_rate(0.03)
    assert torch.tensor(ours.get_learning_rate(), dtype=torch.float32).item() == theirs.get_learning_rate()
