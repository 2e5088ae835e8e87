#!/usr/bin/env bash
# Unpacks, on the GPU machine, whatever part of .peers/ this call carried (shared/peers/README.md says what
# the archives are and how they are made), each only where /tmp does not hold it yet (/tmp outlives a call
# while the machine is kept warm, ~30 s between calls):
#   .peers/zstandard-*.whl              -> /tmp/site      (what unpacks the archives; skipped where python3
#                                                          imports zstandard already)
#   .peers/fbgemm_sm90.tar.zst          -> /tmp/fb        (FBGEMM 1.6 training; test: fbgemm_gpu/__init__.py)
#   .peers/fbgemm_inference_sm90.tar.zst -> /tmp/fb       (its inference library, which TorchRec imports;
#                                                          test: fbgemm_gpu/fbgemm_gpu_tbe_inference.so)
#   (either archive may come as .tar.xz instead, made by scripts/peers_xz.sh: Python's own tarfile unpacks
#   it, so a call carrying it needs no zstandard wheel)
#   .peers/torchrec/*.whl               -> /tmp/trsite    (TorchRec 1.6.1 and its pure-Python dependencies;
#                                                          test: torchrec/__init__.py)
# Each piece is unpacked into a folder beside its target and moved into place when complete, the tested
# file last, so a call cut off mid-way leaves nothing that passes for unpacked. Prints what it did and what
# /tmp holds after; exits non-zero only when an unpack failed (a piece neither carried nor there is
# reported, not an error: scripts/gpu_run.sh's nccl stage reports TorchRec missing as its failure).
# TorchRec then imports with PYTHONPATH=/tmp/fb:/tmp/trsite (the nccl stage adds them itself).
#
# FBGEMM's two archives and the project exceed one call's 64 MiB: carry the main archive (as .tar.xz, with
# TorchRec's wheels) in one call and the inference archive in the next, while the machine is warm (the
# recipe in scripts/gpu_run.sh). As .tar.zst each also needs the zstandard wheel, which does not fit beside
# the main archive.
#
# Environment: PEERS (default: .peers in the repository root), UNPACK_TO (default: /tmp; the folders above
# are under it).
set -uo pipefail
cd "$(dirname "$0")/.." || exit
PEERS=${PEERS:-$PWD/.peers}
TO=${UNPACK_TO:-/tmp}
FB=$TO/fb
TRSITE=$TO/trsite
SITE=$TO/site
FAILED=0
mkdir -p "$TO"
X='import zstandard,tarfile,sys;d=zstandard.ZstdDecompressor(max_window_size=2**31);tarfile.open(fileobj=d.stream_reader(open(sys.argv[1],"rb")),mode="r|").extractall(sys.argv[2])'
X_XZ='import tarfile,sys;tarfile.open(sys.argv[1],mode="r:xz").extractall(sys.argv[2])'

say() { echo "peers: $*"; }

export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1

# zstandard: the interpreter's own, or /tmp/site, or installed there from the carried wheel; prints the
# folder to put on PYTHONPATH (empty for the interpreter's own), or why there is none (status 1).
zstd_path() {
  if python3 -c "import zstandard" 2>/dev/null; then echo ""; return 0; fi
  if [ -d "$SITE/zstandard" ]; then echo "$SITE"; return 0; fi
  local whls=("$PEERS"/zstandard-*.whl) whl
  whl=${whls[0]}
  if [ ! -f "$whl" ]; then
    echo "no zstandard: python3 lacks it, $SITE lacks it, and no $PEERS/zstandard-*.whl was carried"
    return 1
  fi
  if ! python3 -m pip install -q --no-index --no-deps --target "$SITE" "$whl" >&2; then
    echo "no zstandard: installing $(basename "$whl") to $SITE failed"
    return 1
  fi
  say "zstandard installed to $SITE from $(basename "$whl")" >&2
  echo "$SITE"
}

