#!/usr/bin/env bash
# Builds the TransformerEngine peer harness (te_fp8_peer.cpp) against TE's C API and embscale's CUDA build.
#
#   bench/te_peer/build.sh TE_DIR [EMBSCALE_BUILD_DIR] [OUTPUT]
#
# TE_DIR: the folder holding TE's `transformer_engine/` package (the transformer-engine-cu13 wheel unpacked):
#   headers in TE_DIR/transformer_engine/common/include, libtransformer_engine.so anywhere below it.
# EMBSCALE_BUILD_DIR: a build with -DEMBSCALE_CUDA=ON holding libembscale.a (default: build-gpu).
# OUTPUT: the binary (default: EMBSCALE_BUILD_DIR/te_fp8_peer).
# TE_VERSION names TE's version in the records (default: from the wheel's dist-info, when there is one).
# COMPILE_ONLY=1 compiles the object file only (no TE library or embscale build needed), a check on a
# machine without the GPU.
#
# The binary finds TE's library through its run path; TE's own CUDA dependencies (cuBLAS, cuDNN, NVRTC of
# CUDA 13) come from LD_LIBRARY_PATH at run time (torch's nvidia packages; scripts/h200_peers.sh sets it).
# The harness and TE share one CUDA runtime (libcudart.so.13, linked shared), so device pointers, streams
# and events are the same for both.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
if [ $# -lt 1 ] || [ ! -d "$1" ]; then
  echo "usage: $0 TE_DIR [EMBSCALE_BUILD_DIR] [OUTPUT]   (TE_DIR: the folder holding transformer_engine/)" >&2
  exit 2
fi
TE_DIR=$(cd "$1" && pwd)
BUILD_DIR=${2:-$ROOT/build-gpu}
OUTPUT=${3:-$BUILD_DIR/te_fp8_peer}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
TE_INC=$TE_DIR/transformer_engine/common/include
[ -f "$TE_INC/transformer_engine/transformer_engine.h" ] || { echo "error: TE_DIR: no $TE_INC/transformer_engine/transformer_engine.h" >&2; exit 2; }

# TE's version, recorded in every record: $TE_VERSION when set, else the wheel's metadata when unpacked with it.
if [ -z "${TE_VERSION:-}" ]; then
  TE_VERSION=$(cat "$TE_DIR"/transformer_engine*.dist-info/METADATA 2>/dev/null | sed -n "s/^Version: //p" | head -n 1 || true)
fi
TE_VERSION=${TE_VERSION:-unknown}

FLAGS=(-std=c++17 -O2 -I"$ROOT/include" -I"$TE_INC" "-DTE_PEER_VERSION=\"$TE_VERSION\"" -Xcompiler -Wall)
if [ "${COMPILE_ONLY:-0}" = 1 ]; then
  mkdir -p "$(dirname "$OUTPUT")"
  "$NVCC" "${FLAGS[@]}" -c "$HERE/te_fp8_peer.cpp" -o "$OUTPUT.o"
  echo "compiled $OUTPUT.o (TransformerEngine $TE_VERSION)"
  exit 0
fi

[ -f "$BUILD_DIR/libembscale.a" ] || { echo "error: no $BUILD_DIR/libembscale.a (configure with -DEMBSCALE_CUDA=ON and build)" >&2; exit 2; }
TE_LIB=$(find "$TE_DIR" -name 'libtransformer_engine.so' -print -quit)
[ -n "$TE_LIB" ] || { echo "error: no libtransformer_engine.so below $TE_DIR" >&2; exit 2; }
TE_LIB_DIR=$(dirname "$TE_LIB")
CUDA_LIB=$(dirname "$(dirname "$NVCC")")/lib64
mkdir -p "$(dirname "$OUTPUT")"
# libembscale.a's CUDA sources are not separately compiled, so no device link step is needed; its CPU
# backend uses OpenMP. TE's library names symbols of CUDA libraries that are found at run time only.
"$NVCC" "${FLAGS[@]}" "$HERE/te_fp8_peer.cpp" -o "$OUTPUT" -cudart shared \
  "$BUILD_DIR/libembscale.a" -Xcompiler -fopenmp \
  -L"$TE_LIB_DIR" -ltransformer_engine -Xlinker -rpath -Xlinker "$TE_LIB_DIR" \
  -L"$CUDA_LIB" -lnvrtc -Xlinker --allow-shlib-undefined
echo "built $OUTPUT (TransformerEngine $TE_VERSION from $TE_LIB_DIR)"
