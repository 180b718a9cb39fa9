// The bytes of a list of block runs in wire order (run by run, region by region, block by block) as contiguous
// segments of one member's memory: one per run and region where that member's blocks are back to back, else one per
// block. The server walks it over its own layout to send, the requester over its layout to receive: both see the
// same byte stream. Allocates nothing.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "fetch/transport/net/wire.hpp"

namespace kvcomm::detail {

class SegmentCursor {
 public:
  SegmentCursor(const FetchRegionView* regions, size_t numRegions, const WireRun* runs, size_t numRuns)
      : regions_(regions), numRegions_(numRegions), runs_(runs), numRuns_(numRuns) {}

  /// The next at most `max` bytes (max > 0) that are contiguous in memory: their offset from the member's base and
  /// length; the cursor moves past them. False at the end.
  bool take(uint64_t max, uint64_t* offset, uint64_t* bytes) {
    if (!peek(max, offset, bytes)) return false;
    within_ += *bytes;
    return true;
  }

  /// take() without moving: advance() moves past (part of) what it returned.
  bool peek(uint64_t max, uint64_t* offset, uint64_t* bytes) {
    while (run_ < numRuns_) {
      const FetchRegionView& g = regions_[region_];
      const WireRun& r = runs_[run_];
      const bool packed = g.blockStride == g.blockBytes || r.blocks == 1;
      const uint64_t segBytes = packed ? static_cast<uint64_t>(r.blocks) * g.blockBytes : g.blockBytes;
      if (within_ < segBytes) {
        const uint64_t block = static_cast<uint64_t>(r.srcBlock) + (packed ? 0 : static_cast<uint64_t>(block_));
        *offset = g.offset + block * g.blockStride + within_;
        *bytes = std::min(max, segBytes - within_);
        return true;
      }
      within_ = 0;
      if (!packed && ++block_ < r.blocks) continue;
      block_ = 0;
      if (++region_ < numRegions_) continue;
      region_ = 0;
      ++run_;
    }
    return false;
  }
  /// Moves past `n` bytes of what peek() returned last (n at most its length).
  void advance(uint64_t n) { within_ += n; }

  /// Wire index of the run the cursor is in (numRuns at the end).
  size_t run() const { return run_; }

 private:
  const FetchRegionView* regions_;
  size_t numRegions_;
  const WireRun* runs_;
  size_t numRuns_;
  size_t run_ = 0, region_ = 0;
  int64_t block_ = 0;
  uint64_t within_ = 0;
};

}  // namespace kvcomm::detail
