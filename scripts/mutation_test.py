#!/usr/bin/env python3
"""Mutation testing of the CPU library: plant one realistic bug at a time and check that a test fails.

Each mutant (listed in scripts/mutants.py) replaces one exact source snippet (found exactly once in its
file) in the CPU library: src/core, src/fp8 and src/tbe outside their cuda/ folders, src/capi, the Python
package or the CLI (tools/). For every mutant the script applies it in a private copy of the tree,
rebuilds incrementally (CPU backend, <tree>/build-mut; the CLI only when a CLI mutant is measured), runs
the C++ tests (embscale_tests in two fail-fast shards, then the examples, the fuzzers and the C API's
tests), the Python tests (which load the same libembscale_c) and, with the CLI built, its ctest tests
(cli.*, fuzz.cli) until one fails; the file is restored byte for byte afterwards (in a finally block,
also on Ctrl-C).
The shared source tree is never written: the copy is exported from a git revision (default HEAD) or,
with --worktree, from the files of the working tree.

    python3 scripts/mutation_test.py                 # every mutant (about 2.5 to 3.5 hours on 2 cores)
    python3 scripts/mutation_test.py --only capi     # mutants whose id or file contains 'capi'
    python3 scripts/mutation_test.py --list          # list the mutants and check every snippet is found
                                                     # exactly once (tests/python/test_mutation_list.py)

Wall time: the baseline build of the copy takes 2-3 minutes on 2 cores; then each mutant costs its
incremental rebuild (20 s for a .cpp file, up to 2 minutes for a header most files include) plus the
tests until the first failure (a survivor runs all of them: ~60 s of C++ tests and ~35 s of Python
tests). Not run in CI. Results go to --results (JSON lines, one per mutant) and a summary with the
score per folder is printed at the end; docs/mutation_testing.md is the record of a full run.

Equivalent mutants (same behaviour for every input the API accepts) are not in the list; the ones
that were considered and left out are named in docs/mutation_testing.md.
"""
import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# The mutants, and the tests each runs first, live in scripts/mutants.py.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mutants import MUTANTS  # noqa: E402  (found through the path set just above)


# --------------------------------------------------------------------------------------------------

def check_list(root, mutants, verbose=True):
    """Every snippet exactly once in its file, replacement different, ids unique. Returns problems."""
    problems = []
    seen = set()
    for m in mutants:
        if m.id in seen:
            problems.append(f"{m.id}: duplicate id")
        seen.add(m.id)
        path = os.path.join(root, m.file)
        if not os.path.isfile(path):
            problems.append(f"{m.id}: {m.file} does not exist")
            continue
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
        n = text.count(m.find)
        if n != 1:
            problems.append(f"{m.id}: snippet found {n} times in {m.file}")
        if m.find == m.replace:
            problems.append(f"{m.id}: replacement equals the snippet")
        if not m.file.startswith(("src/", "python/embscale/", "tools/")) or "/cuda/" in m.file or \
                m.file.endswith(".cu"):
            problems.append(f"{m.id}: {m.file} is not a CPU library source (src/ outside any cuda/ folder), "
                            "the Python package or the CLI (tools/, not its .cu files)")
    if verbose:
        for m in mutants:
            print(f"{m.id:45s} {m.file:32s} {m.why}")
        by = {}
        for m in mutants:
            by[m.folder] = by.get(m.folder, 0) + 1
        print(f"{len(mutants)} mutants: " + ", ".join(f"{k} {v}" for k, v in sorted(by.items())))
    return problems


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def sync_tree(src_dir, dst_dir):
    """Makes dst_dir hold exactly src_dir's files (build-mut kept); unchanged files keep their mtime so
    the incremental build stays incremental."""
    os.makedirs(dst_dir, exist_ok=True)
    wanted = set()
    for base, dirs, files in os.walk(src_dir):
        rel = os.path.relpath(base, src_dir)
        for name in files:
            r = os.path.normpath(os.path.join(rel, name))
            wanted.add(r)
            s, d = os.path.join(src_dir, r), os.path.join(dst_dir, r)
            with open(s, "rb") as f:
                data = f.read()
            if os.path.isfile(d):
                with open(d, "rb") as f:
                    if f.read() == data:
                        continue
            os.makedirs(os.path.dirname(d), exist_ok=True)
            with open(d, "wb") as f:
                f.write(data)
            shutil.copymode(s, d)
    for base, dirs, files in os.walk(dst_dir):
        rel = os.path.relpath(base, dst_dir)
        if rel.split(os.sep)[0] == "build-mut":
            dirs[:] = []
            continue
        for name in files:
            r = os.path.normpath(os.path.join(rel, name))
            if r not in wanted:
                os.remove(os.path.join(dst_dir, r))


