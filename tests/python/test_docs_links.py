"""The links of README.md and the docs lead somewhere.

Every relative Markdown link of README.md, docs/*.md, dev/README.md and bench/results/README.md (the records'
index, which lists every file of bench/results/) (`[text](path)`, `[text](path#anchor)`, `[text](#anchor)`, images
too) points to a file or folder of the tree, and an anchor to a heading of the Markdown file it names, spelled as
GitHub spells a heading's anchor. A path in backticks that names a file of the tree's
records or docs (`bench/results/...`, `docs/...`, `dev/...`, or a record's bare name such as
`2026-12-02-nvidia-h200-peers.jsonl`), and such a path written bare in the prose, must exist too: such citations
are how the docs point at their sources.
Links with a scheme (https:, mailto:) are not followed.
"""
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\]]*\])*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*```")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
# A citation in backticks: a path under the folders that hold records and docs, or a record's bare name.
CITED = re.compile(r"^(?:(?:bench/results|docs|dev)/[\w.\-/]+\.\w+|\d{4}-\d{2}-\d{2}-[\w.\-]+\.(?:md|jsonl|json|png))$")


RESULTS_INDEX = ROOT / "bench" / "results" / "README.md"


def documents():
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "dev" / "README.md", RESULTS_INDEX]


def prose(text):
    """(line number, line) of every line outside fenced code blocks."""
    out, in_code = [], False
    for n, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line):
            in_code = not in_code
            continue
        if not in_code:
            out.append((n, line))
    return out


def without_code_spans(line):
    return re.sub(r"(`+)(.+?)\1", "", line)


def anchor(heading):
    """The anchor GitHub gives a heading: its text as shown (links by their text, no markup), lower case, every
    character but letters, digits, '_', '-' and spaces dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path):
    """Every anchor of a Markdown file: its headings' (a repeated heading gets -1, -2, ...) and HTML anchors."""
    seen, out = {}, set()
    text = path.read_text()
    for _, line in prose(text):
        m = HEADING.match(line)
        if m:
            a = anchor(m.group(2))
            out.add(a if a not in seen else f"{a}-{seen[a]}")
            seen[a] = seen.get(a, 0) + 1
    out.update(HTML_ANCHOR.findall(text))
    return out


def links(path):
    """(line, target) of every link of a Markdown file, outside code blocks and code spans."""
    out = []
    for n, line in prose(path.read_text()):
        for m in LINK.finditer(without_code_spans(line)):
            out.append((n, m.group(2)))
    return out


def broken_links(path):
    bad = []
    for n, target in links(path):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        file_part, _, frag = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT).as_posix()}:{n}: ({target})"
        if not dest.exists():
            bad.append(f"{where} no such file")
        elif ROOT not in dest.parents and dest != ROOT:
            bad.append(f"{where} outside the tree")
        elif frag and dest.suffix == ".md" and frag not in anchors(dest):
            bad.append(f"{where} no heading with the anchor #{frag} in {dest.relative_to(ROOT).as_posix()}")
    return bad


def citations(line):
    """The cited paths of a line: code spans that are such a path, and such paths written bare in the prose."""
    spans = [s for s in re.findall(r"`([^`]+)`", line) if CITED.match(s)]
    bare = re.findall(r"(?<![\w/.<>-])((?:bench/results|docs|dev)/[\w.\-/]*\w\.\w+)(?![\w/<>-])", line)
    return spans + [b for b in bare if b not in spans]


def broken_citations(path):
    bad = []
    for n, line in prose(path.read_text()):
        for span in citations(line):
            candidates = [ROOT / span] if "/" in span else [ROOT / "bench" / "results" / span,
                                                            *(ROOT / "bench" / "results").glob(f"*/{span}")]
            if not any(c.exists() for c in candidates):
                bad.append(f"{path.relative_to(ROOT).as_posix()}:{n}: `{span}` names no file of the tree")
    return bad


