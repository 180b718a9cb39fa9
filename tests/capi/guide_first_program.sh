#!/usr/bin/env bash
# The first program of docs/c-api.md, built and run with the guide's own two commands: the build tree is installed
# into a temporary prefix that stands in for /opt/kvcomm, and --allow-run-as-root is added as root, as the guide's
# comment says. Every one of the 4 ranks must print its "verified" line, and the program must find libkvcomm through
# the rpath of the guide's mpicc line (LD_LIBRARY_PATH is unset).
#   guide_first_program.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
build=$1 src=$2
command -v mpicc >/dev/null || { echo "SKIPPED: no mpicc"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null || { echo "FAIL: cmake --install"; exit 1; }
guide=$src/docs/c-api.md
awk '/^## A first program/{f=1} f&&/^```c$/{c=1;next} c&&/^```$/{exit} c' "$guide" >"$tmp/first.c"
awk '/^## A first program/{f=1} f&&/^```bash$/{c=1;next} c&&/^```$/{exit} c' "$guide" >"$tmp/commands.sh"
[ -s "$tmp/first.c" ] && grep -q "^mpicc " "$tmp/commands.sh" && grep -q "^mpirun " "$tmp/commands.sh" ||
  { echo "FAIL: the first program or its commands were not found in $guide"; exit 1; }
sed -i "s#/opt/kvcomm#$tmp/prefix#g" "$tmp/commands.sh"
[ "$(id -u)" = 0 ] && sed -i 's#^mpirun #mpirun --allow-run-as-root #' "$tmp/commands.sh"
export OMPI_MCA_btl_vader_single_copy_mechanism=none NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
  NVSHMEM_DISABLE_NVLS=1
cat "$tmp/commands.sh"
out=$(cd "$tmp" && env -u LD_LIBRARY_PATH timeout 120 bash -e commands.sh 2>&1); rc=$?
echo "$out"
verified=$(grep -c "^rank [0-3]: 16 rows from 4 ranks in this replica, 0 wrong bytes: verified$" <<<"$out")
if [ "$rc" != 0 ] || [ "$verified" != 4 ]; then
  echo "FAIL: the guide's commands exited $rc with $verified of 4 ranks verified"
  exit 1
fi
echo "ok: docs/c-api.md's first program, built and run as written: 4 ranks verified"
