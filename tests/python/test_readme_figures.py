"""bench/readme_figures.py: the figures of docs/benchmarks.md and the README's summary lines are exactly what the
generator writes from the records in bench/results/, and a figure edited by hand (or a record changed without
regenerating) fails."""
import json
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_figures_and_summary_match_the_records(readme_figures):
    gen = readme_figures
    doc = (ROOT / "docs" / "benchmarks.md").read_text()
    start, end = doc.index(gen.BEGIN), doc.index(gen.END) + len(gen.END)
    assert doc[start:end] == gen.figures(), "docs/benchmarks.md's figures differ from bench/results/; run " \
                                            "python3 bench/readme_figures.py"
    readme = (ROOT / "README.md").read_text()
    start, end = readme.index(gen.SUMMARY_BEGIN), readme.index(gen.SUMMARY_END) + len(gen.SUMMARY_END)
    assert readme[start:end] == gen.summary(), "README.md's summary differs from bench/results/; run " \
                                               "python3 bench/readme_figures.py"
    assert gen.main(["--check"]) == 0


def test_figures_do_not_depend_on_the_working_directory(tmp_path, monkeypatch, readme_figures):
    gen = readme_figures
    monkeypatch.chdir(ROOT)
    from_root = gen.figures(), gen.summary()
    monkeypatch.chdir(tmp_path)
    assert (gen.figures(), gen.summary()) == from_root


def copies(tmp_path):
    doc, readme = tmp_path / "benchmarks.md", tmp_path / "README.md"
    doc.write_text((ROOT / "docs" / "benchmarks.md").read_text())
    readme.write_text((ROOT / "README.md").read_text())
    return doc, readme


def test_a_figure_edited_by_hand_is_caught(tmp_path, capsys, readme_figures):
    gen = readme_figures
    doc, readme = copies(tmp_path)
    original = doc.read_text()
    assert "| uniform, fp32 | 656 µs |" in gen.figures()  # the TBE forward's uniform fp32 record
    doc.write_text(original.replace("| uniform, fp32 | 656 µs |", "| uniform, fp32 | 600 µs |"))
    assert gen.main(["--check", "--doc", str(doc), "--readme", str(readme)]) == 1
    assert "differ from bench/results/" in capsys.readouterr().err
    assert gen.main(["--doc", str(doc), "--readme", str(readme)]) == 0  # regenerating restores the record's figure
    assert doc.read_text() == original


def test_a_summary_line_edited_by_hand_is_caught(tmp_path, capsys, readme_figures):
    gen = readme_figures
    doc, readme = copies(tmp_path)
    original = readme.read_text()
    line = next(l for l in gen.summary().split("\n") if l.startswith("- **FBGEMM_GPU**"))
    readme.write_text(original.replace(line, line.replace("training steps", "training steps up to 3×, from")))
    assert gen.main(["--check", "--doc", str(doc), "--readme", str(readme)]) == 1
    assert "README.md: the figures differ" in capsys.readouterr().err
    assert gen.main(["--doc", str(doc), "--readme", str(readme)]) == 0
    assert readme.read_text() == original


