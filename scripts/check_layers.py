#!/usr/bin/env python3
"""Checks the include rules of docs/architecture.md over include/ and src/; exit status 1 on a violation.

    python3 scripts/check_layers.py [--root DIR]

Every `#include "..."` (and `#include <...>` of a project folder) of a file under include/ or src/ is
resolved against include/ and src/ (the library's include paths) and checked against the rules below;
each violation is printed as `file:line: includes "x": rule`. ctest runs this (test `layers`), so a
build whose sources break a rule fails its tests.
"""
import argparse
import os
import re
import sys

SOURCE_SUFFIXES = (".h", ".hpp", ".cpp", ".cu", ".cuh")
PROJECT_FOLDERS = ("embscale", "core", "fp8", "tbe", "capi")
CAPABILITIES = ("fp8", "tbe")
OUTSIDE_THE_LIBRARY = ("tools", "tests", "dev", "bench", "examples", "python")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')


def layer(rel):
    """(area, capability-or-None) of a path relative to the root: ("include", None), ("core", None),
    ("capability", "tbe"), ("capi", None)."""
    parts = rel.split("/")
    if parts[0] == "include":
        return "include", None
    if parts[1] == "core":
        return "core", None
    if parts[1] in CAPABILITIES:
        return "capability", parts[1]
    return parts[1], None


def in_folder(path, name):
    """Whether a slash-separated path has a folder called `name` (the file name itself excluded)."""
    return name in path.split("/")[:-1]


def violations_of(rel, target, resolved):
    """The rules that `rel` including `target` (resolved to the root-relative `resolved`, or None) breaks."""
    area, capability = layer(rel)
    found = []
    if resolved is None:
        found.append("does not resolve under include/ or src/; the library includes only its own headers "
                      f"(never {', '.join(f + '/' for f in OUTSIDE_THE_LIBRARY)})")
        return found
    t_area, t_capability = layer(resolved)
    if area == "include" and t_area != "include":
        found.append("a public header includes only public headers (embscale/...)")
    if area == "core" and t_area in ("capability", "capi"):
        found.append("core includes no capability (fp8/, tbe/) and not the C API")
    if area == "capability" and t_area == "capability" and t_capability != capability:
        found.append(f"{capability} does not include another capability ({t_capability}/)")
    if area == "capability" and t_area == "capi":
        found.append("a capability does not include the C API")
    if area == "capi" and t_area not in ("include", "capi"):
        found.append("the C API includes only the public headers (embscale/...) and its own (capi/...)")
    if in_folder(rel, "cpu") and in_folder(resolved, "cuda"):
        found.append("a cpu/ backend never includes cuda/ code")
    return found


def check(root):
    """Every violation under root, as printable lines."""
    search = [os.path.join(root, "include"), os.path.join(root, "src")]
    out = []
    for top in ("include", "src"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                with open(path, encoding="utf-8", errors="replace") as f:
                    lines = f.readlines()
                for number, line in enumerate(lines, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    quote, target = m.groups()
                    if quote == "<" and target.split("/")[0] not in PROJECT_FOLDERS:
                        continue  # a system or third-party header
                    resolved = None
                    for base in search:
                        candidate = os.path.normpath(os.path.join(base, target))
                        if candidate.startswith(base + os.sep) and os.path.isfile(candidate):
                            resolved = os.path.relpath(candidate, root).replace(os.sep, "/")
                            break
                    for rule in violations_of(rel, target, resolved):
                        out.append(f'{rel}:{number}: includes "{target}": {rule}')
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="the repository root (default: this script's)")
    args = ap.parse_args(argv)
    if not os.path.isdir(os.path.join(args.root, "src")):
        print(f"--root: {args.root} has no src/ folder", file=sys.stderr)
        return 2
    found = check(args.root)
    for line in found:
        print(line)
    if found:
        print(f"{len(found)} include(s) break the layering rules of docs/architecture.md", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
