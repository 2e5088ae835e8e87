"""The C API's own contract (include/embscale/embscale_c.h), called through ctypes on the CPU backend:
the per-thread last-error message (set by a failure, cleared by the next success), the non-finite flag
of embscale_amax, embscale_tbe_create's rule that without a feature_table_map num_features must
equal num_tables, that the ctypes mirrors of its structs match the header field for field, and the
optimizer query (embscale_optimizer_info_get) against the state layouts that include/embscale/tbe.h
documents."""
import ctypes
import math
import re
from pathlib import Path

import pytest
import torch

from embscale import _capi

F32, I64 = 0, 6


def cpu():
    return ctypes.byref(_capi.Context(0, 0, None))


def vec(t, dtype):
    shape = (ctypes.c_int64 * 4)(t.numel(), 0, 0, 0)
    return _capi.Tensor(ctypes.c_void_p(t.data_ptr()), dtype, 1, shape)


def last_error():
    return _capi.lib.embscale_last_error().decode()


def amax(x, flag):
    out = torch.full((), -1.0)
    rc = _capi.lib.embscale_amax(cpu(), ctypes.byref(vec(x, F32)), ctypes.c_void_p(out.data_ptr()), 0,
                                 ctypes.c_void_p(flag.data_ptr()), None, 0, None)
    return rc, out.item()


def test_last_error_is_set_by_a_failure_and_cleared_by_a_success(gen):
    x = torch.randn(100, generator=gen)
    flag = torch.zeros((), dtype=torch.int32)
    bad = _capi.lib.embscale_amax(cpu(), ctypes.byref(vec(x, F32)), None, 0, None, None, 0, None)  # amax: NULL
    assert bad == _capi.INVALID_ARGUMENT
    assert last_error().startswith("amax"), last_error()
    rc, got = amax(x, flag)
    assert rc == _capi.OK
    assert last_error() == "", "a successful call must clear the last error"
    assert got == x.abs().max().item()
    # Another failure sets a new message naming its own argument.
    rc = _capi.lib.embscale_amax(cpu(), None, None, 0, None, None, 0, None)  # x: NULL
    assert rc == _capi.INVALID_ARGUMENT and last_error().startswith("x"), last_error()


def test_amax_writes_the_nonfinite_flag(gen):
    x = torch.randn(1000, generator=gen)
    for bad_value, want in ((None, 0), (math.inf, 1), (-math.inf, 1), (math.nan, 1)):
        y = x.clone()
        if bad_value is not None:
            y[int(torch.randint(0, 1000, (), generator=gen))] = bad_value
        flag = torch.full((), 7, dtype=torch.int32)  # neither 0 nor 1
        rc, got = amax(y, flag)
        assert rc == _capi.OK, last_error()
        assert flag.item() == want, f"non-finite flag {flag.item()} for {bad_value}"
        finite = y[~torch.isnan(y)].abs().max().item()
        assert got == finite


def test_create_without_map_needs_one_feature_per_table():
    rows = (ctypes.c_int64 * 2)(10, 20)
    dims = (ctypes.c_int32 * 2)(4, 3)
    handle = ctypes.c_void_p()
    for num_features in (1, 3, 0):
        handle.value = 12345  # a refused call must write NULL
        rc = _capi.lib.embscale_tbe_create(cpu(), 2, rows, dims, num_features, None, F32, ctypes.byref(handle))
        assert rc == _capi.INVALID_ARGUMENT, f"num_features={num_features} accepted with 2 tables and no map"
        assert last_error().startswith("num_features"), last_error()
        assert handle.value is None
    rc = _capi.lib.embscale_tbe_create(cpu(), 2, rows, dims, 2, None, F32, ctypes.byref(handle))
    assert rc == _capi.OK, last_error()
    layout = _capi.TbeLayout()
    assert _capi.lib.embscale_tbe_layout_get(handle, ctypes.byref(layout)) == _capi.OK
    assert (layout.num_weights, layout.total_rows, layout.total_dim, layout.max_dim) == (10 * 4 + 20 * 3, 30, 7, 4)
    _capi.lib.embscale_tbe_destroy(handle)


