// The device runtime below the features: device-memory helpers over the CUDA runtime, used by publish, fetch and
// arena. Compiled with the CUDA backend (device/device_memory.cpp), whether or not NCCL is part of the build; without
// CUDA the stand-ins (device/no_cuda.cpp) throw Unsupported.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvcomm/stream.hpp"

namespace kvcomm::detail {

/// cuMemAlloc of `bytes` (at least 1) on the current context.
void* deviceAlloc(size_t bytes);
/// cuMemFree; logs instead of throwing (destructors call it).
void deviceFree(void* p) noexcept;
/// Sets `bytes` bytes at `p` to `value` and synchronises the context.
void deviceMemset(void* p, int value, size_t bytes);
/// Copies `bytes` bytes from device memory to host memory (synchronous).
void deviceToHost(void* dst, const void* src, size_t bytes);
/// Copies `bytes` bytes from host memory to device memory (synchronous).
void hostToDevice(void* dst, const void* src, size_t bytes);
/// Whether `stream` is being captured into a CUDA graph (false without CUDA).
bool streamCapturing(Stream stream);

/// `count` zeroed 32-bit words of device memory on the current context, freed with the object (the claim words of
/// the gather kernel: see FetchLaunch::claims).
class DeviceWords {
 public:
  DeviceWords() = default;
  explicit DeviceWords(size_t count) : count_(count) {
    p_ = static_cast<uint32_t*>(deviceAlloc(count * sizeof(uint32_t)));
    deviceMemset(p_, 0, count * sizeof(uint32_t));
  }
  ~DeviceWords() {
    if (p_) deviceFree(p_);
  }
  DeviceWords(const DeviceWords&) = delete;
  DeviceWords& operator=(const DeviceWords&) = delete;
  uint32_t* get() const { return p_; }
  size_t count() const { return count_; }

 private:
  uint32_t* p_ = nullptr;
  size_t count_ = 0;
};

}  // namespace kvcomm::detail
