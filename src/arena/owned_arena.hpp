// An owner's arena: its memory, layout and generation, its capabilities, the leases importers hold over sessions and
// the pins of operations in flight. Found by id (a process-wide registry) when an Import request names it. Kept
// alive by the Arena handle and by pins; sessions refer to it weakly.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "arena/arena_memory.hpp"
#include "arena/capability_table.hpp"
#include "arena/pin.hpp"
#include "arena/protocol.hpp"
#include "kvcomm/arena.hpp"

namespace kvcomm::detail::arena {

class Session;

/// ParallelGroups <-> wire regions.
std::vector<WireRegion> toWire(const KvLayout& layout);
KvLayout fromWire(const std::vector<WireRegion>& regions, uint64_t version);
/// Bytes from 0 to the end of the layout's last block (checked); throws InvalidArgumentError naming `call` for a
/// malformed layout (validated like a fetch layout) or one ending beyond `limit`.
size_t layoutExtent(const KvLayout& layout, size_t limit, const char* call);

class OwnedArena : public PinHost, public std::enable_shared_from_this<OwnedArena> {
 public:
  static std::shared_ptr<OwnedArena> create(const KvLayout& layout, const ArenaOptions& options);
  /// The live arena with this id in this process, or nullptr.
  static std::shared_ptr<OwnedArena> find(uint64_t id);
  ~OwnedArena() override;

  // ---- owner (application threads) ----
  uint64_t id() const { return id_; }
  void* data() const;
  size_t bytes() const;
  size_t capacity() const;
  size_t granularity() const;
  MemoryKind kind() const;
  std::string handleType() const;
  int device() const;
  uint64_t generation() const;
  KvLayout layout() const;
  size_t leases() const;
  size_t operations() const;
  std::vector<int> importers() const;
  size_t liveCapabilities() const;
  bool freed() const;
  /// The pieces backing the arena now (none for legacy IPC memory, which has no pieces).
  std::vector<Piece> pieces() const;
  ArenaCapability offer(int pid, uint32_t uid, int64_t ttlMs);
  void revokeCapabilities();
  ArenaGrowth grow(size_t newBytes, const KvLayout* layout, int64_t timeoutMs);
  void shrink(size_t newBytes, const KvLayout* layout, int64_t waitMs);
  void free(int64_t waitMs);
  std::unique_ptr<ArenaPin::Impl> pin(size_t offset, size_t bytes, const char* call);
  void unpin(uint64_t id) noexcept override;
  void copyIn(size_t offset, const void* src, size_t bytes);
  void copyOut(size_t offset, void* dst, size_t bytes);
  ArenaIpcHandle ipcHandle() const;
  /// The Arena handle let go without free(): no new imports; importers are told (Revoked) and keep their mappings.
  void release() noexcept;

  // ---- the session thread ----
  /// An Import request over `session`: answers Grant + Pieces (and records a lease) or Deny, on that session.
  void admit(const std::shared_ptr<Session>& session, const Message& request);
  /// Lease ended: closed by the importer, or its session ended (`why`). Only the session that holds the lease may
  /// end it (a peer cannot name another session's lease).
  void dropLease(uint64_t leaseId, const std::string& why, const Session* from);
  void onGrowAck(uint64_t leaseId, uint64_t generation, bool ok, const std::string& reason, const Session* from);

 private:
  OwnedArena() = default;
  struct Lease {
    std::weak_ptr<Session> session;
    int pid = 0;
    uint64_t mappedGeneration = 0;
    std::string growFailure;  // the importer's reason when it failed to map a growth
  };
  struct PinRange {
    size_t offset, bytes;
  };
  void checkUsable(const char* call) const;
  // Waits (lock held) until `done()` or the deadline; false on expiry.
  template <typename Pred>
  bool waitFor(std::unique_lock<std::mutex>& lock, int64_t waitMs, Pred done);
  std::string busyReason() const;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t id_ = 0;
  std::unique_ptr<OwnerMemory> mem_;
  KvLayout layout_;
  uint64_t generation_ = 1;
  mutable CapabilityTable caps_;  // live() drops expired tokens
  std::map<uint64_t, Lease> leases_;
  uint64_t nextLease_ = 1;
  std::map<uint64_t, PinRange> pins_;
  uint64_t nextPin_ = 1;
  bool freed_ = false;
  bool released_ = false;
};

}  // namespace kvcomm::detail::arena
