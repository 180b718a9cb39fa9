// Sending device memory over a socket through pinned staging (the TCP server's reads of CUDA memory, the requester's
// writes from CUDA memory): one loop for both directions of the protocol.
#pragma once

#include <atomic>
#include <cstdint>

#include "fetch/device_copy.hpp"
#include "fetch/transport/net/net_io.hpp"
#include "fetch/transport/net/segments.hpp"

namespace kvcomm::detail {

/// Sends the next `bytes` bytes of `cursor` over device memory at `base` through the staging's first two slots:
/// device -> slot k while slot k^1 is on the wire. Returns once no copy into a slot is pending, whatever the outcome
/// (the slots may be reused at once).
IoResult sendStaged(int fd, SegmentCursor& cursor, const char* base, uint64_t bytes, HostStaging& staging,
                    int64_t stallMs, const std::atomic<bool>* stop, int* err);

}  // namespace kvcomm::detail
