#!/usr/bin/env bash
# Usage: run_mpi_test.sh NP BINARY [ARGS...] — runs BINARY under mpirun with NP ranks on this host.
# Exit status: the run's; 77 (CTest: skipped) when it passed but skipped tests (the MPI test main prints
# "kvcomm-tests: N of M tests skipped"), so that a suite that skips shows as skipped, never as passed.
set -uo pipefail
np=$1; shift
flags=(--oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
# The machine rules for GPU hosts travel with every rank (multicast must never be enabled).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
envs=(-x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS)
for v in $(env | grep -o '^KVCOMM_[A-Z_]*' || true); do envs+=(-x "$v"); done
# Containers often lack cross-memory attach; shared-memory transport without it is still correct.
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_btl=self,vader,tcp
log=$(mktemp)
trap 'rm -f "$log"' EXIT
timeout --signal=KILL 880 mpirun "${flags[@]}" "${envs[@]}" -np "$np" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
if [ "$rc" = 0 ] && grep -q '^kvcomm-tests: [0-9]* of [0-9]* tests skipped' "$log"; then
  echo "run_mpi_test.sh: tests were skipped: reporting the suite as skipped (exit 77)"
  exit 77
fi
exit "$rc"
