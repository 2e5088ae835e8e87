"""FBGEMM's method names on TableBatchedEmbeddingBags (get_learning_rate, split_optimizer_states,
update_hyper_parameters, set_optimizer_step) with FBGEMM's meaning, checked against the maths: Adam's first
update after set_optimizer_step(n) uses bias correction t = n + 1."""
import enum
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
    m = make("adam", weight_decay_mode="decoupled")
    m.update_hyper_parameters({"lr": 0.5, "eps": 1e-6, "beta1": 0.8, "beta2": 0.95, "weight_decay": 0.01})
    hp = {name: float(m.hparams[i]) for i, name in enumerate(embscale.ops.HPARAM_FIELDS)}
    assert (hp["learning_rate"], hp["eps"], hp["beta1"], hp["beta2"], hp["weight_decay"]) == \
        (0.5, 1e-6, 0.8, 0.95, 0.01)
    before = m.hparams.clone()
    with pytest.raises(ValueError, match="'alpha'"):
        m.update_hyper_parameters({"lr": 0.1, "alpha": 0.9})
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


# ---- FBGEMM's spellings of the constructor's arguments ------------------------------------------------------
# Stand-ins for FBGEMM's enums (fbgemm_gpu is not installed here): embscale reads an enum member by its class's
# name, its module (a fbgemm_gpu one) and its .name, never importing fbgemm_gpu. The real enums are checked against
# the real FBGEMM in test_fbgemm_migration.py.
def fbgemm_enum(class_name, members, module="fbgemm_gpu.split_embedding_configs"):
    return enum.Enum(class_name, members, module=module)


EmbOptimType = fbgemm_enum("EmbOptimType", ["EXACT_SGD", "EXACT_ROWWISE_ADAGRAD", "ADAM", "PARTIAL_ROWWISE_ADAM",
                                            "NONE", "SGD", "ROWWISE_ADAGRAD", "MADGRAD"])
SparseType = fbgemm_enum("SparseType", ["FP32", "FP16", "BF16", "INT8"])
PoolingMode = fbgemm_enum("PoolingMode", ["SUM", "MEAN", "NONE"], "fbgemm_gpu.tbe.config.embedding_config")
BoundsCheckMode = fbgemm_enum("BoundsCheckMode", ["FATAL", "WARNING", "IGNORE", "NONE", "V2_WARNING"],
                              "fbgemm_gpu.tbe.config.embedding_config")
WeightDecayMode = fbgemm_enum("WeightDecayMode", ["NONE", "L2", "DECOUPLE", "COUNTER", "COWCLIP", "DECOUPLE_GLOBAL"],
                              "fbgemm_gpu.tbe.config.optimizer_config")
EmbeddingLocation = fbgemm_enum("EmbeddingLocation", ["DEVICE", "MANAGED", "MANAGED_CACHING", "HOST", "MTIA"],
                                "fbgemm_gpu.tbe.config.embedding_config")
ComputeDevice = fbgemm_enum("ComputeDevice", ["CPU", "CUDA", "MTIA"], "fbgemm_gpu.tbe.config.embedding_config")
HOST = (EmbeddingLocation.HOST, ComputeDevice.CPU)


def test_a_fbgemm_config_ports_by_changing_its_import():
    """FBGEMM's arguments as a FBGEMM script passes them build the module embscale's spellings build, which trains
    bit for bit alike."""
    fbgemm = embscale.TableBatchedEmbeddingBags(
        [(10, 4) + HOST, (7, 8) + HOST], feature_table_map=[0, 1, 1], optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD,
        learning_rate=0.05, eps=0.01, weights_precision=SparseType.FP16, output_dtype=SparseType.FP32,
        pooling_mode=PoolingMode.MEAN, bounds_check_mode=BoundsCheckMode.FATAL,
        weight_decay_mode=WeightDecayMode.DECOUPLE, weight_decay=0.01, stochastic_rounding=False,
        gradient_clipping=False, max_gradient=1.0)
    ours = embscale.TableBatchedEmbeddingBags(
        [(10, 4), (7, 8)], feature_table_map=[0, 1, 1], optimizer="rowwise_adagrad", learning_rate=0.05, eps=0.01,
        weights_dtype=torch.float16, output_dtype=torch.float32, pooling="mean", bounds_check="error",
        weight_decay_mode="decoupled", weight_decay=0.01, stochastic_rounding=False, device="cpu")
    assert (fbgemm.optimizer, fbgemm.pooling, fbgemm.bounds_check, fbgemm.weight_decay_mode) == \
        ("rowwise_adagrad", "mean", "error", "decoupled")
    assert fbgemm.weights.dtype == torch.float16 and fbgemm.weights.device.type == "cpu"
    assert fbgemm.get_extra_state() == ours.get_extra_state() and torch.equal(fbgemm.hparams, ours.hparams)
    with torch.no_grad():
        fbgemm.weights.copy_(ours.weights)
    indices, offsets = torch.tensor([1, 2, 2, 6, 0, 3]), torch.tensor([0, 2, 3, 3, 5, 5, 6])
    for m in (fbgemm, ours):
        m(indices, offsets).sum().backward()
    assert torch.equal(fbgemm.weights, ours.weights) and torch.equal(fbgemm.momentum1, ours.momentum1)


