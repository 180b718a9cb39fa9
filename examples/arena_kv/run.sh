#!/usr/bin/env bash
# The arena example end to end: one server, four clients (two exporting their own KV arena, two importing one the
# server allocates), on GPUs when there are some (the server on GPU 0, clients spread over every GPU), else on host
# memory. Exits non-zero unless every client verified every byte.
#   examples/arena_kv/run.sh BUILD_DIR
set -uo pipefail
b=${1:?usage: run.sh BUILD_DIR}
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
gpus=${gpus:-0}
addr="@kvcomm-arena-example-$$"
"$b/examples/example_arena_server" --address "$addr" --clients 4 --device 0 &
server=$!
pids=()
for i in 0 1 2 3; do
  mode=$([ $((i % 2)) = 0 ] && echo export || echo alloc)
  dev=$([ "$gpus" -gt 0 ] && echo $((i % gpus)) || echo 0)
  "$b/examples/example_arena_client" --address "$addr" --mode "$mode" --tag $((i + 1)) --device "$dev" &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
wait "$server" || status=1
exit $status
