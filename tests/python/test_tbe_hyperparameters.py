"""The optimizer's hyper-parameters and step counter: refused by name, type and value wherever they are set
(the constructor, set_learning_rate, update_hyper_parameters; a checkpoint and a pickle: test_tbe_state_dict.py,
test_tbe_copy_and_save.py) with nothing changed, read by each backward when it runs (a learning rate set
between a forward and its backward is the one that backward uses), kept on the CPU, and a step counted exactly
up to 2^53; a weight decay the optimizer ignores warns (Adam's is FBGEMM's decoupled one whatever the mode),
and a value that rounds to 0 in float32 is refused."""
import copy
import warnings

import pytest
import torch

import embscale
from embscale import ops
from two_tables import B, TOTAL_DIM, make, lookups, refused, raw_backward, train_step, assert_same_state


# ---- checked where they are set -------------------------------------------------------------------------------
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
def test_the_constructor_refuses_bad_hyper_parameters_by_name(kw, message):
    with pytest.raises(ValueError, match=message):
        make("cpu", **kw)


def test_a_bad_hyper_parameter_set_later_is_refused_and_changes_nothing():
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


@pytest.mark.parametrize("value", ["0.1", b"0.1", True, torch.tensor(True), torch.ones(2), None])
def test_a_hyper_parameter_that_is_not_a_number_is_refused_by_type(value):
    with pytest.raises(TypeError, match=r"^learning_rate: .* is not a number$"):
        make("cpu", learning_rate=value)
    m = make("cpu")
    with refused(m, TypeError, r"^lr: .* is not a number$"):
        m.set_learning_rate(value)
    with refused(m, TypeError, r"^params_dict\['lr'\]: .* is not a number$"):
        m.update_hyper_parameters({"lr": value})


def test_hyper_parameters_of_every_number_type_are_taken_alike():
    m = make("cpu", learning_rate=torch.tensor(0.25))
    assert m.learning_rate == 0.25
    m.update_hyper_parameters({"lr": torch.tensor([0.5], dtype=torch.float64), "eps": 1})
    assert m.learning_rate == 0.5 and float(m.hparams[ops.HPARAM["eps"]]) == 1.0
    m.set_learning_rate(3)
    assert m.learning_rate == 3.0


def test_the_hyper_parameters_stay_on_the_cpu_under_another_default_device():
    with torch.device("meta"):
        m = make("cpu", learning_rate=0.125)
    assert m.hparams.device.type == "cpu" and m.learning_rate == 0.125
    m.set_learning_rate(0.25)
    assert m.learning_rate == 0.25


# ---- read by the backward when it runs ------------------------------------------------------------------------
def test_a_learning_rate_set_between_forward_and_backward_is_the_one_that_backward_uses(device, gen):
    a = make(device, optimizer="rowwise_adagrad", learning_rate=0.01)
    b = copy.deepcopy(a)
    i, o = lookups(device)
    g = torch.randn(B, TOTAL_DIM, generator=gen).to(device)
    out = a(i, o)
    a.set_learning_rate(0.5)  # documented: takes effect at the next backward, which is this one
    out.backward(g)
    b.set_learning_rate(0.5)
    b(i, o).backward(g)
    assert_same_state(a, b)
    assert a.learning_rate == 0.5 and a.step == 1


# ---- the step counter -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("step", [2.0**64 + 4096, 2.0**63, 2.0**63 - 1024, 2.0**53, -2.0**64, float("nan"),
                                  float("inf"), float("-inf"), 1.5, 0.0, -5.0])
def test_a_step_that_is_not_an_integer_in_range_is_refused(device, step):
    m = make(device, optimizer="adam")
    i, o = lookups(device)
    m.hparams[7] = step
    out = m(i, o)
    with refused(m, ValueError, "step"):
        out.sum().backward()
    with refused(m, ValueError, "step"):
        raw_backward(m, torch.ones(B, TOTAL_DIM, device=device), i, o)


