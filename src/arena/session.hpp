// One arena session: a SOCK_SEQPACKET connection to another process, its state and its half of the protocol
// (arena/protocol.hpp). Only the reactor thread touches the socket: it reads, dispatches and flushes the outbound
// queue; application threads enqueue messages and wait for replies on the session's condition variable.
//
// Locks: an arena's or an import's lock may be held while a session's is taken (enqueue, lease bookkeeping), never
// the other way round: the session calls into arenas and imports with its own lock released.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "arena/protocol.hpp"
#include "common/fd.hpp"
#include "kvcomm/arena.hpp"
#include "kvcomm/error.hpp"

namespace kvcomm::detail::arena {

using Clock = std::chrono::steady_clock;

class OwnedArena;
class ImportedArena;
class Reactor;
class ReactorThread;
class Session;

/// A message waiting to be sent, with the descriptors it carries (closed once sent or dropped).
struct OutMessage {
  std::vector<uint8_t> bytes;
  std::vector<Fd> fds;
};
OutMessage outMessage(const Message& m, std::vector<Fd> fds = {});

/// What keeps a session (and the thread that serves it) alive for the application: ArenaSession handles and the
/// imports made over it share one; when the last goes, the session ends.
struct SessionLink {
  std::shared_ptr<ReactorThread> thread;
  std::shared_ptr<Session> session;
  ~SessionLink();
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  enum class Role { Client, Server };
  /// Outbound messages a peer may leave unread before the session is dropped.
  static constexpr size_t kMaxQueued = 4096;
  /// Application messages kept for receive(); beyond it the session stops reading (backpressure).
  static constexpr size_t kMaxInbox = 1024;

  Session(Fd sock, int peerPid, uint32_t peerUid, Role role, std::weak_ptr<Reactor> reactor, bool established,
          Clock::time_point handshakeDeadline, int64_t requestTimeoutMs);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // ---- any thread ----
  int peerPid() const { return peerPid_; }
  uint32_t peerUid() const { return peerUid_; }
  Role role() const { return role_; }
  bool alive() const;
  std::string lostReason() const;
  int64_t requestTimeoutMs() const { return requestTimeoutMs_; }
  /// Queues a message for the peer (reactor wakes up to send it). Returns false when the session is gone.
  bool enqueue(OutMessage m);
  bool enqueue(std::vector<OutMessage> ms);

  // ---- application threads ----
  /// Presents `cap` to the peer (the owner) and waits for the arena to be mapped here.
  std::shared_ptr<ImportedArena> import(const ArenaCapability& cap, const ImportOptions& options,
                                        const std::shared_ptr<SessionLink>& link);
  /// Tells the owner that lease (arenaId, leaseId) ended and waits for its acknowledgement until `deadline` (an
  /// owner already gone is not waited for).
  void closeLease(uint64_t arenaId, uint64_t leaseId, Clock::time_point deadline);
  void sendUser(const void* data, size_t bytes);
  std::vector<uint8_t> receiveUser(int64_t timeoutMs);
  /// Ends the session: Bye is sent (best effort) and the reactor drops it. Waits (bounded) for that unless called
  /// on the reactor thread.
  void requestClose(const std::string& reason);

  // ---- owner-side bookkeeping (arenas call these with their lock held) ----
  void addLease(uint64_t arenaId, uint64_t leaseId, std::weak_ptr<OwnedArena> arena);
  void removeLease(uint64_t arenaId, uint64_t leaseId);
  /// Importer side: forget an import (closed).
  void removeImport(uint64_t arenaId, uint64_t leaseId);

  // ---- reactor thread ----
  int fd() const { return sock_.get(); }
  int pidFd() const { return pidfd_.get(); }
  /// poll() events wanted now (POLLIN unless the inbox is full, POLLOUT while messages wait).
  short pollEvents() const;
  bool established() const;
  Clock::time_point handshakeDeadline() const { return handshakeDeadline_; }
  /// Reads and handles one message. Returns true when this message completed the server side's handshake.
  bool onReadable();
  /// Sends what the socket takes now.
  void onWritable();
  /// The peer process exited (its pidfd polled readable).
  void onPeerExit();
  /// Work the reactor must do for this session outside poll events (a close requested, a queue overflowed).
  void service();
  /// Ends the session: the socket closes, leases over it are dropped, imports over it lose their owner, waiters
  /// wake. Idempotent.
  void lose(const std::string& reason);
  bool finished() const { return !sock_.valid(); }

 private:
  struct PendingImport {
    bool done = false;
    std::string error;
    ErrorCode code = ErrorCode::NetworkError;
    std::shared_ptr<ImportedArena> result;
    ImportOptions options;
    void* ctx = nullptr;
    std::weak_ptr<SessionLink> link;
  };
  /// Pieces that follow a Grant or Grown until the last one.
  struct Collecting {
    MsgType what = MsgType::Bye;  // Grant or Grown; Bye: nothing being collected
    uint32_t seq = 0;
    GrantBody grant{};
    GrownBody grown{};
    std::vector<WireRegion> regions;
    std::vector<PieceMeta> metas;
    std::vector<Fd> fds;
    uint64_t arenaId = 0, leaseId = 0;
    uint32_t expected = 0;
  };

  void dispatch(Message& m, std::vector<Fd>& fds);
  void finishGrant(Collecting& c);
  void finishGrown(Collecting& c);
  void protocolError(const std::string& why);
  std::string peerName() const;
  [[noreturn]] void throwLost(const char* call) const;

  const Role role_;
  Fd sock_;
  Fd pidfd_;
  const int peerPid_;
  const uint32_t peerUid_;
  std::weak_ptr<Reactor> reactor_;
  const Clock::time_point handshakeDeadline_;
  const int64_t requestTimeoutMs_;
  Collecting collecting_;  // reactor thread only

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool established_ = false;
  bool lost_ = false;
  bool closeRequested_ = false;
  bool overflow_ = false;
  std::string lostReason_;
  std::string closeReason_;
  std::deque<OutMessage> outq_;
  std::deque<std::vector<uint8_t>> inbox_;
  uint32_t nextSeq_ = 1;
  std::map<uint32_t, PendingImport> pendingImports_;
  std::map<uint32_t, bool> pendingCloses_;                                         // seq -> acknowledged
  std::map<std::pair<uint64_t, uint64_t>, std::weak_ptr<OwnedArena>> leases_;      // owner side: (arena, lease)
  std::map<std::pair<uint64_t, uint64_t>, std::weak_ptr<ImportedArena>> imports_;  // importer side
};

}  // namespace kvcomm::detail::arena

namespace kvcomm {

/// An ArenaSession handle is one link to its session.
struct ArenaSession::Impl : detail::arena::SessionLink {};

}  // namespace kvcomm
