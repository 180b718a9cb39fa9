#!/usr/bin/env bash
# On the GPU machine, in one call: build with CUDA, run every test on the CUDA backend (unit tests, mpirun -np 2
# suites, CUDA graph tests), then the benchmarks. Logs, tables and JSON go to $OUT (default /tmp/kvcomm-gpu).
#   tests/gpu/run.sh [tests|perf|all|sanitize]
# sanitize (not part of all): the CUDA suites under compute-sanitizer (memcheck, racecheck, synccheck).
set -uo pipefail
cd "$(dirname "$0")/../.."
what=${1:-all}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/kvcomm-gpu}
mkdir -p "$OUT"
np=${KVCOMM_GPU_NP:-2}
build=${KVCOMM_BUILD_DIR:-build-gpu}
# iproute2 for the network-namespace tests, carried in .ipr/ where the machine lacks it (tests/gpu/iproute2.sh).
source tests/gpu/iproute2.sh
status=0
step() { echo; echo "=== $*"; }

step "machine"
nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total --format=csv | tee "$OUT/gpus.txt"
nvidia-smi topo -m | tee "$OUT/topo.txt"

step "build"
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
# The Python package too, from the same project (python3 there has nanobind and torch, no package index).
py=(); python3 -c "import nanobind" 2>/dev/null && py=(-DKVCOMM_BUILD_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)")
cmake -S . -B "$build" "${gen[@]}" -DKVCOMM_CUDA=ON -DKVCOMM_WERROR=ON -DCMAKE_BUILD_TYPE=Release "${py[@]}" \
  -DKVCOMM_BUILD_TESTS=ON -DKVCOMM_BUILD_TOOLS=ON -DKVCOMM_BUILD_PERF=ON \
  >"$OUT/configure.log" 2>&1 || { tail -40 "$OUT/configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" >"$OUT/build.log" 2>&1 || { grep -E "error|Error" -A5 "$OUT/build.log" | head -60; exit 1; }
echo "built"

mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$np" -x NCCL_NVLS_ENABLE
     -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS -x KVCOMM_LOG_LEVEL)
export KVCOMM_LOG_LEVEL=${KVCOMM_LOG_LEVEL:-warn}