def export_tree(args):
    """Exports the tree to measure into args.tree; returns a description of what was measured."""
    with tempfile.TemporaryDirectory() as tmp:
        if args.worktree:
            files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                                   stdout=subprocess.PIPE).stdout.decode().split("\0")
            for r in filter(None, files):
                s = os.path.join(ROOT, r)
                if os.path.isfile(s):
                    os.makedirs(os.path.dirname(os.path.join(tmp, r)), exist_ok=True)
                    shutil.copy2(s, os.path.join(tmp, r))
            rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, check=True,
                                 stdout=subprocess.PIPE, text=True).stdout.strip()
            what = f"working tree on {rev}"
        else:
            rev = subprocess.run(["git", "rev-parse", "--short", args.rev], cwd=ROOT, check=True,
                                 stdout=subprocess.PIPE, text=True).stdout.strip()
            archive = subprocess.run(["git", "archive", "--format=tar", rev], cwd=ROOT, check=True,
                                     stdout=subprocess.PIPE).stdout
            tar_path = os.path.join(tmp, "tree.tar")
            with open(tar_path, "wb") as f:
                f.write(archive)
            with tarfile.open(tar_path) as t:
                t.extractall(os.path.join(tmp, "x"))
            os.remove(tar_path)
            shutil.move(os.path.join(tmp, "x"), os.path.join(tmp, "y"))
            tmp = os.path.join(tmp, "y")
            what = f"commit {rev}"
        sync_tree(tmp, args.tree)
    return what


class Runner:
    def __init__(self, args, with_cli):
        self.args = args
        self.tree = args.tree
        self.build = os.path.join(self.tree, "build-mut")
        self.env = dict(os.environ)
        self.with_cli = with_cli  # build the CLI and run its tests (a CLI mutant is measured)

    def configure(self):
        run(["cmake", "-S", self.tree, "-B", self.build, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
             "-DEMBSCALE_CUDA=OFF", f"-DEMBSCALE_BUILD_TOOLS={'ON' if self.with_cli else 'OFF'}"],
            stdout=subprocess.DEVNULL)

    def build_ok(self):
        r = subprocess.run(["cmake", "--build", self.build, "-j", str(self.args.jobs)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        return r.returncode == 0, r.stdout[-3000:]

    def _procs_until_failure(self, cmds, timeout):
        """Runs the commands concurrently; stops all at the first failure. Returns (ok, detail)."""
        procs = []
        # Output goes to files, not pipes: a test that prints more than a pipe holds must not block.
        for cmd, cwd, env in cmds:
            log = tempfile.TemporaryFile()
            procs.append((cmd, subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                start_new_session=True), log))
        deadline = time.time() + timeout
        done = set()
        failed = None
        try:
            while True:
                running = 0
                for cmd, p, log in procs:
                    if p.poll() is None:
                        running += 1
                    elif id(p) not in done:
                        done.add(id(p))
                        if p.returncode != 0 and failed is None:
                            log.seek(0)
                            failed = (cmd, p.returncode, log.read().decode(errors="replace"))
                if failed or running == 0:
                    break
                if time.time() > deadline:
                    failed = (["timeout"], -1, f"timed out after {timeout} s")
                    break
                time.sleep(0.2)
        finally:
            for _, p, log in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
                log.close()
        if failed is None:
            return True, ""
        cmd, rc, out = failed
        if rc == -1:
            return False, out
        lines = out.splitlines()
        # The first failed test (gtest, pytest, ctest by name), else the first failure line, else the last line.
        picks = ([l for l in lines if re.match(r"\[  FAILED  \] [A-Za-z_]", l)] or
                 [l for l in lines if l.startswith("FAILED ") or l.strip().endswith("(Failed)")] or
                 [l for l in lines if "tests FAILED" in l] or
                 [l for l in lines if "Failure" in l or "Error" in l] or lines[-1:] or [""])
        detail = picks[0].strip()
        if rc < 0:
            detail = f"killed by signal {-rc}; " + detail
        return False, f"{os.path.basename(cmd[0])} rc={rc}: {detail[:300]}"

    def gtest(self, gtest_filter):
        exe = os.path.join(self.build, "embscale_tests")
        cmds = []
        shards = self.args.shards
        for i in range(shards):
            env = dict(self.env, GTEST_TOTAL_SHARDS=str(shards), GTEST_SHARD_INDEX=str(i))
            cmds.append(([exe, "--gtest_fail_fast", "--gtest_brief=1", "--gtest_filter=" + gtest_filter], self.build,
                         env))
        return self._procs_until_failure(cmds, self.args.timeout)

    def cpp_tests(self, focus=None):
        for f in ([focus, "-" + focus] if focus else ["*"]):
            ok, detail = self.gtest(f)
            if not ok:
                return False, "C++: " + detail
        # The other ctest tests of the library: the examples, the fuzzers and the C API's own tests (the
        # CLI's fuzzer runs with the CLI's tests).
        return self.ctest(r"^(example|fuzz|capi)\.", r"^fuzz\.cli$")

    def ctest(self, include, exclude=None):
        cmd = ["ctest", "--test-dir", self.build, "-R", include, "-j", str(self.args.shards), "--stop-on-failure",
               "--output-on-failure"] + (["-E", exclude] if exclude else [])
        ok, detail = self._procs_until_failure([(cmd, self.build, self.env)], self.args.timeout)
        if not ok:
            return False, "ctest: " + detail
        return True, ""

    def cli_tests(self):
        """The CLI's ctest tests (refusals, write errors) and its fuzzer."""
        return self.ctest(r"^(cli\.|fuzz\.cli$)")

    def python_tests(self):
        env = dict(self.env, EMBSCALE_LIBRARY=os.path.join(self.build, "libembscale_c.so"),
                   PYTHONPATH=os.path.join(self.tree, "python"))
        # The mutant list's own check fails by design once a snippet is replaced: it judges the script,
        # not the library, so it never counts as catching a mutant.
        cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "tests/python",
               "--ignore=tests/python/test_mutation_list.py"]
        ok, detail = self._procs_until_failure([(cmd, self.tree, env)], self.args.timeout)
        if ok:
            return True, ""
        return False, "Python: " + detail

    def all_tests(self, m=None):
        """C++ tests (the mutant's focus first), then the Python tests, then (when built) the CLI's; for a
        C API or Python mutant the Python tests first (they are its main callers), for a CLI mutant the
        CLI's tests first."""
        stages = [lambda: self.cpp_tests(m.focus if m else None)]
        if not self.args.no_python:
            stages.append(self.python_tests)
        if m is not None and m.folder in ("src/capi", "python/embscale"):
            stages.reverse()
        if self.with_cli:
            if m is not None and m.folder == "tools":
                stages.insert(0, self.cli_tests)
            else:
                stages.append(self.cli_tests)
        for stage in stages:
            ok, detail = stage()
            if not ok:
                return False, detail
        return True, ""


