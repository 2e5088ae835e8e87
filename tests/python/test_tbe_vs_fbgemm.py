"""bench/tbe_vs_fbgemm.py: its agreement measure, its mixed dims and arguments; and, where FBGEMM's CPU TBE is
installed (fbgemm-gpu-cpu), a small run on the CPU whose records pair FBGEMM with embscale."""
import importlib.util
import json
import pathlib

import pytest
import torch

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "tbe_vs_fbgemm.py"


def load_script():
    spec = importlib.util.spec_from_file_location("tbe_vs_fbgemm", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_max_rel_err_is_the_largest_difference_over_the_largest_reference_value():
    tv = load_script()
    seed = 20261201
    print(f"seed {seed}")
    gen = torch.Generator().manual_seed(seed)
    ref = torch.rand(1000, generator=gen) * 4 - 2
    got = ref.clone()
    assert tv.max_rel_err(got, ref) == 0.0
    got[17] += 1e-3
    scale = float(ref.abs().max())
    assert tv.max_rel_err(got, ref) == pytest.approx(1e-3 / scale, rel=1e-3)
    assert tv.max_rel_err(torch.zeros(3), torch.zeros(3)) == 0.0
    assert tv.max_rel_err(torch.ones(3), torch.zeros(3)) == float("inf")


def test_busy_time_is_the_union_of_the_kernels_intervals():
    tv = load_script()
    assert tv.busy_time([]) == 0.0
    assert tv.busy_time([(0.0, 10.0), (20.0, 25.0)]) == 15.0  # apart: the sum
    assert tv.busy_time([(0.0, 10.0), (8.0, 12.0)]) == 12.0  # overlapping: counted once
    assert tv.busy_time([(5.0, 6.0), (0.0, 10.0), (9.0, 11.0)]) == 11.0  # nested, unsorted


def test_kernel_names_lose_template_arguments_and_parameters():
    tv = load_script()
    name = "void ns::kernel_a<float, 4>(ns::Params<float>, int)"
    assert tv.short_kernel_name(name) == "void ns::kernel_a"
    parts = tv.kernel_breakdown({name: 2.0, "void ns::kernel_a<double, 4>(int)": 3.0, "k2": 1.0})
    assert parts == {"void ns::kernel_a": 5.0, "k2": 1.0} and list(parts) == ["void ns::kernel_a", "k2"]


def test_mixed_dims_are_seeded_multiples_of_4_from_16_to_256():
    tv = load_script()
    dims = tv.table_dims("mixed", 32, 7)
    assert dims == tv.table_dims("mixed", 32, 7) and len(dims) == 32 and len(set(dims)) > 1
    assert all(d % 4 == 0 and 16 <= d <= 256 for d in dims)
    assert tv.table_dims(64, 3, 7) == [64, 64, 64]


@pytest.mark.parametrize("args, message", [(["--dims", "6"], "multiple of 4"), (["--dims", "x"], "not an integer"),
                                           (["--optimizers", "adamw"], "not one of"), (["--bag-size", "0"], "positive"),
                                           (["--gb", "0"], "> 0")])
def test_bad_arguments_are_refused_naming_them(args, message, capsys):
    tv = load_script()
    with pytest.raises(SystemExit):
        tv.parse_args(args)
    assert message in capsys.readouterr().err


def test_a_small_cpu_run_pairs_fbgemm_with_embscale(tmp_path):
    pytest.importorskip("fbgemm_gpu")
    tv = load_script()
    out = tmp_path / "records.jsonl"
    status = tv.main(["--device", "cpu", "--gb", "0.001", "--num-tables", "2", "--batch-size", "8", "--dims", "8",
                      "--alphas", "0", "--dtypes", "fp32", "--iters", "1", "--warmup", "0", "--out", str(out)])
    assert status == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["op"], r["impl"]) for r in recs) == sorted(
        (op, impl) for op in ("tbe_forward", "tbe_train_rowwise_adagrad", "tbe_train_sgd")
        for impl in ("fbgemm", "embscale_torch"))
    assert all(r["weights_max_rel_err"] <= r["check_tolerance"] and r["median_us"] > 0 for r in recs)
