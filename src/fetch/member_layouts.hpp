// Every member's KV layout as a fetcher learnt it (MemberLayouts): the collective exchange every member takes part in
// (layouts travel, never pointers) and the tables the planner and kernels read. One layout's validation is kvlayout's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvcomm/comm.hpp"
#include "kvcomm/device/fetch.hpp"
#include "kvcomm/fetch.hpp"
#include "kvcomm/limits.hpp"
#include "kvlayout/kv_layout.hpp"

namespace kvcomm::detail {

/// Every member's layout, learnt through the communicator.
struct MemberLayouts {
  std::vector<KvLayout> layouts;       ///< by rank
  std::vector<uint64_t> hashes;        ///< by rank
  std::vector<FetchRegionView> views;  ///< [rank * numRegions + region]
  size_t numRegions = 0;
  std::vector<uint64_t> minBlocks;  ///< by rank: fewest blocks of any region (valid ids are below it)
  std::vector<uint8_t> contiguous;  ///< by rank: every region's blocks are back to back (stride == blockBytes)
  uint64_t minBlockBytes = 0;       ///< smallest blockBytes of any region
  uint64_t blockBytesSum = 0;       ///< bytes one block pair moves over all regions
  int vec = 16;  ///< widest vector dividing every region's offset, stride and blockBytes on every member
};

/// Collective: allgathers every member's (already validated) layout and checks that every member's is compatible
/// with rank 0's (region count, blockBytes per region); a mismatch throws the same InvalidArgumentError on every
/// rank, naming the rank and region.
MemberLayouts exchangeLayouts(Communicator& comm, const KvLayout& mine);

/// Two layouts as members 0 and 1 (an endpoint's registration and a peer's), with the same checks; errors name them
/// `aName` and `bName`.
MemberLayouts pairLayouts(const KvLayout& a, const KvLayout& b, const char* call, const std::string& aName,
                          const std::string& bName);

}  // namespace kvcomm::detail
