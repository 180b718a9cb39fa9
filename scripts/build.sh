#!/usr/bin/env bash
# Configures and builds kvcomm into ${KVCOMM_BUILD_DIR:-build} (warnings are errors).
#   scripts/build.sh [--target NAME]... [CMAKE_ARGS...]
# --target builds only that target (repeatable; default: everything); other arguments go to the cmake configure step.
# A directory the user configured by hand is reused: its generator and cache stay, the arguments given here are
# applied on top (test.sh and run.sh pass the options they need, so a cache with tests or tools off cannot break them).
# Errors of configure and compile go to stdout and the exit status is non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${KVCOMM_BUILD_DIR:-build}
targets=()
names=()
args=()
while [ $# -gt 0 ]; do
  case $1 in
    --target)
      [ $# -ge 2 ] || { echo "build.sh: --target needs a name"; exit 2; }
      targets+=(--target "$2"); names+=("$2"); shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
gen=()
# A fresh directory gets Ninja where it is installed, and a Release build unless the arguments name a build type
# (the guide's own configure is Release, so the main job's build and a later hand configure share their objects);
# an existing one keeps the generator and build type it was configured with.
if [ ! -f "$dir/CMakeCache.txt" ]; then
  command -v ninja >/dev/null && gen=(-G Ninja)
  [[ " ${args[*]} " == *" -DCMAKE_BUILD_TYPE="* ]] || gen+=(-DCMAKE_BUILD_TYPE=Release)
fi
mkdir -p "$dir"
echo "build.sh: configuring $dir (log: $dir/configure.log)"
cmake -S . -B "$dir" "${gen[@]}" -DKVCOMM_WERROR=ON "${args[@]}" >"$dir/configure.log" 2>&1 ||
  { cat "$dir/configure.log"; echo "build.sh: configure failed (log: $dir/configure.log)"; exit 1; }
echo "build.sh: building ${names[*]:-everything} in $dir"
cmake --build "$dir" -j "$(nproc)" "${targets[@]}" || { echo "build.sh: build failed (errors above)"; exit 1; }
