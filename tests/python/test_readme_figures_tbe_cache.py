"""bench/readme_figures.py's tables of the tables-larger-than-GPU-memory benchmark (bench/tbe_cache_vs_fbgemm.py):
rendered from the newest GPU runs' summary records, one line saying so while there is none, and a --dry-run's
records (made-up numbers) refused. The records here are synthetic, in a temporary directory, shaped as
tbe_cache_vs_fbgemm.py writes them."""
import json
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

IMPLS = {"device": ("embscale_device", "fbgemm_device"), "cached": ("embscale_cached", "fbgemm_cached"),
         "host": ("embscale_host", "fbgemm_managed")}




def run_records(cases, date="2026-12-06", time="10:00", device="NVIDIA H100 80GB HBM3", build="abc1234", gib=16.0,
                backend="cuda", cache_algorithm="lru", prefetch=False, alone=False, dry_run=False):
    """The records of one run, as the benchmark appends them: per case (placement, load factor, alpha, embscale ms,
    FBGEMM ms, embscale hit rate, FBGEMM hit rate, floor ms) the FBGEMM and embscale records, then a summary
    record per case. embscale's all-HBM step of the same alpha gives "embscale_over_own_hbm"."""
    recs, summaries = [], []
    own = {alpha: es for placement, _, alpha, es, *_ in cases if placement == "device"}
    for placement, lf, alpha, es_ms, fb_ms, es_hit, fb_hit, floor in cases:
        config = dict(placement=placement, cache_load_factor=lf, alpha=alpha, tables_gib=gib, num_tables=26,
                      embedding_dim=128, batch_size=8192, bag_size=20, cache_algorithm=cache_algorithm,
                      prefetch=prefetch)
        base = dict(date=date, time=time, harness="tbe_cache_vs_fbgemm", op="tbe_train_rowwise_adagrad",
                    placement=placement, device=device, backend=backend, torch="2.11.0", fbgemm_gpu="1.6.0",
                    embscale_build=build, config=config, num_tables=26, batch_size=8192, embedding_dim=128,
                    bag_size=20, num_embeddings=1290555, tables_gib=gib, alpha=alpha, cache_load_factor=lf,
                    one_impl_at_a_time=alone, link_h2d_GBps=50.0, link_d2h_GBps=50.0, link_GBps=90.0, status="ok")
        es_impl, fb_impl = IMPLS[placement]
        for impl, ms, hit in ((fb_impl, fb_ms, fb_hit), (es_impl, es_ms, es_hit)):
            recs.append(dict(base, impl=impl, median_ms=ms, hit_rate=hit, floor_ms=floor,
                             pct_of_floor=floor / ms if floor else None))
        summaries.append(dict(record="summary", harness="tbe_cache_vs_fbgemm", date=date, device=device,
                              placement=placement, cache_load_factor=lf, alpha=alpha, tables_gib=gib, num_tables=26,
                              embedding_dim=128, batch_size=8192, bag_size=20, embscale_build=build,
                              embscale_ms=es_ms, fbgemm_ms=fb_ms, embscale_hit_rate=es_hit, fbgemm_hit_rate=fb_hit,
                              embscale_pct_of_floor=floor / es_ms if floor else None, floor_ms=floor,
                              ratio_fbgemm_over_embscale=fb_ms / es_ms,
                              embscale_over_own_hbm=es_ms / own[alpha] if placement != "device" and alpha in own
                              else None, goals={}))
    out = recs + summaries
    if dry_run:
        out = [dict(r, dry_run=True) for r in out]
    return out


# (placement, load factor, alpha, embscale ms, FBGEMM ms, embscale hit rate, FBGEMM hit rate, floor ms)
SIXTEEN = [("device", None, 0.0, 4.0, 6.0, None, None, None),
           ("cached", 0.05, 0.0, 40.0, 60.0, 0.05, 0.05, 36.0),
           ("cached", 0.1, 0.0, 38.0, 57.0, 0.1, 0.1, 34.2),
           ("host", None, 0.0, 42.0, 84.0, None, None, 40.0),
           ("device", None, 1.15, 2.0, 3.0, None, None, None),
           ("cached", 0.1, 1.15, 3.0, 6.0, 0.85, 0.8, 1.2),
           ("cached", 0.2, 1.15, 2.5, 5.0, 0.9, 0.88, 0.75)]


