#!/usr/bin/env bash
# The sanitizer jobs of CI: the library and its test binaries built with AddressSanitizer + UndefinedBehaviorSanitizer
# and with ThreadSanitizer (GCC, host backend only: KVCOMM_CUDA=OFF), each running the unit suite (every test of
# kvcomm_unit_tests, CTest label "unit") and the MPI suite at 4 ranks (the mpi.host.np4 cases, through
# tests/mpi/run_mpi_test.sh); under ASan also the 8-rank one (mpi.layout.np8) and the arena tests' host cases. Any
# report fails the job.
# The asan job also runs the C ABI step: the C tests (tests/capi: capi.c11.np4, the property test capi.props.np4)
# and the replay of the C ABI fuzz target (fuzz/capi_calls.c), built from C against the ASan + UBSan library with
# -fno-sanitize-recover=all, so that undefined behaviour reached through the C ABI (an out-of-range enum loaded as
# its type, an unchecked count) stops the test and fails the job. `capi` runs that step alone (same build directory).
#   scripts/sanitize.sh [asan] [tsan] [capi]        (default: asan tsan)
# Build directories: ${KVCOMM_BUILD_DIR:-build}-asan and -tsan. Only third-party runtimes are suppressed, in the
# files of tests/sanitizers/ (each entry says why).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
base=${KVCOMM_BUILD_DIR:-build}
jobs=("$@")
[ ${#jobs[@]} -eq 0 ] && jobs=(asan tsan)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# Open MPI keeps its components loaded, so that leak and race stacks through them can be matched by library name.
export OMPI_MCA_mca_base_component_disable_dlclose=1
# -O1 -g1: line tables for the reports' stacks, about half the compile time of RelWithDebInfo's -O2 -g (most
# of each job is compiling: CI's 45-minute budget).
common=(-DKVCOMM_CUDA=OFF -DKVCOMM_BUILD_TESTS=ON -DKVCOMM_BUILD_TOOLS=OFF -DKVCOMM_BUILD_PERF=OFF
        -DKVCOMM_BUILD_PYTHON=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
        "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG")
targets=(--target kvcomm_unit_tests --target kvcomm_mpi_tests)
# The arena and endpoint tests run under ASan only (processes and lifetimes; TSan sees their threads through the
# unit suite's servers).
asanTargets=(--target kvcomm_arena_tests --target kvcomm_endpoint_tests)
# The C ABI step's programs: C11 tests, and the fuzz target's replay driver (tests/capi, fuzz/CMakeLists.txt).
capiTargets=(--target kvcomm_capi_test --target kvcomm_capi_props --target fuzz_capi_calls_replay)
# UBSan already stops at the first finding (CMakeLists.txt); -fno-sanitize-recover=all makes every sanitizer do so.
asanFlags=(-DKVCOMM_ENABLE_ASAN=ON -DKVCOMM_ENABLE_UBSAN=ON -DKVCOMM_ENABLE_TSAN=OFF
           "-DCMAKE_C_FLAGS=-fno-sanitize-recover=all" "-DCMAKE_CXX_FLAGS=-fno-sanitize-recover=all")
status=0

# The 4-rank filter of mpi.host.np4 (tests/mpi/CMakeLists.txt), plus what a sanitizer leaves out.
np4filter='-*/cuda:*LegacyCudaIpcFallback/host'

mpiOk() {  # exit status of run_mpi_test.sh: 0 passed, 77 passed with skipped cases (listed above)
  [ "$1" = 0 ] || [ "$1" = 77 ]
}

capiStep() {  # dir: the C ABI under UBSan (and ASan); any report or failed check fails the step
  local dir=$1 rc=0 t0=$SECONDS
  echo "== asan: C ABI step (C tests and the C ABI fuzz replay, -fno-sanitize-recover=all)"
  "$root/tests/mpi/run_mpi_test.sh" 4 "$dir/tests/capi/kvcomm_capi_test" || rc=1
  "$root/tests/mpi/run_mpi_test.sh" 4 "$dir/tests/capi/kvcomm_capi_props" "$root/include/kvcomm/kvcomm.h" || rc=1
  "$dir/fuzz/fuzz_capi_calls_replay" --mutations 20000 "$root/fuzz/corpus/capi_calls" || rc=1
  echo "== asan: C ABI step: $((SECONDS - t0)) s, $([ $rc = 0 ] && echo passed || echo FAILED)"
  return $rc
}

asanEnv() {  # runs "$@" with the asan job's sanitizer options
  # Slow unwinding: leak stacks reach through Open MPI's frames (no frame pointers) to the library that leaked.
  ASAN_OPTIONS="detect_leaks=1:fast_unwind_on_malloc=0:strict_string_checks=1:detect_stack_use_after_return=1" \
  LSAN_OPTIONS="suppressions=$root/tests/sanitizers/lsan.supp:print_suppressions=0" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    "$@"
}

run() {  # job dir extra-mpi-filter [unit-tests-to-exclude (ctest -E regex)]
  local job=$1 dir=$2 skip=$3 unitSkip=${4:-} rc=0 t0=$SECONDS
  local exclude=()
  [ -n "$unitSkip" ] && exclude=(-E "$unitSkip")
  echo "== $job: unit suite"
  ctest --test-dir "$dir" -L unit -j 2 --output-on-failure --timeout 600 "${exclude[@]}" || rc=1
  echo "== $job: MPI suite, 4 ranks [$((SECONDS - t0)) s so far]"
  "$root/tests/mpi/run_mpi_test.sh" 4 "$dir/tests/mpi/kvcomm_mpi_tests" --gtest_color=no --gtest_brief=1 \
    "--gtest_filter=$np4filter$skip"
  mpiOk $? || rc=1
  if [ "$job" = asan ]; then
    # Under ASan only: ParallelGroups is one thread's arithmetic per rank (nothing for TSan to see).
    echo "== $job: MPI suite, 8 ranks (ParallelGroups) [$((SECONDS - t0)) s so far]"
    "$root/tests/mpi/run_mpi_test.sh" 8 "$dir/tests/mpi/kvcomm_mpi_tests" --gtest_color=no --gtest_brief=1 \
      --gtest_filter='ParallelGroups*'
    mpiOk $? || rc=1
    # Arenas between processes: free/shrink while busy, pins outliving their handles, kills and 1,000 cycles must
    # never touch freed memory (host cases; the CUDA ones run on the GPU machine).
    echo "== $job: arena tests (host) [$((SECONDS - t0)) s so far]"
    "$dir/tests/arena/kvcomm_arena_tests" --gtest_brief=1 --gtest_filter='*/host:ArenaServerSafety.*:ArenaLifetimes.*' ||
      rc=1
    # Endpoints between processes: unregister under a running transfer, kills, 1,000 cycles, 64 clients.
    echo "== $job: endpoint tests (host) [$((SECONDS - t0)) s so far]"
    "$dir/tests/endpoint/kvcomm_endpoint_tests" --gtest_brief=1 --gtest_filter='-EndpointCuda.*' || rc=1
  fi
  echo "== $job: suites done in $((SECONDS - t0)) s"
  return $rc
}

for job in "${jobs[@]}"; do
  start=$SECONDS
  case $job in
    asan)
      dir=$base-asan
      KVCOMM_BUILD_DIR=$dir ./scripts/build.sh "${targets[@]}" "${asanTargets[@]}" "${capiTargets[@]}" "${common[@]}" \
        "${asanFlags[@]}" ||
        { status=1; continue; }
      asanEnv run asan "$dir" "" || status=1
      asanEnv capiStep "$dir" || status=1
      ;;
    capi)
      dir=$base-asan
      KVCOMM_BUILD_DIR=$dir ./scripts/build.sh "${capiTargets[@]}" "${common[@]}" "${asanFlags[@]}" ||
        { status=1; continue; }
      asanEnv capiStep "$dir" || status=1
      ;;
    tsan)
      dir=$base-tsan
      KVCOMM_BUILD_DIR=$dir ./scripts/build.sh "${targets[@]}" "${common[@]}" -DKVCOMM_ENABLE_TSAN=ON \
        -DKVCOMM_ENABLE_ASAN=OFF -DKVCOMM_ENABLE_UBSAN=OFF || { status=1; continue; }
      # The publish size matrix (up to 190 MB of rows per replica) and the CPU publish copy's oracle sweep (one
      # thread) move data, they do not race: ASan covers them, and under TSan they alone would take most of the job's
      # time (the sweep 52 s of the unit suite's 96).
      TSAN_OPTIONS="suppressions=$root/tests/sanitizers/tsan.supp:second_deadlock_stack=1:history_size=4" \
        run tsan "$dir" ":*MatchesGatherInsertOracleAcrossSizesAndLayouts*" \
          "^PublishCopy.CpuVersionMatchesAnIndependentOracle$" || status=1
      ;;
    *)
      echo "sanitize.sh: unknown job '$job' (asan, tsan, capi)"; exit 2 ;;
  esac
  echo "== $job: $((SECONDS - start)) s, status so far $status"
done
exit $status
