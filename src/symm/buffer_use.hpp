// An operation that reads or writes through a SymmetricBuffer's mappings (publish, insert, fetch) holds a BufferUse
// while it touches them: grow/commit/release (their state change) and close() on other threads wait for it, so the
// mappings and the backed state it read stay valid until it ends; a buffer closed before is refused with
// InvalidArgumentError ("the buffer is closed"), from any thread, instead of a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <shared_mutex>
#include <vector>

#include "kvcomm/symm.hpp"

namespace kvcomm::detail {

class BufferUse {
 public:
  /// Throws InvalidArgumentError naming `call` when the buffer is empty or closed.
  BufferUse(const SymmetricBuffer& buffer, const char* call);
  ~BufferUse();
  BufferUse(const BufferUse&) = delete;
  BufferUse& operator=(const BufferUse&) = delete;

  // The buffer's state, steady while this object lives (the public getters would lock again).
  uint64_t generation() const;
  std::vector<Range> backedRanges() const;
  size_t mappedBytes() const;
  bool isBacked(size_t offset, size_t bytes) const;
  const uint64_t* backedBitmap() const;
  /// The word beside the bitmap (same memory kind): bytes backed from offset 0 on every member.
  const uint64_t* backedPrefix() const;

 private:
  SymmetricBuffer::Impl* impl_ = nullptr;
  std::shared_lock<std::shared_mutex> lock_;
};

}  // namespace kvcomm::detail