def write(directory, name, records):
    (directory / name).write_text("".join(json.dumps(r) + "\n" for r in records))


def rows(text):
    """The body rows of the Markdown tables in `text` (no header, no separator)."""
    return [l for l in text.split("\n") if l.startswith("| ") and not l.startswith(("| ids", "| ---"))]


@pytest.mark.usefixtures("no_cache_marks")
def test_without_a_gpu_record_both_say_so_in_one_line(readme_figures, tmp_path):
    assert readme_figures.tbe_cache_section(str(tmp_path)) == readme_figures.TBE_CACHE_NO_RECORD
    rf = readme_figures
    assert rf.tbe_cache_readme(str(tmp_path)) == "\n\n".join((rf.TBE_CACHE_BEGIN, rf.TBE_CACHE_NO_RECORD,
                                                                 rf.TBE_CACHE_END))
    assert "\n" not in readme_figures.TBE_CACHE_NO_RECORD and "No GPU record yet" in readme_figures.TBE_CACHE_NO_RECORD
    assert not any(ch.isdigit() for ch in readme_figures.TBE_CACHE_NO_RECORD)  # no figure of any kind
    # Other records (another harness, a CPU smoke run of this one) are not a GPU record of it.
    write(tmp_path, "2026-12-01-other.jsonl", [{"date": "2026-12-01", "impl": "fbgemm", "op": "tbe_forward"}])
    write(tmp_path, "2026-12-05-cpu-tbe-cache.jsonl", run_records(SIXTEEN, backend="cpu", device="cpu"))
    assert readme_figures.tbe_cache_section(str(tmp_path)) == readme_figures.TBE_CACHE_NO_RECORD


@pytest.mark.usefixtures("no_cache_marks")
def test_the_full_table(readme_figures, tmp_path):
    write(tmp_path, "2026-12-06-nvidia-h100-tbe-cache-16gib.jsonl", run_records(SIXTEEN))
    text = readme_figures.tbe_cache_section(str(tmp_path))
    assert text.startswith("**16 GiB of fp32 tables: T=26 × 1,290,555 rows, D=128, B=8192, L=20**")
    for part in ("NVIDIA H100 80GB HBM3, 2026-12-06, build `abc1234`", "FBGEMM_GPU 1.6.0",
                 "the host link 90.0 GB/s both ways at once (50.0 H2D, 50.0 D2H)", "checked equal",
                 "Records: `bench/results/2026-12-06-nvidia-h100-tbe-cache-16gib.jsonl` (build `abc1234`)."):
        assert part in text
    assert rows(text) == [
        "| uniform | device (`DEVICE`) | — | 4.00 | 6.00 | 1.5× | — | — | — | — | — |",
        "| uniform | cached (`MANAGED_CACHING`) | 0.05 | 40.0 | 60.0 | 1.5× | 5.0% | 5.0% | 36.0 | 90% | 10× |",
        "| uniform | cached (`MANAGED_CACHING`) | 0.1 | 38.0 | 57.0 | 1.5× | 10.0% | 10.0% | 34.2 | 90% | 9.5× |",
        "| uniform | host (`MANAGED`) | — | 42.0 | 84.0 | 2× | — | — | 40.0 | 95% | 10.5× |",
        "| Zipf 1.15 | device (`DEVICE`) | — | 2.00 | 3.00 | 1.5× | — | — | — | — | — |",
        "| Zipf 1.15 | cached (`MANAGED_CACHING`) | 0.1 | 3.00 | 6.00 | 2× | 85.0% | 80.0% | 1.20 | 40% | 1.5× |",
        "| Zipf 1.15 | cached (`MANAGED_CACHING`) | 0.2 | 2.50 | 5.00 | 2× | 90.0% | 88.0% | 0.75 | 30% | 1.25× |"]


