// Listener hardening shared by every socket kvcomm accepts on (bootstrap root, mesh, fd server): connections whose
// first message has not arrived are bounded in number and in time, accept() survives descriptor exhaustion, and
// refusals are logged once per listener. Why: any local process can connect to a listening socket; an idle or
// hostile connection must never delay a legitimate rank or exhaust the process's descriptors.
#pragma once

#include <poll.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "common/fd.hpp"
#include "common/socket.hpp"

namespace kvcomm::detail {

/// How long a connection may take to present its first message, and how many may wait at once.
inline constexpr int kHandshakeDeadlineMs = 1000;
inline constexpr size_t kMaxPendingHandshakes = 64;

/// Logs the first refused connection of a listener as a warning, later ones at debug level, and counts them.
class RefusalLog {
 public:
  explicit RefusalLog(std::string where) : where_(std::move(where)) {}
  void refused(const std::string& why);
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }

 private:
  std::string where_;
  std::atomic<uint64_t> count_{0};
};

/// accept4() on a non-blocking listener that keeps working when the process runs out of descriptors: one spare
/// descriptor is held, released to accept and close the waiting connection, then taken again (otherwise a
/// level-triggered poll would spin on a connection that can never be accepted).
class Acceptor {
 public:
  Acceptor(int listener, RefusalLog* log, int socketFlags = SOCK_CLOEXEC | SOCK_NONBLOCK);
  /// The next waiting connection, or an invalid Fd when none is waiting (or it had to be dropped).
  Fd next();
  /// The listener to poll, or -1 for a short pause after accept failed for want of descriptors.
  int pollFd() const;

 private:
  int listener_;
  RefusalLog* log_;
  int flags_;
  Fd spare_;
  Clock::time_point pausedUntil_{};
};

/// Accepted connections waiting for their first message of `helloBytes` bytes. At most kMaxPendingHandshakes wait
/// (a new one evicts the oldest), each at most kHandshakeDeadlineMs; connections that close or send a short
/// datagram are dropped. Single-threaded: owned by the thread that polls the listener.
class PendingHandshakes {
 public:
  /// `datagrams`: the hello is one SOCK_SEQPACKET message (read in one call; any other length is "malformed").
  PendingHandshakes(size_t helloBytes, bool datagrams, RefusalLog* log);

  /// Starts the wait for a freshly accepted connection.
  void add(Fd conn);
  /// Appends one pollfd per waiting connection (POLLIN), in order; pass the same span to progress().
  void pollFds(std::vector<pollfd>& out) const;
  /// Milliseconds until the earliest deadline (-1 when none waits).
  int msToNextDeadline() const;
  /// Reads from the connections `pfds` (from pollFds, same order) reports readable and drops the expired ones.
  /// Returns the connections whose hello is complete, with its bytes.
  struct Ready {
    Fd conn;
    std::vector<char> hello;
  };
  std::vector<Ready> progress(const pollfd* pfds, size_t n);
  size_t size() const { return waiting_.size(); }

 private:
  struct Waiting {
    Fd conn;
    Clock::time_point deadline;
    std::vector<char> buf;
  };
  size_t helloBytes_;
  bool datagrams_;
  RefusalLog* log_;
  std::deque<Waiting> waiting_;
};

}  // namespace kvcomm::detail
