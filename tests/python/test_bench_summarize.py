"""bench/summarize.py: embedding (TBE) records are compared with peers measured on the same workload only,
and only embscale's default tuning is set against them."""
import importlib.util
import json
import pathlib

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "summarize.py"


def load_summarize():
    spec = importlib.util.spec_from_file_location("summarize", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def tbe(impl, us, **fields):
    r = {"backend": "cuda", "op": "tbe_forward", "impl": impl, "median_us": us, "num_tables": 32,
         "batch_size": 8192, "embedding_dim": 128, "bag_size": 20, "num_embeddings": 1000000, "alpha": 0.0,
         "weights_precision": "fp32", "output_dtype": "fp32", "pooling": "sum", "weighted": False,
         "indices_dtype": "int64"}
    r.update(fields)
    return r


def speedups(tmp_path, capsys, records):
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert load_summarize().main([str(path)]) == 0
    out = capsys.readouterr().out
    table = out.split("embscale vs the fastest peer")[1].split("embscale vs each peer")[0].splitlines()[3:] \
        if "embscale vs" in out else []
    return [line.split() for line in table if line.strip()]


def test_tbe_records_pair_by_workload_and_default_tuning(tmp_path, capsys):
    rows = speedups(tmp_path, capsys, [
        tbe("embscale", 650.0, variable_bag_size=False, fwd_variant="default", fwd_order="tile", fwd_bags_per_group=0),
        tbe("embscale", 600.0, fwd_variant="u4"),                # a sweep variant: never set against the peer
        tbe("embscale", 700.0, bounds_check="error"),            # another workload: checks on
        tbe("embscale", 150.0, embedding_dim=8),                 # no peer measured at D=8
        tbe("torch_embeddingbag_concat", 1600.0),
        tbe("torch_embeddingbag", 1750.0),
        tbe("embscale", 280.0, alpha=1.15),
        tbe("torch_embeddingbag_concat", 1260.0, alpha=1.15),
        tbe("embscale", 2000.0, op="tbe_backward_sgd", optimizer="sgd", learning_rate=0.10000000149011612),
        tbe("torch_embeddingbag_sparse", 8000.0, op="tbe_backward_sgd", optimizer="sgd", learning_rate=0.1),
    ])
    got = {(r[0], r[3], r[4]): (float(r[5]), r[6], float(r[8])) for r in rows}  # op dtype T D alpha us peer us x
    assert got == {
        ("tbe_backward_sgd", "D128", "a0"): (2000.0, "torch_embeddingbag_sparse", 4.0),
        ("tbe_forward", "D128", "a0"): (650.0, "torch_embeddingbag_concat", round(1600.0 / 650.0, 2)),
        ("tbe_forward", "D128", "a1.15"): (280.0, "torch_embeddingbag_concat", 4.5),
    }


def ratio_rows(tmp_path, capsys, files):
    paths = []
    for name, records in files.items():
        path = tmp_path / name
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        paths.append(str(path))
    assert load_summarize().main(paths) == 0
    out = capsys.readouterr().out
    assert "embscale vs each peer, same run" in out
    table = out.split("embscale vs each peer, same run")[1].splitlines()[3:]
    return [line.split() for line in table if line.strip()]


def fp8(impl, us, **fields):
    r = {"backend": "cuda", "op": "amax", "impl": impl, "median_us": us, "dtype": "bf16", "n": 1 << 20,
         "date": "2026-12-01"}
    r.update(fields)
    return r


def test_ratio_table_pairs_each_peer_with_embscale_of_the_same_run(tmp_path, capsys):
    rows = ratio_rows(tmp_path, capsys, {
        "fbgemm.jsonl": [
            tbe("embscale_torch", 500.0, date="2026-12-01", harness="tbe_vs_fbgemm", kernel_us=400.0, busy_us=300.0),
            tbe("fbgemm", 750.0, date="2026-12-01", harness="tbe_vs_fbgemm", kernel_us=600.0, busy_us=600.0),
            # a training step: the optimizer is part of the case
            tbe("embscale_torch", 2000.0, op="tbe_train_sgd", optimizer="sgd", date="2026-12-01",
                harness="tbe_vs_fbgemm"),
            tbe("fbgemm", 3000.0, op="tbe_train_sgd", optimizer="sgd", date="2026-12-01", harness="tbe_vs_fbgemm"),
            tbe("fbgemm", 9000.0, op="tbe_train_rowwise_adagrad", optimizer="rowwise_adagrad", date="2026-12-01",
                harness="tbe_vs_fbgemm"),  # embscale's record of this case is missing: no ratio
            tbe("fbgemm", 800.0, date="2026-12-02", harness="tbe_vs_fbgemm"),  # another day: another run
        ],
        "te.jsonl": [
            fp8("embscale", 10.0),                                   # the CLI's run, in the same file
            fp8("embscale", 8.0, harness="te_fp8_peer"),             # the harness's own embscale record
            fp8("te", 12.0, harness="te_fp8_peer"),
            fp8("torch_eager", 30.0),                                # no harness: paired with impl embscale
        ],
        "other.jsonl": [tbe("fbgemm", 700.0, date="2026-12-01", harness="tbe_vs_fbgemm")],  # another file: another run
    })
    # op dtype case... embscale-impl us peer us ratio kernel busy (the case has spaces: count from the end)
    got = {(r[0], r[-7], r[-5]): (float(r[-6]), float(r[-4]), r[-3]) for r in rows}
    assert len(rows) == len(got)
    assert got == {
        ("amax", "embscale", "te"): (8.0, 12.0, "1.50"),
        ("amax", "embscale", "torch_eager"): (10.0, 30.0, "3.00"),
        ("tbe_forward", "embscale_torch", "fbgemm"): (500.0, 750.0, "1.50"),
        ("tbe_train_sgd", "embscale_torch", "fbgemm"): (2000.0, 3000.0, "1.50"),
    }
    kernel = {(r[0], r[-5]): r[-2] for r in rows}
    assert kernel[("tbe_forward", "fbgemm")] == "1.50" and kernel[("tbe_train_sgd", "fbgemm")] == "-"
    busy = {(r[0], r[-5]): r[-1] for r in rows}
    assert busy[("tbe_forward", "fbgemm")] == "2.00" and busy[("tbe_train_sgd", "fbgemm")] == "-"
