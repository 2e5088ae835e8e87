#!/usr/bin/env bash
# Compiles the GPU backend for AMD GPUs, without running it (no AMD GPU is needed): the library's HIP
# objects for gfx90a (CDNA, 64-lane wavefronts) and gfx1030 (RDNA, 32 lanes), one build each since the
# lane count is a compile-time constant of a build. Tests, tools and examples are left out: what is
# checked is that the one source compiles at both widths. Prints each build's wall time.
#   bash scripts/ci_hip_compile.sh [build-root]      (default: build-hip)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=${1:-build-hip}
bash scripts/install_hip.sh
JOBS=${EMBSCALE_JOBS:-2}
mkdir -p "$ROOT"
for arch in gfx90a gfx1030; do
  dir="$ROOT/$arch"
  cmake -S . -B "$dir" -G Ninja -DEMBSCALE_HIP=ON -DEMBSCALE_HIP_ARCHITECTURES="$arch" \
        -DEMBSCALE_BUILD_TESTS=OFF -DEMBSCALE_BUILD_TOOLS=OFF -DEMBSCALE_BUILD_EXAMPLES=OFF \
        -DEMBSCALE_BUILD_C_API=OFF > "$dir.configure.log"
  start=$(date +%s)
  cmake --build "$dir" --target embscale_hip_objects -j "$JOBS"
  echo "HIP backend compiled for $arch in $(( $(date +%s) - start )) s"
done
