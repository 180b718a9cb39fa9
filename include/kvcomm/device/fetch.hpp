// kvcomm device API: pulling KV blocks from a mapped peer inside an engine's own kernel (the contract of
// Fetcher::fetchDevice, for engines that fuse the copy into their own kernels).
#pragma once

#include <stdint.h>

#include <type_traits>

#include "kvcomm/device/macros.hpp"
#include "kvcomm/device/symm_device.hpp"
#include "kvcomm/device/vector.hpp"

namespace kvcomm {

/// One region of a registered KV layout, as kernels see it (see kvcomm::KvRegion): block b occupies
/// [offset + b * blockStride, + blockBytes) of the member's memory.
struct FetchRegionView {
  uint64_t offset;
  uint64_t blockBytes;
  uint64_t blockStride;
  uint64_t numBlocks;
};

/// By-value view of a Fetcher for kernels (Fetcher::deviceHandle()). Region tables live in device memory (host
/// memory for host buffers) at addresses that never change for the fetcher's life.
struct FetchDeviceHandle {
  const FetchRegionView* srcRegions;  ///< [size * numRegions]: member r's region j at r * numRegions + j
  const FetchRegionView* dstRegions;  ///< [numRegions]: this rank's layout
  const uint64_t* peers;              ///< [size]: member bases in this process (0 = not mapped), peerTable()
  char* local;                        ///< this rank's base
  const uint64_t* backed;             ///< the buffer's backed-granule bitmap (SymmetricBuffer::backedBitmap())
  uint64_t capacity;                  ///< bytes per member
  int32_t numRegions;
  int32_t size;
  int32_t rank;
  int32_t granShift;  ///< log2 of the buffer's granularity
};

static_assert(std::is_trivially_copyable<FetchDeviceHandle>::value, "passed to kernels by value");

/// Byte offset of `block` in region `r`, or false when the id is outside [0, numBlocks). Registration checked that
/// every valid block lies inside the buffer, so the arithmetic cannot wrap.
KVCOMM_HOST_DEVICE_INLINE bool fetchBlockOffset(const FetchRegionView& r, int64_t block, uint64_t* offset) {
  if (block < 0 || static_cast<uint64_t>(block) >= r.numBlocks) return false;
  *offset = r.offset + static_cast<uint64_t>(block) * r.blockStride;
  return true;
}

/// Whether [offset, offset + bytes) lies wholly in granules backed on every member (read when the kernel runs, so
/// captured kernels follow growth and never touch released pages).
KVCOMM_HOST_DEVICE_INLINE bool fetchRangeBacked(const FetchDeviceHandle& h, uint64_t offset, uint64_t bytes) {
  if (bytes == 0 || offset > h.capacity || bytes > h.capacity - offset) return false;
  for (uint64_t g = offset >> h.granShift, last = (offset + bytes - 1) >> h.granShift; g <= last; ++g)
    if (!((h.backed[g >> 6] >> (g & 63)) & 1u)) return false;
  return true;
}

#if KVCOMM_ON_DEVICE_COMPILER

/// Warp-cooperative copy of `bytes` from `src` to `dst` (both VEC-aligned), four vectors in flight per lane, then
/// a byte tail. Plain loads and stores: order them with a barrier or the stream. Call with all 32 lanes.
template <int VEC>
KVCOMM_DEVICE_INLINE void warpCopy(char* dst, const char* src, uint64_t bytes, int laneId) {
  using V = typename detail::VecType<VEC>::type;
  const uint64_t n = bytes / VEC;
  const V* s = reinterpret_cast<const V*>(src);
  V* d = reinterpret_cast<V*>(dst);
  uint64_t i = static_cast<uint64_t>(laneId);
  for (; i + 96 < n; i += 128) {
    V a = s[i], b = s[i + 32], c = s[i + 64], e = s[i + 96];
    d[i] = a;
    d[i + 32] = b;
    d[i + 64] = c;
    d[i + 96] = e;
  }
  for (; i < n; i += 32) d[i] = s[i];
  for (uint64_t t = n * VEC + static_cast<uint64_t>(laneId); t < bytes; t += 32) dst[t] = src[t];
}

/// Warp-cooperative pull of bytes [from, from + len) of block `srcBlock` of member `srcRank`'s region `region` into
/// the same bytes of this rank's block `dstBlock`. Returns false (copying nothing) when an id is outside its
/// region, the source is not mapped here, or either range is not backed. VEC must divide every region's offset,
/// stride and blockBytes and `from` (Fetcher picks it for its own kernel).
template <int VEC>
KVCOMM_DEVICE_INLINE bool warpPullBlock(const FetchDeviceHandle& h, int srcRank, int region, int64_t srcBlock,
                                        int64_t dstBlock, uint64_t from, uint64_t len, int laneId) {
  if (srcRank < 0 || srcRank >= h.size || h.peers[srcRank] == 0) return false;
  const FetchRegionView& sr = h.srcRegions[srcRank * h.numRegions + region];
  const FetchRegionView& dr = h.dstRegions[region];
  uint64_t so = 0, dO = 0;
  if (!fetchBlockOffset(sr, srcBlock, &so) || !fetchBlockOffset(dr, dstBlock, &dO)) return false;
  if (!fetchRangeBacked(h, so + from, len) || !fetchRangeBacked(h, dO + from, len)) return false;
  warpCopy<VEC>(h.local + dO + from, reinterpret_cast<const char*>(h.peers[srcRank]) + so + from, len, laneId);
  return true;
}

#endif  // KVCOMM_ON_DEVICE_COMPILER

}  // namespace kvcomm
