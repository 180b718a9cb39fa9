// Building a Topology: gathering member identities and P2P rows (world), restricting it to a split (subgroups).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "kvcomm/comm.hpp"

namespace kvcomm::detail {

/// This process's host identity: boot id, network-namespace inode, hostname.
struct HostIdentity {
  std::string bootId;
  uint64_t netns = 0;
  std::string hostname;
};
HostIdentity localHostIdentity();

/// Bytes of one member's record in the topology allgather.
size_t memberWireBytes();
/// Decodes `count` gathered member records (bytes from other processes: every text field is bounded).
std::vector<MemberInfo> decodeMembers(const void* bytes, size_t count);

/// Collective: every member contributes its identity and P2P row through `allgather` (in-place, per-rank bytes).
Topology gatherTopology(int rank, size_t size, const std::function<void(void*, size_t)>& allgather);

/// The topology of the members `parentRanks` (in their new rank order).
Topology subTopology(const Topology& parent, const std::vector<int>& parentRanks);

}  // namespace kvcomm::detail
