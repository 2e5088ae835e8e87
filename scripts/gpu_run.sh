#!/usr/bin/env bash
# Everything the GPU machine is for, in one call: build (Release, CUDA on, sm_90a) into build-gpu/,
# `embscale info`, the whole test suite, the Python package's tests and its DLRM example on CUDA
# (against libembscale_c from the build), the NCCL tests at world size 1 (embscale's TorchRec integration
# under DistributedModelParallel on one GPU against TorchRec's own FBGEMM FUSED kernels, and the DLRM
# example under torchrun; needs TorchRec, see below), a memcheck pass over small CUDA cases, the benchmarks
# (ours with the in-harness peers, then torch's), and a summary table printed last.
#
# Each stage's failure is reported and the later stages still run, so one call yields as much as it
# can; the exit status is non-zero when any stage failed. Logs and one results.jsonl (every benchmark
# record) go to $OUT (default ./out).
#
# Environment:
#   OUT                    output directory (default: ./out)
#   STAGES                 stages to run, in order (default: "build info test python nccl sanitize bench summary");
#                          stages joined by + run at the same time (e.g. "test+sanitize", "python+nccl"), each
#                          into its own log, their reports merged in order: the GPU and 16 cores are shared, so
#                          join only stages that check results, never ones that time them (bench).
#   BUILD_DIR              build directory (default: build-gpu; relative to the repository root, or absolute,
#                          e.g. /tmp/b to reuse an earlier call's build while the machine is warm). When it
#                          already holds embscale, embscale_tests and libembscale_c.so (a build made
#                          elsewhere), the build stage is skipped.
#   EMBSCALE_EXTRA_PREFIX  extra install prefix(es), ':'-separated, for CLI11, nlohmann_json and GTest
#                          when the system lacks them: passed as CMAKE_PREFIX_PATH, and <prefix>/include
#                          (or the directory itself when it holds the headers) is added to the include path.
#   TIME_BUDGET            seconds for the whole run (default: 470); each stage is capped at what is left.
#   SANITIZE_FILTER        gtest filter for the memcheck pass (default: CUDA tests minus the > 2^31 one).
#   TEST_LIMIT             seconds for the test suite (default: 330; the H200 run takes ~200).
#   PYTHON_TEST_LIMIT      seconds for the Python suite (default: 480; ~210 on the H200, ~390 on the H100, in one
#                          process); PYTHON_JOBS processes share its files (default: 1).
#   EXTRA_BENCHES          more benchmark entries, one per line, in the BENCHES format below.
#   BENCH_NAMES            when set, only the benchmark entries of these names (space-separated) run.
#   NCCL_TEST_LIMIT        seconds for the nccl stage's pytest (default: 420); NCCL_DLRM_STEPS steps of each
#                          torchrun example (default: 200), NCCL_DLRM_LIMIT seconds for each (default: 120).
#   NCCL_DEVICE            cuda (default); cpu runs the nccl stage's tests and examples on gloo instead: a dry
#                          run of the stage on a machine without a GPU (with EMBSCALE_TEST_WORLDS=1 for world 1).
#   PEERS, UNPACK_TO       the nccl stage's .peers folder (default: .peers) and where it is unpacked (default:
#                          /tmp), as scripts/gpu_peers_unpack.sh takes them.
#
# The nccl stage: pytest over tests/python/test_torchrec.py, test_torchrec_matches_fbgemm.py,
# test_torchrec_placement.py (FUSED_UVM / FUSED_UVM_CACHING plans, TorchRec's prefetch pipeline) and
# test_data_parallel.py with EMBSCALE_TEST_DIST_DEVICE=cuda (one process per GPU, NCCL; the world-size-1
# cases on a machine of one GPU: tests/python/multiprocess.py's worlds()), then
# `torchrun --standalone --nproc_per_node 1 examples/train_dlrm.py --distributed --device cuda` for every
# --sharding the example takes (each must finish and its loss fall). It needs `import torchrec, fbgemm_gpu`
# to work: /tmp/fb and /tmp/trsite go on PYTHONPATH where they exist, and .peers/ is unpacked there first
# where it was carried (scripts/gpu_peers_unpack.sh). Without TorchRec the stage FAILS with "SKIPPED
# (torchrec not available ...)", so a run without it never reads as a pass.
#
# The whole suite on the GPU machine, two calls (shared/peers/README.md). A call carries at most 64 MiB with
# the tree (12 MB), and /tmp outlives a call only while the machine is kept warm, ~30 s after a call ends.
# Made here once: scripts/peers_xz.sh re-packs FBGEMM's archives as .tar.xz, which the machine's Python
# unpacks without the zstandard wheel, so the main archive (48 MB) travels with TorchRec's wheels:
#   call 1  carry .peers/fbgemm_sm90.tar.xz and .peers/torchrec:
#           bash scripts/gpu_peers_unpack.sh; BUILD_DIR=/tmp/b TIME_BUDGET=570 STAGES="build info test" \
#             bash scripts/gpu_run.sh
#   call 2  within 30 s, carry .peers/fbgemm_inference_sm90.tar.xz:
#           bash scripts/gpu_peers_unpack.sh; PYTHONPATH=/tmp/fb PYTHON_JOBS=3 BUILD_DIR=/tmp/b TIME_BUDGET=570 \
#             STAGES="build python+nccl+sanitize" bash scripts/gpu_run.sh
#           (reuses call 1's build; the three stages at once take about as long as the Python suite alone)
# The bench stage times, so it runs alone: a third call, STAGES="build bench summary".
# Each call is one command of at most 10 minutes; its output comes back under $OUT. A later call on a fresh
# machine (the earlier calls' /tmp gone) reports the stages that need them failed, naming what /tmp lacks.
set -uo pipefail
cd "$(dirname "$0")/.." || exit
ROOT=$PWD
OUT=${OUT:-$ROOT/out}
BUILD_DIR=${BUILD_DIR:-build-gpu}
case $BUILD_DIR in /*) ;; *) BUILD_DIR=$ROOT/$BUILD_DIR ;; esac  # absolute from here on
STAGES=${STAGES:-"build info test python nccl sanitize bench summary"}
TIME_BUDGET=${TIME_BUDGET:-470}
SANITIZE_FILTER=${SANITIZE_FILTER:-"*/cuda:-*RealBufferBeyond2To31Elements*"}
CLI="$BUILD_DIR/embscale"
TESTS="$BUILD_DIR/embscale_tests"
DEV_TESTS="$BUILD_DIR/embscale_dev_tests"  # dev/: the forward's kernel variants
LIB="$BUILD_DIR/libembscale_c.so"

