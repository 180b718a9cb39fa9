#!/usr/bin/env bash
# All tests: installs what it needs, builds with -Werror, runs every CTest test (unit, mpirun -np 4/8 on the host
# backend, network-namespace topology, the find_package consumer, formatting), then the sanitizer jobs
# (scripts/sanitize.sh: ASan+UBSan and TSan builds running the unit and MPI suites) and the fuzzers (scripts/fuzz.sh).
#   scripts/test.sh [CTEST_ARGS...]
# KVCOMM_TEST_JOBS picks the jobs (default "ctest sanitize fuzz"); CTEST_ARGS go to the ctest job. Every job runs
# even when an earlier one failed; the exit status is non-zero when any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
status=0
summary=()
counts=""
for job in ${KVCOMM_TEST_JOBS:-ctest sanitize fuzz}; do
  start=$SECONDS
  rc=0
  echo "=== test.sh: $job"
  case $job in
    ctest)
      # The options the tests need, applied on top of whatever the build directory's cache holds (a user's own
      # configure of the same directory, e.g. the guide's Release build with tests off, must not break this script).
      if ./scripts/build.sh -DKVCOMM_BUILD_TESTS=ON -DKVCOMM_BUILD_TOOLS=ON -DKVCOMM_BUILD_PERF=ON; then
        dir=${KVCOMM_BUILD_DIR:-build}
        junit="$PWD/$dir/ctest-results.xml"
        [[ "$dir" = /* ]] && junit="$dir/ctest-results.xml"
        rm -f "$junit" "$dir/ctest.log"
        # A line a minute while tests run: some take minutes (the Python venv, the sanitizer-free MPI suites).
        (
          t=0
          while sleep 60; do
            t=$((t + 1))
            done_=$(grep -cE '^ *[0-9]+/[0-9]+ Test' "$dir/ctest.log" 2>/dev/null || true)
            echo "test.sh: ctest running for $t min, ${done_:-0} tests finished"
          done
        ) &
        ticker=$!
        ctest --test-dir "$dir" --output-on-failure -j 2 --output-junit "$junit" "$@" 2>&1 | tee "$dir/ctest.log"
        [ "${PIPESTATUS[0]}" = 0 ] || rc=1
        kill "$ticker" 2>/dev/null
        wait "$ticker" 2>/dev/null
        echo "=== test.sh: ctest summary"
        python3 scripts/ctest_summary.py "$junit" >"$dir/ctest-summary.txt"
        cat "$dir/ctest-summary.txt"
        counts=$(tail -1 "$dir/ctest-summary.txt")
      else
        rc=1
      fi
      ;;
    sanitize) ./scripts/sanitize.sh || rc=1 ;;
    fuzz) ./scripts/fuzz.sh || rc=1 ;;
    *) echo "test.sh: unknown job '$job' in KVCOMM_TEST_JOBS (ctest, sanitize, fuzz)"; rc=2 ;;
  esac
  secs=$((SECONDS - start))
  summary+=("$(printf '%-9s %s in %d min %02d s' "$job:" "$([ $rc = 0 ] && echo passed || echo FAILED)" $((secs / 60)) \
    $((secs % 60)))")
  [ $rc = 0 ] || status=1
done
echo "=== test.sh summary"
printf '  %s\n' "${summary[@]}"
# Last, the counts of the ctest job (skipped tests are counted apart and named above, never as passed).
[ -n "$counts" ] && echo "$counts"
exit $status
