#!/usr/bin/env bash
# Endpoints across hosts: network namespaces on one bridge stand for hosts. One server (namespace 0) and clients in
# every other namespace meet through a metadata file only; each client pulls (checking every byte of its memory) and
# pushes, then the server checks every byte of its own.
#   netns_endpoint.sh PROBE [--kind host|cuda] [--hosts N] [--per-host K]   (clients: (N - 1) x K)
# Exit 77 (CTest: skipped) when namespaces cannot be made here, saying why.
set -u
probe=$1; shift
kind=host hosts=2 per=3
while [ $# -gt 0 ]; do
  case $1 in
    --kind) kind=$2; shift 2 ;;
    --hosts) hosts=$2; shift 2 ;;
    --per-host) per=$2; shift 2 ;;
    *) echo "netns_endpoint.sh: unknown argument $1"; exit 2 ;;
  esac
done
[ "$hosts" -ge 2 ] || { echo "netns_endpoint.sh: --hosts must be at least 2"; exit 2; }
source "$(dirname "$0")/netns_hosts.sh"
netns_hosts "$hosts" ke
clients=$(((hosts - 1) * per))
run() {  # host-index log args...
  local h=$1 log=$2; shift 2
  KVCOMM_SOCKET_IFNAME=${ifs[$h]} timeout 150 ip netns exec "${ns[$h]}" "$probe" --dir "$work" --kind "$kind" "$@" \
    >"$log" 2>&1
}
run 0 "$work/server.log" --mode server --clients "$clients" &
pids=($!)
c=0
for ((h = 1; h < hosts; h++)); do
  for ((k = 0; k < per; k++)); do
    run "$h" "$work/client.$c.log" --mode client --index "$c" &
    pids+=($!)
    c=$((c + 1))
  done
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
cat "$work/server.log" "$work"/client.*.log | grep -E "^(PASS|FAIL|server)" | sort
if [ $status = 0 ]; then echo "PASS endpoints: $hosts hosts, $clients clients ($kind memory)"; else
  echo "FAIL endpoints: $hosts hosts, $clients clients ($kind memory)"; tail -n 20 "$work"/*.log; fi
exit $status