@pytest.mark.usefixtures("no_cache_marks")
def test_the_readme_table_is_load_factor_0_1_and_the_all_hbm_step(readme_figures, tmp_path):
    write(tmp_path, "2026-12-06-nvidia-h100-tbe-cache-16gib.jsonl", run_records(SIXTEEN))
    text = readme_figures.tbe_cache_readme(str(tmp_path))
    assert text.startswith(readme_figures.TBE_CACHE_BEGIN + "\n\n")
    assert text.endswith("\n\n" + readme_figures.TBE_CACHE_END)
    assert "NVIDIA H100 80GB HBM3, 2026-12-06, build `abc1234`" in text
    assert "(docs/benchmarks.md#tables-larger-than-gpu-memory-against-fbgemm)" in text
    assert readme_figures.anchor(readme_figures.HEADINGS["tbe_cache"]) == "tables-larger-than-gpu-memory-against-fbgemm"
    assert rows(text) == [
        "| uniform | device (`DEVICE`) | 4.00 | 6.00 | 1.5× | — | — | — |",
        "| uniform | cached (`MANAGED_CACHING`), 0.1 | 38.0 | 57.0 | 1.5× | 10.0% | 90% | 9.5× |",
        "| Zipf 1.15 | device (`DEVICE`) | 2.00 | 3.00 | 1.5× | — | — | — |",
        "| Zipf 1.15 | cached (`MANAGED_CACHING`), 0.1 | 3.00 | 6.00 | 2× | 85.0% | 40% | 1.5× |"]


@pytest.mark.usefixtures("no_cache_marks")
def test_dry_run_records_are_refused(readme_figures, tmp_path, capsys, monkeypatch):
    write(tmp_path, "2026-12-06-nvidia-h100-tbe-cache-16gib.jsonl", run_records(SIXTEEN))
    # A dry run's records, however new, are made-up numbers: the generator stops and names the file and line.
    write(tmp_path, "2026-12-07-dry.jsonl", run_records(SIXTEEN, date="2026-12-07", dry_run=True))
    for render in (readme_figures.tbe_cache_section, readme_figures.tbe_cache_readme):
        with pytest.raises(ValueError, match=r"2026-12-07-dry\.jsonl:1: a record of a --dry-run"):
            render(str(tmp_path))
    # One dry-run record among real ones (a summary appended by hand) is refused as well.
    (tmp_path / "2026-12-07-dry.jsonl").unlink()
    real = run_records(SIXTEEN)
    write(tmp_path, "2026-12-06-nvidia-h100-tbe-cache-16gib.jsonl", real[:-1] + [dict(real[-1], dry_run=True)])
    with pytest.raises(ValueError, match=f"tbe-cache-16gib.jsonl:{len(real)}: "):
        readme_figures.tbe_cache_section(str(tmp_path))
    # The command reports it and exits 2, with --check or without, and writes nothing.
    find = readme_figures.tbe_cache_cases
    monkeypatch.setattr(readme_figures, "tbe_cache_cases", lambda _results_dir: find(str(tmp_path)))
    doc, readme = tmp_path / "benchmarks.md", tmp_path / "README.md"
    doc.write_text((ROOT / "docs" / "benchmarks.md").read_text())
    readme.write_text((ROOT / "README.md").read_text())
    for check in (["--check"], []):
        assert readme_figures.main(check + ["--doc", str(doc), "--readme", str(readme)]) == 2
        assert "tbe-cache-16gib.jsonl" in capsys.readouterr().err
    assert doc.read_text() == (ROOT / "docs" / "benchmarks.md").read_text()
    assert readme.read_text() == (ROOT / "README.md").read_text()


