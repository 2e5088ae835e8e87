#!/usr/bin/env bash
# Runs the tests of embscale under TorchRec (tests/python/test_torchrec.py: DistributedModelParallel on
# gloo, 1, 2 and 3 processes; tests/python/test_torchrec_twrw.py: table-row-wise and grid plans, 2 and 4
# processes as nodes of 1 and 2; tests/python/test_torchrec_sequence.py: the sequence collection, unsharded
# against torchrec's own and sharded on 2 and 3 processes; tests/python/test_torchrec_placement.py: FUSED_UVM
# and FUSED_UVM_CACHING plans, by hand and from TorchRec's planner, and TorchRec's prefetch;
# tests/python/test_torchrec_vbe.py: a batch size per feature, TorchRec's variable batch, unsharded against torchrec's
# own modules and sharded on 2 and 3 processes), of TorchRec's planner with embscale's estimators
# (tests/python/test_torchrec_planner.py), of embscale's sharded training against
# TorchRec's own FBGEMM FUSED kernels
# (tests/python/test_torchrec_matches_fbgemm.py), of replicated tables (tests/python/test_data_parallel.py)
# and of the FBGEMM-named API against FBGEMM's own CPU TBE (tests/python/test_fbgemm_peer.py;
# tests/python/test_fbgemm_migration.py, which checks docs/python.md's migration table by training both side by
# side; tests/python/test_tbe_quant.py: quantized tables against FBGEMM's CPU IntNBit TBE and row quantizer;
# tests/python/test_torchrec_quant.py: the quantized collection against TorchRec's) in a virtual
# environment with the pinned CPU triple (and the TorchRec and data-parallel ones again under torchrec 1.6.1, the oldest
# pyproject.toml accepts) of scripts/torchrec-cpu-requirements.txt. The environment lives
# in a cache folder outside the tree and is reused while its pins are unchanged (first run: a download of
# about 3 GB, since torch's wheel brings its CUDA libraries). Uses the library of build/ (built by
# scripts/test.sh), or EMBSCALE_LIBRARY.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TORCHREC=torchrec==1.9.2
PINS=scripts/torchrec-cpu-requirements.txt
KEY=$( (cat "$PINS"; echo "$TORCHREC") | sha256sum | cut -c1-12)
VENV=${EMBSCALE_TORCHREC_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/embscale/venv-torchrec-$KEY}
if ! "$VENV/bin/python" -c "import torchrec" 2>/dev/null; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q -r "$PINS"
  "$VENV/bin/pip" install -q --no-deps "$TORCHREC"
fi
LIB=${EMBSCALE_LIBRARY:-$ROOT/build/libembscale_c.so}
if [ ! -f "$LIB" ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DEMBSCALE_CUDA=OFF
  cmake --build build -j "$(nproc)" --target embscale_c
  LIB=$ROOT/build/libembscale_c.so
fi
EMBSCALE_LIBRARY="$LIB" PYTHONPATH="$ROOT/python" "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
  tests/python/test_torchrec.py tests/python/test_torchrec_twrw.py tests/python/test_torchrec_sequence.py \
  tests/python/test_torchrec_placement.py tests/python/test_torchrec_planner.py tests/python/test_torchrec_vbe.py \
  tests/python/test_torchrec_matches_fbgemm.py tests/python/test_data_parallel.py tests/python/test_fbgemm_peer.py \
  tests/python/test_fbgemm_migration.py tests/python/test_tbe_quant.py tests/python/test_torchrec_quant.py
# Again under the oldest TorchRec that pyproject.toml accepts (torchrec>=1.6.1), over the same FBGEMM: there
# embscale's collections take another path (TorchRec before 1.7 wraps data-parallel lookups in
# DistributedDataParallel inside its constructor). Its wheel goes into a folder of the environment, first on
# the path.
OLDEST=$VENV/torchrec-1.6.1
if [ ! -f "$OLDEST/torchrec/__init__.py" ]; then
  rm -rf "$OLDEST"
  "$VENV/bin/pip" install -q --no-deps --target "$OLDEST" torchrec==1.6.1
fi
echo "== the same under torchrec 1.6.1"
EMBSCALE_LIBRARY="$LIB" PYTHONPATH="$OLDEST:$ROOT/python" "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
  tests/python/test_torchrec.py tests/python/test_torchrec_twrw.py tests/python/test_torchrec_sequence.py \
  tests/python/test_torchrec_placement.py tests/python/test_torchrec_planner.py tests/python/test_torchrec_vbe.py \
  tests/python/test_data_parallel.py
