#!/usr/bin/env bash
# kvcomm.vllm against the real vLLM from PyPI (pinned: the connector API it implements is that release's), and
# kvcomm.torch's custom ops with the torch that venv carries: a venv with
# vllm and pytest, kept between runs outside the clone (9.5 GB: KVCOMM_VLLM_VENV, default ~/.cache/kvcomm/vllm-VERSION),
# then `pip install .` of this tree into it (its build directory kept in the venv: later runs rebuild what changed),
# then pytest tests/vllm. Fails (never skips) when vLLM cannot be installed or imported, saying why.
#   tests/vllm/run.sh [pytest args...]
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
version=0.33.0
venv=${KVCOMM_VLLM_VENV:-$HOME/.cache/kvcomm/vllm-$version}
start=$(date +%s)
if ! "$venv/bin/python" -c "import vllm, pytest, sys; sys.exit(vllm.__version__ != '$version')" 2>/dev/null; then
  mkdir -p "$(dirname "$venv")"
  free=$(df -Pk "$(dirname "$venv")" | awk 'NR == 2 {print int($4 / 1048576)}')
  if [ "$free" -lt 12 ]; then
    echo "tests/vllm/run.sh: FAILED: vLLM needs about 10 GB and $(dirname "$venv") has $free GB free"
    exit 1
  fi
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "vllm==$version" "pytest>=7" 2>&1 | tail -5 ||
    { echo "tests/vllm/run.sh: FAILED: pip install vllm==$version (output above)"; exit 1; }
  echo "tests/vllm/run.sh: vllm $version installed in $venv in $(($(date +%s) - start)) s"
fi
"$venv/bin/pip" install -q "$src" -C cmake.define.KVCOMM_CUDA=OFF -C build-dir="$venv/kvcomm-build" 2>&1 | tail -5
cd "$venv"  # outside the source tree: the installed package is what is imported
"$venv/bin/python" -c "import vllm, kvcomm.vllm; print('vllm', vllm.__version__, '+ kvcomm', kvcomm.__version__)"
exec "$venv/bin/python" -m pytest "$src/tests/vllm" -q -rs -p no:cacheprovider "$@"
