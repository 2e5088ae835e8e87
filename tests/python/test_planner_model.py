"""The constants of embscale's planner cost model (python/embscale/_planner_model.py, FITTED: the bandwidths
TorchRec's planner estimates embscale's kernels by) are what bench/fit_planner_model.py fits to the records it
names in bench/results/, so they cannot drift from those records; and the fit counts the optimizer state the
library's optimizer table gives. Needs neither a GPU nor torchrec."""
import importlib.util
import os

from embscale import _capi
from embscale import _planner_model as model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "fit_planner_model.py")


def _script():
    spec = importlib.util.spec_from_file_location("fit_planner_model", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fitted_table_is_what_the_records_give():
    fitted = _script().fit()
    assert list(fitted) == list(model.FITTED), "rows (regenerate: python bench/fit_planner_model.py --write)"
    for key, row in fitted.items():
        assert model.FITTED[key] == row, f"{key} (regenerate: python bench/fit_planner_model.py --write)"


def test_table_has_every_row_the_estimator_reads():
    want = {("forward", "", w, i) for w in ("fp32", "fp16") for i in model.INDEX_DISTRIBUTIONS}
    want |= {("backward", o, w, i) for o in model.MEASURED_OPTIMIZERS for w in ("fp32", "fp16")
             for i in model.INDEX_DISTRIBUTIONS}
    want |= {("link", p, "", i) for p in ("host", "cached") for i in model.INDEX_DISTRIBUTIONS}
    assert set(model.FITTED) == want
    for key, row in model.FITTED.items():
        assert row.gbps > 0 and row.floor in model.FLOOR_CHOICES and row.overhead >= 0, key
        assert os.path.isfile(os.path.join(ROOT, "bench", "results", row.source)), key


def test_fit_counts_the_libraries_optimizer_state():
    script = _script()
    for optimizer, layouts in script.STATE_LAYOUTS.items():
        assert tuple(_capi.OPTIMIZER_STATES[optimizer]) == layouts, optimizer
    assert set(script.STATE_LAYOUTS) == set(model.MEASURED_OPTIMIZERS)
