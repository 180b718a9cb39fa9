#!/usr/bin/env bash
# Run-time driver loading, against a stand-in libcuda.so.1 (tests/tools/fake_libcuda.c): kvcomm loads only the entry
# points it calls, a driver without an optional one is still usable (only the feature that needs it is refused,
# naming it), and a driver without a required one is unusable, naming it.
#   cuda_driver_entries.sh PROBE FAKE_LIBCUDA_DIR
set -uo pipefail
probe=$1 dir=$2
status=0
run() { LD_LIBRARY_PATH="$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$probe" 2>&1; }
expect() {  # description output pattern...
  local what=$1 out=$2; shift 2
  for p in "$@"; do
    grep -qE -- "$p" <<<"$out" || { echo "FAIL $what: no /$p/ in:"; echo "$out"; status=1; return; }
  done
  echo "ok   $what"
}
out=$(FAKE_CUDA_MISSING= run)
expect "a complete driver" "$out" "^cuda driver: usable \(version 12040\)" "^core: available" "^legacy-ipc: available" \
  "^adopt: available" "^host-register: available" "^gpudirect-rdma: available"
# Entry points kvcomm never calls must not be asked for: a driver without them is complete.
out=$(FAKE_CUDA_MISSING=cuDeviceGetP2PAttribute,cuDevicePrimaryCtxRelease,cuMemGetAddressRange_v1,cuPointerGetAttribute run)
expect "a driver without entry points kvcomm does not call" "$out" "^cuda driver: usable" "^missing optional: $" \
  "^legacy-ipc: available"
out=$(FAKE_CUDA_MISSING=cuIpcOpenMemHandle,cuMemRetainAllocationHandle,cuGetErrorString run)
expect "a driver without optional entry points" "$out" "^cuda driver: usable" \
  "^missing optional: cuGetErrorString, cuIpcOpenMemHandle, cuMemRetainAllocationHandle$" "^core: available" \
  "^legacy-ipc: Unsupported: .*lacks cuIpcOpenMemHandle, which legacy CUDA IPC needs" \
  "^adopt: Unsupported: .*lacks cuMemRetainAllocationHandle, which adopting an engine's memory needs"
out=$(FAKE_CUDA_MISSING=cuMemGetAddressRange run)
expect "a driver without cuMemGetAddressRange" "$out" "^cuda driver: usable" "^missing optional: cuMemGetAddressRange$" \
  "^legacy-ipc: Unsupported: .*lacks cuMemGetAddressRange, which legacy CUDA IPC needs"
out=$(FAKE_CUDA_MISSING=cuMemHostGetDevicePointer run)
expect "a driver without host registration" "$out" "^cuda driver: usable" "^core: available" \
  "^host-register: Unsupported: .*lacks cuMemHostGetDevicePointer, which device waits on the health flag needs"
out=$(FAKE_CUDA_MISSING=cuMemGetHandleForAddressRange,cuFlushGPUDirectRDMAWrites run)
expect "a driver without the GPUDirect RDMA entry points" "$out" "^cuda driver: usable" \
  "^missing optional: cuMemGetHandleForAddressRange, cuFlushGPUDirectRDMAWrites$" "^core: available" \
  "^gpudirect-rdma: Unsupported: .*lacks cuMemGetHandleForAddressRange, which RDMA registration of GPU memory"
out=$(FAKE_CUDA_MISSING=cuMemCreate run)
expect "a driver without a required entry point" "$out" "^cuda driver: unusable .* - the CUDA driver lacks cuMemCreate" \
  "^core: Unsupported: .*lacks cuMemCreate"
exit $status
