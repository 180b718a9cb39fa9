// What the layers above symm (fetch's network transports) need of a buffer beyond its public API: the pieces of
// this rank's own memory (a NIC registers each one) and a say before any of it stops being backed here, and through
// BufferAccess (SymmetricBuffer's one friend above symm) a handle of their own and the buffer's Impl.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kvcomm/symm.hpp"
#include "symm/memory_backend.hpp"

namespace kvcomm::detail {

/// One mapping of this rank's own memory onto one physical allocation (a committed VMM chunk, a memfd piece).
struct LocalPiece {
  size_t offset = 0;  ///< from the buffer's base
  size_t bytes = 0;
  char* va = nullptr;
};

/// What the features above symm (publish, fetch) may take of a buffer without being named in its header: their own
/// handle on it (the buffer lives as long as either holds it) and its Impl, for the functions below.
struct BufferAccess {
  static SymmetricBuffer share(const SymmetricBuffer& b) { return b.share(); }
  static std::shared_ptr<SymmetricBuffer::Impl> impl(const SymmetricBuffer& b) { return b.impl_; }
};

/// This rank's pieces, sorted by offset.
std::vector<LocalPiece> localPieces(const SymmetricBuffer::Impl& impl);
/// The same with the chunks behind them (a same-host peer maps them from their descriptors); empty for legacy IPC.
std::vector<Piece> localChunks(const SymmetricBuffer::Impl& impl);
/// CUDA ordinal of the buffer's memory (-1 for host memory).
int bufferDevice(const SymmetricBuffer::Impl& impl);

/// Called with ranges of this rank's memory that are about to stop being backed here (release(), or the whole
/// capacity at close()), before anything is unmapped; returns only when nothing the listener started still touches
/// them. Must not throw.
using UnbackListener = std::function<void(const std::vector<Range>& ranges)>;
uint64_t addUnbackListener(SymmetricBuffer::Impl& impl, UnbackListener listener);
void removeUnbackListener(SymmetricBuffer::Impl& impl, uint64_t id) noexcept;

}  // namespace kvcomm::detail