@pytest.mark.usefixtures("no_cache_marks")
def test_newest_case_of_the_newest_card_and_the_standard_setup_only(readme_figures, tmp_path):
    write(tmp_path, "2026-12-06-nvidia-h100-tbe-cache-16gib.jsonl", run_records(SIXTEEN))
    # A later partial run of one case on the same card replaces that case only (its file is cited too).
    write(tmp_path, "2026-12-07-nvidia-h100-tbe-cache-16gib.jsonl",
          run_records([("cached", 0.1, 1.15, 2.8, 7.0, 0.86, 0.8, 1.1)], date="2026-12-07", build="def5678"))
    # Variants of the setup (LFU, prefetch) and laboratory records never enter the table.
    write(tmp_path, "2026-12-08-nvidia-h100-lfu.jsonl",
          run_records(SIXTEEN, date="2026-12-08", cache_algorithm="lfu") +
          run_records(SIXTEEN, date="2026-12-08", prefetch=True) +
          [dict(r, experiment="ab") for r in run_records(SIXTEEN, date="2026-12-08")])
    text = readme_figures.tbe_cache_section(str(tmp_path))
    assert "| Zipf 1.15 | cached (`MANAGED_CACHING`) | 0.1 | 2.80 | 7.00 | 2.5× | 86.0% | 80.0% |" in text
    assert "| uniform | cached (`MANAGED_CACHING`) | 0.1 | 38.0 | 57.0 | 1.5× |" in text
    assert len(rows(text)) == len(SIXTEEN)
    assert "2026-12-06 to 2026-12-07, build `abc1234`, `def5678`" in text
    assert "`bench/results/2026-12-06-nvidia-h100-tbe-cache-16gib.jsonl`, " \
           "`bench/results/2026-12-07-nvidia-h100-tbe-cache-16gib.jsonl`" in text
    assert "lfu" not in text
    # A newer run on another card: the table is that card's alone.
    write(tmp_path, "2026-12-09-nvidia-h200-tbe-cache-16gib.jsonl",
          run_records(SIXTEEN[:3], date="2026-12-09", device="NVIDIA H200"))
    text = readme_figures.tbe_cache_section(str(tmp_path))
    assert "NVIDIA H200, 2026-12-09" in text and "H100" not in text and len(rows(text)) == 3


@pytest.mark.usefixtures("no_cache_marks")
def test_a_table_per_table_set(readme_figures, tmp_path):
    write(tmp_path, "2026-12-06-nvidia-h100-tbe-cache-16gib.jsonl", run_records(SIXTEEN))
    big = [("cached", 0.1, 0.0, 300.0, 450.0, 0.1, 0.1, 280.0), ("cached", 0.1, 1.15, 20.0, 50.0, 0.8, 0.78, 9.0)]
    write(tmp_path, "2026-12-06-nvidia-h100-tbe-cache-96gib.jsonl", run_records(big, gib=96.0, alone=True))
    text = readme_figures.tbe_cache_section(str(tmp_path))
    sixteen, ninety_six = text.split("\n\n**96 GiB")
    assert sixteen.startswith("**16 GiB") and len(rows(sixteen)) == len(SIXTEEN)
    assert "each impl built and run alone" in ninety_six and "checked equal" not in ninety_six
    assert "| Zipf 1.15 | cached (`MANAGED_CACHING`) | 0.1 | 20.0 | 50.0 | 2.5× | 80.0% | 78.0% | 9.00 | 45% | — |" \
        in ninety_six  # no all-HBM step at 96 GiB
    # the README's: the smallest set with load factor 0.1
    assert "16 GiB" in readme_figures.tbe_cache_readme(str(tmp_path))


def test_the_repository_shows_what_the_records_give(readme_figures):
    results = str(ROOT / readme_figures.RESULTS)
    readme = (ROOT / "README.md").read_text()
    start = readme.index(readme_figures.TBE_CACHE_BEGIN)
    end = readme.index(readme_figures.TBE_CACHE_END) + len(readme_figures.TBE_CACHE_END)
    assert readme[start:end] == readme_figures.tbe_cache_readme(results), "run python3 bench/readme_figures.py"
    doc = (ROOT / "docs" / "benchmarks.md").read_text()
    heading = "### " + readme_figures.HEADINGS["tbe_cache"]
    assert heading + "\n\n" + readme_figures.tbe_cache_section(results) + "\n\n###" in doc
    assert readme.index("## Tables larger than GPU memory") < start
