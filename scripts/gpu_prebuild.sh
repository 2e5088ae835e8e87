#!/usr/bin/env bash
# The GPU machine's libembscale_c.so, built here ahead of its calls (Release, sm_90a) and packed as
# .prebuilt/libembscale_c.tar.xz with a stamp of the sources it was built from. A fresh GPU machine spends about
# 3 minutes of device time building it (16 cores); a call that runs only Python (the Python tests, the
# benchmarks against torch or in-harness peers, the laboratory's profiles) carries the archive instead and
# unpacks it where the tree it runs on has the same sources, building as before where not.
#
#   scripts/gpu_prebuild.sh               build into build-gpu-prebuilt/ and pack .prebuilt/libembscale_c.tar.xz
#                                         (needs nvcc here: this machine's CUDA 13 toolkit is the GPU machine's;
#                                         about 20 minutes on 2 cores)
#   scripts/gpu_prebuild.sh --stamp       print this tree's stamp: a hash of every C++/CUDA source and CMake file
#                                         of the library (CMakeLists.txt, cmake/, src/, include/), and the build's
#                                         configuration
#   scripts/gpu_prebuild.sh --unpack DIR  unpack the archive into DIR when its stamp is this tree's (exit 0);
#                                         exit 1, leaving DIR alone, when there is no archive or it is of other
#                                         sources (a stale build never runs)
#
# The archive holds libembscale_c.so and the stamp (CUDA's runtime is linked statically: it needs only the driver
# there). Its 34 MB and the tree's 12 fit a call's 64 MiB with TorchRec's wheels and FBGEMM's inference archive,
# not with FBGEMM's main one (48 MB); the programs (embscale, embscale_tests: each as large again) are built
# there. In a call, carry it (`carry: [".prebuilt/libembscale_c.tar.xz", ...]`) and begin with
#   bash scripts/gpu_prebuild.sh --unpack /tmp/b || cmake --build ... (as scripts/gpu_run.sh builds)
# then EMBSCALE_LIBRARY=/tmp/b/libembscale_c.so.
# Environment: PREBUILT (the archive, default .prebuilt/libembscale_c.tar.xz), PREBUILD_DIR (default
# build-gpu-prebuilt), EMBSCALE_JOBS (default: nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PREBUILT=${PREBUILT:-$ROOT/.prebuilt/libembscale_c.tar.xz}
PREBUILD_DIR=${PREBUILD_DIR:-$ROOT/build-gpu-prebuilt}
CONFIG="Release sm_90a"  # (the configuration below; part of the stamp)
FILES=(libembscale_c.so)

# The stamp: sha256 over each build input's path and content, in path order, and the configuration.
stamp() {
  local inputs=() p
  for p in CMakeLists.txt cmake src include; do [ -e "$p" ] && inputs+=("$p"); done
  {
    echo "$CONFIG"
    find "${inputs[@]}" -type f \
      \( -name '*.cu' -o -name '*.cuh' -o -name '*.cpp' -o -name '*.cc' -o -name '*.c' -o -name '*.h' \
         -o -name '*.hpp' -o -name '*.cmake' -o -name 'CMakeLists.txt' -o -name '*.in' \) \
      | LC_ALL=C sort | while IFS= read -r f; do
        printf '%s %s\n' "$(sha256sum <"$f" | cut -c1-64)" "$f"
      done
  } | sha256sum | cut -c1-64
}

case ${1:-} in
  --stamp)
    stamp
    exit 0
    ;;
  --unpack)
    dir=${2:?"--unpack DIR"}
    [ -f "$PREBUILT" ] || { echo "prebuilt: no ${PREBUILT#"$ROOT"/}; building"; exit 1; }
    want=$(stamp)
    # The archive's stamp, read without unpacking the rest.
    have=$(python3 -c 'import sys,tarfile; print(tarfile.open(sys.argv[1], "r:xz").extractfile("STAMP").read().decode().strip())' \
      "$PREBUILT" 2>/dev/null || true)
    if [ "$have" != "$want" ]; then
      echo "prebuilt: ${PREBUILT#"$ROOT"/} is of other sources (stamp ${have:-unreadable}, this tree $want); building"
      exit 1
    fi
    mkdir -p "$dir"
    python3 -c 'import sys,tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' "$PREBUILT" "$dir"
    echo "prebuilt: unpacked ${PREBUILT#"$ROOT"/} (stamp $want) into $dir"
    exit 0
    ;;
  "") ;;
  *)
    echo "usage: scripts/gpu_prebuild.sh [--stamp | --unpack DIR]" >&2
    exit 2
    ;;
esac

command -v nvcc >/dev/null || { echo "gpu_prebuild: nvcc is not on PATH here" >&2; exit 1; }
gen="Unix Makefiles"
command -v ninja >/dev/null && gen=Ninja
cmake -S . -B "$PREBUILD_DIR" -G "$gen" -DCMAKE_BUILD_TYPE=Release -DEMBSCALE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
cmake --build "$PREBUILD_DIR" -j "${EMBSCALE_JOBS:-$(nproc)}" --target embscale_c
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
for f in "${FILES[@]}"; do cp -L "$PREBUILD_DIR/$f" "$stage/$f"; done
stamp >"$stage/STAMP"
mkdir -p "$(dirname "$PREBUILT")"
tar -C "$stage" -cf - STAMP "${FILES[@]}" | xz -T0 -6 >"$PREBUILT.part"
mv "$PREBUILT.part" "$PREBUILT"
echo "gpu_prebuild: ${PREBUILT#"$ROOT"/}: $(du -h "$PREBUILT" | cut -f1) (stamp $(cat "$stage/STAMP"))"
