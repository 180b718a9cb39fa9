#!/usr/bin/env bash
# Installs the Debian packages kvcomm needs to build and test (idempotent: installs only what is missing).
# apt-get as root, sudo otherwise. The CUDA toolkit is optional (/usr/local/cuda): without nvcc kvcomm builds its
# host backend only.
set -euo pipefail
# clang and its runtime libraries (libFuzzer) build the fuzz targets (scripts/fuzz.sh); GCC's sanitizer runtimes come
# with build-essential (scripts/sanitize.sh).
pkgs=(build-essential cmake git libgtest-dev googletest libopenmpi-dev openmpi-bin libibverbs-dev iproute2
      clang-format python3 python3-venv python3-dev clang libclang-rt-14-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" != 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install ${missing[*]}"; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
