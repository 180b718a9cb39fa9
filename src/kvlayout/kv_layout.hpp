// KV layouts below the features: validation of one layout against the memory it describes, and region extents.
// Fetch (every member's layout) and arenas (the layout an arena is made of) both use it.
#pragma once

#include <cstdint>
#include <functional>

#include "kvcomm/kv_layout.hpp"
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

}  // namespace kvcomm::detail
