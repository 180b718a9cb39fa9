#!/usr/bin/env bash
# The builds CI makes besides the tested one (warnings are errors in each):
#   Debug      every source of the library, tools, examples and benchmarks (the tested build is the other type)
#   no NCCL    the CUDA backend without the NCCL transport (KVCOMM_NCCL=OFF, as on a machine without nccl.h): the
#              library must link with no undefined symbol (-Wl,--no-undefined), and the tools against it
#   no CUDA    the host backend only (KVCOMM_CUDA=OFF, as on a machine without nvcc): the same
# Build directories: ${KVCOMM_BUILD_DIR:-build}-debug, -nonccl and -nocuda.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${KVCOMM_BUILD_DIR:-build}
linked=(--target kvcomm --target kvcomm_mpi --target kvcomm-info --target kvcomm-demo)
echo "== Debug build ($base-debug)"
KVCOMM_BUILD_DIR=$base-debug ./scripts/build.sh -DCMAKE_BUILD_TYPE=Debug -DKVCOMM_BUILD_TESTS=OFF \
  -DKVCOMM_BUILD_TOOLS=ON -DKVCOMM_BUILD_PERF=ON
echo "== CUDA without NCCL ($base-nonccl)"
if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null || [ -n "${CUDACXX:-}" ]; then
  # The libraries and the tools that link them (the Debug build above compiled every other source already).
  KVCOMM_BUILD_DIR=$base-nonccl ./scripts/build.sh -DCMAKE_BUILD_TYPE=Debug -DKVCOMM_CUDA=ON -DKVCOMM_NCCL=OFF \
    -DKVCOMM_BUILD_TESTS=OFF -DKVCOMM_BUILD_TOOLS=ON -DKVCOMM_BUILD_PERF=OFF "${linked[@]}"
  grep -q "NCCL fallback transport OFF" "$base-nonccl/configure.log" ||
    { echo "build-variants: the no-NCCL build still has the NCCL transport"; exit 1; }
else
  echo "build-variants: no nvcc here: the CUDA build without NCCL is not checked"
fi
echo "== no CUDA ($base-nocuda)"
KVCOMM_BUILD_DIR=$base-nocuda ./scripts/build.sh -DCMAKE_BUILD_TYPE=Debug -DKVCOMM_CUDA=OFF -DKVCOMM_BUILD_TESTS=OFF \
  -DKVCOMM_BUILD_TOOLS=ON -DKVCOMM_BUILD_PERF=OFF "${linked[@]}"
