#!/usr/bin/env bash
# Sweep of the CUDA TBE forward on one build (embscale-dev, dev/README.md): every compiled kernel variant
# (--variants all, same inputs in one process) for uniform and Zipf(1.15) lookups, the bags per lane group
# (--bags), then the library's shape over weights dtypes, dimensions and mixed
# dimensions. One JSON record per line to $OUT/tbe_fwd_sweep.jsonl, a readable line per record to stdout.
#
# Environment: BUILD_DIR (default build-gpu), OUT (default ./out), ITERS (default 50),
# PARTS (default "variants bags dims": which groups to run).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-gpu}
OUT=${OUT:-$PWD/out}
ITERS=${ITERS:-50}
PARTS=${PARTS:-"variants bags dims"}
DEV="$PWD/$BUILD_DIR/embscale-dev"
mkdir -p "$OUT"
JSONL="$OUT/tbe_fwd_sweep.jsonl"
: >"$JSONL"
rc=0

# bench ARGS...: one run; JSON records appended to $JSONL, a short line per record printed.
bench() {
  local out
  out=$("$DEV" tbe-forward --json --iters "$ITERS" "$@" 2>&1) || { echo "FAILED: $*"; echo "$out" | tail -n 5; rc=1; }
  echo "$out" | grep '^{' | tee -a "$JSONL" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print("%-14s bags=%-2s D=%-6s %s alpha=%-4s %8.1f us %7.1f GB/s %5.1f%% of floor" % (
        r.get("fwd_variant", "?"), r.get("fwd_bags_per_group", "?"), r["embedding_dim"],
        r["weights_precision"], r["alpha"], r["median_us"], r["GBps"], r["pct_of_floor"]))'
}

for part in $PARTS; do
  case $part in
    variants)
      bench --variants all
      bench --variants all --alpha 1.15
      ;;
    bags)
      bench --bags 1 --variants default,b256u8,v2u4
      bench --bags 4 --variants default,b256u8,v2u4 --alpha 1.15
      ;;
    dims)
      bench --weights-precision fp16
      bench --weights-precision fp16 --alpha 1.15
      for d in 8 32 64 128 256; do bench --embedding-dim "$d"; done
      bench --embedding-dim 1024 --num-tables 4
      bench --mixed-dim
      bench --mixed-dim --alpha 1.15
      ;;
    *) echo "unknown part '$part' (expected variants, bags, dims)"; rc=1 ;;
  esac
done
exit $rc
