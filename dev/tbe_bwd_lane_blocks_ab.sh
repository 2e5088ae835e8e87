#!/usr/bin/env bash
# Blocks per SM of the CUDA backward's lane-group kernel (`group_rows_min_blocks`,
# src/tbe/cuda/backward/tbe_backward_params.cuh), compared on one build: for each value in VALUES the
# policy's value for one class of kernels is written into the source, `embscale-dev` is rebuilt (only the
# backward's translation units recompile) and the cases are timed, the rows phase on its own; the source
# is restored at the end. The classes: `fp32-wide` (fp32 weights, 1..4 rows a warp, rows of 33..512
# columns), `fp32-narrow` (fp32 weights, 8 or 16 rows a warp, rows up to 32 columns), `16bit` (fp16 and
# bf16 weights, every shape). One JSON record per case and value in $OUT/lane_blocks_ab.jsonl, with
# `lane_blocks` = {"class", "value"}; a line per record on stdout.
#
# Environment:
#   BUILD_DIR  the CUDA build (default build-gpu; built with scripts/gpu_run.sh's build stage when it
#              lacks embscale-dev)
#   OUT        output folder (default ./out)
#   CLASS      fp32-wide, fp32-narrow or 16bit (default 16bit)
#   VALUES     the values to compare, in order (default "4 3 2"; each 1..8)
#   WEIGHTS    weights precision of the cases (default fp32 for the fp32 classes, fp16 for 16bit)
#   CASES      ';'-separated "optimizer alpha D rounding" (default: row-wise Adagrad, uniform and Zipf
#              1.15, D = 8 and 32 for fp32-narrow, 64, 128 and 256 otherwise, nearest and stochastic
#              rounding for 16bit)
#   ITERS      timed calls per case (default 20)
# Tables of 2^34 / (128 D) rows each (16 GiB of fp32 over the 32 tables), B = 8192, L = 20.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD_DIR=${BUILD_DIR:-build-gpu}
OUT=$(mkdir -p "${OUT:-out}" && cd "${OUT:-out}" && pwd)
CLASS=${CLASS:-16bit}
VALUES=${VALUES:-"4 3 2"}
ITERS=${ITERS:-20}
POLICY=src/tbe/cuda/backward/tbe_backward_params.cuh
case $CLASS in
  fp32-wide) WEIGHTS=${WEIGHTS:-fp32}; dims="64 128 256"; roundings="nearest" ;;
  fp32-narrow) WEIGHTS=${WEIGHTS:-fp32}; dims="8 32"; roundings="nearest" ;;
  16bit) WEIGHTS=${WEIGHTS:-fp16}; dims="64 128 256"; roundings="nearest stochastic" ;;
  *) echo "CLASS: '$CLASS'; expected fp32-wide, fp32-narrow or 16bit" >&2; exit 2 ;;
esac
if [ -z "${CASES:-}" ]; then
  CASES=""
  for a in 0 1.15; do for d in $dims; do for r in $roundings; do CASES+="rowwise_adagrad $a $d $r;"; done; done; done
fi
JSONL="$OUT/lane_blocks_ab.jsonl"
: >"$JSONL"

[ -x "$BUILD_DIR/embscale-dev" ] || STAGES=build OUT="$OUT/build" bash scripts/gpu_run.sh >/dev/null ||
  { echo "the build failed; see $OUT/build" >&2; exit 1; }
cp "$POLICY" "$OUT/policy.orig"
trap 'cp "$OUT/policy.orig" "$POLICY"' EXIT

# set_value V: the class's value in the policy's source (fails when the source no longer has the form
# this script edits).
set_value() {
  python3 - "$POLICY" "$CLASS" "$1" <<'PY'
import re, sys
path, cls, value = sys.argv[1], sys.argv[2], sys.argv[3]
src = open(path).read()
fp32 = re.compile(r"(if constexpr \(sizeof\(W\) == 4\) return kRows >= 8 \? )(\d)( : )(\d)(;)")
half = re.compile(r"(\n  else return )(\d)(;)")
if not fp32.search(src) or not half.search(src):
    sys.exit("the form of group_rows_min_blocks changed; update dev/tbe_bwd_lane_blocks_ab.sh")
if cls == "fp32-narrow":
    src = fp32.sub(lambda m: m.group(1) + value + m.group(3) + m.group(4) + m.group(5), src, count=1)
elif cls == "fp32-wide":
    src = fp32.sub(lambda m: m.group(1) + m.group(2) + m.group(3) + value + m.group(5), src, count=1)
else:
    src = half.sub(lambda m: m.group(1) + value + m.group(3), src, count=1)
open(path, "w").write(src)
PY
}

rc=0
for v in $VALUES; do
  case $v in [1-8]) ;; *) echo "VALUES: '$v'; expected 1..8" >&2; exit 2 ;; esac
  set_value "$v" || exit 1
  cmake --build "$BUILD_DIR" -j "$(nproc)" --target embscale-dev >"$OUT/rebuild-$v.log" 2>&1 ||
    { echo "rebuild with $v failed: $OUT/rebuild-$v.log" >&2; exit 1; }
  IFS=';' read -r -a cases <<<"$CASES"
  for c in "${cases[@]}"; do
    read -r opt alpha dim rounding <<<"$c"
    [ -n "${opt:-}" ] || continue
    out=$("$BUILD_DIR/embscale-dev" tbe-backward --json --iters "$ITERS" --optimizer "$opt" --alpha "$alpha" \
      --embedding-dim "$dim" --num-embeddings $((2 ** 34 / (128 * dim))) --weights-precision "$WEIGHTS" \
      --output-dtype fp32 --rounding "$rounding" 2>&1) || { echo "FAILED ($v): $c"; echo "$out" | tail -n 3; rc=1; continue; }
    echo "$out" | grep '^{' | CLASS=$CLASS VALUE=$v python3 -c '
import json, os, sys
for line in sys.stdin:
    r = json.loads(line)
    r["lane_blocks"] = {"class": os.environ["CLASS"], "value": int(os.environ["VALUE"])}
    print(json.dumps(r))
    print("%s=%s %s alpha=%s D=%s %s: %.1f us, rows %.1f us" % (os.environ["CLASS"], os.environ["VALUE"],
          r["optimizer"], r["alpha"], r["embedding_dim"], r.get("rounding", ""), r["median_us"],
          r.get("phases", {}).get("rows_us", float("nan"))), file=sys.stderr)' 2>&1 >>"$JSONL"
  done
done
exit $rc
