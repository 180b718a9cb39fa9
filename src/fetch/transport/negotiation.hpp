// What members tell each other about their registered memory at Fetcher::create, and how each member picks the
// transport to every source. Pure functions over the exchanged data (unit-tested); the collective steps are in
// fetcher.cpp.
//
// Phase 1: every member allgathers a DescriptorHead, a 16-byte record every protocol version keeps as it is (magic,
//   the versions it speaks, what it offers, the size of its descriptor). Every member checks every head the same way,
//   so an incompatible member (a version range that does not meet this build's, a foreign magic) makes every rank
//   throw the same error naming it, at once: no vote and no wait.
// Phase 2: the RemoteDescriptor of the agreed version: region id, generation, layout hash, memory kind, the TCP
//   endpoint, the RDMA device (what a requester needs to connect; per-chunk keys and queue pairs travel later).
// Phase 3: each member chooses a route to every source (chooseRoutes) and the route matrix is allgathered, so every
//   member knows who reads it over which transport (servers start and queue pairs connect only where needed).
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "common/env.hpp"
#include "common/socket.hpp"
#include "fetch/transport/net/wire.hpp"

namespace kvcomm::detail {

inline constexpr uint32_t kDescriptorMagic = 0x4446564bu;  // "KVFD"

/// Frozen across protocol versions: an older or newer member's head still decodes.
struct DescriptorHead {
  uint32_t magic;
  uint16_t version;     ///< newest fetch protocol version the member speaks
  uint16_t minVersion;  ///< oldest one
  uint32_t caps;        ///< FetchCap bits it offers
  uint32_t descriptorBytes;
};
static_assert(sizeof(DescriptorHead) == 16 && std::is_trivially_copyable_v<DescriptorHead>);

/// Version 1 of a member's registration as requesters see it.
struct RemoteDescriptor {
  DescriptorHead head;
  uint32_t demand;  ///< the member's KVCOMM_FETCH_TRANSPORT (TransportDemand)
  uint32_t memoryKind;
  uint64_t regionId;  ///< random per registration: a TCP hello must name it (a stale descriptor is refused)
  uint64_t generation;
  uint64_t capacity;
  uint64_t layoutHash;
  SockAddr tcp;            ///< where its TCP server listens (len 0: none)
  char rdmaDevice[32];     ///< its RDMA device ("" : none)
  char rdmaLinkLayer[16];  ///< InfiniBand / Ethernet: READs need both ends on one fabric
  char note[128];          ///< why it offers no RDMA or no TCP ("" when it offers both)
};
static_assert(std::is_trivially_copyable_v<RemoteDescriptor>);

/// This build's head with `caps`, after the test hooks.
DescriptorHead makeHead(uint32_t caps);

/// The protocol version every member speaks, or throws InvalidArgumentError naming the first member whose head is
/// foreign or whose version range does not meet this build's (the same message on every rank).
uint16_t checkHeads(const std::vector<DescriptorHead>& heads, const char* call);

/// Member `rank`'s descriptor is what its head says (size, magic), or "why not".
std::string checkDescriptor(const RemoteDescriptor& d, const DescriptorHead& head, int rank);

/// What a member's KVCOMM_FETCH_TRANSPORT demands (env::kFetchTransport's choices, in order; on the wire as uint32).
enum class TransportDemand : uint32_t { Auto = 0, Peer = 1, Rdma = 2, Tcp = 3 };

/// How this rank reaches a source.
enum class Route : uint8_t { None = 0, Peer = 1, Tcp = 2, Rdma = 3 };
const char* routeName(Route r);

struct RouteInput {
  int me = 0;
  TransportDemand demand = TransportDemand::Auto;
  std::vector<uint8_t> mapped;  ///< by rank: whether this rank maps the member's memory (same host, P2P)
  std::vector<RemoteDescriptor> descs;
};

/// By source: this rank's own blocks are copied locally (Peer); auto takes Peer where mapped, else Rdma where both
/// ends have RDMA on one fabric, else Tcp where the source serves it; a demanded transport is used for every other
/// member or the route is None. `why[r]` says why a route is None.
std::vector<Route> chooseRoutes(const RouteInput& in, std::vector<std::string>* why);

/// Test hooks (unit tests of negotiation): advertise another version range, or withhold capabilities.
struct VerbsApi;  // platform/ibverbs.hpp

struct FetchTestHooks {
  bool overrideVersion = false;  ///< advertise [minVersion, version] instead of this build's range
  uint16_t version = 0;
  uint16_t minVersion = 0;
  uint32_t withhold = 0;            ///< FetchCap bits not offered (descriptor and TCP hello reply)
  const VerbsApi* verbs = nullptr;  ///< the verbs provider endpoints open (nullptr: the real libibverbs)
  int controlReplyDelayMs = 0;      ///< a pause before a control request's reply (widens the race with a close)
};
FetchTestHooks& fetchTestHooks();

}  // namespace kvcomm::detail
