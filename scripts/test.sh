#!/usr/bin/env bash
# All tests: installs what it needs, builds with -Werror, runs every CTest test (unit, mpirun -np 4/8 on the host
# backend, network-namespace topology, the find_package consumer, formatting).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
# The options the tests need, applied on top of whatever the build directory's cache holds (a user's own configure of
# the same directory, e.g. the guide's Release build with tests off, must not break this script).
./scripts/build.sh -DKVCOMM_BUILD_TESTS=ON -DKVCOMM_BUILD_TOOLS=ON -DKVCOMM_BUILD_PERF=ON
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ctest --test-dir "${KVCOMM_BUILD_DIR:-build}" --output-on-failure -j 2 "$@"
