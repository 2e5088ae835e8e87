#!/usr/bin/env bash
# Sweep of the CUDA TBE backward (row-wise Adagrad) on one build: for each embedding dimension in DIMS,
# the segment thresholds and block size (`embscale-dev tbe-backward --sweep-thresholds`: every tuning,
# the defaults first, timed on the same inputs in one process, with its phases) for uniform and
# Zipf(1.15) lookups. One JSON record per line to $OUT/tbe_bwd_sweep.jsonl, a readable line per record
# to stdout.
#
# Environment: BUILD_DIR (default build-gpu), OUT (default ./out), ITERS (default 20),
# DIMS (default "64 128 160 192 256 320"), ALPHAS (default "0 1.15").
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-gpu}
OUT=${OUT:-$PWD/out}
ITERS=${ITERS:-20}
DIMS=${DIMS:-"64 128 160 192 256 320"}
ALPHAS=${ALPHAS:-"0 1.15"}
DEV="$PWD/$BUILD_DIR/embscale-dev"
mkdir -p "$OUT"
JSONL="$OUT/tbe_bwd_sweep.jsonl"
: >"$JSONL"
rc=0

# W:0:T for max_warp_segment W and block_threads T (max_block_segment default; the bench raises it to
# W when W is above the default block limit).
TUNINGS="0:0:0"
for w in 32 128 512 2048; do
  for t in 128 256 512; do TUNINGS="${TUNINGS:+$TUNINGS,}$w:0:$t"; done
done

# bench ARGS...: one run; JSON records appended to $JSONL, a short line per record printed.
bench() {
  local out
  out=$("$DEV" tbe-backward --json --iters "$ITERS" --optimizer rowwise_adagrad "$@" 2>&1) ||
    { echo "FAILED: $*"; echo "$out" | tail -n 5; rc=1; }
  echo "$out" | grep '^{' | tee -a "$JSONL" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    ph = r.get("phases", {})
    print("warp<=%-6s block<=%-6s threads=%-4s D=%-4s alpha=%-4s %8.1f us  rows %8.1f us  sort %6.1f us  %7.1f GB/s" % (
        r.get("max_warp_segment", "?"), r.get("max_block_segment", "?"), r.get("block_threads", "?"),
        r["embedding_dim"], r["alpha"], r["median_us"], ph.get("rows_us", float("nan")),
        ph.get("sort_us", float("nan")), r["GBps"]))'
}

for d in $DIMS; do
  for a in $ALPHAS; do
    bench --sweep-thresholds "$TUNINGS" --embedding-dim "$d" --alpha "$a"
  done
done
exit $rc
