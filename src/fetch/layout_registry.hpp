// Layouts of a fetcher's members: validation of one layout against the buffer, its wire form, and the collective
// registration every member takes part in (layouts travel, never pointers).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kvcomm/comm.hpp"
#include "kvcomm/device/fetch.hpp"
#include "kvcomm/fetch.hpp"
#include "kvcomm/limits.hpp"

namespace kvcomm::detail {

/// Most regions a layout may have: the limit table's (kvcomm/limits.hpp).
inline constexpr size_t kMaxFetchRegions = limits::kMaxFetchRegions;

/// Throws InvalidArgumentError naming the region unless every region is well formed (blockBytes > 0, stride >=
/// blockBytes, numBlocks > 0), its last block ends inside `capacity` without any arithmetic wrapping, and its whole
/// extent is backed (isBacked(offset, bytes)), and no two regions share a byte (checkDisjoint).
void validateLayout(const KvLayout& layout, uint64_t capacity,
                    const std::function<bool(uint64_t offset, uint64_t bytes)>& isBacked, const char* call);

/// Throws InvalidArgumentError naming both regions when two regions of `layout` share a byte (every region's
/// extent already checked). Regions of equal strides are compared exactly (K and V interleaved per block pass);
/// regions of different strides (both of more than one block) must not have intersecting extents.
void checkDisjoint(const KvLayout& layout, const char* call);

/// Bytes from a region's offset to the end of its last block (checked; throws on wrap).
uint64_t regionExtent(const KvRegion& r, const char* call, size_t index);

/// Every member's layout, learnt through the communicator.
struct LayoutTable {
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
LayoutTable exchangeLayouts(Communicator& comm, const KvLayout& mine);

}  // namespace kvcomm::detail
