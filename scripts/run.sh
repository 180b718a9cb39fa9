#!/usr/bin/env bash
# The main job: installs what it needs, builds, then on whatever backend is present (the CUDA backend on GPUs, host
# memory without), under mpirun: kvcomm-info (communicator, layout, topology, capabilities), kvcomm-demo (one
# publish + barrier step and one fetch, each verified byte for byte), the publish benchmark against gather+insert
# and the fetch benchmark against per-block copies, copy-engine batches and MPI / NCCL send/recv; then the arena
# example (a KV block server and its clients, without MPI) and the KV server example (a server and engines started
# separately, meeting through endpoint metadata and notifications). Each step's output is checked (the demo's
# "verified" lines, the benchmarks' JSON, the examples' counts); the last line says whether every step passed.
#   scripts/run.sh [PERF_PUBLISH_ARGS...]
# KVCOMM_BUILD_DIR (default build), KVCOMM_NP (default: the GPU count with 2 or more GPUs, else 4).
set -uo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
./scripts/install-deps.sh || { echo "run.sh: FAILED: installing the dependencies"; exit 1; }
b=${KVCOMM_BUILD_DIR:-build}

# Every program a step runs, built in one go before any step starts. A step runs the program bin[TARGET], which exists only
# for a target of this list and once the build made it (tests/scripts/run_targets.py checks the same statically).
targets=(kvcomm-info kvcomm-demo perf_publish perf_fetch example_arena_server example_arena_client example_kv_server
         example_kv_engine)
declare -A where=([kvcomm-info]=tools [kvcomm-demo]=tools [perf_publish]=perf [perf_fetch]=perf
                  [example_arena_server]=examples [example_arena_client]=examples [example_kv_server]=examples
                  [example_kv_engine]=examples)
prog() {  # TARGET: the path of a program the build made
  local t=$1 p
  [[ " ${targets[*]} " == *" $t "* ]] || { echo "run.sh: BUG: '$t' is not in run.sh's targets"; return 1; }
  p="$b/${where[$t]}/$t"
  [ -x "$p" ] || { echo "run.sh: BUG: the build did not make $p"; return 1; }
  echo "$p"
}

echo "== build ($b): ${targets[*]}"
args=()
for t in "${targets[@]}"; do args+=(--target "$t"); done
./scripts/build.sh -DKVCOMM_BUILD_TOOLS=ON -DKVCOMM_BUILD_PERF=ON "${args[@]}" ||
  { echo "run.sh: FAILED: the build (errors above); nothing was run"; exit 1; }
declare -A bin=()  # target -> program; a step naming a target not built stops at "unbound variable" (set -u)
for t in "${targets[@]}"; do
  p=$(prog "$t") || { echo "run.sh: FAILED: $p"; exit 1; }
  bin[$t]=$p
done

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
np=${KVCOMM_NP:-$([ "${gpus:-0}" -ge 2 ] && echo "$gpus" || echo 4)}
flags=(--oversubscribe --bind-to none -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
logs="$b/run-logs"
mkdir -p "$logs"

steps=6
n=0
results=()
# step NAME CHECK_DESCRIPTION CHECK_COMMAND -- COMMAND...: runs COMMAND (output shown and kept in $logs/NAME.log),
# printing a line every 30 s while it runs, then CHECK_COMMAND (which reads the log). Stops the job on a failure.
step() {
  local name=$1 what=$2 check=$3
  shift 4
  n=$((n + 1))
  local s=$SECONDS log="$logs/$name.log"
  echo
  echo "== [$n/$steps] $name"
  (while sleep 30; do echo "   ... $name still running ($((SECONDS - s)) s)"; done) &
  local ticker=$!
  "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  kill "$ticker" 2>/dev/null
  wait "$ticker" 2>/dev/null
  if [ "$rc" != 0 ]; then
    echo "run.sh: FAILED at step $n/$steps ($name): exit $rc after $((SECONDS - s)) s (log: $log)"
    exit 1
  fi
  if ! (cd "$logs" && eval "$check") >/dev/null 2>&1; then
    echo "run.sh: FAILED at step $n/$steps ($name): its output does not show $what (log: $log)"
    exit 1
  fi
  results+=("$(printf '%-16s %4d s  %s' "$name" $((SECONDS - s)) "$what")")
}

# A count of lines of a log matching a pattern, at least N.
atLeast() { [ "$(grep -c -- "$2" "$1")" -ge "$3" ]; }

step kvcomm-info "the communicator of $np ranks" "grep -q 'communicator: $np ranks' kvcomm-info.log" -- \
  mpirun "${flags[@]}" -np "$np" "${bin[kvcomm-info]}"
# Both steps of the demo, verified on every rank (publish: one line per rank; fetch: one line per rank).
step kvcomm-demo "$((2 * np)) 'verified' lines and no mismatch" \
  "atLeast kvcomm-demo.log 'verified' $((2 * np)) && ! grep -Eq 'FAILED| [1-9][0-9]* differ' kvcomm-demo.log" -- \
  mpirun "${flags[@]}" -np "$np" "${bin[kvcomm-demo]}"
rm -f "$b/perf-publish.jsonl" "$b/perf-fetch.jsonl"
step perf_publish "a table and JSON rows in $b/perf-publish.jsonl" "atLeast ../perf-publish.jsonl '^{' 1" -- \
  mpirun "${flags[@]}" -np "$np" "${bin[perf_publish]}" --json "$b/perf-publish.jsonl" "$@"
step perf_fetch "a table and JSON rows in $b/perf-fetch.jsonl" "atLeast ../perf-fetch.jsonl '^{' 1" -- \
  mpirun "${flags[@]}" -np "$np" "${bin[perf_fetch]}" --json "$b/perf-fetch.jsonl"
# The arena example (examples/arena_kv): a KV block server and four clients, both directions of ownership, on GPUs
# (server on GPU 0, clients spread over every GPU) or host memory; every client checks every byte.
step arena_kv "4 of 4 clients verified" "grep -q 'arena server: 4 of 4 clients verified' arena_kv.log" -- \
  examples/arena_kv/run.sh "$b"
# The KV server example (examples/kv_server): a server and four engines started separately, connecting from the
# metadata the server publishes, reading prefix blocks over the same-host path and TCP, writing new blocks back and
# notifying; the server checks every written byte and that nothing is left pinned.
step kv_server "4 of 4 engines verified, nothing left pinned" \
  "grep -q 'kv server: 4 of 4 engines verified; 0 blocks left pinned, 0 reserved' kv_server.log" -- \
  examples/kv_server/run.sh "$b" 4

echo
echo "== run.sh: every step passed"
printf '  %s\n' "${results[@]}"
backend=$([ "${gpus:-0}" -ge 1 ] && echo "the CUDA backend, $gpus GPU(s)" || echo "host memory")
echo "run.sh: $steps of $steps steps passed in $((SECONDS - start)) s ($np ranks on $backend)"
