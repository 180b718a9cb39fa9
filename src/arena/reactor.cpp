#include "arena/reactor.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/check.hpp"
#include "common/log.hpp"
#include "symm/fd_exchange.hpp"

namespace kvcomm::detail::arena {

namespace {

constexpr int kAcceptsPerRound = 64;
constexpr int kIdlePollMs = 1000;
constexpr int64_t kDefaultHandshakeMs = 1000;
constexpr int64_t kDefaultRequestMs = 10000;

}  // namespace

Reactor::Reactor() {
  wake_.reset(KVCOMM_CHECK_SYS(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)));
}

Reactor::~Reactor() = default;

void Reactor::setListener(Fd listener, const ArenaServerOptions& options) {
  std::lock_guard<std::mutex> lock(mu_);
  listener_ = std::move(listener);
  options_ = options;
  if (options_.handshakeTimeoutMs < 0) options_.handshakeTimeoutMs = kDefaultHandshakeMs;
  if (options_.requestTimeoutMs < 0) options_.requestTimeoutMs = kDefaultRequestMs;
}

void Reactor::add(std::shared_ptr<Session> session) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    sessions_.push_back(std::move(session));
  }
  wake();
}

void Reactor::wake() noexcept {
  uint64_t one = 1;
  ssize_t n = ::write(wake_.get(), &one, sizeof(one));
  (void)n;  // EAGAIN means a wake-up is already pending
}

std::shared_ptr<Session> Reactor::nextAccepted(Clock::time_point deadline, bool bounded) {
  std::unique_lock<std::mutex> lock(mu_);
  auto ready = [&] { return !acceptQueue_.empty() || shutdownRequested_ || stopping_; };
  if (bounded)
    cv_.wait_until(lock, deadline, ready);
  else
    cv_.wait(lock, ready);
  if (shutdownRequested_ || stopping_) KVCOMM_THROW(Aborted, "ArenaServer::accept", "the server is closed");
  if (acceptQueue_.empty()) return nullptr;
  std::shared_ptr<Session> s = std::move(acceptQueue_.front());
  acceptQueue_.pop_front();
  return s;
}

size_t Reactor::sessions() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& s : sessions_)
    if (s->alive() && s->established()) ++n;
  return n;
}

void Reactor::shutdown(const std::string& reason) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!shutdownRequested_) {
    shutdownRequested_ = true;
    shutdownReason_ = reason;
  }
  cv_.notify_all();
  lock.unlock();
  wake();
  if (onThread()) return;
  lock.lock();
  cv_.wait_for(lock, std::chrono::seconds(5), [&] { return shutdownDone_ || stopping_; });
}

void Reactor::stop() noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  wake();
}

void Reactor::refuse(Fd conn, const std::string& why) {
  refused_.fetch_add(1);
  Message r;
  r.type = MsgType::Refused;
  r.reason = why;
  std::vector<uint8_t> bytes = encode(r);
  try {
    trySendWithFds(conn.get(), bytes.data(), bytes.size(), nullptr, 0);  // best effort: never waits
  } catch (const std::exception&) {
  }
  KVCOMM_DEBUG("arena server refused a connection: ", why);
}

void Reactor::acceptAll() {
  for (int i = 0; i < kAcceptsPerRound; ++i) {
    int c = accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      // Out of descriptors or memory: the pending connection stays queued; look again shortly instead of spinning.
      KVCOMM_WARN("arena server: accept failed: ", std::strerror(errno), "; retrying in 100 ms");
      listenerPausedUntil_ = Clock::now() + std::chrono::milliseconds(100);
      return;
    }
    Fd conn(c);
    // Credentials first: nothing is read from a connection of another user.
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (getsockopt(conn.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      refuse(std::move(conn), cat("SO_PEERCRED failed: ", std::strerror(errno)));
      continue;
    }
    if (cred.uid != geteuid()) {
      refuse(std::move(conn),
             cat("uid ", cred.uid, " is not allowed: arena sessions need this server's uid ", geteuid()));
      continue;
    }
    size_t total = 0, pending = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& s : sessions_)
        if (!s->finished()) {
          ++total;
          if (!s->established()) ++pending;
        }
    }
    if (total >= options_.maxSessions) {
      refuse(std::move(conn), cat("the server is full (", total, " sessions; ArenaServerOptions::maxSessions)"));
      continue;
    }
    if (pending >= options_.maxPendingHandshakes) {
      refuse(std::move(conn), cat("too many connections are still handshaking (", pending, ")"));
      continue;
    }
    auto session = std::make_shared<Session>(
        std::move(conn), cred.pid, cred.uid, Session::Role::Server, weak_from_this(), false,
        Clock::now() + std::chrono::milliseconds(options_.handshakeTimeoutMs), options_.requestTimeoutMs);
    std::lock_guard<std::mutex> lock(mu_);
    sessions_.push_back(std::move(session));
  }
}