def test_create_refuses_no_tables_and_an_empty_map_by_their_c_names():
    """num_tables < 1 is refused as num_tables (not the C++ config's field), and a feature_table_map of
    num_features = 0 is refused as num_features (it must not fall back to one feature per table)."""
    rows = (ctypes.c_int64 * 2)(5, 7)
    dims = (ctypes.c_int32 * 2)(4, 3)
    fmap = (ctypes.c_int32 * 1)(0)
    handle = ctypes.c_void_p()
    for num_tables, num_features, map_, name in ((0, 0, None, "num_tables"), (-1, 0, None, "num_tables"),
                                                 (2, 0, fmap, "num_features"), (2, -3, fmap, "num_features")):
        handle.value = 12345
        rc = _capi.lib.embscale_tbe_create(cpu(), num_tables, rows, dims, num_features, map_, F32,
                                           ctypes.byref(handle))
        assert rc == _capi.INVALID_ARGUMENT, (num_tables, num_features)
        assert last_error().startswith(name + ": "), last_error()
        assert handle.value is None
    rc = _capi.lib.embscale_tbe_create(cpu(), 2, rows, dims, 1, fmap, F32, ctypes.byref(handle))
    assert rc == _capi.OK, last_error()
    layout = _capi.TbeLayout()
    assert _capi.lib.embscale_tbe_layout_get(handle, ctypes.byref(layout)) == _capi.OK
    assert layout.total_dim == 4  # one feature, of table 0
    _capi.lib.embscale_tbe_destroy(handle)


