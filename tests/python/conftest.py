"""pytest set-up for the Python package: the devices to run on and a seeded generator per test.

Every test that draws random data takes the `gen` fixture, which prints its seed (shown by pytest for a
failing test) and can be replayed with EMBSCALE_TEST_SEED=<seed>.
"""
import importlib.util
import os
import pathlib
import zlib

import pytest
import torch

import embscale


def _devices():
    devs = ["cpu"]
    if torch.cuda.is_available() and embscale.backend_available("cuda"):
        devs.append("cuda")
    return devs


DEVICES = _devices()


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


@pytest.fixture
def gen(request):
    seed = int(os.environ.get("EMBSCALE_TEST_SEED", zlib.crc32(request.node.nodeid.encode()) & 0x7FFFFFFF))
    print(f"seed={seed} (replay with EMBSCALE_TEST_SEED={seed})")
    g = torch.Generator().manual_seed(seed)
    return g


requires_cuda = pytest.mark.skipif("cuda" not in DEVICES, reason="no CUDA device with an embscale CUDA backend")


@pytest.fixture(scope="module")
def readme_figures():
    """bench/readme_figures.py (the figures' generator) loaded as a module."""
    script = pathlib.Path(__file__).resolve().parents[2] / "bench" / "readme_figures.py"
    spec = importlib.util.spec_from_file_location("readme_figures", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def no_cache_marks(readme_figures, monkeypatch):
    """For the tests that build tables-beyond-HBM figures of their own records: this repository's HISTORICAL
    marks of those figures (which name its own records) are left out while the test runs."""
    for fid in [k for k in readme_figures.HISTORICAL if k.startswith("tbe_cache")]:
        monkeypatch.delitem(readme_figures.HISTORICAL, fid)
