#!/usr/bin/env bash
# One constant of the FP8 launch policy (src/fp8/cuda/fp8_policy.cuh) compared on one build: for each
# value in VALUES the constant's value is written into the source, the CLI is rebuilt (only the FP8
# translation units recompile) and kept as its own binary; the source is restored; then the binaries run
# `embscale bench fp8` in turn, ROUNDS times, on the same inputs. One JSON record per measurement in
# $OUT/fp8_policy_ab.jsonl with `policy` = {"name", "value"}, and a table of the medians on stdout.
# (The 2026-12-02 quantize-blocks record was made this way, with a one-off script, on a switch since
# removed: the contiguous quantize blocks it chose are the only form kept.)
#
# Environment:
#   NAME       the constant, e.g. kAmaxMidVectorsPerThread or kCastBlocksPerSm (required)
#   VALUES     its values, in order, e.g. "true false" or "4 2" (required)
#   ARGS       arguments of `embscale bench fp8` (default: --ops quantize,quantize_current_scaling
#              --sizes 2^24,2^26,2^28 --dtypes fp32,bf16); --json and --no-peers are added
#   ROUNDS     rounds of the binaries in turn (default 2)
#   BUILD_DIR  the build (default build-gpu; built with scripts/gpu_run.sh's build stage when it lacks
#              the CLI)
#   OUT        output folder (default ./out)
set -uo pipefail
cd "$(dirname "$0")/.."
: "${NAME:?NAME: the constant of fp8_policy.cuh to compare}" "${VALUES:?VALUES: its values, e.g. \"true false\"}"
BUILD_DIR=${BUILD_DIR:-build-gpu}
OUT=$(mkdir -p "${OUT:-out}" && cd "${OUT:-out}" && pwd)
ARGS=${ARGS:-"--ops quantize,quantize_current_scaling --sizes 2^24,2^26,2^28 --dtypes fp32,bf16"}
ROUNDS=${ROUNDS:-2}
POLICY=src/fp8/cuda/fp8_policy.cuh
JSONL="$OUT/fp8_policy_ab.jsonl"
: >"$JSONL"

[ -x "$BUILD_DIR/embscale" ] || STAGES=build OUT="$OUT/build" bash scripts/gpu_run.sh >/dev/null ||
  { echo "the build failed; see $OUT/build" >&2; exit 1; }
cp "$POLICY" "$OUT/policy.orig"
restore() {
  cp "$OUT/policy.orig" "$POLICY"
  cmake --build "$BUILD_DIR" --target embscale_cli >/dev/null 2>&1
}
trap restore EXIT

# set_value V: NAME's value in the policy's source (fails when the source has no such constant).
set_value() {
  python3 - "$POLICY" "$NAME" "$1" <<'PY'
import re, sys
path, name, value = sys.argv[1:4]
src = open(path).read()
pattern = re.compile(r"(static constexpr [\w:]+ " + re.escape(name) + r" = )([^;]+)(;)")
if len(pattern.findall(src)) != 1:
    sys.exit(f"{name}: not one 'static constexpr ... {name} = ...;' in {path}")
open(path, "w").write(pattern.sub(lambda m: m.group(1) + value + m.group(3), src))
PY
}

for v in $VALUES; do
  set_value "$v" || exit 2
  cmake --build "$BUILD_DIR" --target embscale_cli >"$OUT/build_$v.log" 2>&1 ||
    { echo "the build with $NAME = $v failed; see $OUT/build_$v.log" >&2; exit 1; }
  cp "$BUILD_DIR/embscale" "$OUT/embscale_$v"
done

for r in $(seq 1 "$ROUNDS"); do
  for v in $VALUES; do
    # shellcheck disable=SC2086  # ARGS: words by design
    "$OUT/embscale_$v" bench fp8 $ARGS --json --no-peers 2>/dev/null |
      python3 -c '
import json, sys
name, value, rnd = sys.argv[1], sys.argv[2], int(sys.argv[3])
for line in sys.stdin:
    r = json.loads(line)
    r.update(policy={"name": name, "value": value}, round=rnd)
    print(json.dumps(r))' "$NAME" "$v" "$r" >>"$JSONL"
  done
done

python3 - "$JSONL" "$NAME" <<'PY'
import collections, json, sys
recs = [json.loads(line) for line in open(sys.argv[1])]
times = collections.defaultdict(list)
for r in recs:
    if r.get("impl") == "embscale":
        times[(r["op"], r.get("dtype", ""), r.get("n", 0), r["policy"]["value"])].append(r["median_us"])
values = list(dict.fromkeys(r["policy"]["value"] for r in recs))
cases = sorted({k[:3] for k in times})
print(f"{sys.argv[2]}: median us per round, " + " | ".join(values))
for op, dtype, n in cases:
    cells = [" / ".join(f"{t:.1f}" for t in times[(op, dtype, n, v)]) for v in values]
    print(f"{op:<26} {dtype:<5} {n:>11}  " + " | ".join(cells))
PY
