#!/usr/bin/env bash
# Fetch across hosts: network namespaces on one bridge stand for hosts (each its own interface and address, no
# shared loopback), members talk over TCP exactly as separate machines would.
#   netns_fetch.sh PROBE [--kind host|cuda] [--hosts N] [--cases suite,mixed,kill,linkdown,malformed]
# Cases (host kind; the cuda kind runs suite only, GPU to GPU):
#   suite      one member per host: every fetch form between every member, byte-exact over whole buffers
#   mixed      two members per host (4 members, 2 hosts): peer mappings within a host, TCP between hosts
#   kill       kill -9 of the serving member in the middle of a fetch
#   linkdown   the serving member's link taken down in the middle of a fetch
#   malformed  1,000 malformed requests to a server while a valid member keeps fetching; fd count and RSS flat
# Exit 77 (CTest: skipped) when namespaces or a bridge cannot be made here (not root, no iproute2), saying why.
set -u
probe=$1; shift
kind=host hosts=4 cases=""
while [ $# -gt 0 ]; do
  case $1 in
    --kind) kind=$2; shift 2 ;;
    --hosts) hosts=$2; shift 2 ;;
    --cases) cases=$2; shift 2 ;;
    *) echo "netns_fetch.sh: unknown argument $1"; exit 2 ;;
  esac
done
[ -n "$cases" ] || { [ "$kind" = cuda ] && cases=suite || cases=suite,mixed,kill,linkdown,malformed; }
source "$(dirname "$0")/netns_hosts.sh"
netns_hosts "$hosts" kf

pids=()
start_rank() {  # case rank size host-index mode
  local c=$1 r=$2 n=$3 h=$4 mode=$5
  # Malformed: the server drops a stalled request after 500 ms (the 1,000 requests include 10 stalled ones).
  local t=3000; [ "$mode" = malformed ] && t=500
  KVCOMM_FETCH_NET_TIMEOUT_MS=$t KVCOMM_SOCKET_IFNAME=${ifs[$h]} timeout 150 ip netns exec "${ns[$h]}" "$probe" --rank "$r" --size "$n" \
    --id-file "$work/$c.id" --dir "$work/$c" --mode "$mode" --ifname "${ifs[$h]}" --kind "$kind" \
    >"$work/$c.$r.log" 2>&1 &
  pids+=($!)
}
finish() {  # case expected-codes...: waits for the case's ranks; prints their logs on failure
  local c=$1; shift
  local rc=0 r=0
  for p in "${pids[@]}"; do
    wait "$p"; local got=$?
    local want=$1; shift
    [ "$got" = "$want" ] || { echo "rank $r of $c exited $got, expected $want"; rc=1; }
    r=$((r + 1))
  done
  pids=()
  grep -h -E "^(PASS|kill|linkdown|malformed)" "$work/$c".*.log
  if [ $rc = 0 ]; then echo "PASS $c"; else echo "FAIL $c"; tail -n 30 "$work/$c".*.log; fi
  return $rc
}
wait_file() { for _ in $(seq 1 1500); do [ -e "$1" ] && return 0; sleep 0.01; done; return 1; }

status=0
has() { [[ ",$cases," == *",$1,"* ]]; }
if has suite; then
  mkdir -p "$work/suite"
  for ((r = 0; r < hosts; r++)); do start_rank suite $r "$hosts" $r suite; done
  codes=(); for ((r = 0; r < hosts; r++)); do codes+=(0); done
  finish suite "${codes[@]}" || status=1
fi
if has mixed && [ "$hosts" -ge 2 ]; then
  mkdir -p "$work/mixed"
  for r in 0 1 2 3; do start_rank mixed $r 4 $((r % 2)) suite; done  # hosts 0,1,0,1: peer and TCP routes
  finish mixed 0 0 0 0 || status=1
fi
for mode in kill linkdown; do
  has $mode && [ "$hosts" -ge 2 ] || continue
  mkdir -p "$work/$mode"
  start_rank $mode 0 2 0 $mode
  start_rank $mode 1 2 1 $mode
  if wait_file "$work/$mode/started" && wait_file "$work/$mode/source.pid"; then
    sleep 0.4
    if [ $mode = kill ]; then
      kill -9 "$(cat "$work/$mode/source.pid")"
    else
      ip -n "${ns[1]}" link set "${ifs[1]}" down
    fi
  fi
  if [ $mode = kill ]; then finish $mode 0 137 || status=1; else
    wait "${pids[0]}"; c0=$?
    ip -n "${ns[1]}" link set "${ifs[1]}" up
    pids=("${pids[1]}"); pids=("${pids[@]}")
    wait "${pids[0]}"; c1=$?; pids=()
    grep -h -E "^linkdown" "$work/linkdown".*.log
    if [ $c0 = 0 ] && [ $c1 = 0 ]; then echo "PASS linkdown"; else
      echo "FAIL linkdown (exit codes $c0 $c1)"; tail -n 30 "$work/linkdown".*.log; status=1; fi
  fi
done
if has malformed && [ "$hosts" -ge 3 ]; then
  mkdir -p "$work/malformed"
  for r in 0 1 2; do start_rank malformed $r 3 $r malformed; done
  finish malformed 0 0 0 || status=1
fi
exit $status
