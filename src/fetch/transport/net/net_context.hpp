// What the network transports (TCP, RDMA) read on the requester side: the destination (this rank's buffer and
// layout) and every member's descriptor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fetch/member_layouts.hpp"
#include "fetch/transport/negotiation.hpp"
#include "fetch/transport/transport.hpp"
#include "kvcomm/symm.hpp"

namespace kvcomm::detail {

struct NetContext {
  char* local = nullptr;  // this rank's base
  MemoryKind kind = MemoryKind::Host;
  int device = -1;
  int rank = 0;
  uint64_t groupId = 0;
  const MemberLayouts* table = nullptr;
  std::vector<RemoteDescriptor> descs;  // by rank
  int64_t netTimeoutMs = 3000;
  int connectionsPerSource = 4;
  /// By rank: the capability a hello to it presents (endpoints); empty: none (a Fetcher's members).
  std::vector<WireCapability> capabilities;
  /// By rank (empty: "source rank N"): how errors name a source (an endpoint's peer: "endpoint 'name'").
  std::vector<std::string> sourceNames;
};

/// The requester side's context of a transport the registry made, once every member's descriptor is known.
inline NetContext netContext(const TransportSetup& s, const std::vector<RemoteDescriptor>& descs) {
  NetContext net;
  net.local = static_cast<char*>(s.buffer->local());
  net.kind = s.kind;
  net.device = s.device;
  net.rank = s.rank;
  net.groupId = s.comm.id();
  net.table = s.table;
  net.descs = descs;
  net.netTimeoutMs = s.netTimeoutMs;
  net.connectionsPerSource = s.connectionsPerSource;
  return net;
}

}  // namespace kvcomm::detail
