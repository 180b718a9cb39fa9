#!/usr/bin/env bash
# The fuzzing job of CI: builds the libFuzzer targets of fuzz/ (clang, ASan + UBSan, host backend only) into
# ${KVCOMM_BUILD_DIR:-build}-fuzz and runs each for KVCOMM_FUZZ_SECONDS seconds (default 20) over its checked-in
# corpus (fuzz/corpus/<target>, read only: new inputs go to the build directory). A crash, leak, sanitizer report or
# broken invariant fails the job; the input that caused it is kept as <build>-fuzz/artifacts/<target>-crash-*.
#   scripts/fuzz.sh [TARGET...]          (default: every target fuzz/CMakeLists.txt lists)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
dir=${KVCOMM_BUILD_DIR:-build}-fuzz
secs=${KVCOMM_FUZZ_SECONDS:-20}
[[ "$secs" =~ ^[0-9]+$ ]] && [ "$secs" -gt 0 ] || { echo "fuzz.sh: KVCOMM_FUZZ_SECONDS='$secs' is not a positive integer"; exit 2; }
command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ is not installed (scripts/install-deps.sh)"; exit 1; }
# clang for a fresh directory only (an existing one keeps its compiler).
[ -f "$dir/CMakeCache.txt" ] || export CC=clang CXX=clang++
# -O1 -g1: half the compile time of -O2 -g, line tables kept for the reports. Warnings are not errors here: the GCC
# builds are the -Werror gate; clang's own extra warnings must not stop fuzzing.
KVCOMM_BUILD_DIR=$dir ./scripts/build.sh -DKVCOMM_BUILD_FUZZERS=ON -DKVCOMM_CUDA=OFF -DKVCOMM_BUILD_TESTS=OFF \
  -DKVCOMM_BUILD_TOOLS=OFF -DKVCOMM_BUILD_PERF=OFF -DKVCOMM_BUILD_PYTHON=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
  -DKVCOMM_WERROR=OFF || exit 1
targets=("$@")
[ ${#targets[@]} -eq 0 ] && read -r -a targets <<<"$(tr ';' ' ' <"$dir/fuzz/fuzzers.txt")"
mkdir -p "$dir/artifacts"
status=0
for t in "${targets[@]}"; do
  [ -x "$dir/fuzz/fuzz_$t" ] || { echo "fuzz.sh: no target '$t'"; status=1; continue; }
  [ -d "$root/fuzz/corpus/$t" ] || { echo "fuzz.sh: no corpus fuzz/corpus/$t"; status=1; continue; }
  work="$dir/corpus/$t"
  mkdir -p "$work"
  log="$dir/fuzz-$t.log"
  ASAN_OPTIONS="detect_leaks=1" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    "$dir/fuzz/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$dir/artifacts/$t-" "$work" "$root/fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  if [ $rc = 0 ]; then
    echo "fuzz $t: ok, ${runs:-?} inputs in ${secs} s (${cov:-cov ?})"
  else
    echo "fuzz $t: FAILED (exit $rc) after ${runs:-?} inputs; log $log; artifacts:"
    ls "$dir/artifacts" | grep "^$t-" || true
    grep -E "ERROR|SUMMARY|invariant|runtime error" "$log" | head -20
    status=1
  fi
done
exit $status
