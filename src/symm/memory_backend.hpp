// Allocation backends behind SymmetricBuffer: reserve address space, create exportable physical chunks, map and
// unmap them, export/import them as file descriptors, and find the chunks behind an engine's own mappings (adopt).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/fd.hpp"
#include "kvcomm/symm.hpp"

namespace kvcomm::detail {

/// How a chunk travels to peers.
enum class HandleKind : uint32_t { MemFd = 1, CudaPosixFd = 2, CudaFabric = 3, CudaIpc = 4 };
const char* handleKindName(HandleKind k);

/// A reference to physical memory this process holds (memfd, CUDA allocation handle). Releasing the last reference
/// does not free memory another process still maps.
class Chunk {
 public:
  virtual ~Chunk() = default;
  /// Bytes of the whole allocation.
  virtual size_t bytes() const = 0;
  /// A new descriptor for SCM_RIGHTS (the caller owns it).
  virtual Fd exportFd() const = 0;
};

/// Address space reserved for one member's memory; released on destruction.
class Reservation {
 public:
  virtual ~Reservation() = default;
  char* base() const { return base_; }
  size_t bytes() const { return bytes_; }

 protected:
  char* base_ = nullptr;
  size_t bytes_ = 0;
};

/// [va, va + bytes) mapped onto a chunk; unmapped on destruction, leaving the address space reserved.
class Mapping {
 public:
  virtual ~Mapping() = default;
  char* va() const { return va_; }
  size_t bytes() const { return bytes_; }

 protected:
  char* va_ = nullptr;
  size_t bytes_ = 0;
};

/// Part of a buffer backed by (part of) one chunk.
struct Piece {
  size_t offset = 0;       // from the buffer's base
  size_t bytes = 0;        // mapped length
  size_t chunkOffset = 0;  // where in the chunk the mapping starts (host file offset; 0 for CUDA)
  std::shared_ptr<Chunk> chunk;
};

/// What travels with each exported fd.
struct PieceMeta {
  uint64_t offset;
  uint64_t bytes;
  uint64_t chunkOffset;
  uint64_t chunkBytes;
};

/// Small word arrays at stable addresses that kernels read (the peer table, the backed-granule bitmap): device
/// memory for CUDA buffers, host memory for host buffers.
class TableMemory {
 public:
  virtual ~TableMemory() = default;
  virtual uint64_t* allocTable(size_t entries) = 0;
  virtual void writeTable(uint64_t* table, const std::vector<uint64_t>& values) = 0;
  virtual void freeTable(uint64_t* table) noexcept = 0;
};

class MemoryBackend : public TableMemory {
 public:
  virtual MemoryKind kind() const = 0;
  virtual HandleKind handleKind() const = 0;
  /// Mapping granularity: sizes and offsets of chunks and mappings are multiples of it.
  virtual size_t granularity() const = 0;
  /// CUDA ordinal of the memory (-1 for host).
  virtual int device() const = 0;

  virtual std::unique_ptr<Reservation> reserve(size_t bytes) = 0;
  virtual std::shared_ptr<Chunk> allocate(size_t bytes) = 0;
  /// Maps [chunkOffset, chunkOffset + bytes) of `chunk` at `va` with read/write access for this process.
  virtual std::unique_ptr<Mapping> map(char* va, size_t bytes, std::shared_ptr<Chunk> chunk, size_t chunkOffset) = 0;
  /// Imports a peer's chunk; verifies it really holds `meta.chunkBytes` where the handle type allows.
  virtual std::shared_ptr<Chunk> importFd(Fd fd, const PieceMeta& meta) = 0;
  /// Chunks behind an engine's mappings covering exactly [va, va + bytes) (adopt). Throws InvalidArgumentError
  /// when part of the range is unmapped or not exportable, naming what it needs.
  virtual std::vector<Piece> retain(char* va, size_t bytes, size_t bufferOffset) = 0;
};

/// Host backend: memfd chunks, PROT_NONE reservations, MAP_FIXED mappings.
std::shared_ptr<MemoryBackend> makeHostBackend();
/// CUDA backend on the current context's device (VMM with POSIX-fd or fabric handles). Throws Unsupported when no
/// CUDA context is current or the device lacks what is needed.
std::shared_ptr<MemoryBackend> makeCudaBackend(HandleKind handles);

}  // namespace kvcomm::detail
