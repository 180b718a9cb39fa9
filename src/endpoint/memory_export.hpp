// What a registration offers a same-host peer (the share protocol's owner side): the pieces of memfd/shm or CUDA VMM
// memory behind it with their descriptors, or the legacy IPC handle of the cudaMalloc allocation that holds it, or why
// it cannot be shared (plain host memory: a peer cannot map it; it is reached over TCP instead).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "endpoint/share_protocol.hpp"
#include "kvcomm/symm.hpp"
#include "symm/memory_backend.hpp"

namespace kvcomm::detail {

struct MemoryExport {
  ShareKind kind = ShareKind::None;
  std::string whyNot;  ///< kind None: why the memory cannot be mapped by another process
  int device = -1;
  uint64_t span = 0;    ///< bytes the importer reserves (fds) or the IPC allocation's size
  uint64_t offset = 0;  ///< where the registration starts in the span
  std::vector<Piece> pieces;
  std::array<uint8_t, 64> ipc{};
};

/// What backs a kvcomm arena or buffer registered from its base, from its own pieces (no /proc lookup, no privilege):
/// kind None when they do not cover [0, bytes) back to back from offset 0 (the caller then tries exportMemory).
MemoryExport exportOwnPieces(std::vector<Piece> pieces, size_t bytes, MemoryKind kind, int device);

/// Finds what backs [base, base + bytes). CUDA memory: the calling thread must have `device` current. Never throws:
/// a failure is kind None with whyNot saying what was tried.
MemoryExport exportMemory(char* base, size_t bytes, MemoryKind kind, int device);

}  // namespace kvcomm::detail
