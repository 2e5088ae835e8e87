"""scripts/check_layers.py: the repository keeps the include rules of docs/architecture.md, and each rule
catches a bad include planted in a small tree of the same shape."""
import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_layers.py"


def load_checker():
    spec = importlib.util.spec_from_file_location("check_layers", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# A tree shaped like the repository, every include allowed.
TREE = {
    "include/embscale/status.h": "#include <string>\n",
    "include/embscale/tbe.h": '#include "embscale/status.h"\n',
    "src/core/check.h": '#include "embscale/status.h"\n',
    "src/core/cuda/check.cuh": '#include "core/check.h"\n',
    "src/fp8/fp8.cpp": '#include "core/check.h"\n#include "fp8/cpu/fp8_cpu.h"\n',
    "src/fp8/cpu/fp8_cpu.h": '#include "core/check.h"\n',
    "src/tbe/tbe.cpp": '#include "embscale/tbe.h"\n#include "tbe/cuda/kernels.cuh"\n',
    "src/tbe/cpu/forward.cpp": '#include "embscale/tbe.h"\n#include "core/check.h"\n',
    "src/tbe/cuda/kernels.cuh": '#include "core/cuda/check.cuh"\n',
    "src/capi/capi.cpp": '#include "embscale/tbe.h"\n',
    "tests/case.h": '#include "tbe/tbe.cpp"\n',
}


def make_tree(root, planted=None):
    files = dict(TREE)
    if planted:
        path, include = planted
        files[path] = files.get(path, "") + f'#include {include}\n'
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_the_repository_keeps_the_rules():
    assert load_checker().check(str(ROOT)) == []


def test_the_clean_tree_passes(tmp_path):
    make_tree(tmp_path)
    assert load_checker().main(["--root", str(tmp_path)]) == 0


@pytest.mark.parametrize("path, include, rule", [
    ("src/core/check.h", '"tbe/tbe.cpp"', "core includes no capability"),
    ("src/fp8/fp8.cpp", '"tbe/cuda/kernels.cuh"', "fp8 does not include another capability (tbe/)"),
    ("src/tbe/cpu/forward.cpp", '"fp8/cpu/fp8_cpu.h"', "tbe does not include another capability (fp8/)"),
    ("src/tbe/cpu/forward.cpp", '"tbe/cuda/kernels.cuh"', "a cpu/ backend never includes cuda/ code"),
    ("src/fp8/cpu/fp8_cpu.h", '"core/cuda/check.cuh"', "a cpu/ backend never includes cuda/ code"),
    ("src/capi/capi.cpp", '"core/check.h"', "the C API includes only the public headers"),
    ("include/embscale/tbe.h", '"core/check.h"', "a public header includes only public headers"),
    ("src/tbe/tbe.cpp", '"case.h"', "does not resolve under include/ or src/"),
    ("src/tbe/tbe.cpp", '"../../tests/case.h"', "does not resolve under include/ or src/"),
    ("src/core/check.h", "<tbe/tbe.cpp>", "core includes no capability"),
])
def test_a_planted_bad_include_is_caught(tmp_path, capsys, path, include, rule):
    make_tree(tmp_path, (path, include))
    assert load_checker().main(["--root", str(tmp_path)]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1, out
    assert out[0].startswith(f"{path}:") and rule in out[0], out[0]