def test_each_summary_line_spans_its_table(readme_figures):
    """A summary line's range is the smallest and largest ratio of the table it links (wall time, no bounds
    checks), and its link names that table's heading."""
    gen = readme_figures
    figures, summary = gen.figures(), gen.summary()

    def part(heading):
        text = figures[figures.index("### " + heading):]
        nxt = text.find("\n### ", 1)
        return text if nxt < 0 else text[:nxt]

    def cells(text, row_filter=lambda row: True):
        out = []
        for row in text.split("\n"):
            if row.startswith("| ") and not row.startswith(("| ---", "|  |")) and row_filter(row):  # no header
                out += [float(v) for v in re.findall(r"\| ([0-9.]+)×", row)]  # the first ratio of each cell
        return out

    lines = {l.split("**")[1]: l for l in summary.split("\n") if l.startswith("- **")}
    fbgemm = part(gen.HEADINGS["fbgemm"])
    train = cells(fbgemm, lambda r: r.startswith("| train") and "bounds checks" not in r)
    fwd = cells(fbgemm, lambda r: r.startswith("| forward") and "bounds checks" not in r)
    assert f"training steps {gen.ratio(min(train))} to {gen.ratio(max(train))}" in lines["FBGEMM_GPU"]
    assert f"forwards {gen.ratio(min(fwd))} to {gen.ratio(max(fwd))}" in lines["FBGEMM_GPU"]
    te = cells(part(gen.HEADINGS["te"]))
    assert f"{gen.ratio(min(te))} to {gen.ratio(max(te))}" in lines["TransformerEngine"]
    cpu = part(gen.HEADINGS["fbgemm_cpu"])
    adagrad = cells(cpu, lambda r: r.startswith("| row-wise Adagrad"))
    assert f"row-wise Adagrad steps {gen.ratio(min(adagrad))} to {gen.ratio(max(adagrad))}" in lines["FBGEMM's CPU TBE"]
    for key, part_name in (("torch", "torch"), ("FBGEMM_GPU", "fbgemm"), ("TransformerEngine", "te"),
                           ("FBGEMM's CPU TBE", "fbgemm_cpu")):
        assert f"(docs/benchmarks.md#{gen.anchor(gen.HEADINGS[part_name])})" in lines[key]
        assert "### " + gen.HEADINGS[part_name] in figures


def tbe_record(impl, op, dtype, alpha, dim, us, kernel_us, date="2026-12-02"):
    return {"date": date, "device": "NVIDIA H200", "backend": "cuda", "harness": "tbe_vs_fbgemm", "op": op,
            "impl": impl, "num_tables": 32, "batch_size": 8192, "bag_size": 20, "num_embeddings": 4194304,
            "embedding_dim": dim, "alpha": alpha, "weights_precision": dtype, "median_us": us, "kernel_us": kernel_us,
            "fbgemm_gpu": "1.6.0"}


def fp8_record(impl, op, dtype, us, n=None, rows=None, cols=None):
    r = {"date": "2026-12-02", "device": "NVIDIA H200", "backend": "cuda", "harness": "te_fp8_peer", "op": op,
         "impl": impl, "dtype": dtype, "median_us": us, "transformer_engine": "2.20.2"}
    if rows:
        r.update(rows=rows, cols=cols, n=rows * cols)
    else:
        r["n"] = n
    return r