def test_large_steps_are_counted_up_to_2_pow_53(device):
    m = make(device, optimizer="adam")
    i, o = lookups(device)
    m.hparams[7] = 2.0**40
    train_step(m, i, o)
    assert m.step == 2**40
    m.hparams[7] = 2.0**53 - 1  # the last step the float64 counter can count past (to 2^53)
    before = m.weights.detach().clone()
    train_step(m, i, o)
    assert not torch.equal(m.weights.detach(), before) and m.step == 2**53 - 1


# ---- a weight decay the optimizer ignores ---------------------------------------------------------------------
@pytest.mark.parametrize("optimizer, hint", [("rowwise_adagrad", "pass weight_decay_mode='l2' or 'decoupled'"),
                                             ("sgd", "optimizer 'sgd' applies no weight decay")])
def test_weight_decay_without_its_mode_warns_that_it_has_no_effect(optimizer, hint):
    # FBGEMM's meaning is kept (weight_decay_mode "none" ignores weight_decay), but not silently.
    with pytest.warns(UserWarning, match=rf"^weight_decay: 0.01 has no effect with weight_decay_mode='none'.*{hint}"):
        m = embscale.TableBatchedEmbeddingBags([(10, 4)], optimizer=optimizer, weight_decay=0.01)
    with pytest.warns(UserWarning, match=r"^params_dict\['weight_decay'\]: 0.02 has no effect"):
        m.update_hyper_parameters({"weight_decay": 0.02})
    assert m.hparams[embscale.ops.HPARAM["weight_decay"]] == 0.02  # kept, as FBGEMM keeps it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m.update_hyper_parameters({"lr": 0.5})  # another field: no new warning
        m.load_state_dict(m.state_dict())
        embscale.TableBatchedEmbeddingBags([(10, 4)], optimizer=optimizer)
        embscale.TableBatchedEmbeddingBags([(10, 4)], optimizer="none", weight_decay=0.01)
        if optimizer != "sgd":
            embscale.TableBatchedEmbeddingBags([(10, 4)], optimizer=optimizer, weight_decay=0.01,
                                               weight_decay_mode="decoupled")


@pytest.mark.parametrize("optimizer", ["adam", "partial_rowwise_adam"])
def test_adam_weight_decay_is_fbgemms_decoupled_one_whatever_the_mode(optimizer):
    """FBGEMM's ADAM and PARTIAL_ROWWISE_ADAM apply decoupled weight decay (w -= lr * (update + wd * w)) whatever
    weight_decay_mode says; so does embscale: a weight decay with the default mode "none" is applied, without a
    warning that it has no effect, and mode "l2" gives the same tables as "decoupled", with a warning that it is
    not torch.optim.Adam's L2."""
    def trained(**kw):
        torch.manual_seed(5)
        m = embscale.TableBatchedEmbeddingBags([(10, 4), (6, 3)], optimizer=optimizer, learning_rate=0.1, **kw)
        for _ in range(3):
            m(torch.tensor([1, 2, 2, 5]), torch.tensor([0, 3, 4])).sum().backward()
        return m
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plain, none, decoupled = trained(), trained(weight_decay=0.5), trained(weight_decay=0.5,
                                                                               weight_decay_mode="decoupled")
        none.update_hyper_parameters({"weight_decay": 0.25})
    with pytest.warns(UserWarning, match=rf"^weight_decay: optimizer '{optimizer}' applies decoupled weight decay.*"
                                         r"whatever weight_decay_mode says.*not torch.optim.Adam's L2"):
        l2 = trained(weight_decay=0.5, weight_decay_mode="l2")
    with pytest.warns(UserWarning, match=r"^params_dict\['weight_decay'\]: optimizer .* applies decoupled"):
        l2.update_hyper_parameters({"weight_decay": 0.25})
    assert not torch.equal(none.weights, plain.weights)  # the decay is applied in mode "none"
    for m in (none, l2):
        assert torch.equal(m.weights, decoupled.weights) and torch.equal(m.momentum1, decoupled.momentum1)
        assert torch.equal(m.momentum2, decoupled.momentum2)
    # The first step by hand (zero state, bias corrections 1 - b^1): row 5 of table 0, looked up once.
    b1, b2, eps, lr, wd = 0.9, 0.999, 1e-8, 0.1, 0.5
    torch.manual_seed(5)
    w = embscale.TableBatchedEmbeddingBags([(10, 4), (6, 3)], optimizer=optimizer).split_embedding_weights()[0][5]
    w = w.double()
    g = torch.ones(4, dtype=torch.float64)
    v = (1 - b2) * g * g if optimizer == "adam" else (1 - b2) * (g * g).mean()
    want = w - lr * (((1 - b1) * g / (1 - b1)) / (torch.sqrt(v / (1 - b2)) + eps) + wd * w)
    one = embscale.TableBatchedEmbeddingBags([(10, 4), (6, 3)], optimizer=optimizer, learning_rate=lr, weight_decay=wd)
    with torch.no_grad():
        one.split_embedding_weights()[0][5] = w.float()
    one(torch.tensor([5]), torch.tensor([0, 1, 1])).sum().backward()
    torch.testing.assert_close(one.split_embedding_weights()[0][5].double(), want, rtol=1e-6, atol=1e-7)


