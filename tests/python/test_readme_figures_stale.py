"""bench/readme_figures.py's figures are true of the code: each names its records and the builds they name, and the
generator refuses a figure whose records' build is older than the last commit that changed the sources it
measures (SOURCES, by figure family), unless HISTORICAL marks it, when its caption says "Historical, measured
<date> on build <hash>". The check needs the git history: where there is none (a tarball, a shallow clone without
the build) the test of this repository's figures skips, saying why. The rule itself is tested on temporary git
repositories with synthetic records of the tables-beyond-HBM benchmark, which land under it once they exist."""
import json
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]




# ---- this repository -------------------------------------------------------------------------------------------
def test_every_source_path_exists_and_every_figure_has_a_family(readme_figures):
    for family, paths in readme_figures.SOURCES.items():
        for p in paths:
            assert (ROOT / p).exists(), f"SOURCES[{family!r}] names {p}, which is not in the tree"
    for fid in readme_figures.provenance():
        assert readme_figures.family_of(fid) in readme_figures.SOURCES, f"figure {fid!r} has no family in SOURCES"


def test_every_figure_names_its_records_and_builds(readme_figures):
    """Each table's caption (the paragraph before it) names records; every file a figure reads is cited in the
    generated text; a figure marked historical says so, with its date and builds."""
    prov = {}
    results = str(ROOT / readme_figures.RESULTS)
    text = readme_figures.figures(prov) + "\n\n" + readme_figures.tbe_cache_readme(results, prov)
    paragraphs = text.split("\n\n")
    for i, p in enumerate(paragraphs):
        if p.startswith("|"):
            caption = next(q for q in reversed(paragraphs[:i]) if not q.startswith("|"))
            assert "Records" in caption, f"a table without its records: {caption[:200]}"
    for fid, used in prov.items():
        for name in {f for f, _ in used}:
            assert f"`{readme_figures.RESULTS}/{name}`" in text, f"{fid}: {name} is not cited"
        if fid in readme_figures.HISTORICAL:
            named, unnamed = readme_figures.builds_of(used)
            mark = readme_figures.HISTORICAL[fid]
            assert f"Historical, measured {readme_figures.dates([r for _, r in used])} " \
                   f"{readme_figures.measured_on(named, unnamed, mark.get('committed'))}: {mark['why']}." in text
        else:
            assert readme_figures.cite(fid, used) in text


def test_the_historical_marks_describe_their_figures(readme_figures):
    readme_figures.check_marks(readme_figures.provenance())  # ValueError names what a mark gets wrong


def test_the_figures_are_of_the_code_they_measure_or_marked_historical(readme_figures):
    prov = readme_figures.provenance()
    try:
        stale = readme_figures.stale_figures(prov)
    except readme_figures.HistoryUnavailable as e:
        pytest.skip(f"no git history to check the records' builds against: {e}")
    assert not stale, "\n".join(stale)


# ---- the rule, on temporary repositories ----------------------------------------------------------------------
GIT_ENV = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@example.com", GIT_CONFIG_NOSYSTEM="1")


def git(repo, *args):
    p = subprocess.run(["git", "-C", str(repo), "-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main", *args],
                       capture_output=True, text=True, env=GIT_ENV, check=True)
    return p.stdout.strip()


def commit(repo, files, message):
    """Writes `files` (path -> text) into `repo`, commits them and returns the commit's short hash."""
    for path, content in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(content)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "--short=7", "HEAD")


@pytest.fixture
def repo(tmp_path):
    r = tmp_path / "repo"
    r.mkdir()
    git(r, "init", "-q")
    return r


CACHE_SOURCE = "src/tbe/cuda/cache/tbe_cache.cu"


