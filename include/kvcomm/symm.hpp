// kvcomm: symmetric memory. A SymmetricBuffer is one region per member of a communicator, each mapped into every
// same-host member's address space at a stable address; kvcomm exchanges the handles itself (POSIX fds over Unix
// sockets, fabric handles, or legacy CUDA IPC) and maps them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvcomm/api.hpp"
#include "kvcomm/comm.hpp"
#include "kvcomm/device/symm_device.hpp"

namespace kvcomm {

/// Which memory backs a buffer.
enum class MemoryKind {
  Auto,  ///< CUDA when this rank has a current CUDA context, else host (must resolve the same on every member)
  Cuda,  ///< cuMemCreate/cuMemMap (VMM) on the current device
  Host,  ///< memfd chunks mapped into a PROT_NONE reservation
};

/// "cuda" / "host" / "auto".
KVCOMM_API const char* memoryKindName(MemoryKind kind);

/// A byte range relative to a buffer's base.
struct Range {
  size_t offset = 0;
  size_t bytes = 0;
};

namespace detail {
class BufferUse;
struct BufferAccess;  // the layers above symm: a handle of their own, the buffer's internals (buffer_internals.hpp)
}  // namespace detail

/// Symmetric memory on a communicator (or a subgroup of it).
///
/// Call order (every call marked collective is made by every member, in the same order):
///   1. create(comm, capacity, initialBytes) — or adopt(comm, base, reservedBytes) over an engine's reservation;
///   2. grow(newBytes) (created buffers) / commit(ranges), release(ranges) (adopted buffers), as often as needed;
///      local(), peer(r), deviceHandle() and peerTable() never change;
///   3. close() (local: never waits on peers) or destruction of the last handle (a Publisher holds one). Peer windows
///      are unmapped before this rank's own memory is released; a peer that still maps this rank's memory keeps it
///      alive until that peer closes.
///
/// Members on other hosts are not mapped (peer(r) == nullptr, isMapped(r) == false): a SymmetricBuffer gives no
/// access to their memory.
///
/// Threads: the collective calls (grow, commit, release) are made by one thread at a time (a second thread's call
/// while one is in flight throws InvalidArgumentError). Publishers and fetchers using the buffer on other threads
/// are safe against them: an operation in flight finishes first, later ones see the new backed state. close() may be
/// called from any thread: it waits only for host operations through the mappings in flight (never for peers), a
/// collective call in flight on another thread ends first and the memory is released then; every later call on the
/// buffer, and on publishers and fetchers built on it, throws InvalidArgumentError ("the buffer is closed"). Getters
/// are safe from any thread. Kernels already launched are the caller's to order: synchronise their streams before
/// release() or close().
class KVCOMM_API SymmetricBuffer {
 public:
  /// Reserves `capacity` bytes of address space for this rank's memory and one window per same-host member, maps
  /// the first `initialBytes` (rounded up to the granularity) everywhere. Collective; every member must pass the
  /// same sizes and kind (a mismatch is an InvalidArgumentError naming the rank on every rank).
  static SymmetricBuffer create(Communicator comm, size_t capacity, size_t initialBytes,
                                MemoryKind kind = MemoryKind::Auto);

  /// Adopts an address range the engine reserved (`base`, `reservedBytes`; same size on every member) whose physical
  /// memory the engine commits itself; announce each change with commit()/release(). Collective.
  static SymmetricBuffer adopt(Communicator comm, void* base, size_t reservedBytes, MemoryKind kind = MemoryKind::Auto);

  SymmetricBuffer();
  ~SymmetricBuffer();
  SymmetricBuffer(SymmetricBuffer&&) noexcept;
  SymmetricBuffer& operator=(SymmetricBuffer&&) noexcept;
  SymmetricBuffer(const SymmetricBuffer&) = delete;
  SymmetricBuffer& operator=(const SymmetricBuffer&) = delete;

  bool valid() const { return impl_ != nullptr; }

  /// Maps [mappedBytes(), newBytes) — rounded up to the granularity — locally and in every member's window.
  /// Existing bytes and every address stay. Collective; created buffers only.
  void grow(size_t newBytes);

  /// The engine mapped physical memory at these ranges of its reservation (the same ranges on every member); peers
  /// map exactly them at the same offsets. Each range must be covered by whole engine allocations made with an
  /// exportable handle type (CUDA: CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR; host: MAP_SHARED memfd/shm mappings).
  /// Collective; adopted buffers only.
  void commit(const std::vector<Range>& ranges);

  /// Peers unmap these previously committed ranges (sleep mode: the engine may then recommit the same VAs with new
  /// physical memory and call commit() again). Collective; adopted buffers only.
  void release(const std::vector<Range>& ranges);

  /// Unmaps peer windows, then releases this rank's memory. Local, never waits on peers; idempotent.
  void close();

  /// This rank's memory.
  void* local() const;
  /// Member `r`'s memory as mapped in this process (local() for r == rank()); nullptr when not mapped here.
  void* peer(int r) const;
  bool isMapped(int r) const;
  int rank() const;
  int size() const;
  /// Address space per member.
  size_t capacity() const;
  /// Bytes backed on every member: the mapped prefix (created buffers) or the committed bytes (adopted buffers).
  size_t mappedBytes() const;
  /// Whether [offset, offset + bytes) is backed on every member (validation before publishing).
  bool isBacked(size_t offset, size_t bytes) const;
  /// Currently backed ranges, sorted.
  std::vector<Range> backedRanges() const;
  /// Increments with every grow/commit/release.
  uint64_t generation() const;
  size_t granularity() const;
  MemoryKind kind() const;
  bool adopted() const;
  /// The handle type this rank's memory was created with: "posix_fd", "fabric" (chunks also carry a fabric handle;
  /// same-host peers still receive POSIX fds), "cuda_ipc" (legacy CUDA IPC) or "memfd" (host memory).
  std::string handleType() const;
  Communicator& communicator() const;

  /// By-value view for kernels (throws InvalidArgumentError for groups larger than kMaxHandlePeers).
  SymmDeviceHandle deviceHandle() const;
  /// uint64[size()] of member base addresses (0 = not mapped) at an address that never changes for the buffer's
  /// life: device memory for CUDA buffers, host memory for host buffers. Engine kernels take this plus offsets.
  const uint64_t* peerTable() const;
  /// Bit g of the word array (bit g % 64 of word g / 64) says whether granule g ([g, g + 1) * granularity()) is
  /// backed on every member; same memory kind and stability as peerTable(), updated by every grow/commit/release.
  /// Kernels captured before a change check rows against it, so they follow growth and never touch released pages.
  const uint64_t* backedBitmap() const;

  struct Impl;

 private:
  friend struct detail::BufferAccess;  // features keep their own handle (src/symm/buffer_internals.hpp)
  friend class detail::BufferUse;      // operations through the mappings (src/symm/buffer_use.hpp)
  explicit SymmetricBuffer(std::shared_ptr<Impl> impl);
  SymmetricBuffer share() const { return SymmetricBuffer(impl_); }
  std::shared_ptr<Impl> impl_;
};

}  // namespace kvcomm