def test_peer_tables_come_from_the_newest_run(tmp_path, readme_figures):
    gen = readme_figures
    assert gen.peer_sections(str(tmp_path)) == []  # no FBGEMM or TE records yet: no tables
    older = [tbe_record("fbgemm", "tbe_forward", "fp32", 0.0, 128, 900.0, 800.0, date="2026-12-01"),
             tbe_record("embscale_torch", "tbe_forward", "fp32", 0.0, 128, 100.0, 90.0, date="2026-12-01")]
    newer = []
    for dim, fb in ((64, 300.0), (128, 500.0), ("mixed", 450.0)):
        newer += [tbe_record("fbgemm", "tbe_forward", "fp32", 0.0, dim, fb, fb / 2),
                  tbe_record("embscale_torch", "tbe_forward", "fp32", 0.0, dim, 250.0, 100.0)]
    newer += [tbe_record("fbgemm", "tbe_train_sgd", "fp16", 1.15, 128, 2000.0, 1500.0),
              tbe_record("embscale_torch", "tbe_train_sgd", "fp16", 1.15, 128, 1000.0, 1000.0)]
    # The same case in each library's default checked mode: a row of its own, after the unchecked ones.
    newer += [dict(tbe_record("fbgemm", "tbe_forward", "fp32", 0.0, 64, 330.0, 400.0), bounds_check="warn"),
              dict(tbe_record("embscale_torch", "tbe_forward", "fp32", 0.0, 64, 300.0, 100.0), bounds_check="warn")]
    te = [dict(fp8_record("embscale", "amax", "bf16", 1.0, n=1 << 20), harness=None),  # the CLI's, same file
          fp8_record("te", "amax", "bf16", 12.0, n=1 << 20), fp8_record("embscale", "amax", "bf16", 8.0, n=1 << 20),
          fp8_record("te", "amax", "bf16", 30.0, n=1 << 24), fp8_record("embscale", "amax", "bf16", 30.0, n=1 << 24),
          fp8_record("te", "cast_transpose", "fp32", 110.0, rows=8192, cols=8192),
          fp8_record("embscale", "cast_transpose", "fp32", 100.0, rows=8192, cols=8192)]
    for name, recs in (("2026-12-01-a.jsonl", older), ("2026-12-02-b.jsonl", newer + te)):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in recs))
    fbgemm, te_part = gen.peer_sections(str(tmp_path))
    assert "FBGEMM_GPU 1.6.0" in fbgemm and "`bench/results/2026-12-02-b.jsonl`" in fbgemm
    # wall 300/250, 500/250, 450/250; kernel (in brackets) 150/100, 250/100, 225/100
    assert "| forward, fp32, uniform | 1.2× (1.5×) | 2× (2.5×) | 1.8× (2.25×) |" in fbgemm
    assert "| train, SGD, fp16, Zipf 1.15 | — | 2× (1.5×) | — |" in fbgemm
    assert fbgemm.endswith("| train, SGD, fp16, Zipf 1.15 | — | 2× (1.5×) | — |\n"
                           "| forward, fp32, uniform, bounds checks warn | 1.1× (4×) | — | — |")
    assert "| D=64 | D=128 | D=mixed |" in fbgemm
    # kernel: 150/100, 250/100, 225/100 (forwards; not the older 800/90, nor the warn row's 400/100), 1500/1000
    assert "without bounds checks: training steps 1.5× to 1.5× and forwards 1.5× to 2.5×;" in fbgemm
    assert "| amax, bf16 | 1.5× | 1× |" in te_part and "| 2^20 | 2^24 |" in te_part
    assert "| cast_transpose, fp32 | 1.1× |" in te_part and "TransformerEngine** (2.20.2" in te_part


def test_te_table_takes_cast_transpose_from_the_newest_run_that_measured_it(tmp_path, readme_figures):
    gen = readme_figures
    older = [fp8_record("te", "amax", "bf16", 12.0, n=1 << 20), fp8_record("embscale", "amax", "bf16", 8.0, n=1 << 20),
             fp8_record("te", "cast_transpose", "fp32", 110.0, rows=8192, cols=8192),
             fp8_record("embscale", "cast_transpose", "fp32", 100.0, rows=8192, cols=8192)]
    newer = [fp8_record("te", "amax", "bf16", 30.0, n=1 << 24), fp8_record("embscale", "amax", "bf16", 20.0, n=1 << 24)]
    for name, recs, date in (("2026-12-02-a.jsonl", older, "2026-12-02"), ("2026-12-03-b.jsonl", newer, "2026-12-03")):
        (tmp_path / name).write_text("".join(json.dumps(dict(r, date=date)) + "\n" for r in recs))
    (te_part,) = gen.peer_sections(str(tmp_path))
    assert "| amax, bf16 | 1.5× |" in te_part and "| 2^24 |" in te_part and "2^20" not in te_part
    assert "| cast_transpose, fp32 | 1.1× |" in te_part
    assert "The cast_transpose rows are of 2026-12-02, the newest run that measured it." in te_part
    assert "Records: `bench/results/2026-12-03-b.jsonl`, `bench/results/2026-12-02-a.jsonl`" in te_part


