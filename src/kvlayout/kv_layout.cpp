// KV layouts: the hash peers compare, and the validation every user of a layout runs (regions well formed, inside
// the memory, backed, disjoint) before anything is planned against it.
#include "kvlayout/kv_layout.hpp"

#include <algorithm>

#include "common/check.hpp"

namespace kvcomm {

uint64_t layoutHash(const KvLayout& layout) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(layout.version);
  mix(layout.regions.size());
  for (const KvRegion& r : layout.regions) {
    mix(r.offset);
    mix(r.blockBytes);
    mix(r.blockStride ? r.blockStride : r.blockBytes);
    mix(r.numBlocks);
  }
  return h ? h : 1;  // 0 means "any" in a request
}

namespace detail {

namespace {

// A validated region: its blocks are [offset + b * stride, + blockBytes) for b < numBlocks, all before `end`.
struct Span {
  uint64_t offset, blockBytes, stride, numBlocks, end;
  size_t index;
};

// Whether [x, x + bytes) shares a byte with a block of `r` (exact: the block at or before x, and the one after).
bool meetsBlock(uint64_t x, uint64_t bytes, const Span& r) {
  if (x + bytes <= r.offset || x >= r.end) return false;
  if (x < r.offset) return true;  // block 0 starts inside [x, x + bytes)
  uint64_t c = (x - r.offset) / r.stride;
  if (r.offset + c * r.stride + r.blockBytes > x) return true;
  return c + 1 < r.numBlocks && r.offset + (c + 1) * r.stride < x + bytes;
}

// Whether regions a and b (a.offset <= b.offset, extents intersecting) share a byte. Equal strides: the blocks of b
// sit at d = b.offset - a.offset from a's, modulo the stride; only the block of a at or before b's first block (q
// strides in) and the one after it can meet it, so with d = q * stride + r they overlap iff r < a.blockBytes (and
// that block exists) or stride - r < b.blockBytes (and the next exists). K and V interleaved per block (same
// stride, V at offset K's blockBytes) gives r = a.blockBytes: disjoint. Different strides: refused where the extents
// intersect (an interval test), unless one region is a single block (exact).
bool overlaps(const Span& a, const Span& b) {
  if (a.numBlocks == 1) return meetsBlock(a.offset, a.blockBytes, b);
  if (b.numBlocks == 1) return meetsBlock(b.offset, b.blockBytes, a);
  if (a.stride != b.stride) return true;
  uint64_t d = b.offset - a.offset, q = d / a.stride, r = d % a.stride;
  return (q < a.numBlocks && r < a.blockBytes) || (q + 1 < a.numBlocks && a.stride - r < b.blockBytes);
}

}  // namespace

uint64_t regionExtent(const KvRegion& r, const char* call, size_t index) {
  uint64_t stride = r.blockStride ? r.blockStride : r.blockBytes;
  uint64_t span = 0, extent = 0;
  KVCOMM_CHECK_ARG(!__builtin_mul_overflow(static_cast<uint64_t>(r.numBlocks - 1), stride, &span) &&
                       !__builtin_add_overflow(span, static_cast<uint64_t>(r.blockBytes), &extent),
                   call, "region ", index, ": ", r.numBlocks, " blocks of stride ", stride, " overflow 64-bit offsets");
  return extent;
}

void validateLayout(const KvLayout& layout, uint64_t capacity,
                    const std::function<bool(uint64_t offset, uint64_t bytes)>& isBacked, const char* call) {
  KVCOMM_CHECK_ARG(!layout.regions.empty() && layout.regions.size() <= kMaxFetchRegions, call, "a layout has 1 to ",
                   kMaxFetchRegions, " regions, not ", layout.regions.size());
  for (size_t j = 0; j < layout.regions.size(); ++j) {
    const KvRegion& r = layout.regions[j];
    KVCOMM_CHECK_ARG(r.blockBytes > 0 && r.numBlocks > 0, call, "region ", j, ": blockBytes (", r.blockBytes,
                     ") and numBlocks (", r.numBlocks, ") must be positive");
    KVCOMM_CHECK_ARG(r.blockStride == 0 || r.blockStride >= r.blockBytes, call, "region ", j, ": blockStride ",
                     r.blockStride, " is smaller than blockBytes ", r.blockBytes, " (blocks would overlap)");
    uint64_t extent = regionExtent(r, call, j), end = 0;
    KVCOMM_CHECK_ARG(!__builtin_add_overflow(static_cast<uint64_t>(r.offset), extent, &end) && end <= capacity, call,
                     "region ", j, ": [", r.offset, ", +", extent, ") ends beyond the buffer's ", capacity, " bytes");
    KVCOMM_CHECK_ARG(isBacked(r.offset, extent), call, "region ", j, ": [", r.offset, ", +", extent,
                     ") is not wholly backed (grow() or commit() it before registering)");
  }
  checkDisjoint(layout, call);
}

void checkDisjoint(const KvLayout& layout, const char* call) {
  // A block id names disjoint bytes in every region: otherwise one pair's copies overwrite what another pair of the
  // same batch still reads, which the batch's hazard checks (by block id) cannot see. Sorted by offset, each region
  // is compared with the ones that start inside its extent.
  std::vector<Span> spans;
  spans.reserve(layout.regions.size());
  for (size_t j = 0; j < layout.regions.size(); ++j) {
    const KvRegion& r = layout.regions[j];
    uint64_t stride = r.blockStride ? r.blockStride : r.blockBytes;
    spans.push_back({r.offset, r.blockBytes, stride, r.numBlocks, r.offset + regionExtent(r, call, j), j});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& x, const Span& y) {
    return x.offset != y.offset ? x.offset < y.offset : x.index < y.index;
  });
  for (size_t i = 0; i < spans.size(); ++i)
    for (size_t k = i + 1; k < spans.size() && spans[k].offset < spans[i].end; ++k) {
      const Span& a = spans[i];
      const Span& b = spans[k];
      if (!overlaps(a, b)) continue;
      size_t first = std::min(a.index, b.index), second = std::max(a.index, b.index);
      const Span& x = a.index == first ? a : b;
      const Span& y = a.index == first ? b : a;
      KVCOMM_THROW(InvalidArgument, call, "regions ", first, " and ", second, " overlap: region ", first, " (offset ",
                   x.offset, ", blockBytes ", x.blockBytes, ", blockStride ", x.stride, ", numBlocks ", x.numBlocks,
                   ") and region ", second, " (offset ", y.offset, ", blockBytes ", y.blockBytes, ", blockStride ",
                   y.stride, ", numBlocks ", y.numBlocks, ") share bytes",
                   x.stride != y.stride && x.numBlocks > 1 && y.numBlocks > 1
                       ? " (regions of different strides must not share an address range)"
                       : "",
                   "; every region's blocks must be disjoint from every other region's");
    }
}

}  // namespace detail
}  // namespace kvcomm
