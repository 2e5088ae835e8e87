"""FBGEMM's method names on TableBatchedEmbeddingBags (get_learning_rate, split_optimizer_states,
update_hyper_parameters, set_optimizer_step) with FBGEMM's meaning, checked against the maths: Adam's first
update after set_optimizer_step(n) uses bias correction t = n + 1."""
import math

import pytest
import torch

import embscale

SEED = 20261201


def make(optimizer, **kw):
    torch.manual_seed(SEED)
    return embscale.TableBatchedEmbeddingBags([(10, 4), (7, 8)], optimizer=optimizer, **kw)


def test_get_learning_rate_reads_the_rate_set_either_way():
    m = make("rowwise_adagrad", learning_rate=0.25)
    assert m.get_learning_rate() == 0.25
    m.set_learning_rate(0.5)
    assert m.get_learning_rate() == 0.5
    m.update_hyper_parameters({"lr": 0.125})
    assert m.get_learning_rate() == 0.125


@pytest.mark.parametrize("optimizer, shapes", [
    ("sgd", [[], []]),
    ("rowwise_adagrad", [[(10,)], [(7,)]]),
    ("adam", [[(10, 4), (10, 4)], [(7, 8), (7, 8)]]),
    ("partial_rowwise_adam", [[(10, 4), (10,)], [(7, 8), (7,)]]),
])
def test_split_optimizer_states_per_table_in_fbgemm_order(optimizer, shapes):
    m = make(optimizer)
    states = m.split_optimizer_states()
    assert [[tuple(s.shape) for s in table] for table in states] == shapes
    if shapes[0]:
        states[1][0].fill_(3.0)  # views: writes reach the module's state
        assert float(m.optimizer_state()[1][next(iter(m.optimizer_state()[1]))].flatten()[0]) == 3.0


def test_update_hyper_parameters_sets_each_and_refuses_bad_ones_whole():
    m = make("adam", weight_decay_mode="l2")
    m.update_hyper_parameters({"lr": 0.5, "eps": 1e-6, "beta1": 0.8, "beta2": 0.95, "weight_decay": 0.01})
    hp = {name: float(m.hparams[i]) for i, name in enumerate(embscale.ops.HPARAM_FIELDS)}
    assert (hp["learning_rate"], hp["eps"], hp["beta1"], hp["beta2"], hp["weight_decay"]) == \
        (0.5, 1e-6, 0.8, 0.95, 0.01)
    before = m.hparams.clone()
    with pytest.raises(ValueError, match="'momentum'"):
        m.update_hyper_parameters({"lr": 0.1, "momentum": 0.9})
    with pytest.raises(ValueError, match=r"params_dict\['eps'\]"):
        m.update_hyper_parameters({"lr": 0.1, "eps": float("nan")})
    with pytest.raises(TypeError, match="params_dict"):
        m.update_hyper_parameters([("lr", 0.1)])
    assert torch.equal(m.hparams, before)  # nothing set by a refused call


@pytest.mark.parametrize("n", [0, 4])
def test_set_optimizer_step_gives_adam_bias_correction_of_the_next_step(n):
    lr, b1, b2, eps = 0.1, 0.9, 0.999, 1e-8
    m = make("adam", learning_rate=lr, beta1=b1, beta2=b2, eps=eps)
    m.set_optimizer_step(n)
    assert m.step == n  # steps taken, as FBGEMM's iter
    w0 = [w.clone() for w in m.split_embedding_weights()]
    indices = torch.tensor([2, 5])
    offsets = torch.tensor([0, 1, 2])  # feature 0 looks up row 2, feature 1 row 5; batch of one
    out = m(indices, offsets)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(SEED))
    print("seed", SEED)
    out.backward(g)
    t = n + 1
    for table, (row, cols) in enumerate([(2, slice(0, 4)), (5, slice(4, 12))]):
        grad = g[0, cols].double()
        m1, m2 = (1 - b1) * grad, (1 - b2) * grad * grad  # first update from zero state
        expected = w0[table][row].double() - lr * (m1 / (1 - b1 ** t)) / ((m2 / (1 - b2 ** t)).sqrt() + eps)
        torch.testing.assert_close(m.split_embedding_weights()[table][row].double(), expected, rtol=1e-5, atol=1e-6)
    assert m.step == n + 1


def test_step_counts_the_steps_taken_as_fbgemms_iter():
    # FBGEMM's iter is the number of training steps taken: 3 after 3 steps (embscale's step read 4 then).
    m = make("rowwise_adagrad")
    assert m.step == 0
    for _ in range(3):
        m(torch.tensor([1, 2]), torch.tensor([0, 1, 2])).sum().backward()
    assert m.step == 3
    assert m.hparams[embscale.ops.HPARAM["step"]] == 4  # the next step's number, which the backward uses


@pytest.mark.parametrize("bad", [-1, 2**53 - 1, 2**53, 1.5, True, "3"])
def test_set_optimizer_step_refuses_what_is_not_a_step_count(bad):
    m = make("adam")
    with pytest.raises(ValueError, match="step"):
        m.set_optimizer_step(bad)
    assert m.step == 0


def test_the_step_counter_refuses_a_step_it_cannot_count_past():
    # The step is a float64 in hparams, which holds 2^53 but not 2^53 + 1: the counter once stopped at 2^53
    # (Adam's bias correction and the stochastic-rounding seed frozen). The last countable step runs; the next
    # backward is refused, naming the step, and changes nothing.
    m = make("adam")
    m.set_optimizer_step(2**53 - 2)
    indices, offsets = torch.tensor([2, 5]), torch.tensor([0, 1, 2])
    m(indices, offsets).sum().backward()
    assert m.step == 2**53 - 1
    before = (m.weights.detach().clone(), m.momentum1.clone(), m.hparams.clone())
    with pytest.raises(ValueError, match=r"^step: .*2\^53"):
        m(indices, offsets).sum().backward()
    assert torch.equal(m.weights, before[0]) and torch.equal(m.momentum1, before[1])
    assert torch.equal(m.hparams, before[2]) and m.step == 2**53 - 1
    state = m.state_dict()
    fresh = make("adam")
    with pytest.raises(ValueError, match="step"):  # a checkpoint at the limit is refused as the backward would
        fresh.load_state_dict(state)


@pytest.mark.parametrize("idx_dtype, off_dtype", [(torch.int64, torch.int32), (torch.int32, torch.int64)])
def test_mixed_index_and_offset_dtypes_run_as_int64(idx_dtype, off_dtype):
    # FBGEMM accepts int64 indices with int32 offsets (and the reverse): same output and same update as int64.
    indices, offsets = torch.tensor([1, 2, 9, 0, 6, 6]), torch.tensor([0, 2, 3, 5, 6])
    a, b = make("rowwise_adagrad"), make("rowwise_adagrad")
    out_a = a(indices, offsets)
    out_b = b(indices.to(idx_dtype), offsets.to(off_dtype))
    assert torch.equal(out_a, out_b)
    g = torch.randn(out_a.shape, generator=torch.Generator().manual_seed(SEED))
    out_a.backward(g)
    out_b.backward(g)
    assert torch.equal(a.weights, b.weights) and torch.equal(a.momentum1, b.momentum1)
