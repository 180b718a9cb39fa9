// The memory behind arenas, on the symm memory backends: an owner's chunks mapped into its reservation (growing and
// shrinking by whole chunks at stable addresses), and an importer's mapping of the pieces it received into a
// reservation of the owner's capacity. Legacy CUDA IPC arenas allocate the whole capacity up front instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/fd.hpp"
#include "kvcomm/symm.hpp"
#include "symm/fd_exchange.hpp"
#include "symm/memory_backend.hpp"

namespace kvcomm::detail::arena {

/// Memory kind Auto resolved: CUDA when the calling thread has a current CUDA context.
MemoryKind resolveKind(MemoryKind kind);

/// An owner's memory. Not thread-safe: the arena's lock guards it.
class OwnerMemory {
 public:
  /// Reserves `capacity` bytes (at least `bytes`; rounded up to the granularity) and backs the first `bytes`.
  OwnerMemory(MemoryKind kind, bool legacyIpc, size_t capacity, size_t bytes);
  ~OwnerMemory();
  OwnerMemory(const OwnerMemory&) = delete;
  OwnerMemory& operator=(const OwnerMemory&) = delete;

  char* base() const { return base_; }
  size_t bytes() const { return bytes_; }
  size_t capacity() const { return capacity_; }
  size_t granularity() const { return gran_; }
  MemoryKind kind() const { return kind_; }
  HandleKind handles() const { return handles_; }
  int device() const { return device_; }
  /// The CUDA context the memory was made on (nullptr for host memory).
  void* context() const { return ctx_; }
  bool released() const { return base_ == nullptr; }

  /// Backs [bytes(), newBytes) rounded up to the granularity with one new chunk; returns the index of its piece.
  size_t grow(size_t newBytes);
  /// What bytes() would be after shrink(newBytes): whole pieces are released from the top.
  size_t shrinkTarget(size_t newBytes) const;
  void shrink(size_t newBytes);
  size_t pieceCount() const { return pieces_.size(); }
  /// The pieces, by offset (each holds its chunk: a same-host peer maps them from their fds).
  std::vector<Piece> pieces() const;
  /// Metas and fresh descriptors of pieces [from, pieceCount()).
  ExportSet exportPieces(size_t from) const;
  /// The legacy IPC handle (legacyIpc memory only).
  void ipcHandle(uint8_t out[64]) const;
  /// Unmaps and releases everything now (idempotent); base() becomes nullptr.
  void release() noexcept;

 private:
  struct Held {
    Piece piece;
    std::unique_ptr<Mapping> map;
  };
  MemoryKind kind_;
  HandleKind handles_;
  int device_ = -1;
  void* ctx_ = nullptr;
  size_t gran_ = 0, capacity_ = 0, bytes_ = 0;
  char* base_ = nullptr;
  std::shared_ptr<MemoryBackend> backend_;
  std::unique_ptr<Reservation> va_;
  std::vector<Held> pieces_;  // by offset; destroyed before the reservation
  void* ipc_ = nullptr;       // legacy IPC allocation
};

/// An importer's mapping of another process's arena. Not thread-safe: the import's lock guards it.
class ImportedMemory {
 public:
  /// Reserves `capacity` bytes on this process's backend for `handles` (MemFd or CudaPosixFd; for CUDA the
  /// calling thread's current context). The owner's granularity must be a multiple of this process's.
  ImportedMemory(HandleKind handles, size_t capacity, size_t ownerGranularity);
  /// Opens a legacy IPC handle of an allocation of `capacity` bytes.
  ImportedMemory(const uint8_t ipcHandle[64], size_t capacity);
  ~ImportedMemory();
  ImportedMemory(const ImportedMemory&) = delete;
  ImportedMemory& operator=(const ImportedMemory&) = delete;

  char* base() const { return base_; }
  size_t capacity() const { return capacity_; }
  /// End of the mapped prefix.
  size_t mapped() const { return mapped_; }
  HandleKind handles() const { return handles_; }
  MemoryKind kind() const { return handles_ == HandleKind::MemFd ? MemoryKind::Host : MemoryKind::Cuda; }

  /// Maps pieces that must cover [mapped(), newEnd) exactly, back to back: checked before anything is mapped (an
  /// owner cannot make this process map outside its reservation), imported with the real size checked (host), and
  /// all or nothing. For IPC memory (no pieces) only raises mapped() up to the capacity.
  void map(const std::vector<PieceMeta>& metas, std::vector<Fd>& fds, size_t newEnd);
  /// Unmaps everything now (idempotent); base() becomes nullptr.
  void release() noexcept;

 private:
  HandleKind handles_;
  size_t capacity_ = 0, mapped_ = 0, gran_ = 0;
  char* base_ = nullptr;
  std::shared_ptr<MemoryBackend> backend_;
  std::unique_ptr<Reservation> va_;
  std::vector<std::unique_ptr<Mapping>> maps_;
  void* ipc_ = nullptr;
};

}  // namespace kvcomm::detail::arena
