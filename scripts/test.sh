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
for job in ${KVCOMM_TEST_JOBS:-ctest sanitize fuzz}; do
  start=$SECONDS
  rc=0
  echo "=== test.sh: $job"
  case $job in
    ctest)
      # The options the tests need, applied on top of whatever the build directory's cache holds (a user's own
      # configure of the same directory, e.g. the guide's Release build with tests off, must not break this script).
      if ./scripts/build.sh -DKVCOMM_BUILD_TESTS=ON -DKVCOMM_BUILD_TOOLS=ON -DKVCOMM_BUILD_PERF=ON; then
        ctest --test-dir "${KVCOMM_BUILD_DIR:-build}" --output-on-failure -j 2 "$@" || rc=1
      else
        rc=1
      fi
      ;;
    sanitize) ./scripts/sanitize.sh || rc=1 ;;
    fuzz) ./scripts/fuzz.sh || rc=1 ;;
    *) echo "test.sh: unknown job '$job' in KVCOMM_TEST_JOBS (ctest, sanitize, fuzz)"; rc=2 ;;
  esac
  summary+=("$job: $([ $rc = 0 ] && echo passed || echo FAILED) in $((SECONDS - start)) s")
  [ $rc = 0 ] || status=1
done
echo "=== test.sh summary"
printf '  %s\n' "${summary[@]}"
exit $status
