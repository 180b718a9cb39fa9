#!/usr/bin/env bash
# The KV server example end to end: one server and N engines, each started on its own and knowing the server only
# from the metadata file it publishes. Engines alternate between the same-host path (auto: the server's arena mapped
# here) and TCP (what engines on other hosts use); with an RDMA device one engine demands RDMA; with GPUs, half the
# engines keep their KV cache in GPU memory and read from the server's GPU memory. Exits non-zero unless the server
# and every engine verified every byte.
#   examples/kv_server/run.sh BUILD_DIR [ENGINES]
set -uo pipefail
b=${1:?usage: run.sh BUILD_DIR [ENGINES]}
engines=${2:-4}
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
gpus=${gpus:-0}
rdma=$(ls /sys/class/infiniband 2>/dev/null | head -1)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
addr=127.0.0.1:0  # this host; engines elsewhere would need the server's routable address
"$b/examples/example_kv_server" --dir "$dir" --engines "$engines" --device 0 --tcp-address "$addr" &
server=$!
pids=()
for ((i = 0; i < engines; i++)); do
  via=$([ $((i % 2)) = 0 ] && echo auto || echo tcp)
  [ -n "$rdma" ] && [ "$i" = 1 ] && via=rdma
  memory=host dev=0
  if [ "$gpus" -gt 0 ] && [ $((i / 2 % 2)) = 1 ]; then memory=cuda dev=$((i % gpus)); fi
  "$b/examples/example_kv_engine" --dir "$dir" --index "$i" --memory "$memory" --via "$via" --device "$dev" \
    --tcp-address "$addr" &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
wait "$server" || status=1
exit $status