def test_back_to_back_ratios_span_the_unchecked_cases_that_have_them(tmp_path, readme_figures):
    gen = readme_figures
    def loop(rec, us):
        return dict(rec, loop_us=us)
    recs = [loop(tbe_record("fbgemm", "tbe_forward", "fp32", 0.0, 64, 300.0, 200.0), 330.0),
            loop(tbe_record("embscale_torch", "tbe_forward", "fp32", 0.0, 64, 250.0, 100.0), 110.0),  # 3x
            loop(tbe_record("fbgemm", "tbe_train_sgd", "fp32", 1.15, 64, 900.0, 800.0), 1200.0),
            loop(tbe_record("embscale_torch", "tbe_train_sgd", "fp32", 1.15, 64, 600.0, 500.0), 1000.0),  # 1.2x
            loop(tbe_record("fbgemm", "tbe_train_sgd", "fp32", 1.15, 128, 900.0, 800.0), 1400.0),
            loop(tbe_record("embscale_torch", "tbe_train_sgd", "fp32", 1.15, 128, 600.0, 500.0), 1000.0),  # 1.4x
            # no loop_us: left out of the span
            tbe_record("fbgemm", "tbe_train_sgd", "fp32", 0.0, 64, 900.0, 800.0),
            tbe_record("embscale_torch", "tbe_train_sgd", "fp32", 0.0, 64, 100.0, 100.0),
            # checked mode: left out of the span
            dict(loop(tbe_record("fbgemm", "tbe_train_sgd", "fp32", 1.15, 64, 900.0, 800.0), 9000.0), bounds_check="warn"),
            dict(loop(tbe_record("embscale_torch", "tbe_train_sgd", "fp32", 1.15, 64, 600.0, 500.0), 1000.0),
                 bounds_check="warn")]
    (tmp_path / "2026-12-02-a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    fbgemm = gen.peer_sections(str(tmp_path))[0]
    assert "no bounds checks): training steps 1.2× to 1.4× and forwards 3× to 3×." in fbgemm
    (tmp_path / "2026-12-02-a.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k != "loop_us"}) + "\n"
                                                         for r in recs))
    assert "Back to back" not in gen.peer_sections(str(tmp_path))[0]  # records without loop_us: no sentence


