#!/usr/bin/env bash
# Skips are never reported as passes:
#   - run_mpi_test.sh: a suite that skips exits 77 (CTest: skipped), a clean suite exits 0, and a failing suite fails
#     even when it also skipped;
#   - tests/gpu/check_skips.sh: a skipped CUDA case fails the GPU script; a skipped host case does not.
#   skip_reporting.sh RUN_MPI_TEST MPI_TEST_BINARY CHECK_SKIPS
set -uo pipefail
runner=$1 bin=$2 check=$3
status=0
expect() {  # want-exit description command...
  local want=$1 what=$2; shift 2
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ "$rc" = "$want" ]; then echo "ok   $what -> $rc"; else echo "FAIL $what -> $rc (want $want)"; echo "$out" | tail -15; status=1; fi
}
expect 77 "a suite whose only case skips" "$runner" 2 "$bin" --gtest_filter='*LegacyCudaIpcFallback/host'
expect 0 "a suite that runs its cases" "$runner" 2 "$bin" --gtest_filter='FdTokens.*'
fake=$(mktemp -d)
trap 'rm -rf "$fake"' EXIT
printf '#!/bin/sh\necho "[  FAILED  ] A.b"\necho "kvcomm-tests: 1 of 2 tests skipped"\nexit 1\n' >"$fake/failing"
chmod +x "$fake/failing"
expect 1 "a failing suite that also skipped" "$runner" 1 "$fake/failing"

printf '[ RUN      ] Backends/Publish.X/host\n[  SKIPPED ] Backends/Publish.X/host (0 ms)\n' >"$fake/host.log"
printf '[  SKIPPED ] Backends/Publish.MatchesOracle/cuda (1 ms)\n' >"$fake/cuda.log"
printf '[  SKIPPED ] GraphSymm.GraphCapturedBeforeGrowthStaysValid\n' >"$fake/graph.log"
expect 0 "check_skips on a skipped host case" "$check" "$fake/host.log"
expect 1 "check_skips on a skipped CUDA case" "$check" "$fake/host.log" "$fake/cuda.log"
expect 1 "check_skips on a skipped graph case" "$check" "$fake/graph.log"
exit $status
