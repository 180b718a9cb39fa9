// pollError() and checkErrors() of the objects that own a device error record (Publisher, Fetcher) or are one
// (Barrier): spelt once. An object reads its own record first, then its barrier's, and throws what it found as the API
// exception of its kind.
#pragma once

#include <cstdint>

#include "kvcomm/barrier.hpp"
#include "kvcomm/comm.hpp"
#include "kvcomm/device_error.hpp"

namespace kvcomm::detail {

/// pollError(): the first error of `record` (in `kind` memory; null: the object has none), else the first of
/// `barrier` (null or empty: none). What is read is cleared.
DeviceError pollDeviceErrors(MemoryKind kind, DeviceErrorRecord* record, Barrier* barrier);

/// checkErrors() of what pollDeviceErrors() found: a PeerFailed as `comm`'s own error (Aborted, or a NetworkError
/// naming the member that is gone), the rest as throwDeviceError() does (a BarrierTimeout naming `timeoutMs`, the
/// bound that expired). No-op for no error.
void throwDeviceErrors(const DeviceError& e, Communicator& comm, uint64_t timeoutMs);

}  // namespace kvcomm::detail