def test_fbgemm_names_map_to_embscales():
    for member, name in [("EXACT_SGD", "sgd"), ("EXACT_ROWWISE_ADAGRAD", "rowwise_adagrad"), ("ADAM", "adam"),
                         ("PARTIAL_ROWWISE_ADAM", "partial_rowwise_adam"), ("NONE", "none")]:
        assert embscale.TableBatchedEmbeddingBags([(10, 4)], optimizer=EmbOptimType[member]).optimizer == name
    # FBGEMM's enum values, as str(EmbOptimType.X) and configs give them
    for value, name in [("exact_sgd", "sgd"), ("exact_row_wise_adagrad", "rowwise_adagrad"),
                        ("partial_row_wise_adam", "partial_rowwise_adam")]:
        assert embscale.TableBatchedEmbeddingBags([(10, 4)], optimizer=value).optimizer == name
    for member, mode in [("WARNING", "warn"), ("IGNORE", "skip"), ("NONE", "off"), ("V2_WARNING", "warn")]:
        assert embscale.TableBatchedEmbeddingBags([(10, 4)], bounds_check_mode=BoundsCheckMode[member]).bounds_check \
            == mode
    for member, dtype in [("FP32", torch.float32), ("BF16", torch.bfloat16)]:
        m = embscale.TableBatchedEmbeddingBags([(10, 4)], weights_precision=SparseType[member],
                                               output_dtype=SparseType[member])
        assert m.weights.dtype == m.output_dtype == dtype
    assert embscale.TableBatchedEmbeddingBags([(10, 4)], pooling=PoolingMode.NONE).pooling == "none"
    assert embscale.TableBatchedEmbeddingBags([(10, 4)], weight_decay_mode=WeightDecayMode.L2).weight_decay_mode == "l2"
    # FBGEMM's default optimizer, EXACT_SGD, for a config in FBGEMM's spelling; embscale's own otherwise
    assert embscale.TableBatchedEmbeddingBags([(10, 4) + HOST]).optimizer == "sgd"
    assert embscale.TableBatchedEmbeddingBags([(10, 4)]).optimizer == "rowwise_adagrad"


