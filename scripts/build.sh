#!/usr/bin/env bash
# Configures and builds kvcomm into ${KVCOMM_BUILD_DIR:-build} (warnings are errors). Extra args go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${KVCOMM_BUILD_DIR:-build}
gen=()
command -v ninja >/dev/null && [ ! -f "$dir/Makefile" ] && gen=(-G Ninja)
mkdir -p "$dir"
cmake -S . -B "$dir" "${gen[@]}" -DKVCOMM_WERROR=ON "$@" >"$dir/configure.log" 2>&1 || { cat "$dir/configure.log"; exit 1; }
cmake --build "$dir" -j "$(nproc)"