def cache_records(build, date="2026-12-06"):
    """A tables-beyond-HBM run's records as bench/tbe_cache_vs_fbgemm.py writes them, the minimum the generator
    reads: per id distribution the all-HBM case and the cached one at load factor 0.1, each impl's record, then
    a summary per case naming the build."""
    recs, summaries = [], []
    for alpha in (0.0, 1.15):
        for placement, lf, es_ms, fb_ms in (("device", None, 4.0, 6.0), ("cached", 0.1, 38.0, 57.0)):
            base = dict(date=date, time="10:00", harness="tbe_cache_vs_fbgemm", op="tbe_train_rowwise_adagrad",
                        placement=placement, device="NVIDIA H100 80GB HBM3", backend="cuda", fbgemm_gpu="1.6.0",
                        embscale_build=build, config=dict(cache_algorithm="lru", prefetch=False), num_tables=26,
                        batch_size=8192, embedding_dim=128, bag_size=20, num_embeddings=1290555, tables_gib=16.0,
                        alpha=alpha, cache_load_factor=lf, status="ok")
            impls = {"device": ("embscale_device", "fbgemm_device"), "cached": ("embscale_cached", "fbgemm_cached")}
            recs += [dict(base, impl=impls[placement][1], median_ms=fb_ms),
                     dict(base, impl=impls[placement][0], median_ms=es_ms)]
            summaries.append(dict(record="summary", harness="tbe_cache_vs_fbgemm", date=date, device=base["device"],
                                  placement=placement, cache_load_factor=lf, alpha=alpha, tables_gib=16.0,
                                  num_tables=26, embedding_dim=128, batch_size=8192, bag_size=20, embscale_build=build,
                                  embscale_ms=es_ms, fbgemm_ms=fb_ms, embscale_hit_rate=None, fbgemm_hit_rate=None,
                                  embscale_pct_of_floor=None, floor_ms=None, ratio_fbgemm_over_embscale=fb_ms / es_ms,
                                  embscale_over_own_hbm=None, goals={}))
    return recs + summaries


RECORD = "2026-12-06-nvidia-h100-tbe-cache-16gib.jsonl"


def cache_figures(readme_figures, results, build, **kw):
    """(the provenance of the tables-beyond-HBM figures of a run of `build`, their docs/benchmarks.md text)."""
    results.mkdir(exist_ok=True)
    (results / RECORD).write_text("".join(json.dumps(r) + "\n" for r in cache_records(build, **kw)))
    prov = {}
    text = readme_figures.tbe_cache_section(str(results), prov)
    readme_figures.tbe_cache_readme(str(results), prov)
    return prov, text


@pytest.mark.usefixtures("no_cache_marks")
def test_a_record_older_than_a_change_to_what_it_measures_is_refused(readme_figures, repo, tmp_path):
    first = commit(repo, {CACHE_SOURCE: "v1\n", "docs/notes.md": "a\n"}, "the cache")
    results = tmp_path / "results"
    prov, text = cache_figures(readme_figures, results, first)
    (fid,) = prov
    assert fid.startswith("tbe_cache, 16 GiB") and readme_figures.family_of(fid) == "tbe_cache"
    assert f"Records: `bench/results/{RECORD}` (build `{first}`)." in text
    assert readme_figures.stale_figures(prov, str(repo)) == []  # measured on the build that last changed the cache

    commit(repo, {"docs/notes.md": "b\n"}, "docs only")
    assert readme_figures.stale_figures(prov, str(repo)) == []  # a change to nothing the figure measures

    changed = commit(repo, {CACHE_SOURCE: "v2\n"}, "the cache changes")
    (problem,) = readme_figures.stale_figures(prov, str(repo))
    assert problem.startswith(f"{fid}: bench/results/{RECORD}: build {first} is older than {changed}")
    assert "SOURCES['tbe_cache']" in problem and "HISTORICAL" in problem

    # The module the cached step runs through is measured too.
    prov, _ = cache_figures(readme_figures, results, changed)
    assert readme_figures.stale_figures(prov, str(repo)) == []
    commit(repo, {"python/embscale/_row_cache.py": "x = 1\n"}, "the host side of the cache")
    assert len(readme_figures.stale_figures(prov, str(repo))) == 1