void Reactor::run() {
  threadId_.store(std::this_thread::get_id());
  std::vector<pollfd> pfds;
  std::vector<std::pair<Session*, bool>> owners;  // session, true for its pidfd
  std::vector<std::shared_ptr<Session>> snapshot;
  while (true) {
    std::vector<std::shared_ptr<Session>> ending;
    std::string endReason;
    bool stopNow = false, shutdownNow = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopNow = stopping_;
      shutdownNow = shutdownRequested_ && !shutdownDone_;
      if (stopNow || shutdownNow) {
        ending.swap(sessions_);
        acceptQueue_.clear();
        listener_.reset();
        endReason = stopNow ? "the process is closing its arena sessions" : shutdownReason_;
      }
    }
    for (auto& s : ending) s->lose(endReason);
    ending.clear();
    if (stopNow) break;
    if (shutdownNow) {
      std::lock_guard<std::mutex> lock(mu_);
      shutdownDone_ = true;
      cv_.notify_all();
    }

    {
      std::lock_guard<std::mutex> lock(mu_);
      snapshot = sessions_;
    }
    Clock::time_point now = Clock::now();
    for (auto& s : snapshot) {
      s->service();
      if (!s->finished() && s->role() == Session::Role::Server && !s->established() && now >= s->handshakeDeadline()) {
        s->lose("no hello within the handshake deadline");
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      std::erase_if(sessions_, [&](const std::shared_ptr<Session>& s) {
        if (!s->finished()) return false;
        if (s->role() == Session::Role::Server && !s->established()) refused_.fetch_add(1);  // dropped in handshake
        return true;
      });
      // Sessions that ended before the application accepted them are not handed out.
      std::erase_if(acceptQueue_, [](const std::shared_ptr<Session>& s) { return s->finished(); });
      snapshot = sessions_;
    }

    pfds.clear();
    owners.clear();
    pfds.push_back({wake_.get(), POLLIN, 0});
    bool listening = listener_.valid() && now >= listenerPausedUntil_;
    if (listening) pfds.push_back({listener_.get(), POLLIN, 0});
    size_t firstSession = pfds.size();
    int timeout = kIdlePollMs;
    if (listener_.valid() && !listening)
      timeout = std::min<int64_t>(
          timeout, std::chrono::duration_cast<std::chrono::milliseconds>(listenerPausedUntil_ - now).count() + 1);
    for (auto& s : snapshot) {
      pfds.push_back({s->fd(), s->pollEvents(), 0});
      owners.push_back({s.get(), false});
      if (s->pidFd() >= 0) {
        pfds.push_back({s->pidFd(), POLLIN, 0});
        owners.push_back({s.get(), true});
      }
      if (s->role() == Session::Role::Server && !s->established())
        timeout = std::min<int64_t>(
            timeout,
            std::max<int64_t>(
                0, std::chrono::duration_cast<std::chrono::milliseconds>(s->handshakeDeadline() - now).count() + 1));
    }
    int rc = poll(pfds.data(), pfds.size(), timeout);
    if (rc < 0) {
      if (errno != EINTR) KVCOMM_WARN("arena reactor: poll failed: ", std::strerror(errno));
      continue;
    }
    if (pfds[0].revents & POLLIN) {
      uint64_t v;
      ssize_t n = ::read(wake_.get(), &v, sizeof(v));
      (void)n;
    }
    if (listening && (pfds[1].revents & POLLIN)) acceptAll();
    for (size_t i = firstSession; i < pfds.size(); ++i) {
      Session* s = owners[i - firstSession].first;
      short re = pfds[i].revents;
      if (!re || s->finished()) continue;
      if (owners[i - firstSession].second) {
        s->onPeerExit();
        continue;
      }
      if (re & POLLOUT) s->onWritable();
      if (!s->finished() && (re & (POLLIN | POLLHUP | POLLERR))) {
        if (s->onReadable()) {
          std::lock_guard<std::mutex> lock(mu_);
          for (auto& held : sessions_)
            if (held.get() == s) acceptQueue_.push_back(held);
          cv_.notify_all();
        }
      }
    }
    snapshot.clear();
  }
  std::lock_guard<std::mutex> lock(mu_);
  shutdownDone_ = true;
  cv_.notify_all();
}

ReactorThread::ReactorThread(std::shared_ptr<Reactor> reactor) : reactor_(std::move(reactor)) {
  thread_ = std::thread([r = reactor_] { r->run(); });
}

ReactorThread::~ReactorThread() {
  reactor_->stop();
  if (thread_.get_id() == std::this_thread::get_id())
    thread_.detach();  // the last owner let go on the reactor thread: it ends by itself, holding its own reference
  else
    thread_.join();
}

}  // namespace kvcomm::detail::arena
