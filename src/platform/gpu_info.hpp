// The calling process's GPU and P2P reachability, through the run-time-loaded driver (stubs without CUDA).
#pragma once

#include <string>

#include "common/internal_api.hpp"
#include "kvcomm/capabilities.hpp"

namespace kvcomm::detail {

/// The device of the current CUDA context (device -1 when CUDA is absent or no context is current).
KVCOMM_INTERNAL_API GpuInfo currentGpu();

/// Uuid and PCI bus id of CUDA device `ordinal` (device -1 when absent).
GpuInfo describeDevice(int ordinal);

/// Whether this process's GPU `mine` can access `peer`'s GPU (same host assumed): same device, or CUDA peer access
/// between the devices with those PCI bus ids. False when either GPU is not visible here.
bool gpuPeerAccess(const GpuInfo& mine, const GpuInfo& peer);

}  // namespace kvcomm::detail
