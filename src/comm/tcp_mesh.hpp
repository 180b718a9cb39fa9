// Point-to-point TCP mesh among the processes of a bootstrap: tagged messages, lazy connections, bounded waits, and
// a liveness watch.
//
// Why this shape: sub-communicators (TP, PCP groups) must run collectives among their members only, whatever the
// engine's bootstrap was, so every Communicator talks over this mesh. Each direction of a pair has its own
// connection (the sender dials), so there is no connect race.
//
// One progress thread per mesh owns every read: it accepts (bounded, with a 1 s hello deadline: see
// common/listener.hpp), reads every inbound connection into a stash as data arrives, and watches liveness. So no
// call ever holds the mesh while it waits (a recv sleeps on a condition variable; a send holds only its peer's send
// lock), two ranks sending large messages to each other never deadlock on full socket buffers, and communicators of
// one world may be driven from different threads.
//
// Liveness, independent of the data path: every rank other than world rank 0 keeps one Watch connection to rank 0.
// A mesh that closes normally first says Bye on it. Rank 0 sees a Watch connection close without a Bye as the death
// of that rank and tells every other rank (a Gone notice); every rank sees rank 0's death as its Watch connection
// closing without a Bye. TCP keepalive and TCP_USER_TIMEOUT on Watch connections turn a silent host loss into a
// closed connection within KVCOMM_LIVENESS_TIMEOUT_MS. A death marks every group containing that rank unhealthy
// (comm/health.hpp), which wakes its waiters. A Bye is relayed the same way (a Gone notice with dead = 0): the
// groups record the departure without failing, and waits for that rank stop. Every rank learns of deaths and
// departures in rank 0's order, so every survivor names the same first rank gone.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/health.hpp"
#include "comm/wire.hpp"
#include "common/fd.hpp"
#include "common/listener.hpp"
#include "common/socket.hpp"