@pytest.mark.parametrize("path", documents(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_leads_to_a_file_and_heading(path):
    bad = broken_links(path)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", documents(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_cited_record_and_doc_exists(path):
    bad = broken_citations(path)
    assert not bad, "\n".join(bad)


def source_files():
    """The library's, the package's and the tools' own files, whose comments cite records and docs too."""
    out = [ROOT / "CMakeLists.txt"]
    for folder in ("src", "include", "python/embscale", "tools", "dev", "scripts", "bench", "examples"):
        for f in sorted((ROOT / folder).rglob("*")):
            if f.is_file() and "results" not in f.relative_to(ROOT).parts and f.suffix in (
                    ".h", ".cuh", ".cpp", ".cu", ".py", ".sh", ".cmake", ".txt", ".md", ""):
                out.append(f)
    return out


def test_code_cites_records_and_docs_that_exist():
    """A path under bench/results/, docs/ or dev/ written in a source file (a policy header's comment naming the
    record that chose a value, say) names a file of the tree."""
    bad = []
    for f in source_files():
        try:
            text = f.read_text()
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.split("\n"), 1):
            for cited in re.findall(r"(?<![\w/.<>{-])((?:bench/results|docs|dev)/[\w.\-/]*\w\.\w+)(?![\w/<>}-])", line):
                if not (ROOT / cited).exists():
                    bad.append(f"{f.relative_to(ROOT).as_posix()}:{n}: {cited} names no file of the tree")
    assert not bad, "\n".join(bad)


def test_the_results_index_lists_every_file_of_bench_results():
    """bench/results/README.md has a line for each file of bench/results/ (its links are checked above)."""
    listed = {target for _, target in links(RESULTS_INDEX) if not re.match(r"^[a-z]+:|\.\./|#", target)}
    present = {p.relative_to(RESULTS_INDEX.parent).as_posix() for p in RESULTS_INDEX.parent.rglob("*")
               if p.is_file() and p != RESULTS_INDEX}
    assert sorted(present - listed) == [], "files of bench/results/ missing from bench/results/README.md"


def test_the_readme_links_every_guide():
    readme = {t.partition("#")[0] for _, t in links(ROOT / "README.md")}
    for guide in ("docs/python.md", "docs/cpp_api.md", "docs/fp8_training.md", "docs/distributed.md",
                  "docs/tbe_cache.md", "docs/cli.md", "docs/building.md", "docs/testing.md", "docs/benchmarks.md",
                  "dev/README.md"):
        assert guide in readme, f"README.md does not link {guide}"


def test_anchors_are_spelled_as_github_spells_them():
    assert anchor("Moving from FBGEMM's `SplitTableBatchedEmbeddingBagsCodegen`") == \
        "moving-from-fbgemms-splittablebatchedembeddingbagscodegen"
    assert anchor("Tuning sweeps, NVIDIA H200, 2026-11-30") == "tuning-sweeps-nvidia-h200-2026-11-30"
    assert anchor("amax: single-cluster path vs grid path by size (`EMBSCALE_AMAX_CLUSTER_MAX_BYTES`)") == \
        "amax-single-cluster-path-vs-grid-path-by-size-embscale_amax_cluster_max_bytes"
    assert anchor("The [laboratory](dev/README.md)") == "the-laboratory"


def test_a_broken_link_and_a_missing_heading_are_caught(tmp_path, monkeypatch):
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# B\n\n## Two words\n\n## Two words\n")
    a = tmp_path / "docs" / "a.md"
    a.write_text("# A\n\n[ok](b.md#two-words) [ok](b.md#two-words-1) [ok](#a) `[not a link](nowhere.md)`\n"
                 "[gone](c.md) [no heading](b.md#three) [self](#b)\n\n```\n[in code](nowhere.md)\n```\n"
                 "`docs/b.md` `docs/c.md` `2026-01-01-gone.jsonl` (bench/results/gone.md)\n")
    assert broken_links(a) == ["docs/a.md:4: (c.md) no such file",
                               "docs/a.md:4: (b.md#three) no heading with the anchor #three in docs/b.md",
                               "docs/a.md:4: (#b) no heading with the anchor #b in docs/a.md"]
    assert broken_citations(a) == ["docs/a.md:9: `docs/c.md` names no file of the tree",
                                   "docs/a.md:9: `2026-01-01-gone.jsonl` names no file of the tree",
                                   "docs/a.md:9: `bench/results/gone.md` names no file of the tree"]