# ---- a hyper-parameter that rounds to 0 in float32 ------------------------------------------------------------
def test_a_hyper_parameter_that_rounds_to_zero_in_float32_is_refused_wherever_it_is_set():
    # A learning rate of 1e-50 used to be taken: the optimizer computes in float32, where it is 0, so training
    # stopped without a word (a gradient clipping or weight decay that small was off likewise).
    message = (r"rounds to 0 in float32, the precision the optimizer computes in; expected 0 or a magnitude of at "
               r"least 1\.4e-45")
    with pytest.raises(ValueError, match=rf"^learning_rate: 1e-50 {message}"):
        embscale.TableBatchedEmbeddingBags([(10, 4)], learning_rate=1e-50)
    with pytest.raises(ValueError, match=rf"^gradient_clipping: 1e-60 {message}"):
        embscale.TableBatchedEmbeddingBags([(10, 4)], gradient_clipping=1e-60)
    m = embscale.TableBatchedEmbeddingBags([(10, 4)], learning_rate=0.5)
    indices, offsets = torch.tensor([1, 2]), torch.tensor([0, 2])
    m(indices, offsets).sum().backward()
    before = m.hparams.clone(), m.weights.detach().clone()

    def unchanged():
        return torch.equal(m.hparams, before[0]) and torch.equal(m.weights, before[1])

    with pytest.raises(ValueError, match=rf"^lr: 1e-50 {message}$"):
        m.set_learning_rate(1e-50)
    with pytest.raises(ValueError, match=rf"^params_dict\['lr'\]: 1e-46 {message}"):
        m.update_hyper_parameters({"lr": 1e-46, "eps": 1e-3})
    sd = m.state_dict()
    sd["hparams"] = sd["hparams"].clone()
    sd["hparams"][embscale.ops.HPARAM["learning_rate"]] = 1e-50
    with pytest.raises(ValueError, match=rf"^state_dict: hparams: learning_rate: 1e-50 {message}"):
        m.load_state_dict(sd)
    assert unchanged()
    m.hparams[embscale.ops.HPARAM["learning_rate"]] = 1e-50  # written past the checks: the backward refuses it
    with pytest.raises(ValueError, match=rf"^optimizer.learning_rate: 1e-50 {message}"):
        m(indices, offsets).sum().backward()
    assert torch.equal(m.weights, before[1]) and m.step == 1  # (the one step taken before; the refused one counts none)
    # 0 stays a rate (a frozen table), and so does the smallest float32 above it.
    for lr in (0.0, 1e-45):
        m.set_learning_rate(lr)
        m(indices, offsets).sum().backward()
