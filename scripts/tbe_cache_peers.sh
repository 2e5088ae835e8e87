#!/usr/bin/env bash
# Tables beyond HBM on the GPU machine, in one device call of at most 10 minutes: embscale's cached and host
# tables against FBGEMM's MANAGED_CACHING and MANAGED (bench/tbe_cache_vs_fbgemm.py), same process.
#
#   scripts/tbe_cache_peers.sh [MODE] [BUDGET_S]
#     16       (default) 16 GiB of tables, both impls resident and checked against each other: all-HBM
#              (device), cached at load factors 0.05, 0.1, 0.2, host/managed; uniform and Zipf 1.15
#     96       96 GiB, one impl at a time (the host holds the set once): fbgemm_cached, then embscale_cached,
#              at load factor $LFS (default 0.1; one load factor per call: each impl's build of 96 GiB takes
#              minutes)
#     96-host  96 GiB, one impl at a time: fbgemm_managed, then embscale_host
#     smoke    0.5 GiB, every impl, few steps: the whole path in about a minute after the build
#   BUDGET_S   seconds for the whole call, unpacking and building included (default 560); the benchmark gets
#              what is left, stops before work it estimates would not end in time and records what it did
#
# Needs in the repository root (unless /tmp/fb already holds FBGEMM): .peers/fbgemm_sm90.tar.zst and
# .peers/zstandard-*.whl (docs/benchmarks.md); the two and the tree exceed one call's 64 MiB carry, so carry
# the wheel in an earlier call while the machine is warm (/tmp/site keeps it: scripts/gpu_run.sh). Stages: unpack FBGEMM to /tmp/fb (skipped when there), build
# libembscale_c.so with CUDA into $BUILD_DIR (configured as scripts/h200_peers.sh does when not yet
# configured), run the benchmark. Environment:
#   OUT             output directory (default ./out): tbe_cache_<mode>.jsonl (records), tbe_cache_<mode>.log,
#                   unpack.log, build.log
#   BUILD_DIR       default build-gpu
#   LFS             load factors of mode 96 (default 0.1)
#   ARGS            more arguments for bench/tbe_cache_vs_fbgemm.py (after the mode's)
#   EMBSCALE_BUILD  the build's name in the records (default: git's short commit where .git came along)
#   EMBSCALE_EXTRA_PREFIX  as for scripts/gpu_run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
START=$(date +%s)
MODE=${1:-16}
BUDGET=${2:-560}
OUT=${OUT:-$ROOT/out}
BUILD_DIR=${BUILD_DIR:-build-gpu}
case $BUILD_DIR in /*) LIBDIR=$BUILD_DIR ;; *) LIBDIR=$ROOT/$BUILD_DIR ;; esac
PEERS=$ROOT/.peers
[ -z "${EMBSCALE_EXTRA_PREFIX:-}" ] && [ -d "$ROOT/.deps" ] && EMBSCALE_EXTRA_PREFIX=$ROOT/.deps
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

case $MODE in
  16) MODE_ARGS=(--gb 16 --load-factors "0.1,0.05,0.2") ;;
  96) MODE_ARGS=(--gb 96 --one-impl-at-a-time --load-factors "${LFS:-0.1}" --impls "fbgemm_cached,embscale_cached") ;;
  96-host) MODE_ARGS=(--gb 96 --one-impl-at-a-time --impls "fbgemm_managed,embscale_host") ;;
  smoke) MODE_ARGS=(--gb 0.5 --warmup 4 --iters 5 --load-factors 0.1) ;;
  *) echo "unknown mode '$MODE' (16, 96, 96-host or smoke)" >&2; exit 2 ;;
esac

elapsed() { echo $(($(date +%s) - START)); }

echo "tbe_cache_peers: mode $MODE, budget ${BUDGET}s, build $BUILD_DIR, output $OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
grep -E '^(MemTotal|MemAvailable):' /proc/meminfo | tr -s ' ' | sed 's/^/host: /'

# ---- unpack FBGEMM (the Unpack block of shared/peers/README.md)
if [ -f /tmp/fb/fbgemm_gpu/__init__.py ]; then
  echo "== unpack: /tmp/fb exists"
else
  echo "== unpack FBGEMM to /tmp/fb"
  X='import zstandard,tarfile,sys;d=zstandard.ZstdDecompressor(max_window_size=2**31);tarfile.open(fileobj=d.stream_reader(open(sys.argv[1],"rb")),mode="r|").extractall(sys.argv[2])'
  (
    set -e
    python3 -c 'import zstandard' 2>/dev/null || [ -d /tmp/site/zstandard ] ||
      python3 -m pip install -q --no-index --no-deps --target /tmp/site "$PEERS"/zstandard-*.whl
    PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} timeout 180 python3 -c "$X" "$PEERS/fbgemm_sm90.tar.zst" /tmp/fb
  ) >"$OUT/unpack.log" 2>&1
  rc=$?
  if [ $rc -ne 0 ] || [ ! -f /tmp/fb/fbgemm_gpu/__init__.py ]; then
    tail -n 20 "$OUT/unpack.log"
    echo "unpack FAILED (rc $rc): is .peers/ (fbgemm_sm90.tar.zst, zstandard-*.whl) in the repository root?"
    rm -rf /tmp/fb
    exit 1
  fi
  echo "   done in $(elapsed)s"
fi

# ---- build libembscale_c.so with CUDA
echo "== build $BUILD_DIR/libembscale_c.so"
(
  set -e
  # A build directory carried from another checkout has a cache naming other paths: start it afresh.
  if [ -f "$BUILD_DIR/CMakeCache.txt" ] && ! grep -q "CMAKE_HOME_DIRECTORY:INTERNAL=$ROOT\$" "$BUILD_DIR/CMakeCache.txt"; then
    rm -rf "$BUILD_DIR/CMakeCache.txt" "$BUILD_DIR/CMakeFiles"
  fi
  if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
    gen="Unix Makefiles"
    command -v ninja >/dev/null && gen=Ninja
    args=(-S . -B "$BUILD_DIR" -G "$gen" -DCMAKE_BUILD_TYPE=Release -DEMBSCALE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a)
    if [ -n "${EMBSCALE_EXTRA_PREFIX:-}" ]; then
      incs=""
      IFS=':' read -r -a plist <<<"$EMBSCALE_EXTRA_PREFIX"
      for p in "${plist[@]}"; do
        if [ -d "$p/include" ]; then incs+=" -I$p/include"; else incs+=" -I$p"; fi
      done
      args+=("-DCMAKE_PREFIX_PATH=${EMBSCALE_EXTRA_PREFIX//:/;}" "-DCMAKE_CXX_FLAGS=$incs" "-DCMAKE_CUDA_FLAGS=$incs")
    fi
    cmake "${args[@]}"
  fi
  cmake --build "$BUILD_DIR" -j "$(nproc)" --target embscale_c
) >"$OUT/build.log" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
  tail -n 30 "$OUT/build.log"
  echo "build FAILED (rc $rc)"
  exit 1
fi
echo "   done ($(elapsed)s since the start)"

# ---- the benchmark, in what is left of the budget
LEFT=$((BUDGET - $(elapsed) - 15))
if [ $LEFT -lt 60 ]; then
  echo "only ${LEFT}s left of the ${BUDGET}s budget after unpacking and building: not running the benchmark"
  exit 1
fi
if [ -z "${EMBSCALE_BUILD:-}" ] && git rev-parse --short HEAD >/dev/null 2>&1; then
  EMBSCALE_BUILD=$(git rev-parse --short HEAD)
fi
RECORDS=$OUT/tbe_cache_$MODE.jsonl
LOG=$OUT/tbe_cache_$MODE.log
echo "== bench/tbe_cache_vs_fbgemm.py ${MODE_ARGS[*]} ${ARGS:-} (time budget ${LEFT}s) -> ${RECORDS#"$OUT"/}"
# shellcheck disable=SC2086  # ARGS: words by design
PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/fb:$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" \
  EMBSCALE_LIBRARY="$LIBDIR/libembscale_c.so" EMBSCALE_BUILD="${EMBSCALE_BUILD:-}" \
  timeout --kill-after=10 $((LEFT + 10)) python3 bench/tbe_cache_vs_fbgemm.py "${MODE_ARGS[@]}" ${ARGS:-} \
  --time-budget "$LEFT" --out "$RECORDS" 2>&1 | tee "$LOG"
rc=${PIPESTATUS[0]}
case $rc in
  0) echo "== benchmark: ok ($(elapsed)s in all)" ;;
  124 | 137) echo "== benchmark: TIMEOUT after $((LEFT + 10))s (records so far in ${RECORDS#"$OUT"/}; $(elapsed)s in all)" ;;
  *) echo "== benchmark: rc $rc (failed or unchecked cases above; $(elapsed)s in all)" ;;
esac
exit "$rc"
