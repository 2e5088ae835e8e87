#!/usr/bin/env bash
# Sanitizer run: builds the CPU backend, the C API, the CLI, the C++ tests and the fuzzers with
# AddressSanitizer and UndefinedBehaviorSanitizer (-DEMBSCALE_SANITIZE=ON, CUDA off) in their own folder,
# then runs under the sanitizers
#   1. the whole C++ test suite (ctest: every GoogleTest test, the examples, the CLI's refusal test and a
#      short C API fuzz pass, fuzz.capi),
#   2. a longer C API fuzz pass (tests/fuzz/),
#   3. the CLI fuzzer against the sanitized embscale binary (tests/fuzz/fuzz_cli.py).
# All three run even when one fails; the exit status is non-zero if any did. Any sanitizer report is fatal
# (-fno-sanitize-recover=all), and the fuzzers run each case (or batch) in a process of its own, so a report
# fails that case and the run goes on.
#
# Environment: BUILD_DIR (default build-asan), FUZZ_SEED (default 20261201; another seed explores other
# cases, the same seed replays them), FUZZ_CAPI_CASES (default 20000), FUZZ_CLI_CASES (default 120).
#
# Build type: RelWithDebInfo with -O1 -g1 (line tables): the sanitized build of every target takes about
# half the time it takes at -O2 -g, and reports still name file and line. The library keeps its own -O3.
#
# OpenMP: no suppression file and no ASAN_OPTIONS workaround is needed. libgomp is not instrumented, but
# AddressSanitizer only checks the accesses of instrumented code (ours) and tracks libgomp's thread stacks
# like any other threads; the false positives libgomp is known for are ThreadSanitizer's (it cannot see
# libgomp's internal synchronisation), and this run does not use TSan. The whole suite runs clean without one.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-asan}
SEED=${FUZZ_SEED:-20261201}
CAPI_CASES=${FUZZ_CAPI_CASES:-20000}
CLI_CASES=${FUZZ_CLI_CASES:-120}
JOBS=$(nproc)
start=$(date +%s)

cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1" \
  -DEMBSCALE_CUDA=OFF -DEMBSCALE_SANITIZE=ON -DEMBSCALE_BUILD_TESTS=ON -DEMBSCALE_BUILD_TOOLS=ON
cmake --build "$BUILD_DIR" -j "$JOBS"
built=$(date +%s)
echo "sanitize.sh: built in $((built - start)) s"

# detect_leaks: LeakSanitizer at exit (the C fuzzer's batches exit normally so leaks in them are reported);
# strict_string_checks and check_initialization_order: extra checks that cost little.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:strict_string_checks=1:check_initialization_order=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}

failed=()
step() {  # step NAME COMMAND...: runs a step, records a failure, goes on
  local name=$1 t0 rc
  shift
  t0=$(date +%s)
  echo "==== sanitize.sh: $name"
  set +e
  "$@"
  rc=$?
  set -e
  echo "==== sanitize.sh: $name: exit $rc after $(($(date +%s) - t0)) s"
  [ "$rc" -eq 0 ] || failed+=("$name")
}

step "ctest (ASan+UBSan)" bash -c "cd '$BUILD_DIR' && ctest --output-on-failure -j '$JOBS' --timeout 1200"
step "C API fuzzer, $CAPI_CASES cases, seed $SEED" "$BUILD_DIR/embscale_fuzz_capi" --cases "$CAPI_CASES" --seed "$SEED"
step "CLI fuzzer, $CLI_CASES cases, seed $SEED" python3 tests/fuzz/fuzz_cli.py --cli "$BUILD_DIR/embscale" \
  --cases "$CLI_CASES" --seed "$SEED" --jobs "$JOBS" --timeout 120

echo "sanitize.sh: $(($(date +%s) - start)) s in all (build $((built - start)) s)"
if [ ${#failed[@]} -gt 0 ]; then
  printf 'sanitize.sh: FAILED: %s\n' "${failed[@]}"
  exit 1
fi
echo "sanitize.sh: all passed"
