// Host-memory copies of KV blocks: large copies with streaming (non-temporal) stores. A copy into a KV slot is not
// read back by this CPU soon (the engine reads it later, or a GPU DMA does), so writing around the cache saves the
// read-for-ownership of every destination line and keeps the cache for the source: measured on this project's 2-core
// CPU machine, one 2 MiB block 11.8 -> 18.7 GB/s, sixteen 64 KiB blocks 15 -> 22 GB/s, sixteen 2 MiB blocks 4.8 ->
// 14.6 GB/s. Small copies stay plain memcpy (their destination is likely read soon, and they fit in cache).
#pragma once

#include <cstddef>

namespace kvcomm::detail {

/// Copies below this many bytes are plain memmove.
inline constexpr size_t kBulkCopyBytes = 64 * 1024;

/// memmove(dst, src, n); from kBulkCopyBytes up, with streaming stores when the ranges do not overlap (x86-64; other
/// targets memmove). Ends with a store fence: the bytes are visible to whoever is told after it returns.
void bulkCopy(void* dst, const void* src, size_t n);

}  // namespace kvcomm::detail
