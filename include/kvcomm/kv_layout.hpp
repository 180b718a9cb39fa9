// kvcomm: the KV layout of a cache -- the regions one block id indexes together. Fetch plans against it, arenas are
// described by it, and peers compare its hash; it lives below the features that use it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvcomm/api.hpp"

namespace kvcomm {

/// One region of a KV layout, in bytes from the buffer's base: block b occupies
/// [offset + b * blockStride, offset + b * blockStride + blockBytes).
/// Typically one region per layer and per K/V (or one per layer when K and V share a block).
struct KvRegion {
  size_t offset = 0;
  size_t blockBytes = 0;   ///< bytes of one block in this region (what a fetch copies)
  size_t blockStride = 0;  ///< bytes between consecutive blocks (0: blockBytes)
  size_t numBlocks = 0;    ///< valid block ids are [0, numBlocks)
};

/// A member's KV cache layout: the regions one block id indexes together. Every member registers its own; members
/// may place regions differently (offsets, strides, block counts), but every member must have the same number of
/// regions with the same blockBytes, region by region (what a fetch copies must fit on both sides).
struct KvLayout {
  std::vector<KvRegion> regions;
  uint64_t version = 0;  ///< the engine's own version of this layout; part of the hash
};

/// FNV-1a hash of a layout (regions and version): what requests and peers compare.
KVCOMM_API uint64_t layoutHash(const KvLayout& layout);

}  // namespace kvcomm
