#!/usr/bin/env bash
# Same-run A/B of the headline benchmarks between this tree and another checkout of the project (a base
# commit, e.g. `git worktree add ../base main`), alternating the two builds so that both see the same
# machine state: TBE forward (uniform, Zipf 1.15, D = 32, fp16 weights), TBE backward (uniform, Zipf, D = 32
# Zipf, D = 8/16 uniform) and FP8 (amax, quantize, current scaling at 2^24 and 2^28, bf16).
#
# Usage: scripts/bench_ab.sh BASE_DIR [OUT]
#   BASE_DIR  the other checkout; it is built in BASE_DIR/build-ab (CLI only)
#   OUT       folder for ab.jsonl (one line per record: {"ab": "new"|"base", "rep", "args", "record"}) and
#             ab.txt (the table: per case the best of the repetitions, new/base); default ./out-ab
# Environment: BUILD_DIR (this tree's build, relative to the root or absolute, default build-gpu; built with
#   scripts/gpu_run.sh's build stage when it lacks the CLI), REPS (default 2), BACKEND (cuda or cpu, default cuda), CMAKE_ARGS (extra
#   configure arguments for the base build, e.g. the prefix of GoogleTest/CLI11/nlohmann-json).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BASE=$(cd "${1:?usage: scripts/bench_ab.sh BASE_DIR [OUT]}" && pwd)
OUT=$(mkdir -p "${2:-out-ab}" && cd "${2:-out-ab}" && pwd)
BUILD_DIR=${BUILD_DIR:-build-gpu}
case $BUILD_DIR in /*) ;; *) BUILD_DIR=$ROOT/$BUILD_DIR ;; esac  # absolute from here on
REPS=${REPS:-2}
BACKEND=${BACKEND:-cuda}
cuda=ON; [ "$BACKEND" = cpu ] && cuda=OFF

if [ ! -x "$BUILD_DIR/embscale" ]; then
  if [ "$BACKEND" = cuda ]; then
    BUILD_DIR="$BUILD_DIR" STAGES=build OUT="$OUT/build" bash scripts/gpu_run.sh
  else
    cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEMBSCALE_CUDA=OFF >/dev/null
    cmake --build "$BUILD_DIR" --target embscale_cli >/dev/null
  fi
fi
# shellcheck disable=SC2086
cmake -S "$BASE" -B "$BASE/build-ab" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEMBSCALE_CUDA=$cuda \
  -DEMBSCALE_BUILD_TESTS=OFF -DEMBSCALE_BUILD_EXAMPLES=OFF ${CMAKE_ARGS:-} >"$OUT/base_configure.log"
cmake --build "$BASE/build-ab" -j "$(nproc)" --target embscale_cli >"$OUT/base_build.log"

NEW=$BUILD_DIR/embscale
OLD=$BASE/build-ab/embscale
CASES=("tbe-forward" "tbe-forward --alpha 1.15" "tbe-forward --embedding-dim 32" "tbe-forward --weights-precision fp16"
       "tbe-backward" "tbe-backward --alpha 1.15" "tbe-backward --embedding-dim 32 --alpha 1.15"
       "tbe-backward --embedding-dim 8" "tbe-backward --embedding-dim 16"
       "fp8 --ops amax,quantize,quantize_current_scaling --sizes 2^24,2^28 --dtypes bf16 --no-peers")
if [ "$BACKEND" = cpu ]; then
  CASES=("tbe-forward --backend cpu --threads 1" "tbe-backward --backend cpu --threads 1"
         "tbe-backward --backend cpu --threads 1 --embedding-dim 16")
fi
: >"$OUT/ab.jsonl"
for rep in $(seq "$REPS"); do
  for which in new base; do
    bin=$NEW; [ "$which" = base ] && bin=$OLD
    for args in "${CASES[@]}"; do
      # shellcheck disable=SC2086
      "$bin" bench $args --json 2>/dev/null | grep '^{' | while read -r r; do
        echo "{\"ab\": \"$which\", \"rep\": $rep, \"args\": \"$args\", \"record\": $r}"
      done >>"$OUT/ab.jsonl"
    done
  done
done
python3 - "$OUT/ab.jsonl" <<'PY' | tee "$OUT/ab.txt"
import collections, json, sys
best = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    r = json.loads(line)
    rec = r["record"]
    key = r["args"]
    if key.startswith("fp8"):
        key = "fp8 %s %s n=%s" % (rec.get("op"), rec.get("dtype"), rec.get("n"))
    v = rec.get("median_us") or rec.get("us")
    if v:
        best[key][r["ab"]] = min(v, best[key].get(r["ab"], float("inf")))
print(f"{'case':60s} {'new us':>10s} {'base us':>10s} {'new/base':>9s}")
for k, d in best.items():
    if "new" in d and "base" in d:
        print(f"{k:60s} {d['new']:10.1f} {d['base']:10.1f} {d['new'] / d['base']:9.4f}")
PY
