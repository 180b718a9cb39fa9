// The pairwise RDMA connection of two endpoints' registrations: what the requester sends in a control request
// (kControlRdmaConnect) over the TCP connection of the pair, and what the owner answers. Pure encode/decode
// (unit-tested and fuzzed): decoding trusts no count of the input.
//
// Request: {numQps, reserved, FabricAddress, numQps x QpAddress}: the requester's device and its queue pairs.
// Reply:   {numQps, numChunks, FabricAddress, numQps x QpAddress, numChunks x WireChunk}: the owner's device, its
//          queue pairs (already connected to the requester's) and its registered pieces (offset from the
//          registration's base, bytes, the address work requests name, rkey), sorted and disjoint.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fetch/transport/rdma/verbs_transport.hpp"

namespace kvcomm::detail {

/// Most pieces a reply may carry (an arena of many VMM chunks stays far below).
inline constexpr uint32_t kMaxConnectChunks = 2048;

struct RdmaConnectRequest {
  FabricAddress fabric{};
  std::vector<QpAddress> qps;
};

struct RdmaConnectReply {
  FabricAddress fabric{};
  std::vector<QpAddress> qps;
  std::vector<ChunkKey> chunks;  ///< lkey 0
};

std::vector<uint8_t> encodeConnectRequest(const RdmaConnectRequest& r);
/// "" when well-formed (kQpsPerPeer queue pairs, a valid fabric address), else why not.
std::string decodeConnectRequest(const void* data, size_t bytes, RdmaConnectRequest* out);

std::vector<uint8_t> encodeConnectReply(const RdmaConnectReply& r);
/// "" when well-formed: kQpsPerPeer queue pairs, a valid fabric address, at most kMaxConnectChunks pieces, sorted,
/// disjoint, non-empty and inside [0, registeredBytes) (the registration's size, from its metadata).
std::string decodeConnectReply(const void* data, size_t bytes, uint64_t registeredBytes, RdmaConnectReply* out);

}  // namespace kvcomm::detail
