#!/usr/bin/env bash
# The tables-beyond-HBM records in one device call: scripts/tbe_cache_peers.sh MODE (embscale's cached and host
# tables against FBGEMM, same process), then bench/tbe_cache_sync_check.py (the cached step's host
# synchronisations, with and without prefetch) on the library it built.
#   scripts/tbe_cache_gpu.sh [MODE] [BUDGET_S]     (MODE as tbe_cache_peers.sh's; BUDGET_S default 560)
set -uo pipefail
cd "$(dirname "$0")/.."
MODE=${1:-16}
BUDGET=${2:-560}
export OUT=${OUT:-$PWD/out} BUILD_DIR=${BUILD_DIR:-build-gpu}
mkdir -p "$OUT"
bash scripts/tbe_cache_peers.sh "$MODE" $((BUDGET - 60)) | grep -v '^{'
rc=${PIPESTATUS[0]}
case $BUILD_DIR in /*) LIB=$BUILD_DIR ;; *) LIB=$PWD/$BUILD_DIR ;; esac
for pf in "" --prefetch; do
  EMBSCALE_LIBRARY=$LIB/libembscale_c.so PYTHONPATH=$PWD/python timeout 50 \
    python3 bench/tbe_cache_sync_check.py $pf --out "$OUT/tbe_cache_sync.jsonl" || rc=1
done
exit "$rc"
