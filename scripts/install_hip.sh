#!/usr/bin/env bash
# Installs the AMD GPU toolchain that the HIP build (-DEMBSCALE_HIP=ON) needs, from Debian's packages when
# missing: hipcc (clang with the HIP runtime headers, ROCm 5.2 in Debian 12) and rocPRIM's headers (the
# radix sort, run-length encode and scans that CUB does on NVIDIA; hipCUB is not packaged in Debian 12).
# No AMD GPU is needed: this is enough to compile the GPU backend for gfx90a and gfx1030. gfx942 (MI300)
# and gfx950 (MI350) need a newer ROCm than Debian packages (docs/building.md).
set -euo pipefail
need=()
command -v hipcc >/dev/null || need+=(hipcc)
[ -f /usr/include/rocprim/rocprim.hpp ] || need+=(librocprim-dev)
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
hipcc --version | head -n 3
