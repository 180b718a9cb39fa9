#!/usr/bin/env bash
# perf_fetch's cross-host table on one machine: two network namespaces joined by a veth pair stand for two hosts
# (their own interfaces and addresses; TCP between them crosses the kernel's network stack as it would between
# hosts, minus the wire). Rank 0 pulls from rank 1 over kvcomm's TCP transport; the baseline is one plain TCP
# connection carrying the same bytes between the same two namespaces, measured in the same run.
#   perf/fetch_netns.sh PERF_FETCH [--kind host|cuda] [--reps N] [--quick] [--json FILE]   (root)
set -u
bin=$1; shift
[ "$(id -u)" = 0 ] || { echo "fetch_netns.sh: network namespaces need root"; exit 77; }
tag=$$ A=kpa$tag B=kpb$tag VA=kva$tag VB=kvb$tag
net="10.$((50 + tag % 50)).$((tag % 250))"
work=$(mktemp -d)
cleanup() { ip netns del "$A" 2>/dev/null; ip netns del "$B" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
ip netns add "$A" && ip netns add "$B" || { echo "fetch_netns.sh: ip netns add failed"; exit 77; }
ip link add "$VA" type veth peer name "$VB" && ip link set "$VA" netns "$A" && ip link set "$VB" netns "$B" || exit 77
ip -n "$A" addr add "$net.1/24" dev "$VA" && ip -n "$B" addr add "$net.2/24" dev "$VB" || exit 77
for n in "$A" "$B"; do ip -n "$n" link set lo up; done
ip -n "$A" link set "$VA" up && ip -n "$B" link set "$VB" up || exit 77
KVCOMM_SOCKET_IFNAME=$VB ip netns exec "$B" "$bin" --net-rank 1 --id-file "$work/id" --ifname "$VB" "$@" \
  >"$work/rank1.log" 2>&1 &
r1=$!
KVCOMM_SOCKET_IFNAME=$VA ip netns exec "$A" "$bin" --net-rank 0 --id-file "$work/id" --ifname "$VA" "$@"
rc=$?
wait $r1 || { rc=1; cat "$work/rank1.log"; }
exit $rc
