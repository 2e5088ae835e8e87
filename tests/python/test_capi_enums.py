"""The Python package's tables of the C API's enumerations (embscale._capi) against the values the C header
documents (include/embscale/embscale_c.h, whose lists the C++ tests hold to the library's enums): every
documented name maps to its documented value, and every value a table uses is in the documented range,
which the library refuses the first value past (tests/capi/test_capi_enums.cpp)."""
import ctypes
import re
from pathlib import Path

import pytest

from embscale import _capi

HEADER = Path(__file__).resolve().parents[2] / "include" / "embscale" / "embscale_c.h"


def documented():
    """{label: [name of value 0, name of value 1, ...]} from the header's conventions comment."""
    flat = re.sub(r"\s*\n\s*\*?\s*", " ", HEADER.read_text())
    lists = {}
    for label, values in re.findall(r"([a-z][a-z ]*) \((?:embscale::\w+: )?((?:\d+ \w+(?:, )?)+)\)", flat):
        pairs = [(int(code), name) for code, name in re.findall(r"(\d+) (\w+)", values)]
        assert [code for code, _ in pairs] == list(range(len(pairs))), label
        lists[label] = [name for _, name in pairs]
    return lists


@pytest.mark.parametrize("label, table", [
    ("backend", _capi.BACKEND), ("amax algo", _capi.AMAX_ALGO), ("activation", _capi.ACTIVATION),
    ("pooling", _capi.POOLING), ("bounds check", _capi.BOUNDS_CHECK), ("weight decay", _capi.WEIGHT_DECAY),
    ("rounding", _capi.ROUNDING), ("optimizer", _capi.OPTIMIZER), ("weight type", _capi.QUANT_TYPE)])
def test_tables_hold_the_documented_values(label, table):
    names = documented()[label]
    for code, name in enumerate(names):
        assert table.get(name) == code, f"{label}: {name!r} is {code} in the header, {table.get(name)} in _capi"
    assert set(table.values()) <= set(range(len(names))), f"{label}: _capi uses values outside 0..{len(names) - 1}"


def test_the_first_value_past_each_documented_range_is_refused():
    """One entry point per enumeration, through ctypes: the value the header's list stops before is refused,
    naming the argument."""
    lists = documented()
    info = _capi.OptimizerInfo()
    n = len(lists["optimizer"])
    assert _capi.lib.embscale_optimizer_info_get(n, ctypes.byref(info)) == _capi.INVALID_ARGUMENT
    assert _capi.lib.embscale_last_error().decode() == f"optimizer: value {n} is out of range [0, {n - 1}]"
    n = len(lists["weight type"])
    out, one = ctypes.c_void_p(), (ctypes.c_int64 * 1)(4)
    ctx = _capi.Context()
    for t in (n, n - 1):
        rc = _capi.lib.embscale_quant_tbe_create(ctypes.byref(ctx), 1, one, (ctypes.c_int32 * 1)(4),
                                                 (ctypes.c_int32 * 1)(t), 1, None, 16, 128, ctypes.byref(out))
        if t == n:
            assert rc == _capi.INVALID_ARGUMENT
            assert _capi.lib.embscale_last_error().decode() == f"types[0]: value {n} is out of range [0, {n - 1}]"
        else:
            assert rc == _capi.OK, _capi.lib.embscale_last_error()
            _capi.lib.embscale_quant_tbe_destroy(out)
    assert _capi.lib.embscale_backend_compiled(len(lists["backend"])) == 0
    assert _capi.lib.embscale_backend_compiled(len(lists["backend"]) - 1) in (0, 1)
