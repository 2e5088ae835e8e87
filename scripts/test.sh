#!/usr/bin/env bash
# Builds (CPU backend, plus CUDA when nvcc is present and EMBSCALE_CUDA allows) and runs the test suite.
# CUDA tests skip themselves when no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEMBSCALE_CUDA="${EMBSCALE_CUDA:-AUTO}"
cmake --build "$BUILD_DIR" -j "$(nproc)"
cd "$BUILD_DIR" && ctest --output-on-failure -j "$(nproc)"
