#!/usr/bin/env bash
# Installs the build dependencies from Debian's packages when they are missing: a C++17 compiler,
# CMake, Ninja, GoogleTest, CLI11 and nlohmann-json. The CUDA toolkit is optional (the CPU backend,
# CLI and tests build without it).
#
# --python: also what the Python package's tests need, from the Python package registry when missing:
# torch, pytest, hypothesis (the property-based fuzz tests) and numpy (matplotlib too, for the example's plot).
set -euo pipefail
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v g++ >/dev/null || need+=(g++)
[ -f /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)
[ -f /usr/include/CLI/CLI.hpp ] || need+=(libcli11-dev)
[ -f /usr/include/nlohmann/json.hpp ] || need+=(nlohmann-json3-dev)
if [ "${1:-}" = "--python" ]; then
  command -v python3 >/dev/null || need+=(python3 python3-pip python3-venv)
fi
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}"
fi
if [ "${1:-}" = "--python" ]; then
  pip_need=()
  for mod in torch pytest hypothesis numpy matplotlib; do
    python3 -c "import $mod" 2>/dev/null || pip_need+=("$mod")
  done
  if [ ${#pip_need[@]} -gt 0 ]; then
    python3 -m pip install -q "${pip_need[@]}"
  fi
fi
