#!/usr/bin/env python3
"""Compares the machine code (SASS) of two CUDA builds function by function, ignoring addresses.

    python3 scripts/compare_sass.py BUILD_A BUILD_B

BUILD_A and BUILD_B are build folders (or single object files / static libraries) of the same sources
at two commits. Every CUDA object under a folder (*.cu.o) is disassembled with `cuobjdump -sass`; each
kernel's instructions are kept without their addresses (an instruction's text and its encoding, control
bits included), anonymous-namespace names without the hash of the source's path, so a function is "identical" when its instruction stream is. CUOBJDUMP names the
disassembler when it is not on PATH (any cuobjdump as new as the toolkit that compiled). Prints one line per
object, the functions that differ or exist in one build only, and a total; exits 1 when anything differs.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

FUNC = re.compile(r"^\s*Function : (\S+)")
ADDR = re.compile(r"/\*[0-9a-f]{4,}\*/")
# Names in anonymous namespaces carry a hash of the source's path, which differs between two checkouts.
ANON = re.compile(r"_GLOBAL__N__[0-9a-f]+_")


def objects(root: Path):
    if root.is_file():
        return {root.name: root}
    found = {}
    for p in sorted(root.rglob("*.cu.o")):
        found[str(p.relative_to(root))] = p
    return found


def functions(obj: Path):
    tool = os.environ.get("CUOBJDUMP", "cuobjdump")
    out = subprocess.run([tool, "-sass", str(obj)], check=True, capture_output=True, text=True).stdout
    funcs, name, body = {}, None, []
    for line in out.splitlines():
        line = ANON.sub("_GLOBAL__N__", line)
        m = FUNC.match(line)
        if m:
            if name:
                funcs[name] = body
            name, body = m.group(1), []
            continue
        if name is None:
            continue
        text = ADDR.sub("", line).strip()
        if text and not text.startswith(".") and not text.startswith("//"):
            body.append(text)
    if name:
        funcs[name] = body
    return funcs


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    a_root, b_root = Path(sys.argv[1]), Path(sys.argv[2])
    for r in (a_root, b_root):
        if not r.exists():
            sys.exit(f"{r}: no such build folder or object")
    a_objs, b_objs = objects(a_root), objects(b_root)
    if not a_objs:
        sys.exit(f"{a_root}: no CUDA objects (*.cu.o)")
    total = same = 0
    differ = []
    for key in sorted(set(a_objs) | set(b_objs)):
        if key not in a_objs or key not in b_objs:
            differ.append(f"{key}: only in {'B' if key not in a_objs else 'A'}")
            continue
        fa, fb = functions(a_objs[key]), functions(b_objs[key])
        n_same = 0
        for name in sorted(set(fa) | set(fb)):
            total += 1
            if name not in fa or name not in fb:
                differ.append(f"{key}: {name}: only in {'B' if name not in fa else 'A'}")
            elif fa[name] != fb[name]:
                differ.append(f"{key}: {name}: {len(fa[name])} vs {len(fb[name])} instructions differ")
            else:
                n_same += 1
        same += n_same
        print(f"{key}: {n_same} of {len(set(fa) | set(fb))} functions identical")
    for d in differ:
        print("DIFFERS " + d)
    print(f"total: {same} of {total} functions identical")
    sys.exit(0 if not differ else 1)


if __name__ == "__main__":
    main()
