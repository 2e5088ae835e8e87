#!/usr/bin/env bash
# The real peers on the GPU machine, in one call: FBGEMM's TBE (bench/tbe_vs_fbgemm.py) and
# TransformerEngine's FP8 ops (bench/te_peer/) against embscale, each in one process on identical inputs.
#
#   scripts/h200_peers.sh            # quick: a few D, fewer steps and sizes (about 5 minutes with a warm build)
#   FULL=1 scripts/h200_peers.sh     # every D, size and step count of the issue (split it with TBE_ARGS)
#
# Needs, in the repository root: .peers/ with zstandard-*.whl, fbgemm_sm90.tar.zst and te_sm90.tar.zst
# (docs/benchmarks.md says where they come from). Stages, each timed and reported, a failed one not
# stopping the next:
#   unpack   the zstandard wheel to /tmp/site, FBGEMM to /tmp/fb, TE to /tmp/te (each skipped when there,
#            or when only the other peer's stage is in STAGES)
#   build    embscale's libembscale.a and libembscale_c.so with CUDA into $BUILD_DIR (configured as
#            scripts/gpu_run.sh does when it is not configured yet)
#   te       builds bench/te_peer/te_fp8_peer and runs it         -> $OUT/te.jsonl, $OUT/te.log
#   fbgemm   bench/tbe_vs_fbgemm.py                               -> $OUT/fbgemm.jsonl, $OUT/fbgemm.log
#   summary  both record files in one, and bench/summarize.py's table -> $OUT/peers.jsonl (the file to keep in
#            bench/results/ as <date>-nvidia-h200-peers.jsonl), $OUT/summary.txt (also printed)
#
# Environment:
#   OUT                    output directory (default: ./out)
#   BUILD_DIR              embscale's CUDA build directory (default: build-gpu, shared with scripts/gpu_run.sh)
#   EMBSCALE_EXTRA_PREFIX  prefix(es) with CLI11, nlohmann_json and GTest for the configure step, as for
#                          scripts/gpu_run.sh (default: .deps when it exists)
#   FULL                   1: the full sweep (default: the quick one)
#   TE_ARGS, TBE_ARGS      extra arguments for te_fp8_peer and tbe_vs_fbgemm.py (after the mode's own;
#                          e.g. TBE_ARGS="--dims 8,16,32,64" to run part of the full sweep)
#   STAGES                 stages to run (default: "unpack build te fbgemm summary")
set -uo pipefail
cd "$(dirname "$0")/.."
export ROOT=$PWD
export OUT=${OUT:-$ROOT/out}
export BUILD_DIR=${BUILD_DIR:-build-gpu}
export PEERS=$ROOT/.peers
export FULL=${FULL:-0} TE_ARGS=${TE_ARGS:-} TBE_ARGS=${TBE_ARGS:-}
export STAGES=${STAGES:-"unpack build te fbgemm summary"}
[ -z "${EMBSCALE_EXTRA_PREFIX:-}" ] && [ -d "$ROOT/.deps" ] && EMBSCALE_EXTRA_PREFIX=$ROOT/.deps
export EMBSCALE_EXTRA_PREFIX=${EMBSCALE_EXTRA_PREFIX:-}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# stage NAME LIMIT_S LOG CMD...: runs CMD under a time limit, output to LOG (its tail shown when it fails).
stage() {
  local name=$1 limit=$2 log=$3 t0 rc status
  shift 3
  echo "== $name (limit ${limit}s) -> ${log#"$OUT"/}"
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  rc=$?
  case $rc in
    0) status=ok ;;
    124 | 137) status="TIMEOUT after ${limit}s" ;;
    *) status="FAILED (rc $rc)" ;;
  esac
  if [ $rc -ne 0 ]; then
    FAILED+=("$name")
    tail -n 20 "$log" | sed 's/^/   | /'
  fi
  REPORT+=("$(printf '%-10s %-24s %5ss' "$name" "$status" $(($(date +%s) - t0)))")
  echo "   $status in $(($(date +%s) - t0))s (${SECONDS}s since the start)"
  return $rc
}

has_stage() { [[ " $STAGES " == *" $1 "* ]]; }

unpack() {
  local x='import zstandard,tarfile,sys;d=zstandard.ZstdDecompressor(max_window_size=2**31);tarfile.open(fileobj=d.stream_reader(open(sys.argv[1],"rb")),mode="r|").extractall(sys.argv[2])'
  set -e
  python3 -c 'import zstandard' 2>/dev/null || [ -d /tmp/site/zstandard ] ||
    python3 -m pip install -q --no-index --no-deps --target /tmp/site "$PEERS"/zstandard-*.whl
  # Only the peers of the stages asked for (a run of one stage carries only that peer's archive); both
  # when neither stage is (an unpack-only call).
  local fb=1 te=1
  if has_stage fbgemm || has_stage te; then
    has_stage fbgemm || fb=0
    has_stage te || te=0
  fi
  if [ "$fb" = 1 ]; then
    if [ -f /tmp/fb/fbgemm_gpu/__init__.py ]; then echo "FBGEMM: /tmp/fb exists"; else
      PYTHONPATH=/tmp/site python3 -c "$x" "$PEERS/fbgemm_sm90.tar.zst" /tmp/fb && echo "FBGEMM unpacked to /tmp/fb"; fi
  fi
  if [ "$te" = 1 ]; then
    if [ -d /tmp/te/transformer_engine ]; then echo "TE: /tmp/te exists"; else
      PYTHONPATH=/tmp/site python3 -c "$x" "$PEERS/te_sm90.tar.zst" /tmp/te && echo "TE unpacked to /tmp/te"; fi
  fi
}

