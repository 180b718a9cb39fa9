// The device error record objects own (Publisher, Barrier, Fetcher): where it lives, reading it back, and the
// exception each kind becomes.
#pragma once

#include <cstdint>

#include "kvcomm/device_error.hpp"
#include "kvcomm/symm.hpp"

namespace kvcomm::detail {

/// One zeroed DeviceErrorRecord in device memory (Cuda) or host memory (Host); freed on destruction.
class ErrorRecordMemory {
 public:
  explicit ErrorRecordMemory(MemoryKind kind);
  ~ErrorRecordMemory();
  ErrorRecordMemory(const ErrorRecordMemory&) = delete;
  ErrorRecordMemory& operator=(const ErrorRecordMemory&) = delete;
  DeviceErrorRecord* get() const { return rec_; }

 private:
  MemoryKind kind_;
  DeviceErrorRecord* rec_ = nullptr;
};

/// Reads the record (device or host memory of `kind`) and clears it when it holds an error.
DeviceError readDeviceError(MemoryKind kind, DeviceErrorRecord* rec);

/// Throws the error as its API exception: SlotOutOfRange and BlockOutOfRange as InvalidArgumentError naming the
/// index, BarrierTimeout as a Timeout naming rank, peer and lane (`timeoutMs` is the bound that expired). No-op for
/// DeviceErrorKind::None.
void throwDeviceError(const DeviceError& e, uint64_t timeoutMs);

}  // namespace kvcomm::detail
