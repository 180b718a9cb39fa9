// The thread that serves arena sessions: one poll() loop over a wake-up eventfd, an optional listening socket (an
// ArenaServer) and every session's socket and pidfd. Nothing in it blocks: sockets are read one datagram per
// readiness event and written only while they take data, so an idle or hostile peer cannot stall the others. A
// server's connections are checked (SO_PEERCRED uid) before anything is read, capped, and must complete their
// handshake within a deadline.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "arena/session.hpp"
#include "common/fd.hpp"
#include "kvcomm/arena.hpp"

namespace kvcomm::detail::arena {

class Reactor : public std::enable_shared_from_this<Reactor> {
 public:
  Reactor();
  ~Reactor();
  Reactor(const Reactor&) = delete;
  Reactor& operator=(const Reactor&) = delete;

  /// Makes this reactor a server: it accepts on `listener` (non-blocking, listening) under `options`. Before its
  /// thread starts.
  void setListener(Fd listener, const ArenaServerOptions& options);
  /// Adds an established session (a client's).
  void add(std::shared_ptr<Session> session);
  void wake() noexcept;
  bool onThread() const { return std::this_thread::get_id() == threadId_.load(); }

  /// Server: the next established session not yet accepted, waiting until `deadline`; nullptr on expiry. Throws
  /// Aborted once the server is closed.
  std::shared_ptr<Session> nextAccepted(Clock::time_point deadline, bool bounded);
  size_t sessions() const;
  uint64_t refused() const { return refused_.load(); }
  /// Server close: stops listening and ends every session; returns when done (at once on the reactor thread).
  void shutdown(const std::string& reason);

  /// The thread body; returns after stop().
  void run();
  void stop() noexcept;

 private:
  void acceptAll();
  void refuse(Fd conn, const std::string& why);

  Fd wake_;
  std::atomic<std::thread::id> threadId_{};
  std::atomic<uint64_t> refused_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool shutdownRequested_ = false;
  bool shutdownDone_ = false;
  std::string shutdownReason_;
  Fd listener_;
  ArenaServerOptions options_;
  Clock::time_point listenerPausedUntil_{};
  std::vector<std::shared_ptr<Session>> sessions_;
  std::deque<std::shared_ptr<Session>> acceptQueue_;
};

/// Runs a reactor on its own thread; destruction stops and joins it (or detaches when the last owner lets go on the
/// reactor thread itself: the thread keeps its own reference, so nothing is used after it is freed).
class ReactorThread {
 public:
  explicit ReactorThread(std::shared_ptr<Reactor> reactor);
  ~ReactorThread();
  ReactorThread(const ReactorThread&) = delete;
  ReactorThread& operator=(const ReactorThread&) = delete;
  const std::shared_ptr<Reactor>& reactor() const { return reactor_; }

 private:
  std::shared_ptr<Reactor> reactor_;
  std::thread thread_;
};

}  // namespace kvcomm::detail::arena
