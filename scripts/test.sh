#!/usr/bin/env bash
# Builds (CPU backend, plus CUDA when nvcc and a GPU are present, or EMBSCALE_CUDA=ON) and runs the test suite:
# the C++ tests and examples (ctest), then the Python package's tests (pytest, against the library just
# built) when torch and pytest are installed. CUDA tests skip themselves when no GPU is present.
# EMBSCALE_REQUIRE_PYTHON=1 makes missing torch/pytest an error instead of a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEMBSCALE_CUDA="${EMBSCALE_CUDA:-AUTO}"
cmake --build "$BUILD_DIR" -j "$(nproc)"
(cd "$BUILD_DIR" && ctest --output-on-failure -j "$(nproc)")
if python3 -c "import torch, pytest" 2>/dev/null; then
  EMBSCALE_LIBRARY="$ROOT/$BUILD_DIR/libembscale_c.so" PYTHONPATH="$ROOT/python" \
    python3 -m pytest -q -p no:cacheprovider tests/python
elif [ "${EMBSCALE_REQUIRE_PYTHON:-0}" = 1 ]; then
  echo "error: the Python tests need torch and pytest (bash scripts/install_deps.sh --python)" >&2
  exit 1
else
  echo "Python tests skipped: torch and pytest are not installed (bash scripts/install_deps.sh --python)"
fi
