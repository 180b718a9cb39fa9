#include "device/launch_limits.hpp"

#include <cuda_runtime.h>

#include <atomic>

#include "common/check.hpp"

namespace kvcomm::detail {

namespace {

// Ordinals below this are cached (a lock-free table, read on every launch); any higher ordinal is queried each time.
constexpr int kCachedDevices = 64;
std::atomic<int> smCounts[kCachedDevices];  // 0: not queried yet

[[noreturn]] void throwCuda(const char* call, cudaError_t e, int device) {
  throwError(ErrorCode::CudaError, call,
             cat("device ", device, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e),
                 " (the launch limits of the current device)"),
             __FILE__, __LINE__, static_cast<int>(e));
}

}  // namespace

int currentDeviceSmCount() {
  int device = -1;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) throwCuda("cudaGetDevice", e, device);
  const bool cached = device >= 0 && device < kCachedDevices;
  if (cached)
    if (int n = smCounts[device].load(std::memory_order_relaxed); n > 0) return n;
  int sms = 0;
  if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device); e != cudaSuccess)
    throwCuda("cudaDeviceGetAttribute", e, device);
  if (sms <= 0)
    KVCOMM_THROW(CudaError, "cudaDeviceGetAttribute", "device ", device, " reports ", sms,
                 " multiprocessors (the launch limits of the current device)");
  if (cached) smCounts[device].store(sms, std::memory_order_relaxed);
  return sms;
}

}  // namespace kvcomm::detail