@pytest.mark.parametrize("kw, error, message", [
    (dict(optimizer="row_wise_adagrad"), ValueError,
     r"^optimizer: 'row_wise_adagrad' is not supported \(FBGEMM's ROWWISE_ADAGRAD .*optimizer='rowwise_adagrad'"),
    (dict(optimizer=EmbOptimType.SGD), ValueError, r"^optimizer: EmbOptimType.SGD is not supported .*optimizer='sgd'"),
    (dict(optimizer=EmbOptimType.MADGRAD), ValueError,
     r"^optimizer: EmbOptimType.MADGRAD is not supported; embscale's optimizers are 'sgd' \(FBGEMM's EXACT_SGD\)"),
    (dict(optimizer="adagrad_typo"), ValueError,
     r"^optimizer: 'adagrad_typo' is not one of .*'rowwise_adagrad' \(FBGEMM's EXACT_ROWWISE_ADAGRAD\)"),
    (dict(optimizer=fbgemm_enum("EmbOptimType", ["ADAM"], module="elsewhere").ADAM), ValueError, r"^optimizer: "),
    (dict(weights_precision=SparseType.INT8), TypeError,
     r"^weights_precision: SparseType.INT8 is not supported; embscale takes SparseType.FP32, SparseType.FP16"),
    (dict(output_dtype=SparseType.INT8), TypeError, r"^output_dtype: SparseType.INT8 is not supported"),
    (dict(weight_decay_mode=WeightDecayMode.COUNTER), ValueError,
     r"^weight_decay_mode: WeightDecayMode.COUNTER needs FBGEMM's counter-based regularization"),
    (dict(weight_decay_mode=WeightDecayMode.DECOUPLE_GLOBAL), ValueError,
     r"^weight_decay_mode: WeightDecayMode.DECOUPLE_GLOBAL is FBGEMM's global weight decay"),
    (dict(pooling="mean", pooling_mode=PoolingMode.SUM), ValueError,
     r"^pooling_mode: .*contradicts pooling='mean'"),
    (dict(weights_dtype=torch.float16, weights_precision=SparseType.BF16), ValueError,
     r"^weights_precision: .*contradicts weights_dtype=torch.float16"),
    (dict(gradient_clipping=True, max_gradient=0.5), ValueError,
     r"^gradient_clipping: FBGEMM's gradient_clipping=True \(max_gradient=0.5\) clamps each element of the output "
     r"gradient.*gradient_clipping=0.5"),
    (dict(gradient_clipping=0.5, max_gradient=0.5), ValueError, r"^max_gradient: "),
    (dict(embedding_specs=[(10, 4) + HOST, (5, 4, EmbeddingLocation.MANAGED_CACHING, ComputeDevice.CUDA)]),
     ValueError, r"^embedding_specs: the tables name different compute devices"),
    (dict(embedding_specs=[(10, 4, EmbeddingLocation.MANAGED, ComputeDevice.CPU)]), ValueError,
     r"^embedding_specs\[0\]: EmbeddingLocation.MANAGED goes with ComputeDevice.CUDA"),
    (dict(embedding_specs=[(10, 4, EmbeddingLocation.MTIA, ComputeDevice.CUDA)]), ValueError,
     r"^embedding_specs\[0\]: .*MTIA.* is not supported; embscale takes EmbeddingLocation.DEVICE, MANAGED, "
     r"MANAGED_CACHING"),
    (dict(embedding_specs=[(10, 4, "uvm")]), ValueError, r"^embedding_specs\[0\]: placement 'uvm' is not one of"),
    (dict(embedding_specs=[(10, 4, "cached")], cache_load_factor=0.0), ValueError, r"^cache_load_factor: 0.0"),
    (dict(embedding_specs=[(10, 4, "cached")], cache_load_factor=1.5), ValueError, r"^cache_load_factor: 1.5"),
    (dict(embedding_specs=[(10, 4, "cached")], cache_algorithm="fifo"), ValueError,
     r"^cache_algorithm: 'fifo' is not 'lru' or 'lfu'"),
    (dict(embedding_specs=[(10, 4, "cached")], cache_max_lookups=0), ValueError, r"^cache_max_lookups: 0"),
    (dict(embedding_specs=[(10, 4, EmbeddingLocation.DEVICE, ComputeDevice.CPU)]), ValueError,
     r"^embedding_specs\[0\]: EmbeddingLocation.DEVICE goes with ComputeDevice.CUDA"),
    (dict(embedding_specs=[(10, 4, EmbeddingLocation.HOST, ComputeDevice.CUDA)]), ValueError,
     r"^embedding_specs\[0\]: EmbeddingLocation.HOST goes with ComputeDevice.CPU"),
    (dict(embedding_specs=[(10, 4) + HOST, (5, 4)]), ValueError, r"^embedding_specs: the tables name different"),
    (dict(embedding_specs=[(10, 4) + HOST], device="cuda"), ValueError, r"^device: 'cuda' contradicts"),
    (dict(embedding_specs=[(10, 4, EmbeddingLocation.HOST, "cpu")]), ValueError, r"^embedding_specs\[0\]: 'cpu' is "
                                                                                    r"not a ComputeDevice"),
])
def test_fbgemm_spellings_embscale_cannot_take_name_the_argument_and_embscales_equivalent(kw, error, message):
    kw = dict(kw)
    specs = kw.pop("embedding_specs", [(10, 4)])
    with pytest.raises(error, match=message):
        embscale.TableBatchedEmbeddingBags(specs, **kw)
