// Whether the publish and barrier kernels use programmatic dependent launch on the current device.
#include <atomic>

#include "common/env.hpp"
#include "kernels/dependent_launch.cuh"

namespace kvcomm::detail {

bool dependentLaunchOn() {
  // 0: not known yet, 1: off, 2: on. Indexed by device; devices past the table ask the driver every time.
  static std::atomic<int> known[64];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (dev >= 0 && dev < 64) {
    int k = known[dev].load(std::memory_order_relaxed);
    if (k != 0) return k == 2;
  }
  int major = 0;
  bool on = env::dependentLaunch() &&
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9;
  if (dev >= 0 && dev < 64) known[dev].store(on ? 2 : 1, std::memory_order_relaxed);
  return on;
}

}  // namespace kvcomm::detail
