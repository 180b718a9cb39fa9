#!/usr/bin/env bash
# Installs the build tree into a temporary prefix, then against that prefix only:
#   1. configures, builds and runs tests/consumer (find_package(kvcomm));
#   2. runs the installed tools with no LD_LIBRARY_PATH (their install RPATH must find the libraries);
#   3. builds the first program of docs/getting-started.md with the guide's own g++ command and runs it as the guide
#      does (2 ranks over an id file), without RANK/WORLD_SIZE, and with a stale id file (must say so within seconds).
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null
cmake -S "$src/tests/consumer" -B "$tmp/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$tmp/build" -j 2 >/dev/null
LD_LIBRARY_PATH="$prefix/lib:${LD_LIBRARY_PATH:-}" "$tmp/build/consumer"

if [ -x "$prefix/bin/kvcomm-info" ]; then
  echo "== installed tools"
  env -u LD_LIBRARY_PATH "$prefix/bin/kvcomm-info" --help | head -1
  env -u LD_LIBRARY_PATH "$prefix/bin/kvcomm-demo" --help | head -1
  flags=(--oversubscribe --bind-to none); [ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
  env -u LD_LIBRARY_PATH OMPI_MCA_btl_vader_single_copy_mechanism=none timeout 120 \
    mpirun "${flags[@]}" -np 2 "$prefix/bin/kvcomm-demo" --tokens 64 | tee "$tmp/demo.txt"
  [ "$(grep -c " verified$" "$tmp/demo.txt")" = 2 ] || { echo "FAIL: the installed kvcomm-demo did not verify"; exit 1; }
fi

echo "== the first program of docs/getting-started.md"
# The C++ block under "### TcpBootstrap", and the g++ line after it, exactly as the guide shows them.
awk '/^### TcpBootstrap/{f=1} f&&/^```cpp/{c=1;next} c&&/^```/{exit} c' "$src/docs/getting-started.md" >"$tmp/first.cpp"
compile=$(awk '/^### TcpBootstrap/{f=1} f&&/^g\+\+ /{print; exit}' "$src/docs/getting-started.md")
[ -s "$tmp/first.cpp" ] && [ -n "$compile" ] || { echo "FAIL: the guide's first program was not found"; exit 1; }
(cd "$tmp" && eval "${compile//\/opt\/kvcomm/$prefix}")
set +e
out=$(env -u RANK -u WORLD_SIZE "$tmp/first" 2>&1); rc=$?
set -e
[ "$rc" != 0 ] && grep -q "set RANK and WORLD_SIZE" <<<"$out" ||
  { echo "FAIL: without RANK/WORLD_SIZE: exit $rc: $out"; exit 1; }
echo "ok: without RANK/WORLD_SIZE: $out"
rm -f "$tmp/kvcomm.id"
for r in 0 1; do RANK=$r WORLD_SIZE=2 timeout 60 "$tmp/first" "$tmp/kvcomm.id" >"$tmp/first.$r.txt" 2>&1 & done
wait
cat "$tmp"/first.*.txt
grep -q "^rank 0: tp 0/2 pcp 0/1 on 1 host(s)" "$tmp/first.0.txt" && grep -q "^rank 1: tp 1/2" "$tmp/first.1.txt" ||
  { echo "FAIL: the first program did not run as the guide says"; exit 1; }
# The id file is stale now (its root has exited): a rank that reads it must say so within seconds, then time out.
set +e
start=$SECONDS
out=$(RANK=1 WORLD_SIZE=2 KVCOMM_BOOTSTRAP_TIMEOUT_MS=4000 timeout 60 "$tmp/first" "$tmp/kvcomm.id" 2>&1); rc=$?
set -e
grep -q "An id left from an earlier run names a root that is gone" <<<"$out" && [ "$rc" = 1 ] &&
  [ $((SECONDS - start)) -lt 30 ] || { echo "FAIL: a stale id: exit $rc: $out"; exit 1; }
echo "ok: a stale id is reported:"; head -2 <<<"$out"