@pytest.mark.usefixtures("no_cache_marks")
def test_builds_that_are_not_commits_are_refused(readme_figures, repo, tmp_path):
    head = commit(repo, {CACHE_SOURCE: "v1\n"}, "the cache")
    for build, says in ((head + "+dirty", "is not a commit"), ("before", "is not a commit"),
                        ("deadbee", "is not a commit of this repository"), ("", "records that name no build")):
        prov, text = cache_figures(readme_figures, tmp_path / "results", build)
        (problem,) = readme_figures.stale_figures(prov, str(repo))
        assert says in problem, problem
    assert "(no build named)" in text


@pytest.mark.usefixtures("no_cache_marks")
def test_a_figure_marked_historical_says_so_and_passes(readme_figures, repo, tmp_path, monkeypatch):
    first = commit(repo, {CACHE_SOURCE: "v1\n"}, "the cache")
    commit(repo, {CACHE_SOURCE: "v2\n"}, "the cache changes")
    prov, _ = cache_figures(readme_figures, tmp_path / "results", first)
    (fid,) = prov
    assert len(readme_figures.stale_figures(prov, str(repo))) == 1
    monkeypatch.setitem(readme_figures.HISTORICAL, fid, dict(records=(RECORD,), measured="2026-12-06", builds=(first,),
                                                  why="the cache has changed since"))
    prov, text = cache_figures(readme_figures, tmp_path / "results", first)
    assert readme_figures.stale_figures(prov, str(repo)) == []
    readme_figures.check_marks(prov, complete=False)  # prov: this figure's alone
    assert (f"Historical, measured 2026-12-06 on build `{first}`: the cache has changed since. Records: "
            f"`bench/results/{RECORD}`.") in text
    readme = readme_figures.tbe_cache_readme(str(tmp_path / "results"))
    assert f"Historical, measured 2026-12-06 on build `{first}`" in readme
    # The mark covers those records only: a new run's file, or a build the mark does not give, is refused.
    (tmp_path / "results" / RECORD).rename(tmp_path / "results" / "2026-12-07-nvidia-h100-tbe-cache-16gib.jsonl")
    prov = {}
    readme_figures.tbe_cache_section(str(tmp_path / "results"), prov)
    with pytest.raises(ValueError, match=r"2026-12-07-nvidia-h100-tbe-cache-16gib\.jsonl, which its HISTORICAL mark"):
        readme_figures.check_marks(prov, complete=False)
    (tmp_path / "results" / "2026-12-07-nvidia-h100-tbe-cache-16gib.jsonl").unlink()
    prov, _ = cache_figures(readme_figures, tmp_path / "results", "abc1234")
    with pytest.raises(ValueError, match="name builds abc1234, which its HISTORICAL mark does not"):
        readme_figures.check_marks(prov, complete=False)
    # A mark whose figure is gone is refused too.
    with pytest.raises(ValueError, match="which no figure is"):
        readme_figures.check_marks({})


@pytest.mark.usefixtures("no_cache_marks")
def test_the_command_refuses_a_stale_figure(readme_figures, repo, tmp_path, monkeypatch, capsys):
    """main() exits 2 naming the figure, with --check and without, and writes nothing; the other figures of this
    repository are left out of the check here (their records and marks are of this repository's history)."""
    first = commit(repo, {CACHE_SOURCE: "v1\n"}, "the cache")
    results = tmp_path / "results"
    cache_figures(readme_figures, results, first)
    find, check = readme_figures.tbe_cache_cases, readme_figures.stale_figures
    monkeypatch.setattr(readme_figures, "tbe_cache_cases", lambda _results_dir: find(str(results)))
    monkeypatch.setattr(readme_figures, "stale_figures", lambda prov: check(
        {k: v for k, v in prov.items() if k.startswith("tbe_cache")}, str(repo)))
    doc, readme = tmp_path / "benchmarks.md", tmp_path / "README.md"
    doc.write_text((ROOT / "docs" / "benchmarks.md").read_text())
    readme.write_text((ROOT / "README.md").read_text())
    assert readme_figures.main(["--doc", str(doc), "--readme", str(readme)]) == 0  # fresh: written
    written = doc.read_text(), readme.read_text()
    assert f"(build `{first}`)" in written[0] and f"(build `{first}`)" in written[1]
    changed = commit(repo, {CACHE_SOURCE: "v2\n"}, "the cache changes")
    capsys.readouterr()
    for check_flag in (["--check"], []):
        assert readme_figures.main(check_flag + ["--doc", str(doc), "--readme", str(readme)]) == 2
        err = capsys.readouterr().err
        assert "not of the code they measure" in err and f"build {first} is older than {changed}" in err
    assert (doc.read_text(), readme.read_text()) == written


