#!/usr/bin/env bash
# kvcomm endpoints beside NIXL (perf/nixl/compare.py): the same scattered host-memory READs through both, in the same
# run, (1) between two processes of one host (kvcomm's peer mapping vs UCX's shared-memory transports) and (2)
# between two network namespaces joined by a veth pair (kvcomm's TCP vs UCX_TLS=tcp; root and iproute2). Tables on
# stdout, JSON lines in OUT_DIR/nixl-compare.jsonl.
#   perf/nixl/compare.sh [OUT_DIR] [--quick] [--seconds S]
# PYTHON: an interpreter with kvcomm and nixl installed; without it, a venv is made in OUT_DIR/venv (pip install . and
# nixl: NIXL is a benchmark-only dependency, never the library's).
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-/tmp/kvcomm-nixl}; shift || true
mkdir -p "$out"
if [ -z "${PYTHON:-}" ]; then
  python3 -m venv "$out/venv" && "$out/venv/bin/pip" install -q "$src" nixl numpy ||
    { echo "compare.sh: installing kvcomm and nixl failed"; exit 1; }
  PYTHON=$out/venv/bin/python
fi
bench=$src/perf/nixl/compare.py
json=$out/nixl-compare.jsonl
rm -f "$json"
status=0

pair() {  # transport library [netns prefix for server] [netns prefix for client]: one server and its client
  local t=$1 lib=$2 work
  work=$(mktemp -d)
  ${3:-} "$PYTHON" "$bench" --role server --library "$lib" --dir "$work" --transport "$t" &
  local server=$!
  ${4:-} "$PYTHON" "$bench" --role client --library "$lib" --dir "$work" --transport "$t" --json "$json" "${args[@]}" ||
    status=1
  wait $server || status=1
  rm -rf "$work"
}
args=("$@")

echo "== two processes on one host"
for lib in kvcomm nixl; do pair peer $lib; done

echo
echo "== two network namespaces over TCP"
if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null; then
  echo "SKIPPED: network namespaces need root and iproute2"
else
  tag=$$ A=nxa$tag B=nxb$tag VA=nva$tag VB=nvb$tag
  net="10.$((150 + tag % 50)).$((tag % 250))"
  cleanup() { ip netns del "$A" 2>/dev/null; ip netns del "$B" 2>/dev/null; }
  trap cleanup EXIT
  ip netns add "$A" && ip netns add "$B" && ip link add "$VA" type veth peer name "$VB" &&
    ip link set "$VA" netns "$A" && ip link set "$VB" netns "$B" &&
    ip -n "$A" addr add "$net.1/24" dev "$VA" && ip -n "$B" addr add "$net.2/24" dev "$VB" &&
    ip -n "$A" link set lo up && ip -n "$B" link set lo up &&
    ip -n "$A" link set "$VA" up && ip -n "$B" link set "$VB" up || { echo "compare.sh: namespaces failed"; exit 1; }
  for lib in kvcomm nixl; do
    pair tcp $lib "env KVCOMM_SOCKET_IFNAME=$VB UCX_TLS=tcp UCX_NET_DEVICES=$VB ip netns exec $B" \
      "env KVCOMM_SOCKET_IFNAME=$VA UCX_TLS=tcp UCX_NET_DEVICES=$VA ip netns exec $A"
  done
fi
"$PYTHON" "$bench" --table "$json"
echo
echo "compare.sh: JSON in $json"
exit $status