def header_fields(struct):
    """Field names of `typedef struct <struct> { ... }` in the C header, in order."""
    header = (Path(__file__).resolve().parents[2] / "include" / "embscale" / "embscale_c.h").read_text()
    body = re.search(r"typedef struct %s \{(.*?)\} %s;" % (struct, struct), header, re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    return [re.search(r"(\w+)\s*(\[\d+\])?$", decl.strip()).group(1) for decl in body.split(";")[:-1]]


@pytest.mark.parametrize("struct, mirror", [
    ("embscale_context", _capi.Context), ("embscale_tensor", _capi.Tensor), ("embscale_tbe_layout", _capi.TbeLayout),
    ("embscale_tbe_forward_args", _capi.TbeForwardArgs), ("embscale_optimizer", _capi.Optimizer),
    ("embscale_tbe_backward_args", _capi.TbeBackwardArgs), ("embscale_optimizer_info", _capi.OptimizerInfo),
    ("embscale_quant_tbe_layout", _capi.QuantTbeLayout),
    ("embscale_quant_tbe_forward_args", _capi.QuantTbeForwardArgs)])
def test_ctypes_structs_mirror_the_header(struct, mirror):
    assert [name for name, _ in mirror._fields_] == header_fields(struct)


def test_the_removed_deterministic_field_is_refused():
    assert "deterministic" not in header_fields("embscale_tbe_backward_args")
    with pytest.raises(AttributeError):
        _capi.TbeBackwardArgs().deterministic = 0  # every backend is deterministic; there is no switch


# tbe.h: row-wise Adagrad keeps a row-wise momentum1; Adam and LAMB element-wise momentum1 and momentum2; their
# partial row-wise forms an element-wise momentum1 and a row-wise momentum2; Adagrad and LARS-SGD an element-wise
# momentum1; SGD and dense mode none. The C enum numbers OptimizerType's values in declaration order.
DOCUMENTED_OPTIMIZERS = [
    ("none", (None, None)),
    ("sgd", (None, None)),
    ("rowwise_adagrad", (("rows", "sum"), None)),
    ("adam", (("elements", "exp_avg"), ("elements", "exp_avg_sq"))),
    ("partial_rowwise_adam", (("elements", "exp_avg"), ("rows", "exp_avg_sq"))),
    ("adagrad", (("elements", "sum"), None)),
    ("lamb", (("elements", "exp_avg"), ("elements", "exp_avg_sq"))),
    ("partial_rowwise_lamb", (("elements", "exp_avg"), ("rows", "exp_avg_sq"))),
    ("lars_sgd", (("elements", "momentum_buffer"), None)),
]
LAYOUT = {None: 0, "rows": 1, "elements": 2}


def test_optimizer_query_matches_the_documented_state_layouts():
    assert _capi.lib.embscale_num_optimizers() == len(DOCUMENTED_OPTIMIZERS)
    for code, (name, states) in enumerate(DOCUMENTED_OPTIMIZERS):
        info = _capi.OptimizerInfo()
        assert _capi.lib.embscale_optimizer_info_get(code, ctypes.byref(info)) == _capi.OK, last_error()
        assert info.name.decode() == name
        for k, state in enumerate(states):
            assert info.state_layouts[k] == LAYOUT[state[0] if state else None], (name, k)
            assert info.state_names[k].decode() == (state[1] if state else ""), (name, k)
    # The Python package's tables come from the query.
    assert _capi.OPTIMIZER == {name: code for code, (name, _) in enumerate(DOCUMENTED_OPTIMIZERS)}
    assert _capi.OPTIMIZER_STATES == dict(DOCUMENTED_OPTIMIZERS)


def test_optimizer_query_refuses_bad_arguments():
    info = _capi.OptimizerInfo()
    for bad in (-1, len(DOCUMENTED_OPTIMIZERS), 1000):
        assert _capi.lib.embscale_optimizer_info_get(bad, ctypes.byref(info)) == _capi.INVALID_ARGUMENT
        assert last_error().startswith("optimizer: value"), last_error()
    assert _capi.lib.embscale_optimizer_info_get(0, None) == _capi.INVALID_ARGUMENT
    assert last_error().startswith("out"), last_error()


def _optimizer(**fields):
    o = _capi.Optimizer()
    o.type, o.learning_rate, o.eps, o.beta1, o.beta2, o.step = _capi.OPTIMIZER["rowwise_adagrad"], 0.01, 1e-8, 0.9, \
        0.999, 1
    for name, value in fields.items():
        setattr(o, name, value)
    return o


@pytest.mark.parametrize("fields, message", [
    (dict(learning_rate=math.nan), r"optimizer.learning_rate: nan; expected a finite value >= 0"),
    (dict(learning_rate=-1.0), r"optimizer.learning_rate: -1; expected a finite value >= 0$"),
    (dict(eps=0.0), r"optimizer.eps: 0; rowwise_adagrad needs a finite eps > 0$"),
    (dict(type=3, beta2=1.0), r"optimizer.beta2: 1 is outside \[0, 1\)$"),
    (dict(type=1, max_norm=1.0), r"optimizer.max_norm: sgd does not support it"),
    (dict(gradient_clipping=math.inf), r"optimizer.gradient_clipping: inf; expected a finite value >= 0"),
    (dict(step=0), r"optimizer.step: 0; steps count from 1"),
    (dict(type=8, eta=-1.0), r"optimizer.eta: -1; expected a finite value >= 0$"),
    (dict(type=8, momentum=1.0), r"optimizer.momentum: 1 is outside \[0, 1\)$"),
    (dict(type=5, weight_decay=0.5, weight_decay_mode=1), r"optimizer.weight_decay: adagrad applies no weight decay"),
    (dict(type=9), r"optimizer.type: value 9"),
    (dict(weight_decay_mode=3), r"optimizer.weight_decay_mode: value 3"),
])
def test_optimizer_check_refuses_what_the_backward_refuses_by_field(fields, message):
    """embscale_optimizer_check is the backward's check of its optimizer field on its own (bindings call it
    when a hyper-parameter is set)."""
    assert _capi.lib.embscale_optimizer_check(ctypes.byref(_optimizer())) == _capi.OK, last_error()
    assert _capi.lib.embscale_optimizer_check(ctypes.byref(_optimizer(**fields))) == _capi.INVALID_ARGUMENT
    assert re.match(message, last_error()), last_error()
    assert _capi.lib.embscale_optimizer_check(None) == _capi.INVALID_ARGUMENT
    assert last_error() == "optimizer: must not be null"


def test_optimizer_weight_decay_query_gives_fbgemms_rules():
    """embscale_optimizer_weight_decay_get: how each optimizer applies weight_decay (FBGEMM's rules, which the
    Python package reads): not at all, as weight_decay_mode says (row-wise Adagrad), or decoupled whatever the
    mode (Adam and partial row-wise Adam, as FBGEMM's ADAM and PARTIAL_ROWWISE_ADAM); bad arguments refused."""
    header = (Path(__file__).resolve().parents[2] / "include" / "embscale" / "embscale_c.h").read_text()
    codes = {name: int(value) for name, value in re.findall(r"#define EMBSCALE_WEIGHT_DECAY_(\w+) (\d+)", header)}
    assert codes == {"NONE": 0, "BY_MODE": 1, "DECOUPLED": 2}
    want = {"none": "NONE", "sgd": "NONE", "rowwise_adagrad": "BY_MODE", "adam": "DECOUPLED",
            "partial_rowwise_adam": "DECOUPLED", "adagrad": "NONE", "lamb": "DECOUPLED",
            "partial_rowwise_lamb": "DECOUPLED", "lars_sgd": "DECOUPLED"}
    rule = ctypes.c_int32(-1)
    for name, code in _capi.OPTIMIZER.items():
        assert _capi.lib.embscale_optimizer_weight_decay_get(code, ctypes.byref(rule)) == _capi.OK, last_error()
        assert rule.value == codes[want[name]], name
    assert _capi.OPTIMIZER_WEIGHT_DECAY == {name: rule.lower() for name, rule in want.items()}
    for bad in (-1, len(_capi.OPTIMIZER)):
        assert _capi.lib.embscale_optimizer_weight_decay_get(bad, ctypes.byref(rule)) == _capi.INVALID_ARGUMENT
        assert last_error().startswith("optimizer: value"), last_error()
    assert _capi.lib.embscale_optimizer_weight_decay_get(0, None) == _capi.INVALID_ARGUMENT
    assert last_error().startswith("out"), last_error()
