#!/usr/bin/env bash
# The builds CI makes besides the tested one (warnings are errors in each):
#   Debug, no NCCL  the library, tools, examples and benchmarks in the other build type (the tested build is Release),
#                   with the CUDA backend but without the NCCL transport (KVCOMM_NCCL=OFF, as on a machine without
#                   nccl.h): the library must link with no undefined symbol (-Wl,--no-undefined), and the tools
#                   against it. One build for both checks (CI's 45-minute budget): the sources that need nccl.h (the
#                   NCCL transport, the benchmarks' NCCL baselines) are compiled, warning-free, by the tested build.
#   no CUDA         the host backend only (KVCOMM_CUDA=OFF, as on a machine without nvcc): the same link check
# Without nvcc the first build is a Debug host build. Build directories: ${KVCOMM_BUILD_DIR:-build}-debug and -nocuda.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${KVCOMM_BUILD_DIR:-build}
linked=(--target kvcomm --target kvcomm_mpi --target kvcomm-info --target kvcomm-demo)
echo "== Debug build, CUDA without NCCL ($base-debug)"
KVCOMM_BUILD_DIR=$base-debug ./scripts/build.sh -DCMAKE_BUILD_TYPE=Debug -DKVCOMM_NCCL=OFF -DKVCOMM_BUILD_TESTS=OFF \
  -DKVCOMM_BUILD_TOOLS=ON -DKVCOMM_BUILD_PERF=ON
if grep -q "kvcomm: CUDA backend ON" "$base-debug/configure.log"; then
  grep -q "NCCL fallback transport OFF" "$base-debug/configure.log" ||
    { echo "build-variants: the no-NCCL build still has the NCCL transport"; exit 1; }
else
  echo "build-variants: no nvcc here: the CUDA build without NCCL is not checked"
fi
echo "== no CUDA ($base-nocuda)"
KVCOMM_BUILD_DIR=$base-nocuda ./scripts/build.sh -DCMAKE_BUILD_TYPE=Debug -DKVCOMM_CUDA=OFF -DKVCOMM_BUILD_TESTS=OFF \
  -DKVCOMM_BUILD_TOOLS=ON -DKVCOMM_BUILD_PERF=OFF "${linked[@]}"