def apply_and_test(runner, m):
    path = os.path.join(runner.tree, m.file)
    with open(path, "rb") as f:
        original = f.read()
    text = original.decode("utf-8")
    if text.count(m.find) != 1:
        return {"status": "invalid", "detail": f"snippet found {text.count(m.find)} times"}
    t0 = time.time()
    try:
        with open(path, "wb") as f:
            f.write(text.replace(m.find, m.replace).encode("utf-8"))
        ok, log = runner.build_ok()
        if not ok:
            return {"status": "build_error", "detail": log[-600:], "seconds": round(time.time() - t0)}
        passed, detail = runner.all_tests(m)
        return {"status": "survived" if passed else "killed", "detail": detail, "seconds": round(time.time() - t0)}
    finally:
        with open(path, "wb") as f:
            f.write(original)
        with open(path, "rb") as f:
            assert f.read() == original, f"failed to restore {m.file}"


def summarize(results, mutants):
    by_folder = {}
    for m in mutants:
        r = results.get(m.id)
        if r is None or r["status"] not in ("killed", "survived"):
            continue
        k, n = by_folder.get(m.folder, (0, 0))
        by_folder[m.folder] = (k + (r["status"] == "killed"), n + 1)
    lines = []
    tk = tn = 0
    for folder in sorted(by_folder):
        k, n = by_folder[folder]
        lines.append(f"  {folder:12s} {k:3d}/{n:<3d} caught ({100.0 * k / n:5.1f}%)")
        if folder not in ("src/capi", "python/embscale", "tools"):
            tk, tn = tk + k, tn + n
    if tn:
        lines.append(f"  common+api+cpu {tk}/{tn} caught ({100.0 * tk / tn:.1f}%)")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="run only mutants whose id or file contains this string (several: comma-separated)")
    ap.add_argument("--list", action="store_true", help="list the mutants and check every snippet (exit 1 on a problem)")
    ap.add_argument("--quiet", action="store_true", help="with --list: print problems only")
    ap.add_argument("--tree", default=os.path.join(tempfile.gettempdir(), "embscale-mutation"),
                    help="private copy of the tree to mutate (default: %(default)s)")
    ap.add_argument("--rev", default="HEAD", help="git revision to measure (default: HEAD)")
    ap.add_argument("--worktree", action="store_true", help="measure the working tree's files instead of --rev")
    ap.add_argument("--jobs", type=int, default=2, help="build parallelism (default: %(default)s)")
    ap.add_argument("--shards", type=int, default=2, help="parallel shards of embscale_tests (default: %(default)s)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per test stage (default: %(default)s)")
    ap.add_argument("--no-python", action="store_true", help="C++ tests only")
    ap.add_argument("--results", default=None, help="JSON lines output (default: <tree>/mutation_results.jsonl)")
    ap.add_argument("--resume", action="store_true",
                    help="skip the mutants the results file already holds a verdict for (same measured tree)")
    args = ap.parse_args()

    patterns = [p for p in (args.only or "").split(",") if p]
    mutants = [m for m in MUTANTS if not patterns or any(p in m.id or p in m.file for p in patterns)]
    if args.list:
        problems = check_list(ROOT, mutants, verbose=not args.quiet)
        for p in problems:
            print("problem:", p, file=sys.stderr)
        return 1 if problems else 0
    if not mutants:
        print("no mutant matches", args.only, file=sys.stderr)
        return 2
    if os.path.realpath(args.tree).startswith(os.path.realpath(ROOT) + os.sep) or \
            os.path.realpath(args.tree) == os.path.realpath(ROOT):
        print("--tree must be outside the repository: the shared tree is never mutated", file=sys.stderr)
        return 2

    # SIGTERM ends the run like Ctrl-C: through the finally blocks, so the copy is restored.
    def on_term(signum, _frame):
        print(f"stopped by signal {signum}; restoring the copy", file=sys.stderr, flush=True)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    what = export_tree(args)
    problems = check_list(args.tree, mutants, verbose=False)
    if problems:
        for p in problems:
            print("problem:", p, file=sys.stderr)
        return 1
    results_path = args.results or os.path.join(args.tree, "mutation_results.jsonl")
    runner = Runner(args, with_cli=any(m.folder == "tools" for m in mutants))
    started = time.time()
    print(f"measuring {what} in {args.tree}; {len(mutants)} mutants; results -> {results_path}", flush=True)
    runner.configure()
    ok, log = runner.build_ok()
    if not ok:
        print("baseline build failed:\n" + log, file=sys.stderr)
        return 1
    ok, detail = runner.all_tests()
    if not ok:
        print("baseline tests fail, nothing to measure: " + detail, file=sys.stderr)
        return 1
    print(f"baseline built and passing ({time.time() - started:.0f} s)", flush=True)

    results = {}
    if args.resume and os.path.exists(results_path):
        with open(results_path) as f:
            for line in f:
                r = json.loads(line)
                if r.get("measured") == what and r["status"] in ("killed", "survived"):
                    results[r["id"]] = r
    with open(results_path, "a") as out:
        for i, m in enumerate(mutants, 1):
            if m.id in results:
                r = results[m.id]
                print(f"[{i}/{len(mutants)}] {r['status']:11s} {m.id:45s} (earlier run)", flush=True)
                continue
            r = apply_and_test(runner, m)
            r.update(id=m.id, file=m.file, why=m.why, measured=what,
                     date=datetime.datetime.now().isoformat(timespec="seconds"))
            results[m.id] = r
            out.write(json.dumps(r) + "\n")
            out.flush()
            print(f"[{i}/{len(mutants)}] {r['status']:11s} {m.id:45s} {r.get('seconds', 0):4d} s  {r['detail'][:140]}",
                  flush=True)
    # Leave the copy built from unmutated sources.
    runner.build_ok()
    print(f"\n{what}: {len(mutants)} mutants in {(time.time() - started) / 60:.1f} min")
    print(summarize(results, mutants))
    survivors = [m for m in mutants if results[m.id]["status"] == "survived"]
    for m in survivors:
        print(f"  survived: {m.id} ({m.file}): {m.why}")
    broken = [m for m in mutants if results[m.id]["status"] in ("build_error", "invalid")]
    for m in broken:
        print(f"  not measured ({results[m.id]['status']}): {m.id}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