# unpack_archive NAME BASE TEST_FILE (relative to $FB): BASE.tar.zst, or BASE.tar.xz (scripts/peers_xz.sh; the
# interpreter unpacks it without the zstandard wheel), a tar of fbgemm_gpu/, into $FB.
unpack_archive() {
  local name=$1 base=$2 test=$3 archive
  if [ -f "$FB/$test" ]; then say "$name: $FB/$test exists; not unpacked again"; return 0; fi
  archive=$base.tar.zst
  [ -f "$archive" ] || archive=$base.tar.xz
  if [ ! -f "$archive" ]; then say "$name: not carried ($base.tar.zst or .tar.xz absent) and not in $FB"; return 0; fi
  local zp="" stage t0 unpack=$X
  if [ "${archive%.xz}" != "$archive" ]; then
    unpack=$X_XZ
  elif ! zp=$(zstd_path); then
    say "$name: FAILED: $zp"
    FAILED=1
    return 1
  fi
  t0=$(date +%s)
  stage=$(mktemp -d "$TO/fb.unpack.XXXXXX") || { say "$name: FAILED: no folder could be made under $TO"; FAILED=1; return 1; }
  if ! PYTHONPATH="$zp${PYTHONPATH:+:$PYTHONPATH}" python3 -c "$unpack" "$archive" "$stage"; then
    say "$name: FAILED to unpack $archive"
    rm -rf "$stage"
    FAILED=1
    return 1
  fi
  # Into place, the tested file last (a folder of the archive that $FB lacks moves whole).
  mkdir -p "$FB/fbgemm_gpu"
  local f
  for f in "$stage"/fbgemm_gpu/* "$stage"/fbgemm_gpu/.[!.]*; do
    [ -e "$f" ] || continue
    [ "fbgemm_gpu/$(basename "$f")" = "$test" ] && continue
    rm -rf "$FB/fbgemm_gpu/$(basename "$f")"
    mv "$f" "$FB/fbgemm_gpu/"
  done
  if [ -e "$stage/$test" ]; then mv "$stage/$test" "$FB/$test"; fi
  rm -rf "$stage"
  if [ -f "$FB/$test" ]; then
    say "$name: unpacked $(basename "$archive") to $FB in $(($(date +%s) - t0))s"
  else
    say "$name: FAILED: $(basename "$archive") holds no $test"
    FAILED=1
  fi
}

unpack_torchrec() {
  if [ -f "$TRSITE/torchrec/__init__.py" ]; then say "torchrec: $TRSITE/torchrec exists; not installed again"; return 0; fi
  local wheels=("$PEERS"/torchrec/*.whl)
  if [ ! -f "${wheels[0]}" ]; then say "torchrec: not carried ($PEERS/torchrec/*.whl absent) and not in $TRSITE"; return 0; fi
  local stage
  stage=$(mktemp -d "$TO/trsite.unpack.XXXXXX") || { say "torchrec: FAILED: no folder could be made under $TO"; FAILED=1; return 1; }
  if ! python3 -m pip install -q --no-index --no-deps --target "$stage" "${wheels[@]}"; then
    say "torchrec: FAILED to install ${#wheels[@]} wheels from $PEERS/torchrec"
    rm -rf "$stage"
    FAILED=1
    return 1
  fi
  rm -rf "$TRSITE"
  mv "$stage" "$TRSITE"
  say "torchrec: installed ${#wheels[@]} wheels (${wheels[*]##*/}) to $TRSITE"
}

unpack_archive "FBGEMM" "$PEERS/fbgemm_sm90" fbgemm_gpu/__init__.py
unpack_archive "FBGEMM inference" "$PEERS/fbgemm_inference_sm90" fbgemm_gpu/fbgemm_gpu_tbe_inference.so
unpack_torchrec

have() { [ -e "$1" ] && echo yes || echo no; }
say "state: FBGEMM $(have "$FB/fbgemm_gpu/__init__.py"), FBGEMM inference $(have "$FB/fbgemm_gpu/fbgemm_gpu_tbe_inference.so"), TorchRec $(have "$TRSITE/torchrec/__init__.py")"
missing=()
[ -f "$FB/fbgemm_gpu/__init__.py" ] || missing+=(.peers/fbgemm_sm90.tar.zst/.xz)
[ -f "$FB/fbgemm_gpu/fbgemm_gpu_tbe_inference.so" ] || missing+=(.peers/fbgemm_inference_sm90.tar.zst/.xz)
[ -f "$TRSITE/torchrec/__init__.py" ] || missing+=(.peers/torchrec)
if [ ${#missing[@]} -gt 0 ]; then
  say "TorchRec is not usable yet: /tmp lacks ${missing[*]}; carry them while the machine is warm, each call with" \
    "FBGEMM's two archives in separate calls (the recipe in scripts/gpu_run.sh's header)"
else
  say "TorchRec is usable: PYTHONPATH=$FB:$TRSITE"
fi
exit $FAILED
