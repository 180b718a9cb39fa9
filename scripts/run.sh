#!/usr/bin/env bash
# The main job: installs what it needs, builds, then on whatever backend is present (the CUDA backend on GPUs, host
# memory without), under mpirun: kvcomm-info (communicator, layout, topology, capabilities), kvcomm-demo (one
# publish + barrier step and one fetch, each verified byte for byte), the publish benchmark against gather+insert
# and the fetch benchmark against per-block copies, copy-engine batches and MPI / NCCL send/recv; then the arena
# example (a KV block server and its clients, without MPI).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
b=${KVCOMM_BUILD_DIR:-build}
# Only what the main job runs; compile errors are shown (and stop the job) here.
echo "== build ($b)"
./scripts/build.sh -DKVCOMM_BUILD_TOOLS=ON -DKVCOMM_BUILD_PERF=ON --target kvcomm-info --target kvcomm-demo \
  --target perf_publish
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
np=${KVCOMM_NP:-$([ "${gpus:-0}" -ge 2 ] && echo "$gpus" || echo 4)}
flags=(--oversubscribe --bind-to none -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
export OMPI_MCA_btl_vader_single_copy_mechanism=none
echo; echo "== kvcomm-info"
mpirun "${flags[@]}" -np "$np" "$b/tools/kvcomm-info"
echo; echo "== kvcomm-demo"
mpirun "${flags[@]}" -np "$np" "$b/tools/kvcomm-demo"
echo; echo "== publish benchmark (JSON: $b/perf-publish.jsonl)"
rm -f "$b/perf-publish.jsonl"
mpirun "${flags[@]}" -np "$np" "$b/perf/perf_publish" --json "$b/perf-publish.jsonl" "$@"
echo; echo "== fetch benchmark (JSON: $b/perf-fetch.jsonl)"
rm -f "$b/perf-fetch.jsonl"
mpirun "${flags[@]}" -np "$np" "$b/perf/perf_fetch" --json "$b/perf-fetch.jsonl"

# ---- arena example (examples/arena_kv): a KV block server and four clients, both directions of ownership, on GPUs
# (server on GPU 0, clients spread over every GPU) or host memory; every client checks every byte.
echo; echo "== arena example: KV block server + 4 clients (examples/arena_kv)"
./scripts/build.sh -DKVCOMM_BUILD_TOOLS=ON --target example_arena_server --target example_arena_client
examples/arena_kv/run.sh "$b"
