// kvcomm device API: storing a KV row into every replica, for engines that fuse it into their own cache-store
// kernel (see examples/fused_cache_store.cu).
#pragma once

#include <stdint.h>

#include "kvcomm/device/macros.hpp"
#include "kvcomm/device/symm_device.hpp"
#include "kvcomm/device/vector.hpp"

namespace kvcomm {

/// Byte offset of `slot`'s row: offset + (slot / blockSize) * blockStride + (slot % blockSize) * rowStride.
/// Unchecked (it wraps modulo 2^64 for hostile strides or slots): use slotDestinationChecked() where a slot or a
/// layout is not known to be in range.
KVCOMM_HOST_DEVICE_INLINE uint64_t slotDestination(int64_t slot, uint64_t offset, uint64_t blockSize,
                                                   uint64_t blockStride, uint64_t rowStride) {
  uint64_t s = static_cast<uint64_t>(slot);
  return offset + (s / blockSize) * blockStride + (s % blockSize) * rowStride;
}

/// slotDestination() with every step checked: stores offset + (slot / blockSize) * blockStride +
/// (slot % blockSize) * rowStride in *dst and returns true only when no step wraps and the row's `rowBytes` bytes end
/// within `limit` bytes of `offset` (the region the tensor may address). A negative slot (padding) or blockSize 0
/// returns false.
KVCOMM_HOST_DEVICE_INLINE bool slotDestinationChecked(int64_t slot, uint64_t offset, uint64_t blockSize,
                                                      uint64_t blockStride, uint64_t rowStride, uint64_t rowBytes,
                                                      uint64_t limit, uint64_t* dst) {
  if (slot < 0 || blockSize == 0) return false;
  uint64_t s = static_cast<uint64_t>(slot);
  uint64_t block = s / blockSize, within = s - block * blockSize;
  uint64_t a, b, rel, end, at;
  if (mulOverflows(block, blockStride, &a) || mulOverflows(within, rowStride, &b) || addOverflows(a, b, &rel) ||
      addOverflows(rel, rowBytes, &end) || end > limit || addOverflows(offset, rel, &at))
    return false;
  *dst = at;
  return true;
}

#if KVCOMM_ON_DEVICE_COMPILER

/// Warp-cooperative: copies `bytes` from `src` into every member mapped in `h` at byte `dst` of its memory, this
/// rank's own replica included. `src` and `dst` must be VEC-aligned (and the bases, which are); any length works
/// (a byte tail follows the vectors). Plain (weak) stores: publish them with a barrier (barrier.hpp). Call with
/// all 32 lanes of a warp; `laneId` = threadIdx.x % 32.
template <int VEC>
KVCOMM_DEVICE_INLINE void warpStoreToReplicas(const SymmDeviceHandle& h, uint64_t dst, const char* src, uint64_t bytes,
                                              int laneId) {
  using V = typename detail::VecType<VEC>::type;
  const uint64_t vecs = bytes / VEC;
  for (uint64_t c = static_cast<uint64_t>(laneId); c < vecs; c += 32) {
    V v = reinterpret_cast<const V*>(src)[c];
    for (int r = 0; r < h.size; ++r)
      if (h.isMapped(r)) reinterpret_cast<V*>(h.peer(r) + dst)[c] = v;
  }
  for (uint64_t b = vecs * VEC + static_cast<uint64_t>(laneId); b < bytes; b += 32) {
    char v = src[b];
    for (int r = 0; r < h.size; ++r)
      if (h.isMapped(r)) h.peer(r)[dst + b] = v;
  }
}

#endif  // KVCOMM_ON_DEVICE_COMPILER

}  // namespace kvcomm