def test_gpu_time_is_the_busy_time_where_both_records_have_it(tmp_path, readme_figures):
    gen = readme_figures
    def busy(rec, us):
        return dict(rec, busy_us=us)
    recs = [busy(tbe_record("fbgemm", "tbe_train_sgd", "fp32", 1.15, 64, 900.0, 800.0), 800.0),
            busy(tbe_record("embscale_torch", "tbe_train_sgd", "fp32", 1.15, 64, 600.0, 700.0), 500.0),  # 1.6x, sum 1.14x
            busy(tbe_record("fbgemm", "tbe_train_sgd", "fp32", 1.15, 128, 900.0, 900.0), 900.0),
            busy(tbe_record("embscale_torch", "tbe_train_sgd", "fp32", 1.15, 128, 600.0, 600.0), 450.0),  # 2x, sum 1.5x
            # an older record pair without busy_us: its summed kernel time
            tbe_record("fbgemm", "tbe_train_sgd", "fp32", 1.15, 256, 900.0, 1200.0),
            tbe_record("embscale_torch", "tbe_train_sgd", "fp32", 1.15, 256, 600.0, 1000.0)]  # 1.2x
    (tmp_path / "2026-12-02-a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    fbgemm = gen.peer_sections(str(tmp_path))[0]
    assert "| train, SGD, fp32, Zipf 1.15 | 1.5× (1.6×) | 1.5× (2×) | 1.5× (1.2×) |" in fbgemm
    assert "without bounds checks: training steps 1.2× to 2×." in fbgemm
    assert "on the sums the training steps are 1.14× to 1.5×. Rows from records without the busy time" in fbgemm
    (tmp_path / "2026-12-02-a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs[:4]))
    fbgemm = gen.peer_sections(str(tmp_path))[0]  # every bracket on busy time: no such sentence
    assert "on the sums the training steps are 1.14× to 1.5×." in fbgemm
    assert "Rows from records without the busy time" not in fbgemm


def test_runs_of_one_date_are_ordered_by_their_time(tmp_path, readme_figures):
    """Of two runs on one date, the later by its records' time wins whatever the file names; a run without
    a time counts as the day's earliest."""
    gen = readme_figures
    def run(fb, time=None):
        recs = [tbe_record("fbgemm", "tbe_forward", "fp32", 0.0, 128, fb, fb),
                tbe_record("embscale_torch", "tbe_forward", "fp32", 0.0, 128, 100.0, 100.0)]
        return [dict(r, time=time) if time else r for r in recs]
    for name, recs in (("2026-12-02-a.jsonl", run(300.0, "14:05")), ("2026-12-02-b.jsonl", run(200.0, "09:30")),
                       ("2026-12-02-c.jsonl", run(400.0))):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert [name for _, name, _ in gen.runs_of(str(tmp_path), "fbgemm")] == [
        "2026-12-02-c.jsonl", "2026-12-02-b.jsonl", "2026-12-02-a.jsonl"]
    fbgemm = gen.peer_sections(str(tmp_path))[0]
    assert "| forward, fp32, uniform | 3× (3×) |" in fbgemm


def test_laboratory_experiments_are_not_peer_runs(tmp_path, readme_figures):
    """Records of a laboratory experiment (field "experiment": build A/Bs, cost breakdowns) never become the
    run a figures table comes from, however new; without that field the same records would."""
    gen = readme_figures
    def run(fb, **extra):
        return [dict(r, **extra) for r in (tbe_record("fbgemm", "tbe_forward", "fp32", 0.0, 128, fb, fb),
                                           tbe_record("embscale_torch", "tbe_forward", "fp32", 0.0, 128, 100.0, 100.0))]
    (tmp_path / "2026-12-02-a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in run(300.0)))
    lab = run(500.0, date="2026-12-03", experiment="some_ab", variant="lab build")
    (tmp_path / "2026-12-03-b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lab))
    assert [name for _, name, _ in gen.runs_of(str(tmp_path), "fbgemm")] == ["2026-12-02-a.jsonl"]
    assert gen.newest_run(str(tmp_path), "fbgemm")[0] == "2026-12-02-a.jsonl"
    assert "| forward, fp32, uniform | 3× (3×) |" in gen.peer_sections(str(tmp_path))[0]
    plain = [{k: v for k, v in r.items() if k not in ("experiment", "variant")} for r in lab]
    (tmp_path / "2026-12-03-b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in plain))
    assert gen.newest_run(str(tmp_path), "fbgemm")[0] == "2026-12-03-b.jsonl"


def test_cpu_peer_table_comes_from_the_newest_run(tmp_path, readme_figures):
    gen = readme_figures
    assert gen.cpu_peer_sections(str(tmp_path)) == []  # no FBGEMM CPU records: no table

    def cpu(impl, op, alpha, dim, med, mn, date="2026-12-02"):
        return {"date": date, "device": "Intel(R) Xeon(R) Processor", "backend": "cpu", "op": op, "impl": impl,
                "num_tables": 8, "num_embeddings": 100000, "batch_size": 512, "bag_size": 20, "alpha": alpha,
                "embedding_dim": dim, "median_us": med, "min_us": mn, "fbgemm_gpu": "1.9.0", "threads": 1}

    older = [cpu("fbgemm_cpu", "tbe_forward", 0.0, 32, 900.0, 900.0, date="2026-12-01"),
             cpu("embscale", "tbe_forward", 0.0, 32, 100.0, 100.0, date="2026-12-01")]
    newer = [cpu("fbgemm_cpu", "tbe_forward", 0.0, 32, 300.0, 200.0), cpu("embscale", "tbe_forward", 0.0, 32, 200.0, 100.0),
             cpu("fbgemm_cpu", "tbe_forward", 0.0, 128, 500.0, 400.0), cpu("embscale", "tbe_forward", 0.0, 128, 500.0, 500.0),
             cpu("fbgemm_cpu", "tbe_train_sgd", 1.15, 128, 900.0, 800.0),
             cpu("embscale", "tbe_train_sgd", 1.15, 128, 1000.0, 1000.0)]
    for name, recs in (("2026-12-01-a.jsonl", older), ("2026-12-02-b.jsonl", newer)):
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in recs))
    (part,) = gen.cpu_peer_sections(str(tmp_path))
    assert "fbgemm_gpu 1.9.0" in part and "`bench/results/2026-12-02-b.jsonl`" in part
    assert "| | D=32 | D=128 |" in part.replace("|  |", "| |")
    assert "| forward, uniform | 1.5× (2×) | 1× (0.8×) |" in part  # median 300/200, min 200/100; 500/500, 400/500
    assert "| SGD step, Zipf 1.15 | — | 0.9× (0.8×) |" in part


def test_cpu_peer_tables_one_per_cpu_model(tmp_path, readme_figures):
    gen = readme_figures

    def cpu(device, impl, med, date):
        return {"date": date, "device": device, "backend": "cpu", "op": "tbe_forward", "impl": impl,
                "num_tables": 8, "num_embeddings": 100000, "batch_size": 512, "bag_size": 20, "alpha": 0.0,
                "embedding_dim": 32, "median_us": med, "min_us": med, "fbgemm_gpu": "1.9.0", "threads": 1}

    runs = {"2026-12-01-amd-old.jsonl": [cpu("AMD EPYC", "fbgemm_cpu", 900.0, "2026-12-01"),
                                         cpu("AMD EPYC", "embscale", 100.0, "2026-12-01")],
            "2026-12-02-xeon.jsonl": [cpu("Intel Xeon", "fbgemm_cpu", 300.0, "2026-12-02"),
                                      cpu("Intel Xeon", "embscale", 200.0, "2026-12-02")],
            "2026-12-03-amd.jsonl": [cpu("AMD EPYC", "fbgemm_cpu", 500.0, "2026-12-03"),
                                     cpu("AMD EPYC", "embscale", 250.0, "2026-12-03")]}
    for name, recs in runs.items():
        (tmp_path / name).write_text("".join(json.dumps(r) + "\n" for r in recs))
    amd, xeon = gen.cpu_peer_sections(str(tmp_path))  # the most recent run first, the older AMD run gone
    assert "AMD EPYC" in amd and "2026-12-03-amd.jsonl" in amd and "| forward, uniform | 2× (2×) |" in amd
    assert "Intel Xeon" in xeon and "2026-12-02-xeon.jsonl" in xeon and "| forward, uniform | 1.5× (1.5×) |" in xeon


def test_backward_phases_from_old_and_new_records(readme_figures):
    gen = readme_figures

    def bwd(dim, us, phases=None, impl="embscale"):
        r = {"op": "tbe_backward_sgd", "impl": impl, "build": gen.GPU_SWEEP_BUILD, "alpha": 0.0,
             "embedding_dim": dim, "median_us": us}
        if phases:
            r["phases"] = {name + "_us": v for name, v in zip(("linearize", "sort", "encode", "rows"), phases)}
        return r

    # D=64: a record of the CLI from before the phases moved (it has them); D=128: the CLI's newer record
    # (no phases) and embscale-dev's (with them): one row each, with the phases.
    recs = [bwd(64, 1000.0, (100.0, 200.0, 300.0, 400.0)), bwd(128, 3000.0),
            bwd(128, 2000.0, (110.0, 220.0, 330.0, 1300.0)), bwd(128, 8000.0, impl="torch_embeddingbag_sparse")]
    text = gen.gpu_tbe_backward(recs)
    assert "| sgd, uniform, D=64 | 1.00 ms (linearize 0.10, sort 0.20, encode 0.30, rows 0.40) | — | — |" in text
    assert "| sgd, uniform, D=128 | 2.00 ms (linearize 0.11, sort 0.22, encode 0.33, rows 1.30) | 8.0 ms | 4× |" in text
    assert text.count("D=128") == 1
