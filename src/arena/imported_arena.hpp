// An importer's view of another process's arena: the mapping, the layout and generation it follows, the owner's
// liveness, and the pins of operations in flight. Kept alive by the ArenaImport handle and by pins; it keeps the
// session it came over alive (to tell the owner when it closes), and the session refers to it weakly.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "arena/arena_memory.hpp"
#include "arena/pin.hpp"
#include "arena/protocol.hpp"
#include "arena/session.hpp"
#include "kvcomm/arena.hpp"

namespace kvcomm::detail::arena {

class ImportedArena : public PinHost, public std::enable_shared_from_this<ImportedArena> {
 public:
  /// An import over a session (made on the session thread once the owner's pieces are mapped).
  ImportedArena(std::shared_ptr<SessionLink> link, const GrantBody& grant, KvLayout layout,
                std::unique_ptr<ImportedMemory> mem, OwnerLoss policy, void* ctx, int ownerPid);
  /// A legacy IPC handle opened without a session.
  ImportedArena(std::unique_ptr<ImportedMemory> mem, KvLayout layout, void* ctx);
  ~ImportedArena() override;

  // ---- application threads ----
  void* data() const;
  size_t bytes() const;
  size_t capacity() const;
  MemoryKind kind() const;
  std::string handleType() const;
  uint64_t arenaId() const { return arenaId_; }
  uint64_t leaseId() const { return leaseId_; }
  uint64_t generation() const;
  KvLayout layout() const;
  int ownerPid() const { return ownerPid_; }
  bool ownerAlive() const;
  std::string ownerLostReason() const;
  bool closed() const;
  void check(const char* call) const;
  size_t operations() const;
  std::unique_ptr<ArenaPin::Impl> pin(size_t offset, size_t bytes, const char* call);
  void unpin(uint64_t id) noexcept override;
  void copyIn(size_t offset, const void* src, size_t bytes);
  void copyOut(size_t offset, void* dst, size_t bytes);
  /// Drain, unmap, tell the owner (see ArenaImport::close).
  void close(int64_t timeoutMs);
  /// The ArenaImport handle let go: close now when no pin is left, else when the last one ends; never waits.
  void closeWhenIdle() noexcept;

  // ---- the session thread ----
  /// The owner grew the arena: map the new pieces, take the new layout; returns the GrowAck to send.
  Message applyGrowth(const GrownBody& grown, const std::vector<WireRegion>& regions,
                      const std::vector<PieceMeta>& metas, std::vector<Fd>& fds);
  /// The owner is gone (`why`): calls throw from now on; OwnerLoss::Release unmaps once no pin is left.
  void ownerLost(const std::string& why);

 private:
  enum class State { Live, Closing, Closed };
  // Unmaps (lock held) with the import's CUDA context current and tells the owner without waiting when `notify`.
  // Returns the session link, which the caller drops after unlocking (the last link may stop a thread).
  std::shared_ptr<SessionLink> finishLocked(bool notify) noexcept;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<SessionLink> link_;  // null for legacy IPC opens, and once closed
  std::unique_ptr<ImportedMemory> mem_;
  const uint64_t arenaId_ = 0, leaseId_ = 0;
  const int ownerPid_ = 0;
  const OwnerLoss policy_ = OwnerLoss::Keep;
  void* const ctx_ = nullptr;
  const MemoryKind kind_;
  const HandleKind handles_;
  const size_t capacity_;
  KvLayout layout_;
  uint64_t generation_ = 0;
  size_t bytes_ = 0;
  State state_ = State::Live;
  bool ownerGone_ = false;
  bool closeWhenIdle_ = false;
  bool ownerNotified_ = false;  // the owner was told (Close sent) or needs no telling
  std::string lostReason_;
  std::map<uint64_t, std::pair<size_t, size_t>> pins_;
  uint64_t nextPin_ = 1;
};

}  // namespace kvcomm::detail::arena

namespace kvcomm {

/// The handle's share of an import: letting go of it closes the import once no pin is left.
struct ArenaImport::Impl {
  std::shared_ptr<detail::arena::ImportedArena> core;
  ~Impl() {
    if (core) core->closeWhenIdle();
  }
};

}  // namespace kvcomm
