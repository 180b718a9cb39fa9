// What converted reads (converted_read.cpp) need of an endpoint beyond its public API: a same-host peer's
// registration mapped here, to copy pieces straight out of it (no landing copy).
#pragma once

#include <memory>
#include <string>

#include "endpoint/peer_mapping.hpp"
#include "fetch/transport/peer/peer_memory.hpp"
#include "kvcomm/endpoint.hpp"

namespace kvcomm::detail {

/// A peer's registration mapped into this process. While it lives the mapping stays (an unmap -- the owner revoked,
/// unregistered or died, this endpoint closes -- waits for it): copy, synchronise, then drop it.
struct DirectMapping {
  std::shared_ptr<PeerMapping> mapping;
  std::unique_ptr<PeerMemory::Use> use;  // released before `mapping`
  const char* base = nullptr;            // the registration's first byte here
};

struct EndpointAccess {
  /// The same-host mapping of `remote` for copies into `local` (the peer path's: one host, one memory kind, the
  /// owner grants it), or null with *why: *refused when the owner refused the metadata itself (stale, forged,
  /// unregistered: a read would fail), else the peer path cannot reach it (another host, another memory kind, not
  /// shareable: a read goes over the network). Throws what Endpoint::read throws for bad handles.
  static std::unique_ptr<DirectMapping> map(Endpoint& endpoint, const Registration& local, const RemoteMemory& remote,
                                            const char* call, std::string* why, bool* refused);
};

}  // namespace kvcomm::detail