if [ "$what" = sanitize ]; then
  # API-error reports are off: capabilities() probes with driver calls that are expected to fail (cuMemCreate with a
  # fabric handle, cuMemRetainAllocationHandle on non-VMM pointers, cudaFuncGetAttributes without a kernel image).
  cs=(compute-sanitizer --report-api-errors no --error-exitcode 1 --print-limit 20)
  command -v compute-sanitizer >/dev/null || cs[0]=/usr/local/cuda/bin/compute-sanitizer
  for tool in memcheck racecheck synccheck; do
    step "compute-sanitizer --tool $tool: kvcomm_gpu_tests and the CUDA cases of kvcomm_mpi_tests ($np ranks)"
    timeout 900 "${mpi[@]}" "${cs[@]}" --tool "$tool" "$build/tests/mpi/kvcomm_gpu_tests" --gtest_color=no 2>&1 | \
      tee "$OUT/sanitize_${tool}_gpu.txt" | grep -E "ERROR SUMMARY|^\[ *(PASSED|FAILED) |Failure" | head -20
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
    timeout 900 "${mpi[@]}" "${cs[@]}" --tool "$tool" "$build/tests/mpi/kvcomm_mpi_tests" --gtest_color=no \
      '--gtest_filter=*/cuda:-*Pcp*/cuda:*SizesAndLayouts*' 2>&1 | tee "$OUT/sanitize_${tool}_mpi.txt" | \
      grep -E "ERROR SUMMARY|^\[ *(PASSED|FAILED) |Failure" | head -20
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
  echo; echo "=== status $status"
  (cd "$OUT" && tar czf logs.tgz --remove-files ./*.txt ./*.log 2>/dev/null)
  exit $status
fi

if [ "$what" != perf ]; then
  step "capabilities and topology (kvcomm-info, $np ranks)"
  "${mpi[@]}" "$build/tools/kvcomm-info" --tp 1 2>&1 | tee "$OUT/info.txt" || status=1

  step "unit tests"
  # The whole log is kept (a brief tail had shown "104 passed" of 105 without naming the one that did not pass).
  timeout 300 "$build/tests/unit/kvcomm_unit_tests" --gtest_color=no >"$OUT/unit.txt" 2>&1 || status=1
  grep -E "^\[ *(FAILED|SKIPPED) |Failure$|tests? from .* ran|^\[ *PASSED" "$OUT/unit.txt" | head -30

  step "arena tests (processes; CUDA: server on GPU 0, clients on every GPU) and the arena example"
  timeout 600 "$build/tests/arena/kvcomm_arena_tests" --gtest_color=no 2>&1 | tee "$OUT/arena.txt" | \
    grep -E "^\[ *(OK|PASSED|FAILED|SKIPPED) |Failure|^\[arena\]|only (before|after)" | head -80
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  timeout 120 examples/arena_kv/run.sh "$build" 2>&1 | tee "$OUT/arena_example.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1

  step "endpoint tests (processes that meet through metadata; CUDA: cudaMalloc memory on both sides)"
  timeout 600 "$build/tests/endpoint/kvcomm_endpoint_tests" --gtest_color=no 2>&1 | tee "$OUT/endpoint.txt" | \
    grep -E "^\[ *(OK|PASSED|FAILED|SKIPPED) |Failure" | head -40
  [ "${PIPESTATUS[0]}" = 0 ] || status=1

  for bin in kvcomm_mpi_tests kvcomm_gpu_tests; do
    step "$bin (mpirun -np $np, CUDA backend where a GPU is present)"
    # The TP2/PCP2 CUDA cases need 4 ranks: they run in the 4-rank step below, not here.
    filter=(); [ "$bin" = kvcomm_mpi_tests ] && filter=(--gtest_filter=-*Pcp*/cuda)
    timeout 500 "${mpi[@]}" "$build/tests/mpi/$bin" --gtest_color=no "${filter[@]}" 2>&1 | tee "$OUT/$bin.txt" | \
      grep -E "^\[ *(OK|PASSED|FAILED|SKIPPED) |Failure|error|^\[rank [0-9]" | head -80
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
  step "example: fused cache-store kernel (device API), and the demo"
  "${mpi[@]}" "$build/examples/example_fused_cache_store" 2>&1 | tee "$OUT/example.txt" || status=1
  "${mpi[@]}" "$build/tools/kvcomm-demo" 2>&1 | tee "$OUT/demo.txt" || status=1

  # The 4-rank tests (TP2/PCP2 layouts, fetch with two ranks per GPU): two ranks per GPU.
  step "kvcomm_mpi_tests, 4 ranks on $np GPUs (TP2/PCP2 and fetch tests)"
  mpi4=("${mpi[@]}"); mpi4[6]=4
  timeout 300 "${mpi4[@]}" "$build/tests/mpi/kvcomm_mpi_tests" --gtest_color=no \
    --gtest_filter='*Pcp*:*Tp*:ParallelGroups*:Split*:*Fetch*' 2>&1 | tee "$OUT/mpi4.txt" | \
    grep -E "^\[ *(OK|PASSED|FAILED|SKIPPED) |Failure|error|^\[rank [0-9]" | head -40
  [ "${PIPESTATUS[0]}" = 0 ] || status=1

  # Two processes in two network namespaces are two hosts: TCP fetch from one GPU's memory into the other's, byte for
  # byte over whole buffers (and two members per namespace: peer mappings within a host, TCP between hosts). Runs as
  # root here; a skip (no namespaces, no iproute2) fails the step.
  step "fetch across hosts: GPU to GPU over TCP between two network namespaces"
  timeout 300 tests/scripts/netns_fetch.sh "$build/tests/unit/fetch_probe" --kind cuda --hosts 2 --cases suite,mixed \
    2>&1 | tee "$OUT/netns_fetch_cuda.txt" | grep -E "^(PASS|FAIL|SKIPPED)|rank .* exited"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  step "endpoints across hosts: a GPU server and GPU clients in 3 other network namespaces"
  timeout 200 tests/scripts/netns_endpoint.sh "$build/tests/endpoint/endpoint_probe" --kind cuda --hosts 4 \
    --per-host 1 2>&1 | tee "$OUT/netns_endpoint_cuda.txt" | grep -E "^(PASS|FAIL|SKIPPED)"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  step "fetch across hosts: the host-memory suite (4 namespaces: kill -9, link down, malformed requests)"
  timeout 300 tests/scripts/netns_fetch.sh "$build/tests/unit/fetch_probe" 2>&1 | tee "$OUT/netns_fetch_host.txt" | \
    grep -E "^(PASS [a-z]|FAIL|SKIPPED)|^(kill|linkdown|malformed):"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  step "RDMA device tests (tests/rdma: exit 77 = not run, no RDMA device)"
  timeout 120 "$build/tests/rdma/kvcomm_rdma_tests" 2>&1 | tee "$OUT/rdma.txt" | tail -5
  rc=${PIPESTATUS[0]}; [ "$rc" = 0 ] || [ "$rc" = 77 ] || status=1

  # A GPU is present, so every CUDA case must have run: a skipped one fails the script (its reason is in the log).
  step "skipped CUDA cases"
  tests/gpu/check_skips.sh "$OUT/kvcomm_mpi_tests.txt" "$OUT/kvcomm_gpu_tests.txt" "$OUT/mpi4.txt" "$OUT/arena.txt" \
    "$OUT/endpoint.txt" || status=1

  step "the KV server example (a server and four engines started separately; two engines on GPU memory)"
  timeout 120 examples/kv_server/run.sh "$build" 4 2>&1 | tee "$OUT/kv_server_example.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1

  step "C ABI tests and C example (mpirun -np 4, host memory)"
  timeout 120 tests/mpi/run_mpi_test.sh 4 "$build/tests/capi/kvcomm_capi_test" 2>&1 | tee "$OUT/capi.txt" | tail -3
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  timeout 120 tests/mpi/run_mpi_test.sh 4 "$build/tests/capi/kvcomm_capi_endpoint_test" 2>&1 | tee -a "$OUT/capi.txt" | \
    tail -1
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  timeout 120 tests/mpi/run_mpi_test.sh 4 "$build/examples/example_c_publish" 2>&1 | tee -a "$OUT/capi.txt" || status=1

  if [ ${#py[@]} -gt 0 ]; then
    export PYTHONPATH="$PWD/$build/python${PYTHONPATH:+:$PYTHONPATH}"
    # torch's NCCL process group needs a GPU per process: as many processes as there are GPUs, up to $np.
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU'); pynp=$(( gpus < np ? gpus : np )); [ "$pynp" -ge 1 ] || pynp=1
    step "python: host tests (4 spawned ranks) and CUDA tests (torchrun, $pynp processes) from the build tree"
    timeout 300 python3 -m pytest tests/python/test_host.py -q -rs -p no:cacheprovider 2>&1 | tee "$OUT/pytest_host.txt" | tail -5
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
    timeout 400 torchrun --standalone --nproc-per-node "$pynp" -m pytest tests/python/test_cuda.py -q -rs \
      -p no:cacheprovider 2>&1 | tee "$OUT/pytest_cuda.txt" | tail -12
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
    if grep -q "SKIPPED\|skipped" "$OUT/pytest_cuda.txt"; then echo "python CUDA cases skipped on the GPU machine"; status=1; fi
    # Endpoints and the P/D hand-off from Python, torch tensors on the GPU included: no case may skip here.
    timeout 300 python3 -m pytest tests/python/test_endpoint.py tests/python/test_pd.py -q -rs -p no:cacheprovider 2>&1 | \
      tee "$OUT/pytest_endpoint.txt" | tail -5
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
    if grep -q "SKIPPED" "$OUT/pytest_endpoint.txt"; then echo "python endpoint or P/D cases skipped on the GPU machine"; status=1; fi
    step "example: vLLM-style PCP step (torchrun, $pynp processes): all_gather+index_copy_ vs torch SymmetricMemory vs kvcomm"
    timeout 500 torchrun --standalone --nproc-per-node "$pynp" examples/vllm_pcp/vllm_pcp.py \
      --json "$OUT/vllm_pcp.jsonl" 2>&1 | tee "$OUT/vllm_pcp.txt" | tail -40
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
    if [ "$pynp" -lt 2 ]; then
      # Path D (the custom op at vLLM's call site) needs 2 ranks: on one GPU, 2 ranks share it (gloo, A via host).
      step "example: vLLM-style PCP step, 2 ranks sharing the GPU (paths C and D checked against A, captured)"
      timeout 500 torchrun --standalone --nproc-per-node 2 examples/vllm_pcp/vllm_pcp.py --tokens 1,256,4096 \
        --iters 10 --json "$OUT/vllm_pcp_shared.jsonl" 2>&1 | tee "$OUT/vllm_pcp_shared.txt" | tail -20
      [ "${PIPESTATUS[0]}" = 0 ] || status=1
    fi
  else
    step "python: skipped (python3 has no nanobind)"
  fi
fi

if [ "$what" != tests ]; then
  step "perf: rendezvous"
  for kind in cuda host; do
    timeout 300 "${mpi[@]}" "$build/perf/perf_symm_rendezvous" --kind $kind --json "$OUT/perf.jsonl" 2>&1 | \
      tee -a "$OUT/perf.txt" | tail -9 || status=1
  done
  for k in cuda host; do
    step "perf: fetch across hosts (two network namespaces, $k memory): TCP vs plain send/recv, RDMA rows"
    timeout 300 perf/fetch_netns.sh "$build/perf/perf_fetch" --kind $k --reps 20 --json "$OUT/perf.jsonl" 2>&1 | \
      tee -a "$OUT/perf.txt" | tail -16
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
  for k in cuda host; do
    step "perf: endpoint on one host ($k memory): peer mapping beside the Fetcher, device ids, per-block copies"
    timeout 400 "${mpi[@]}" "$build/perf/perf_fetch" --endpoint --kind $k --reps 20 --json "$OUT/perf.jsonl" 2>&1 | \
      tee -a "$OUT/perf.txt" | grep -E "^\|" | head -80
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  done
  for b in "$build"/perf/perf_publish "$build"/perf/perf_fetch; do
    [ -x "$b" ] || continue
    step "perf: $(basename "$b")"
    timeout 400 "${mpi[@]}" "$b" --json "$OUT/perf.jsonl" 2>&1 | tee -a "$OUT/perf.txt" | tail -40 || status=1
  done
  step "perf: converted reads into GPU memory beside plain reads and the engine way (perf/conversion/compare.py)"
  PYTHONPATH="$PWD/$build/python" timeout 300 python3 perf/conversion/compare.py --kind cuda --reps 9 \
    --json "$OUT/perf.jsonl" 2>&1 | tee -a "$OUT/perf.txt" | tail -8
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  # The verdicts on the latency targets (judged only on 2 GPUs; a miss does not fail this script).
  if [ "$np" = 2 ]; then
    step "perf: against the latency targets (perf/targets.py)"
    python3 perf/targets.py "$OUT/perf.jsonl" --txt "$OUT/perf.txt" --json "$OUT/targets.json" | tee "$OUT/targets.txt"
  fi
fi
echo; echo "=== status $status"
# What comes back from the machine is limited in file count: one archive of the logs, plus the JSON.
(cd "$OUT" && tar czf logs.tgz --remove-files ./*.txt ./*.log 2>/dev/null)
exit $status
