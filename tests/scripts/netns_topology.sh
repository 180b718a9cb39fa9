#!/usr/bin/env bash
# Topology across network namespaces: processes in two namespaces (joined by a veth pair) must be reported on
# different hosts; processes in one namespace on the same host. Exit 77 (CTest: skipped) when namespaces cannot be
# made here, saying why.
set -u
probe=$1
skip() { echo "SKIPPED: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "network namespaces need root"
command -v ip >/dev/null || skip "ip (iproute2) is not installed"
tag=$$
A=kvcA$tag B=kvcB$tag VA=kva$tag VB=kvb$tag
net="10.$((200 + tag % 50)).$((tag % 250))"
cleanup() { ip netns del "$A" 2>/dev/null; ip netns del "$B" 2>/dev/null; rm -rf "$work"; }
work=$(mktemp -d)
trap cleanup EXIT
err=$(ip netns add "$A" 2>&1) || skip "ip netns add failed: $err"
ip netns add "$B" || skip "second namespace failed"
err=$(ip link add "$VA" type veth peer name "$VB" 2>&1) || skip "veth pair failed: $err"
ip link set "$VA" netns "$A" && ip link set "$VB" netns "$B" || skip "moving veth ends failed"
ip -n "$A" addr add "$net.1/24" dev "$VA" && ip -n "$B" addr add "$net.2/24" dev "$VB" || skip "addresses failed"
for ns in "$A" "$B"; do ip -n "$ns" link set lo up; done
ip -n "$A" link set "$VA" up && ip -n "$B" link set "$VB" up || skip "link up failed"

run_case() {  # name expect publish-mode ns-of-rank0 ns-of-rank1 ...
  local name=$1 expect=$2 publish=$3; shift 3
  local n=$# idf="$work/$name.id" pids=() r=0 rc=0
  for ns in "$@"; do
    local ifname=$VA; [ "$ns" = "$B" ] && ifname=$VB
    KVCOMM_SOCKET_IFNAME=$ifname timeout 60 ip netns exec "$ns" "$probe" --rank $r --size "$n" --id-file "$idf" \
      --expect "$expect" --ifname "$ifname" ${publish:+--publish $publish} &
    pids+=($!); r=$((r + 1))
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  if [ $rc = 0 ]; then echo "PASS $name (hosts $expect)"; else echo "FAIL $name (expected hosts $expect)"; fi
  return $rc
}

status=0
run_case two_namespaces 0,0,1,1 "" "$A" "$A" "$B" "$B" || status=1
run_case interleaved 0,1,0,1 "" "$A" "$B" "$A" "$B" || status=1
run_case one_namespace 0,0,0,0 "" "$A" "$A" "$A" "$A" || status=1
# Publication across hosts: direct demanded is refused clearly; auto falls back to gather+insert with exact bytes.
run_case direct_refused_across_hosts 0,0,1,1 force "$A" "$A" "$B" "$B" || status=1
run_case fallback_across_hosts 0,1,0,1 auto "$A" "$B" "$A" "$B" || status=1
run_case direct_on_one_host 0,0,0,0 auto "$A" "$A" "$A" "$A" || status=1
exit $status
