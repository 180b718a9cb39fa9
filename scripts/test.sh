#!/usr/bin/env bash
# All tests: installs what it needs, builds with -Werror, runs every CTest test (unit, mpirun -np 4/8 on the host
# backend, network-namespace topology, the find_package consumer, formatting).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ctest --test-dir "${KVCOMM_BUILD_DIR:-build}" --output-on-failure -j 2 "$@"