def test_without_history_the_check_says_why_and_does_not_fail(readme_figures, tmp_path, monkeypatch, capsys):
    prov, _ = cache_figures(readme_figures, tmp_path / "results", "abc1234")
    tarball = tmp_path / "tarball"
    tarball.mkdir()
    with pytest.raises(readme_figures.HistoryUnavailable, match="not a git checkout"):
        readme_figures.stale_figures(prov, str(tarball))
    # The command carries on, saying the builds were not checked; its output does not depend on git.
    check = readme_figures.stale_figures
    monkeypatch.setattr(readme_figures, "stale_figures", lambda prov: check(prov, str(tarball)))
    assert readme_figures.main(["--check"]) == 0
    assert "the records' builds are not checked against the sources" in capsys.readouterr().err


@pytest.mark.usefixtures("no_cache_marks")
def test_a_shallow_clone_without_the_build_cannot_tell(readme_figures, repo, tmp_path):
    old = commit(repo, {CACHE_SOURCE: "v1\n"}, "the cache")
    commit(repo, {CACHE_SOURCE: "v2\n"}, "the cache changes")
    head = commit(repo, {"docs/notes.md": "a\n"}, "docs")
    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow)], check=True,
                   capture_output=True, env=GIT_ENV)
    prov, _ = cache_figures(readme_figures, tmp_path / "results", old)
    with pytest.raises(readme_figures.HistoryUnavailable, match=f"{old} is not in this shallow clone's history"):
        readme_figures.stale_figures(prov, str(shallow))
    prov, _ = cache_figures(readme_figures, tmp_path / "results", head)
    assert readme_figures.stale_figures(prov, str(shallow)) == []  # a build the clone has is checked as usual


@pytest.mark.usefixtures("no_cache_marks")
def test_the_marks_commits_must_have_added_their_records(readme_figures, repo, tmp_path, monkeypatch):
    """For records that name no build, a mark gives the commits that added them; a commit that did not is
    refused (the check runs where the history is)."""
    (repo / "bench" / "results").mkdir(parents=True)
    other = commit(repo, {CACHE_SOURCE: "v1\n"}, "the cache")
    added = commit(repo, {f"bench/results/{RECORD}": "{}\n"}, "records")
    prov, _ = cache_figures(readme_figures, tmp_path / "results", "")
    (fid,) = prov
    for commits, ok in (((added,), True), ((other,), False)):
        monkeypatch.setitem(readme_figures.HISTORICAL, fid, dict(records=(RECORD,), measured="2026-12-06", builds=(),
                                                      committed=commits, why="the cache has changed since"))
        readme_figures.check_marks(prov, complete=False)
        problems = readme_figures.stale_figures(prov, str(repo))
        assert (problems == []) == ok, problems
    monkeypatch.setitem(readme_figures.HISTORICAL, fid, dict(records=(RECORD,), measured="2026-12-06", builds=(),
                                                  why="the cache has changed since"))
    with pytest.raises(ValueError, match="must give the commits that added them"):
        readme_figures.check_marks(prov, complete=False)
