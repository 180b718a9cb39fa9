#!/usr/bin/env bash
# The main job: installs what it needs, builds, and runs kvcomm's demo on 4 ranks (mpirun) on whatever backend is
# present (the CUDA backend on GPUs, host memory without).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh >/dev/null
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
np=${KVCOMM_NP:-4}
flags=(--oversubscribe --bind-to none -x NCCL_NVLS_ENABLE -x TORCH_SYMM_MEM_DISABLE_MULTICAST -x NVSHMEM_DISABLE_NVLS)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
export OMPI_MCA_btl_vader_single_copy_mechanism=none
mpirun "${flags[@]}" -np "$np" "${KVCOMM_BUILD_DIR:-build}/tools/kvcomm-info" "$@"
