#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ (clang, ASan + UBSan, host backend) in ${KVCOMM_BUILD_DIR:-build}-fuzz and runs
# each from its seeds for a bounded time; a crash or failed invariant stops the script (libFuzzer saves the input).
#   scripts/fuzz.sh [SECONDS per target, default 60]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
dir=${KVCOMM_BUILD_DIR:-build}-fuzz
command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ is needed (libFuzzer)"; exit 1; }
# Warnings are errors in the GCC builds CI makes; clang's extra warnings are not this job's subject (KVCOMM_WERROR=OFF).
CC=clang CXX=clang++ KVCOMM_BUILD_DIR=$dir ./scripts/build.sh -DKVCOMM_BUILD_FUZZERS=ON -DKVCOMM_CUDA=OFF \
  -DKVCOMM_WERROR=OFF -DKVCOMM_BUILD_TESTS=OFF -DKVCOMM_BUILD_TOOLS=OFF -DKVCOMM_BUILD_PERF=OFF
for name in $(cat "$dir/fuzz/fuzzers.txt"); do
  corpus=$dir/fuzz/corpus/$name  # a copy of the checked-in seeds: libFuzzer adds what it finds there
  mkdir -p "$corpus"
  cp -r "fuzz/corpus/$name/." "$corpus"
  echo "== fuzz_$name for $secs s"
  "$dir/fuzz/fuzz_$name" -max_total_time="$secs" -print_final_stats=1 "$corpus"
done