build() {
  set -e
  # A build directory carried from another checkout has a cache naming other paths: start it afresh.
  if [ -f "$BUILD_DIR/CMakeCache.txt" ] && ! grep -q "CMAKE_HOME_DIRECTORY:INTERNAL=$ROOT\$" "$BUILD_DIR/CMakeCache.txt"; then
    rm -rf "$BUILD_DIR/CMakeCache.txt" "$BUILD_DIR/CMakeFiles"
  fi
  if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
    local gen="Unix Makefiles"
    command -v ninja >/dev/null && gen=Ninja
    local args=(-S . -B "$BUILD_DIR" -G "$gen" -DCMAKE_BUILD_TYPE=Release -DEMBSCALE_CUDA=ON
                -DCMAKE_CUDA_ARCHITECTURES=90a)
    if [ -n "${EMBSCALE_EXTRA_PREFIX:-}" ]; then
      local incs="" p
      IFS=':' read -r -a plist <<<"$EMBSCALE_EXTRA_PREFIX"
      for p in "${plist[@]}"; do
        if [ -d "$p/include" ]; then incs+=" -I$p/include"; else incs+=" -I$p"; fi
      done
      args+=("-DCMAKE_PREFIX_PATH=${EMBSCALE_EXTRA_PREFIX//:/;}" "-DCMAKE_CXX_FLAGS=$incs" "-DCMAKE_CUDA_FLAGS=$incs")
    fi
    cmake "${args[@]}"
  fi
  cmake --build "$BUILD_DIR" -j "$(nproc)" --target embscale embscale_c
}

# TE's CUDA dependencies from torch's nvidia packages, and TE's own library folder.
te_library_path() {
  local nv
  nv=$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null) || true
  local dirs=""
  [ -n "$nv" ] && dirs=$(find "$nv" -mindepth 2 -maxdepth 2 -type d -name lib | sort | tr "\n" :)
  echo "${dirs}$(dirname "$(find /tmp/te -name libtransformer_engine.so -print -quit)")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

run_te() {
  set -e
  # te_sm90.tar.zst holds transformer-engine-cu13 2.20.2 without the wheel's metadata.
  TE_VERSION=${TE_VERSION:-2.20.2} bench/te_peer/build.sh /tmp/te "$BUILD_DIR" "$BUILD_DIR/te_fp8_peer"
  local mode=(--sizes "2^16,2^20,2^24,2^28" --shapes "8192x8192,16384x16384" --iters 15 --warmup 2)
  [ "$FULL" = 1 ] && mode=()
  : >"$OUT/te.jsonl"
  # shellcheck disable=SC2086  # TE_ARGS: words by design
  LD_LIBRARY_PATH=$(te_library_path) "$BUILD_DIR/te_fp8_peer" "${mode[@]}" $TE_ARGS --out "$OUT/te.jsonl" >/dev/null
}

run_fbgemm() {
  local mode=(--quick)
  [ "$FULL" = 1 ] && mode=()
  : >"$OUT/fbgemm.jsonl"
  # shellcheck disable=SC2086  # TBE_ARGS: words by design
  PYTHONPATH="/tmp/fb:$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" EMBSCALE_LIBRARY="$ROOT/$BUILD_DIR/libembscale_c.so" \
    python3 bench/tbe_vs_fbgemm.py "${mode[@]}" $TBE_ARGS --out "$OUT/fbgemm.jsonl" >/dev/null
}

# `h200_peers.sh --stage NAME` runs one stage's function (what `stage` calls under its time limit).
if [ "${1:-}" = --stage ]; then
  "$2"
  exit $?
fi
START=$(date +%s)
REPORT=()
FAILED=()
TE_LIMIT=150 TBE_LIMIT=330
[ "$FULL" = 1 ] && TE_LIMIT=300 TBE_LIMIT=3000

echo "embscale peers run: stages '$STAGES', $([ "$FULL" = 1 ] && echo full || echo quick), build $BUILD_DIR, output $OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
SELF=$ROOT/scripts/h200_peers.sh
has_stage unpack && stage unpack 120 "$OUT/unpack.log" bash "$SELF" --stage unpack
has_stage build && stage build 480 "$OUT/build.log" bash "$SELF" --stage build
if has_stage te; then
  stage te "$TE_LIMIT" "$OUT/te.log" bash "$SELF" --stage run_te
  grep -E '^(te_fp8_peer|error)|te/embscale' "$OUT/te.log" | sed 's/^/   /'
fi
if has_stage fbgemm; then
  stage fbgemm "$TBE_LIMIT" "$OUT/fbgemm.log" bash "$SELF" --stage run_fbgemm
  grep -E '^(tbe_vs_fbgemm|error)|max rel error|fbgemm/embscale' "$OUT/fbgemm.log" | sed 's/^/   /'
fi
if has_stage summary; then
  files=()
  for f in "$OUT/te.jsonl" "$OUT/fbgemm.jsonl"; do [ -s "$f" ] && files+=("$f"); done
  if [ ${#files[@]} -gt 0 ]; then
    cat "${files[@]}" >"$OUT/peers.jsonl"
    stage summary 60 "$OUT/summary.txt" python3 bench/summarize.py "$OUT/peers.jsonl" && sed -n '/same run/,$p' "$OUT/summary.txt"
  else
    echo "== summary: no records"
    FAILED+=(summary)
  fi
fi

echo
echo "== stages ($(($(date +%s) - START))s in all)"
for line in "${REPORT[@]}"; do echo "   $line"; done
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "FAILED: ${FAILED[*]}"
  exit 1
fi
echo "all stages passed"
