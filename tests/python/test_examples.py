"""The Python example programs of examples/ (examples/fp8_training.py is run by test_fp8_training.py):
train_dlrm.py refuses bad arguments by flag."""
import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("flag, value", [("--steps", "0"), ("--batch-size", "0"), ("--embedding-dim", "-1"),
                                         ("--lr", "nan")])
def test_train_dlrm_refuses_bad_arguments_by_flag(flag, value):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, os.path.join(root, "examples", "train_dlrm.py"), flag, value],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and f"error: {flag}: {value}" in r.stderr, r.stderr
