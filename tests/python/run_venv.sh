#!/usr/bin/env bash
# CI's Python step: a fresh venv, `pip install .` of the repository (the same CMake project, through
# scikit-build-core), then pytest on 4 ranks (spawned processes, TCP unique id) on host memory.
#   tests/python/run_venv.sh VENV_DIR [pytest args...]
# The wheel is built without the CUDA backend here (KVCOMM_PYTHON_CUDA=OFF by default: CI has no GPU and the kernels
# only add compile time); set KVCOMM_PYTHON_CUDA=AUTO to build it as `pip install .` does by default.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
venv=$1; shift
rm -rf "$venv"
python3 -m venv "$venv"
start=$(date +%s)
"$venv/bin/python" -m pip install -q "$src" -C cmake.define.KVCOMM_CUDA="${KVCOMM_PYTHON_CUDA:-OFF}" \
  -C build-dir="$venv/build" 2>&1 | tail -20
"$venv/bin/python" -m pip install -q "pytest>=7" 2>&1 | tail -5
echo "run_venv: pip install . took $(($(date +%s) - start)) s"
# Outside the source tree, so that `import kvcomm` is the installed package.
cd "$venv"
"$venv/bin/python" -c "import kvcomm; print('kvcomm', kvcomm.__version__, 'from', kvcomm.__file__)"
exec "$venv/bin/python" -m pytest "$src/tests/python" -q -rs -p no:cacheprovider "$@"
