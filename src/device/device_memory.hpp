// The device runtime below the features: device-memory helpers over the CUDA runtime, used by publish, fetch and
// arena. Compiled with the CUDA backend (device/device_memory.cpp), whether or not NCCL is part of the build; without
// CUDA the stand-ins (device/no_cuda.cpp) throw Unsupported.
#pragma once

#include <cstddef>

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

}  // namespace kvcomm::detail
