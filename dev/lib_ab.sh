#!/usr/bin/env bash
# Same-run A/B of libembscale_c on any Python benchmark: this tree against a base, the base being this tree
# with a patch reversed (`git diff BASE > change.patch` before the run; carry the patch, it is small), both
# built side by side and run one after the other in the same call, each run's records named by its build.
#
#   dev/lib_ab.sh PATCH OUT -- COMMAND...
#     PATCH    the change under test (`git diff BASE`), reversed onto a copy of this tree to make the base
#     OUT      folder for base.jsonl / new.jsonl (COMMAND gets `--out OUT/<side>.jsonl` appended) and the logs
#     COMMAND  a harness that takes --out, e.g. python3 bench/tbe_quant_vs_fbgemm.py --device cuda --dims 128
#
# Environment: NEW_BUILD, BASE_BUILD (the records' build names; default: this tree's short commit and
# "base-of-<it>"); CMAKE_ARGS (extra configure arguments, e.g. -DEMBSCALE_CUDA=OFF for a CPU A/B); REPS (runs
# of each side, alternating, default 1); JOBS (compile jobs per build, default half the cores). The base's
# records carry "experiment": they are an A/B, never a README figure. PYTHONPATH gets python/ in front.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PATCH=$(cd "$(dirname "${1:?usage: dev/lib_ab.sh PATCH OUT -- COMMAND...}")" && pwd)/$(basename "$1")
OUT=$(mkdir -p "${2:?OUT}" && cd "$2" && pwd)
shift 2
[ "${1:-}" = "--" ] && shift
[ $# -gt 0 ] || { echo "dev/lib_ab.sh: no command" >&2; exit 2; }
JOBS=${JOBS:-$(( ($(nproc) + 1) / 2 ))}
NEW_BUILD=${NEW_BUILD:-$(git rev-parse --short HEAD 2>/dev/null || echo new)}
BASE_BUILD=${BASE_BUILD:-base-of-$NEW_BUILD}
WORK=${AB_WORK:-/tmp/lib-ab}
mkdir -p "$WORK"
rm -rf "$WORK/base-src" && mkdir -p "$WORK/base-src"
tar cf - --exclude=./.git --exclude=./.peers --exclude='./build*' --exclude=./out . | tar xf - -C "$WORK/base-src"
(cd "$WORK/base-src" && patch -s -R -p1 < "$PATCH")
build() {  # SRC DIR LOG
  # shellcheck disable=SC2086
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEMBSCALE_BUILD_TESTS=OFF -DEMBSCALE_BUILD_EXAMPLES=OFF \
    -DEMBSCALE_BUILD_DEV=OFF -DEMBSCALE_BUILD_TOOLS=OFF ${CMAKE_ARGS:-} >"$3" 2>&1 &&
    cmake --build "$2" -j "$JOBS" --target embscale_c >>"$3" 2>&1
}
build "$ROOT" "$WORK/new" "$OUT/build_new.log" & NEW_PID=$!
build "$WORK/base-src" "$WORK/base" "$OUT/build_base.log" & BASE_PID=$!
wait $NEW_PID || { echo "dev/lib_ab.sh: this tree did not build ($OUT/build_new.log)" >&2; exit 1; }
wait $BASE_PID || { echo "dev/lib_ab.sh: the base did not build ($OUT/build_base.log)" >&2; exit 1; }
for rep in $(seq 1 "${REPS:-1}"); do
  for side in base new; do
    if [ $side = base ]; then build=$BASE_BUILD; else build=$NEW_BUILD; fi
    echo "== $side ($build), run $rep: $*"
    EMBSCALE_BUILD=$build EMBSCALE_LIBRARY="$WORK/$side/libembscale_c.so" PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" \
      "$@" --out "$OUT/$side.jsonl.part" 2>&1 | tee -a "$OUT/$side.log" | grep -v '^{' || true
  done
done
# The base's records are an A/B's: marked so that no figure reads them.
python3 - "$OUT" "$BASE_BUILD" "$NEW_BUILD" <<'PY'
import json, os, sys
out, base, new = sys.argv[1:]
for side in ("base", "new"):
    part = os.path.join(out, side + ".jsonl.part")
    if not os.path.exists(part):
        continue
    with open(part) as f, open(os.path.join(out, side + ".jsonl"), "a") as g:
        for line in f:
            if line.strip():
                r = json.loads(line)
                if side == "base":
                    r["experiment"] = f"A/B base {base} against {new} (dev/lib_ab.sh)"
                g.write(json.dumps(r) + "\n")
    os.remove(part)
PY
echo "records: $OUT/base.jsonl (marked experiment), $OUT/new.jsonl"
