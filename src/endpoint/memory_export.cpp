#include "endpoint/memory_export.hpp"

#include <cstdint>

#include "arena/cuda_support.hpp"
#include "common/check.hpp"
#include "common/log.hpp"

namespace kvcomm::detail {

namespace {

// The pieces behind [base, base + bytes) rounded out to `backend`'s granularity.
void retainPieces(MemoryBackend& backend, char* base, size_t bytes, MemoryExport& e) {
  const uintptr_t g = backend.granularity();
  const uintptr_t lo = reinterpret_cast<uintptr_t>(base) / g * g;
  const uintptr_t hi = (reinterpret_cast<uintptr_t>(base) + bytes + g - 1) / g * g;
  e.pieces = backend.retain(reinterpret_cast<char*>(lo), hi - lo, 0);
  e.span = hi - lo;
  e.offset = reinterpret_cast<uintptr_t>(base) - lo;
}

}  // namespace

MemoryExport exportOwnPieces(std::vector<Piece> pieces, size_t bytes, MemoryKind kind, int device) {
  MemoryExport e;
  e.device = device;
  size_t at = 0;
  for (const Piece& p : pieces) {
    if (p.offset != at || p.bytes == 0) {
      e.whyNot = cat("its pieces do not continue at offset ", at);
      return e;
    }
    at += p.bytes;
  }
  if (pieces.empty() || at < bytes) {
    e.whyNot = cat("its pieces cover ", at, " of its ", bytes, " bytes");
    return e;
  }
  e.kind = kind == MemoryKind::Host ? ShareKind::MemFd : ShareKind::CudaPosixFd;
  e.span = at;
  e.offset = 0;
  e.pieces = std::move(pieces);
  return e;
}

MemoryExport exportMemory(char* base, size_t bytes, MemoryKind kind, int device) {
  MemoryExport e;
  e.device = device;
  if (kind == MemoryKind::Host) {
    try {
      retainPieces(*makeHostBackend(), base, bytes, e);
      e.kind = ShareKind::MemFd;
    } catch (const std::exception& x) {
      e.pieces.clear();
      e.whyNot =
          "its host memory is not memfd or shm mappings (private or plain memory cannot be mapped by another "
          "process; kvcomm arenas and buffers can)";
      KVCOMM_DEBUG("endpoint: host memory at ", static_cast<void*>(base), " is not shareable: ", x.what());
    }
    return e;
  }
  std::string vmm;
  try {
    retainPieces(*makeCudaBackend(HandleKind::CudaPosixFd), base, bytes, e);
    e.kind = ShareKind::CudaPosixFd;
    return e;
  } catch (const std::exception& x) {
    e.pieces.clear();
    vmm = x.what();
  }
  try {
    void* allocBase = nullptr;
    size_t allocBytes = 0;
    arena::ipcAllocationOf(base, &allocBase, &allocBytes);
    const auto b = reinterpret_cast<uintptr_t>(base), a = reinterpret_cast<uintptr_t>(allocBase);
    if (b < a || bytes > allocBytes - (b - a))
      KVCOMM_THROW(InvalidArgument, "legacy IPC export",
                   "the registration spans more than the cudaMalloc "
                   "allocation at 0x",
                   std::hex, a, " (", std::dec, allocBytes, " bytes)");
    arena::ipcGetHandle(allocBase, e.ipc.data());
    e.kind = ShareKind::CudaIpc;
    e.span = allocBytes;
    e.offset = b - a;
  } catch (const std::exception& x) {
    e.whyNot = cat("CUDA memory is shared as exportable VMM allocations (", vmm, ") or as one cudaMalloc allocation (",
                   x.what(), ")");
  }
  return e;
}

}  // namespace kvcomm::detail