namespace kvcomm::detail {

class TcpMesh {
 public:
  /// `listener` is bound to the interface this rank advertises (never the wildcard address).
  TcpMesh(int rank, int size, const Nonce& nonce, Fd listener, int64_t timeoutMs);
  /// Says Bye on the Watch connection(s), stops the progress thread, closes every connection. Never blocks on peers.
  ~TcpMesh();
  TcpMesh(const TcpMesh&) = delete;
  TcpMesh& operator=(const TcpMesh&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int64_t timeoutMs() const { return timeoutMs_; }
  /// Where this rank's mesh listens.
  SockAddr listenAddress() const;

  /// Sets every rank's listening address, dials the Watch connection to rank 0 (other ranks) and starts the
  /// progress thread. Call once, before any send/recv.
  void start(std::vector<SockAddr> addrs);

  /// Sends `len` bytes to `peer` under `tag`. `group` (may be null) is checked while the send waits: an aborted
  /// or broken group stops it.
  void send(int peer, uint64_t tag, const void* data, size_t len, const GroupHealth* group);
  /// Receives the next message from `peer` under `tag`; its length must be `len`. Messages already received are
  /// returned even when the group or the peer failed since.
  void recv(int peer, uint64_t tag, void* data, size_t len, const GroupHealth* group);
  /// Ring allgather among `members` (mesh ranks, sorted by group rank); `me` is this rank's index in it.
  void allgather(const std::vector<int>& members, int me, void* data, size_t bytesPerRank, uint64_t tag,
                 const GroupHealth* group);

  /// A new identity for a group created collectively by every mesh rank.
  uint32_t nextWorldGroupId();
  /// Marks `group` when one of its members dies from now on (or has died already).
  void watchGroup(const std::shared_ptr<GroupHealth>& group);
  /// Wakes every waiting call so it re-checks its group (after an abort).
  void wakeAll();

  /// Why no more messages will come from mesh rank `peer` ("" while they may).
  std::string goneReason(int peer);
  /// Connections accepted but not yet identified by a valid hello (tests).
  size_t pendingConnections();
  /// Inbound connections from identified ranks (tests).
  size_t inboundConnections();

 private:
  struct Inbound {
    Fd fd;
    int rank = -1;
    bool watch = false;  // rank 0 only: a Watch connection from `rank`
    bool bye = false;    // the peer said Bye on it
    FrameReader frames;
    std::vector<char> watchBuf;
  };
  struct Outbound {
    std::mutex sendMu;    // one sender per peer at a time: frames never interleave
    Fd fd;                // written by senders, read by the progress thread (EOF, refusal); closed at destruction only
    bool broken = false;  // a send stopped midway: the stream is unusable
  };

  void progressLoop();
  void progressOnce(int timeoutMs);
  void acceptAll();
  void admit(Fd conn, const std::vector<char>& helloBytes);
  bool readInbound(Inbound& in);
  void readOutbound(int peer);
  void readWatch();
  /// Records (once, in the order rank 0 reports them) that `peer` died or left, tells every watched group, and on
  /// rank 0 with `relay` tells every other rank.
  void memberGone(int peer, const std::string& why, bool died, bool relay);
  /// Whether rank 0's word on `peer` (death or departure) arrived, or can no longer come.
  bool isReportedLocked(int peer) const;
  /// Why `peer` is gone (left, died, its connection closed), for messages.
  const std::string& whyGoneLocked(int peer) const;
  /// Throws NetworkError for a receive from `peer` that can no longer complete, naming the first rank gone (among
  /// `group`'s members when given) first.
  [[noreturn]] void throwGoneLocked(int peer, const GroupHealth* group, const char* call) const;
  void peerGone(int peer, const std::string& why);
  void sendWatch(int fd, const WatchMsg& m);
  int outboundFd(int peer, const GroupHealth* group, Clock::time_point deadline);
  void notifyLocked();
  /// Throws (naming the first rank gone) when sends to `peer` cannot go through.
  void checkSendable(int peer, const GroupHealth* group);
  /// Waits (bounded, kGoneSettleMs) for rank 0's word on `peer` once its connection closed, so an error names the
  /// rank that went first, as on every other survivor.
  void settleLocked(std::unique_lock<std::mutex>& lock, int peer);
  [[noreturn]] void throwPeerGone(int peer, const char* call);

  const int rank_;
  const int size_;
  const Nonce nonce_;
  Fd listener_;
  SockAddr listenAddr_;
  const int64_t timeoutMs_;
  const int pid_;
  std::vector<SockAddr> addrs_;  // set once by start()

  std::mutex mu_;  // everything below
  std::condition_variable cv_;
  uint32_t worldGroups_ = 0;
  std::vector<std::unique_ptr<Inbound>> inbound_;  // progress thread only (mu_ held for its bookkeeping)
  std::vector<std::unique_ptr<Outbound>> outbound_;
  std::vector<uint8_t> outboundPolled_;      // per peer: the progress thread polls its outbound fd
  std::vector<std::string> gone_;            // per peer: why no more frames will come from it ("" while alive)
  std::vector<std::string> outboundClosed_;  // per peer: why sends to it cannot go through ("" while they can)
  std::vector<uint8_t> dead_;                // per peer: known dead (not merely gone)
  std::vector<uint8_t> left_;                // per peer: known to have left normally (relayed by rank 0)
  std::vector<std::string> leftWhy_;         // per peer: how it left ("" while it has not)
  std::vector<Clock::time_point> leftAt_;    // per peer: when this rank learned it left
  std::vector<int> goneOrder_;               // peers known dead or left, in the order rank 0 reported them
  std::map<std::pair<int, uint64_t>, std::deque<std::vector<char>>> stash_;
  std::vector<std::weak_ptr<GroupHealth>> groups_;
  size_t pendingCount_ = 0;  // pending_->size(), readable by other threads
  bool stop_ = false;

  RefusalLog refusals_;
  std::unique_ptr<Acceptor> acceptor_;
  std::unique_ptr<PendingHandshakes> pending_;
  Fd watch_;  // other ranks: the Watch connection to rank 0 (progress thread only, once started)
  std::vector<char> watchBuf_;
  bool rootBye_ = false;
  Fd wake_;  // eventfd: interrupts the progress thread's poll
  std::unique_ptr<std::thread> thread_;
};

}  // namespace kvcomm::detail
