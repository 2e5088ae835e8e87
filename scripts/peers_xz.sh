#!/usr/bin/env bash
# Re-packs FBGEMM's archives in .peers/ (fbgemm_sm90.tar.zst, fbgemm_inference_sm90.tar.zst; how they are made:
# shared/peers/README.md) as .tar.xz beside them. The GPU machine's Python unpacks .tar.xz with its own tarfile
# (scripts/gpu_peers_unpack.sh), so a call that carries one needs no zstandard wheel: the main archive as .xz
# (48 MB) travels with the tree and TorchRec's wheels in one call. Needs zstd and xz here; ~2 minutes on 2 cores.
# Usage: scripts/peers_xz.sh [PEERS]   (default: .peers in the repository root)
set -euo pipefail
cd "$(dirname "$0")/.."
peers=${1:-.peers}
for name in fbgemm_sm90 fbgemm_inference_sm90; do
  src=$peers/$name.tar.zst
  if [ ! -f "$src" ]; then echo "$src: absent, skipped"; continue; fi
  zstd -q -dc --long=31 "$src" | xz -9 -T0 >"$peers/$name.tar.xz.part"
  mv "$peers/$name.tar.xz.part" "$peers/$name.tar.xz"
  echo "$peers/$name.tar.xz: $(stat -c %s "$peers/$name.tar.xz") bytes (from $(stat -c %s "$src"))"
done
