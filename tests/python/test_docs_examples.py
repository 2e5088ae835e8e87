"""The code of README.md and the docs runs as written.

Every ```python block of README.md, docs/*.md and dev/README.md runs on its own, in a fresh process (the
Python tests' environment, a temporary working directory), and must exit 0. The line right before a block's
opening fence may mark it:

    <!-- not runnable: <reason> -->   a fragment (it needs a model, a process group, a peer library): not run;
                                      the reason is required
    <!-- runnable: cuda -->           it needs a GPU: run where CUDA and embscale's CUDA backend are available
                                      (the GPU suite), skipped elsewhere
    <!-- excerpt: <path> -->          a block of any language that is an excerpt of a file of the tree (a C++
                                      example that ctest builds and runs): its lines, split at elision lines
                                      (a comment that starts with "..."), appear in that file in that order,
                                      each part as consecutive lines

So a runnable block is self-contained (its imports, its inputs) and small enough for the CPU suite.
"""
import os
import pathlib
import re
import subprocess
import sys

import pytest

import embscale
from conftest import DEVICES

ROOT = pathlib.Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!--\s*(not runnable|runnable|excerpt)\s*(?::\s*(.*?))?\s*-->$")
ELISION = re.compile(r"^\s*(//|#)\s*\.\.\.")


def documents():
    """The files whose blocks are checked: the README, every page of docs/ and the laboratory's README."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "dev" / "README.md"]


def blocks(text):
    """Every fenced block of a Markdown text as (line of the opening fence, language, marker, argument, code);
    marker and argument are None for a block without a marker on the line before its fence. A fence may be
    indented (a block inside a list); the code loses that indentation."""
    out = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)```(\S*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        indent, lang, start = m.group(1), m.group(2), i
        marker = arg = None
        if i > 0:
            mm = MARKER.match(lines[i - 1].strip())
            if mm:
                marker, arg = mm.group(1), mm.group(2)
        i += 1
        code = []
        while i < len(lines) and lines[i].strip() != "```":
            code.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        out.append((start + 1, lang, marker, arg, "\n".join(code) + "\n"))
        i += 1
    return out


def all_blocks():
    for doc in documents():
        for line, lang, marker, arg, code in blocks(doc.read_text()):
            yield doc.relative_to(ROOT).as_posix(), line, lang, marker, arg, code


def python_blocks():
    return [pytest.param(path, marker, arg, code, id=f"{path}:{line}")
            for path, line, lang, marker, arg, code in all_blocks() if lang == "python"]


def excerpts():
    return [pytest.param(path, arg, code, id=f"{path}:{line}")
            for path, line, lang, marker, arg, code in all_blocks() if marker == "excerpt"]


def run_block(code, cwd):
    """Runs `code` in a new interpreter in `cwd`, with the embscale package (and library) the tests use."""
    env = dict(os.environ)
    package_dir = str(pathlib.Path(embscale.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_dir, env.get("PYTHONPATH")) if p)
    if env.get("EMBSCALE_LIBRARY"):
        env["EMBSCALE_LIBRARY"] = os.path.abspath(env["EMBSCALE_LIBRARY"])
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize("path,marker,arg,code", python_blocks())
def test_python_block_runs(path, marker, arg, code, tmp_path):
    if marker == "not runnable":
        pytest.skip(f"marked not runnable: {arg}")
    if marker == "runnable" and arg == "cuda" and "cuda" not in DEVICES:
        pytest.skip("needs CUDA and embscale's CUDA backend")
    r = run_block(code, tmp_path)
    assert r.returncode == 0, f"{path}: the block exits {r.returncode}\n--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}"


def test_every_marker_is_known_and_complete():
    bad = []
    for path, line, lang, marker, arg, code in all_blocks():
        where = f"{path}:{line}"
        if marker == "not runnable" and not arg:
            bad.append(f"{where}: 'not runnable' without a reason")
        elif marker == "runnable" and arg != "cuda":
            bad.append(f"{where}: 'runnable: {arg}' (known: 'runnable: cuda')")
        elif marker == "excerpt" and not (arg and (ROOT / arg).is_file()):
            bad.append(f"{where}: 'excerpt: {arg}' names no file of the tree")
        elif marker in ("not runnable", "runnable") and lang != "python":
            bad.append(f"{where}: a '{marker}' marker on a ```{lang} block (only python blocks run)")
    for doc in documents():  # a marker that marks no block (a blank line between it and the fence) is a slip
        lines = doc.read_text().split("\n")
        for i, l in enumerate(lines):
            if MARKER.match(l.strip()) and not (i + 1 < len(lines) and lines[i + 1].lstrip().startswith("```")):
                bad.append(f"{doc.relative_to(ROOT).as_posix()}:{i + 1}: a marker not right before a fence")
    assert not bad, "\n".join(bad)


def test_the_readme_has_a_runnable_python_example_and_the_cpp_excerpt():
    readme = [(lang, marker, arg) for path, _, lang, marker, arg, _ in all_blocks() if path == "README.md"]
    assert ("python", None, None) in readme
    assert ("cpp", "excerpt", "examples/tbe_forward.cpp") in readme


def excerpt_parts(code):
    parts, part = [], []
    for line in code.rstrip("\n").split("\n"):
        if ELISION.match(line):
            parts.append(part)
            part = []
        else:
            part.append(line)
    parts.append(part)
    return [p for p in parts if p]


def find_in_order(parts, lines):
    """The first part that is not found as consecutive lines after the previous one (None: all are)."""
    at = 0
    for part in parts:
        hit = next((i for i in range(at, len(lines) - len(part) + 1) if lines[i:i + len(part)] == part), None)
        if hit is None:
            return part
        at = hit + len(part)
    return None


@pytest.mark.parametrize("path,source,code", excerpts())
def test_an_excerpt_is_part_of_its_file(path, source, code):
    lines = (ROOT / source).read_text().split("\n")
    missing = find_in_order(excerpt_parts(code), lines)
    assert missing is None, f"{path}: these lines are not in {source} (in this order, consecutive):\n" + \
        "\n".join(missing)


def test_the_parser_reads_markers_fences_and_elisions():
    text = "\n".join([
        "Intro.", "", "```python", "print(1)", "```", "",
        "<!-- not runnable: needs a process group -->", "```python", "dist.init()", "```",
        "<!-- runnable: cuda -->", "```python", "import torch", "```",
        "- a list", "  ```python", "  x = 1", "  ```",
        "<!-- excerpt: examples/tbe_forward.cpp -->", "```cpp", "int main() {", "  // ... elided", "}", "```"])
    got = [(line, lang, marker, arg, code) for line, lang, marker, arg, code in blocks(text)]
    assert got == [(3, "python", None, None, "print(1)\n"),
                   (8, "python", "not runnable", "needs a process group", "dist.init()\n"),
                   (12, "python", "runnable", "cuda", "import torch\n"),
                   (16, "python", None, None, "x = 1\n"),
                   (20, "cpp", "excerpt", "examples/tbe_forward.cpp", "int main() {\n  // ... elided\n}\n")]
    assert excerpt_parts(got[-1][4]) == [["int main() {"], ["}"]]
    assert find_in_order([["a", "b"], ["d"]], ["a", "b", "c", "d"]) is None
    assert find_in_order([["d"], ["a"]], ["a", "b", "c", "d"]) == ["a"]  # out of order
    assert find_in_order([["a", "c"]], ["a", "b", "c"]) == ["a", "c"]    # not consecutive
