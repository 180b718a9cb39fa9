#!/usr/bin/env bash
# The builds CI makes besides the tested one (warnings are errors in each):
#   Debug    every source of the library, tools, examples and benchmarks (the tested build is the other type)
# Build directories: ${KVCOMM_BUILD_DIR:-build}-debug, ...
set -euo pipefail
cd "$(dirname "$0")/.."
base=${KVCOMM_BUILD_DIR:-build}
echo "== Debug build ($base-debug)"
KVCOMM_BUILD_DIR=$base-debug ./scripts/build.sh -DCMAKE_BUILD_TYPE=Debug -DKVCOMM_BUILD_TESTS=OFF \
  -DKVCOMM_BUILD_TOOLS=ON -DKVCOMM_BUILD_PERF=ON
