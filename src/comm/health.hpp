// Group health: whether a communicator's group can still run collectives. One flag word per group, in host memory
// on a page of its own (so the CUDA driver can map it for device code): 0 while healthy, then why it stopped —
// aborted (Communicator::abort) or a member died (the mesh's liveness watch). Waits of every layer poll it (host
// loops read flag(); kernels read deviceFlag()) so that no wait outlives a known failure, and every collective
// checks it on entry.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kvcomm/comm.hpp"
#include "kvcomm/device/group_health.hpp"

namespace kvcomm::detail {

/// Values of the health flag (never cleared once set).
enum HealthState : uint32_t {
  kHealthy = 0,
  kAborted = 1,   ///< abort() was called on the communicator (or one it was split from)
  kPeerDied = 2,  ///< a member's process died (its liveness connection closed without a goodbye)
};

class GroupHealth {
 public:
  /// `meshMembers`: the mesh (world) rank of each member, in group-rank order.
  explicit GroupHealth(std::vector<int> meshMembers);
  ~GroupHealth();
  GroupHealth(const GroupHealth&) = delete;
  GroupHealth& operator=(const GroupHealth&) = delete;

  /// The flag word in host memory (stable for the group's life, alone on its page). Poll with an acquire load.
  const uint32_t* flag() const { return flag_; }
  /// Current state (acquire load; cheap enough for every loop iteration).
  HealthState state() const { return static_cast<HealthState>(__atomic_load_n(flag_, __ATOMIC_ACQUIRE)); }
  bool healthy() const { return state() == kHealthy; }

  /// The flag's address for device code (a CUDA kernel polls it with a volatile or relaxed system-scope load):
  /// registers the page with the CUDA driver on first call (needs a current context). 0 without CUDA.
  uint64_t deviceFlag();

  /// Marks the group aborted (and every group split from it); `why` is kept for messages.
  void abort(const std::string& why);
  /// Marks the group broken by the death of the member at `meshRank` (no-op when it is not a member).
  void memberDied(int meshRank, const std::string& why);
  /// Records that the member at `meshRank` left normally (destroyed its communicator or exited). The group stays
  /// healthy (what it sent before leaving is still delivered, and a collective it finished stays finished), but a
  /// wait for that member stops: host and device barrier waits read its departure word (departedWord()).
  void memberLeft(int meshRank, const std::string& why);
  /// Groups split from this one: aborted with it.
  void addChild(const std::shared_ptr<GroupHealth>& child);

  bool containsMeshRank(int meshRank) const;
  /// Group rank of the first member known dead, or -1.
  int deadRank() const;
  /// Why the member at group rank `groupRank` is known dead ("" while it is not: alive, or not known dead).
  std::string deathOf(int groupRank) const;
  /// "rank G is gone: why" for the first member known gone, in the order this rank learned of them (rank 0's order,
  /// which relays every death and departure); "" while none is.
  std::string firstGoneText() const;
  /// Throws NetworkError (naming the first member gone and the one waited for) when `waitedFor` (a group rank) is
  /// gone: for waits that stopped on a member that left without arriving.
  void checkPresent(const char* call, int waitedFor) const;
  /// Throws NetworkError "rank G is gone: why (<context>)" for the first member known gone; nothing when none is.
  void checkNoneGone(const char* call, const std::string& context) const;
  /// Why the group stopped ("" while healthy).
  std::string reason() const;
  /// Throws when the group is not healthy: Error(Aborted) after abort(), NetworkError naming the dead rank.
  void check(const char* call) const;

 private:
  void markGoneLocked(int groupRank, const std::string& why);
  /// Members with a departure word on the flag's page (the rest are watched by their timeouts only).
  static size_t departedCapacity();

  uint32_t* flag_ = nullptr;  // first word of a private page; departure words from kHealthDepartedWord on
  std::vector<int> members_;
  mutable std::mutex mu_;
  std::string reason_;
  int deadRank_ = -1;
  std::vector<std::string> deaths_;  // by group rank: why it died ("" while alive); every death, not only the first
  std::vector<std::string> gone_;    // by group rank: why it died or left ("" while present)
  std::vector<int> goneOrder_;       // group ranks in the order this rank learned they were gone
  std::vector<std::weak_ptr<GroupHealth>> children_;
  uint64_t deviceFlag_ = 0;
  bool registered_ = false;
};

/// The health of a communicator's group (valid communicators only).
GroupHealth& healthOf(const Communicator& comm);

/// Throws when `comm`'s group is aborted or lost a member (see GroupHealth::check).
void checkHealthy(const Communicator& comm, const char* call);
/// Says why a device wait recorded a PeerFailed for group rank `peer`: throws for an abort, a death or the peer's
/// departure (nothing when none is known).
void explainPeerFailed(const Communicator& comm, int peer, const char* call);

}  // namespace kvcomm::detail
