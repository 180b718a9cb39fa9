#!/usr/bin/env bash
# All tests: installs what it needs, builds with -Werror, runs every CTest test (unit, mpirun -np 4/8 on the host
# backend, network-namespace topology, the find_package consumer, formatting), then the arena tests under ASan.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
# The options the tests need, applied on top of whatever the build directory's cache holds (a user's own configure of
# the same directory, e.g. the guide's Release build with tests off, must not break this script).
./scripts/build.sh -DKVCOMM_BUILD_TESTS=ON -DKVCOMM_BUILD_TOOLS=ON -DKVCOMM_BUILD_PERF=ON
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
ctest --test-dir "${KVCOMM_BUILD_DIR:-build}" --output-on-failure -j 2 "$@"
# The arena tests again under AddressSanitizer (host backend, no CUDA, only that test binary: a few minutes on two
# cores): free/shrink while busy, pins that outlive their handles, kills and 1,000 cycles must never touch freed memory.
# Skipped when arguments select a subset of the CTest tests.
if [ $# -eq 0 ]; then
  b=${KVCOMM_BUILD_DIR:-build}
  echo "== arena tests under AddressSanitizer ($b-asan)"
  KVCOMM_BUILD_DIR=$b-asan ./scripts/build.sh -DCMAKE_BUILD_TYPE=Debug -DKVCOMM_CUDA=OFF -DKVCOMM_ENABLE_ASAN=ON \
    -DKVCOMM_BUILD_TESTS=ON -DKVCOMM_BUILD_TOOLS=OFF -DKVCOMM_BUILD_PERF=OFF --target kvcomm_arena_tests
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 "$b-asan/tests/arena/kvcomm_arena_tests" --gtest_brief=1 \
    --gtest_filter='*/host:ArenaServerSafety.*:ArenaLifetimes.*'
fi