# Benchmarks, in order: "name|timeout_s|command". A command prints readable lines and/or JSON records
# on stdout, and may also write JSON records to the file $JSONL; records from both end up in
# results.jsonl. Add embedding benchmarks here (or through EXTRA_BENCHES).
BENCHES=(
  "fp8|200|\"\$CLI\" bench fp8 --json"
  "torch_fp8|220|python3 bench/torch_fp8_peers.py --out \"\$JSONL\""
)
if [ -n "${EXTRA_BENCHES:-}" ]; then
  while IFS= read -r line; do [ -n "$line" ] && BENCHES+=("$line"); done <<<"$EXTRA_BENCHES"
fi

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
RESULTS="$OUT/results.jsonl"
START=$(date +%s)
FAILED=()
REPORT=()

remaining() { echo $((TIME_BUDGET - ($(date +%s) - START))); }

# run_step NAME TIMEOUT LOG CMD...: runs CMD with a time limit capped by the budget, output to LOG;
# records ok / FAILED (rc) / TIMEOUT in the report.
run_step() {
  local name=$1 limit=$2 log=$3
  shift 3
  local left
  left=$(remaining)
  if [ "$left" -lt 15 ]; then
    echo "== $name: skipped, the time budget is spent"
    FAILED+=("$name")
    REPORT+=("$(printf '%-26s %s' "$name" "SKIPPED (time budget spent)")")
    return 1
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name (limit ${limit}s) -> ${log#"$OUT"/}"
  local t0 rc
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  rc=$?
  local dt=$(($(date +%s) - t0)) status
  if [ $rc -eq 0 ]; then
    status="ok"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    status="TIMEOUT after ${limit}s"
  else
    status="FAILED (rc $rc)"
  fi
  [ $rc -ne 0 ] && { FAILED+=("$name"); tail -n 15 "$log" | sed 's/^/   | /'; }
  REPORT+=("$(printf '%-26s %-24s %4ss' "$name" "$status" "$dt")")
  return $rc
}

has_stage() { [[ " ${STAGES//+/ } " == *" $1 "* ]]; }

stage_build() {
  if [ -x "$CLI" ] && [ -x "$TESTS" ] && [ -f "$LIB" ]; then
    echo "== build: $BUILD_DIR holds embscale, embscale_tests and libembscale_c.so; not rebuilding"
    REPORT+=("$(printf '%-26s %s' build "prebuilt (skipped)")")
    return 0
  fi
  local gen="Unix Makefiles"
  command -v ninja >/dev/null && gen=Ninja
  local args=(-S . -B "$BUILD_DIR" -G "$gen" -DCMAKE_BUILD_TYPE=Release -DEMBSCALE_CUDA=ON
              -DCMAKE_CUDA_ARCHITECTURES=90a)
  if [ -n "${EMBSCALE_EXTRA_PREFIX:-}" ]; then
    local prefixes="${EMBSCALE_EXTRA_PREFIX//:/;}" incs="" p
    IFS=':' read -r -a plist <<<"$EMBSCALE_EXTRA_PREFIX"
    for p in "${plist[@]}"; do
      if [ -d "$p/include" ]; then incs+=" -I$p/include"; else incs+=" -I$p"; fi
    done
    args+=("-DCMAKE_PREFIX_PATH=$prefixes" "-DCMAKE_CXX_FLAGS=$incs" "-DCMAKE_CUDA_FLAGS=$incs")
  fi
  # A build directory carried from another checkout has a cache naming other paths: start it afresh.
  if [ -f "$BUILD_DIR/CMakeCache.txt" ] && ! grep -q "CMAKE_HOME_DIRECTORY:INTERNAL=$ROOT\$" "$BUILD_DIR/CMakeCache.txt"; then
    rm -rf "$BUILD_DIR/CMakeCache.txt" "$BUILD_DIR/CMakeFiles"
  fi
  run_step configure 120 "$OUT/configure.log" cmake "${args[@]}" || return 1
  run_step build 360 "$OUT/build.log" cmake --build "$BUILD_DIR" -j "$(nproc)" --target embscale_cli embscale_tests \
    embscale_c embscale_dev embscale_dev_tests
}

stage_info() { run_step info 30 "$OUT/info.log" "$CLI" info && cat "$OUT/info.log"; }

stage_test() {
  run_step test "${TEST_LIMIT:-330}" "$OUT/test.log" "$TESTS" --gtest_output="xml:$OUT/tests.xml"
  run_step "dev tests" 150 "$OUT/dev_test.log" "$DEV_TESTS" --gtest_output="xml:$OUT/dev_tests.xml"
  grep -hE "^\[==========\] [0-9]+ tests? from .* ran|^\[  (PASSED|SKIPPED) +\] [0-9]+ tests?|^\[  FAILED  \]" "$OUT/test.log" "$OUT/dev_test.log" \
    2>/dev/null | head -n 20
}

# pytest over tests/python (CPU and CUDA tensors) and the DLRM example on CUDA, against the build's
# libembscale_c. pytest is installed from $BUILD_DIR/wheels when the machine lacks it and wheels are there.
# PYTHON_JOBS > 1 splits the test files round-robin over that many pytest processes at once (each file's
# tests stay in one process; distributed tests meet through their own temporary folders, so shards do not
# collide), their logs concatenated into pytest.log.
stage_python() {
  export EMBSCALE_LIBRARY="$LIB" PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}"
  ensure_pytest
  export -f python_shards
  run_step "python tests" "${PYTHON_TEST_LIMIT:-480}" "$OUT/pytest.log" bash -c 'python_shards "$1"' _ "${PYTHON_JOBS:-1}"
  grep -hE "^(FAILED|ERROR) | (passed|failed|error)" "$OUT/pytest.log" | tail -n 12
  run_step "python example" 150 "$OUT/train_dlrm.log" python3 examples/train_dlrm.py --device cuda --steps 300 \
    --out "$OUT/train_dlrm_cuda.png"
  cat "$OUT/train_dlrm.log"
}

# python_shards N: pytest over tests/python's test files in N processes (1: one process, all of them); fails
# when any shard fails.
python_shards() {
  local jobs=$1 files i k rc=0
  [ "$jobs" -ge 1 ] || jobs=1
  files=(tests/python/test_*.py)
  local dir pids=()
  dir=$(mktemp -d)
  for ((i = 0; i < jobs; i++)); do
    local shard=()
    for ((k = i; k < ${#files[@]}; k += jobs)); do shard+=("${files[k]}"); done
    python3 -m pytest -q -p no:cacheprovider "${shard[@]}" >"$dir/shard_$i.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do wait "${pids[i]}" || rc=1; done
  for ((i = 0; i < jobs; i++)); do echo "== pytest shard $i of $jobs"; cat "$dir/shard_$i.log"; done
  rm -rf "$dir"
  return $rc
}

ensure_pytest() {
  if ! python3 -c "import pytest" 2>/dev/null && [ -d "$BUILD_DIR/wheels" ]; then
    python3 -m pip install -q --no-index --find-links "$BUILD_DIR/wheels" pytest >"$OUT/pip.log" 2>&1
  fi
}

# The NCCL tests at world size 1 (see the header): TorchRec's DistributedModelParallel on this GPU with
# embscale's kernels, against TorchRec's own FBGEMM FUSED kernels and one process on the global batch, and
# the DLRM example under torchrun for each sharding type.
NCCL_SHARDINGS="table_wise row_wise column_wise data_parallel"  # examples/train_dlrm.py's --sharding choices
# Reads the example's JSON: every loss finite, and the last 20 steps' mean below the first 20's.
LOSS_FELL='import json, math, sys
loss = json.load(open(sys.argv[1]))["results"]["distributed"]["loss"]
first, last = sum(loss[:20]) / 20, sum(loss[-20:]) / 20
print(f"loss: {first:.4f} over the first 20 steps, {last:.4f} over the last 20")
sys.exit(0 if all(map(math.isfinite, loss)) and last < first - 0.005 else "the loss did not fall")'
stage_nccl() {
  local peers=${PEERS:-$ROOT/.peers} to=${UNPACK_TO:-/tmp}  # as scripts/gpu_peers_unpack.sh takes them
  if [ -d "$peers" ]; then  # whatever of .peers/ this call carried, unpacked to /tmp (once)
    run_step "nccl unpack .peers" 120 "$OUT/peers_unpack.log" env PEERS="$peers" UNPACK_TO="$to" \
      bash "$ROOT/scripts/gpu_peers_unpack.sh"
    grep "^peers:" "$OUT/peers_unpack.log" | sed 's/^/   /'
  fi
  local pp="$ROOT/python" d
  for d in "$to/fb" "$to/trsite"; do [ -d "$d" ] && pp+=":$d"; done
  pp+="${PYTHONPATH:+:$PYTHONPATH}"
  if ! PYTHONPATH="$pp" python3 -c "import torchrec, fbgemm_gpu" >"$OUT/nccl_import.log" 2>&1; then
    echo "== nccl: \`import torchrec, fbgemm_gpu\` fails (PYTHONPATH=$pp):"
    tail -n 3 "$OUT/nccl_import.log" | sed 's/^/   | /'
    FAILED+=(nccl)
    REPORT+=("$(printf '%-26s %s' nccl "SKIPPED (torchrec not available: carry .peers (the two calls of this script's header))")")
    return 1
  fi
  if [ ! -f "$LIB" ]; then
    echo "== nccl: $LIB is missing (the build stage makes it)"
    FAILED+=(nccl)
    REPORT+=("$(printf '%-26s %s' nccl "FAILED (no libembscale_c.so in $BUILD_DIR)")")
    return 1
  fi
  ensure_pytest
  local dev=${NCCL_DEVICE:-cuda}
  local envs=(env EMBSCALE_LIBRARY="$LIB" PYTHONPATH="$pp" EMBSCALE_TEST_DIST_DEVICE="$dev")
  run_step "nccl tests" "${NCCL_TEST_LIMIT:-420}" "$OUT/nccl_pytest.log" "${envs[@]}" python3 -m pytest -q -rs \
    -p no:cacheprovider --durations=10 tests/python/test_torchrec.py tests/python/test_torchrec_matches_fbgemm.py \
    tests/python/test_torchrec_placement.py tests/python/test_data_parallel.py
  grep -E "^(FAILED|ERROR) |^SKIPPED|passed|failed" "$OUT/nccl_pytest.log" | tail -n 20 | sed 's/^/   /'
  # Every case skipped for want of TorchRec would pass quietly: a failure here.
  if grep -q "torchrec is not installed" "$OUT/nccl_pytest.log"; then
    echo "   pytest did not import torchrec: the TorchRec cases were skipped"
    FAILED+=("nccl tests")
    REPORT+=("$(printf '%-26s %s' "nccl tests" "FAILED (pytest skipped the TorchRec cases)")")
  fi
  local s
  for s in $NCCL_SHARDINGS; do
    # shellcheck disable=SC2016  # the inner script's arguments, expanded there
    run_step "nccl dlrm $s" "${NCCL_DLRM_LIMIT:-120}" "$OUT/nccl_dlrm_$s.log" "${envs[@]}" bash -c \
      'python3 -m torch.distributed.run --standalone --nproc_per_node 1 examples/train_dlrm.py --distributed \
         --device "$5" --steps "$1" --sharding "$2" --out "$3.png" && python3 -c "$4" "$3.json"' \
      _ "${NCCL_DLRM_STEPS:-200}" "$s" "$OUT/train_dlrm_nccl_$s" "$LOSS_FELL" "$dev"
    grep -E "^distributed|^loss:|did not fall|Error" "$OUT/nccl_dlrm_$s.log" | tail -n 3 | sed 's/^/   /'
  done
}

stage_sanitize() {
  local cs
  cs=$(command -v compute-sanitizer || true)
  [ -z "$cs" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ] && cs=/usr/local/cuda/bin/compute-sanitizer
  if [ -z "$cs" ]; then
    echo "== sanitize: compute-sanitizer not found"
    FAILED+=(sanitize)
    REPORT+=("$(printf '%-26s %s' sanitize "FAILED (compute-sanitizer not found)")")
    return 1
  fi
  local mc=("$cs" --tool memcheck --error-exitcode 99 --print-limit 20)
  run_step "memcheck tests" 150 "$OUT/memcheck_tests.log" "${mc[@]}" "$TESTS" --gtest_filter="$SANITIZE_FILTER"
  run_step "memcheck check" 90 "$OUT/memcheck_check.log" "${mc[@]}" "$CLI" check --backend cuda
  # Every fp8 op and amax peer once at small, odd sizes (tails after the last full vector).
  run_step "memcheck bench fp8" 90 "$OUT/memcheck_bench.log" "${mc[@]}" "$CLI" bench fp8 --backend cuda \
    --sizes 1000003,4099 --shape 300x260 --dtypes fp32,bf16,fp16 --warmup 0 --iters 1
}

stage_bench() {
  : >"$RESULTS"
  local entry name limit cmd
  for entry in "${BENCHES[@]}"; do
    name=${entry%%|*}
    limit=${entry#*|}
    limit=${limit%%|*}
    cmd=${entry#*|*|}
    if [ -n "${BENCH_NAMES:-}" ] && [[ " $BENCH_NAMES " != *" $name "* ]]; then continue; fi
    JSONL="$OUT/bench_$name.jsonl"
    : >"$JSONL"
    export CLI JSONL
    run_step "bench $name" "$limit" "$OUT/bench_$name.log" bash -c "$cmd"
    grep -h '^{' "$OUT/bench_$name.log" "$JSONL" >>"$RESULTS" 2>/dev/null
    echo "   $(grep -c '^{' "$OUT/bench_$name.log" "$JSONL" 2>/dev/null | awk -F: '{s += $NF} END {print s + 0}') records"
  done
}

stage_summary() {
  [ -s "$RESULTS" ] || { echo "== summary: no results"; return 0; }
  python3 bench/summarize.py "$RESULTS" >"$OUT/summary.txt" 2>&1 || FAILED+=(summary)
}

echo "embscale GPU run: stages '$STAGES', build $BUILD_DIR, output $OUT, budget ${TIME_BUDGET}s"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
run_stage() {
  case $1 in
    build|info|test|python|nccl|sanitize|bench|summary) "stage_$1" ;;
    *) echo "== unknown stage '$1' (expected build info test python nccl sanitize bench summary)"; FAILED+=("$1") ;;
  esac
}

# run_group A+B+...: the stages at once, each in a subshell with its output in $OUT/stage_NAME.out; each
# subshell's report lines and failures come back through files and are merged in the group's order.
run_group() {
  local tmp s
  tmp=$(mktemp -d)
  IFS='+' read -r -a parts <<<"$1"
  echo "== stages at once: ${parts[*]}"
  for s in "${parts[@]}"; do
    (
      REPORT=() FAILED=()
      run_stage "$s" >"$OUT/stage_$s.out" 2>&1
      [ ${#REPORT[@]} -gt 0 ] && printf '%s\n' "${REPORT[@]}" >"$tmp/$s.report"
      [ ${#FAILED[@]} -gt 0 ] && printf '%s\n' "${FAILED[@]}" >"$tmp/$s.failed"
      exit 0
    ) &
  done
  wait
  local line
  for s in "${parts[@]}"; do
    echo "== [$s]"
    cat "$OUT/stage_$s.out"
    [ -f "$tmp/$s.report" ] && while IFS= read -r line; do REPORT+=("$line"); done <"$tmp/$s.report"
    [ -f "$tmp/$s.failed" ] && while IFS= read -r line; do FAILED+=("$line"); done <"$tmp/$s.failed"
  done
  rm -rf "$tmp"
}

for s in $STAGES; do
  if [[ $s == *+* ]]; then run_group "$s"; else run_stage "$s"; fi
done

echo
echo "== stages ($(($(date +%s) - START))s in all)"
for line in "${REPORT[@]}"; do echo "   $line"; done
if has_stage summary && [ -f "$OUT/summary.txt" ]; then
  echo
  cat "$OUT/summary.txt"
fi
# Only a few files come back from a remote run: pack every log into one archive beside the results.
pack=$(mktemp -d)
(cd "$OUT" && tar -czf "$pack/logs.tgz" --exclude=results.jsonl --exclude=summary.txt --exclude='train_dlrm*' . &&
  find . -mindepth 1 -maxdepth 1 ! -name results.jsonl ! -name summary.txt ! -name 'train_dlrm*' -exec rm -rf {} + &&
  mv "$pack/logs.tgz" .)
rmdir "$pack" 2>/dev/null
if [ ${#FAILED[@]} -gt 0 ]; then
  echo "FAILED: ${FAILED[*]}"
  exit 1
fi
echo "all stages passed"
