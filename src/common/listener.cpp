#include "common/listener.hpp"

#include <fcntl.h>
#include <sys/socket.h>

#include <cstring>

#include "common/check.hpp"
#include "common/log.hpp"

namespace kvcomm::detail {

void RefusalLog::refused(const std::string& why) {
  if (count_.fetch_add(1, std::memory_order_relaxed) == 0)
    KVCOMM_WARN(where_, ": refused a connection: ", why, " (further refusals are logged at debug level)");
  else
    KVCOMM_DEBUG(where_, ": refused a connection: ", why);
}

Acceptor::Acceptor(int listener, RefusalLog* log, int socketFlags)
    : listener_(listener), log_(log), flags_(socketFlags), spare_(::open("/dev/null", O_RDONLY | O_CLOEXEC)) {}

int Acceptor::pollFd() const {
  return Clock::now() < pausedUntil_ ? -1 : listener_;
}

Fd Acceptor::next() {
  if (!spare_) spare_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  while (true) {
    int c = accept4(listener_, nullptr, nullptr, flags_);
    if (c >= 0) return Fd(c);
    int err = errno;
    if (err == EINTR || err == ECONNABORTED) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) return {};
    if ((err == EMFILE || err == ENFILE) && spare_) {
      // Out of descriptors (accept fails so even when nothing waits): free the spare, take the waiting connection
      // off the queue and close it, take the spare back.
      spare_.reset();
      int dropped = accept4(listener_, nullptr, nullptr, flags_);
      if (dropped >= 0) ::close(dropped);
      spare_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
      if (dropped < 0) return {};  // nothing was waiting
      if (log_) log_->refused("out of file descriptors (RLIMIT_NOFILE); the connection was closed");
      continue;
    }
    // No spare (another thread took the last descriptor) or another failure: stop polling the listener for a
    // moment rather than spin on a connection that cannot be accepted.
    pausedUntil_ = Clock::now() + std::chrono::milliseconds(100);
    if (log_) log_->refused(cat("accept failed: ", std::strerror(err)));
    return {};
  }
}

PendingHandshakes::PendingHandshakes(size_t helloBytes, bool datagrams, RefusalLog* log)
    : helloBytes_(helloBytes), datagrams_(datagrams), log_(log) {}

void PendingHandshakes::add(Fd conn) {
  if (waiting_.size() >= kMaxPendingHandshakes) {
    waiting_.pop_front();  // the oldest has had the longest to speak
    if (log_) log_->refused(cat(kMaxPendingHandshakes, " connections were already waiting; dropped the oldest"));
  }
  Waiting w;
  w.conn = std::move(conn);
  w.deadline = deadlineIn(kHandshakeDeadlineMs);
  waiting_.push_back(std::move(w));
}

void PendingHandshakes::pollFds(std::vector<pollfd>& out) const {
  for (const Waiting& w : waiting_) out.push_back({w.conn.get(), POLLIN, 0});
}

int PendingHandshakes::msToNextDeadline() const {
  if (waiting_.empty()) return -1;
  int best = msLeft(waiting_.front().deadline);
  for (const Waiting& w : waiting_) best = std::min(best, msLeft(w.deadline));
  return best;
}

std::vector<PendingHandshakes::Ready> PendingHandshakes::progress(const pollfd* pfds, size_t n) {
  std::vector<Ready> ready;
  std::deque<Waiting> keep;
  for (size_t i = 0; i < waiting_.size(); ++i) {
    Waiting& w = waiting_[i];
    bool readable = i < n && pfds[i].fd == w.conn.get() && pfds[i].revents != 0;
    bool drop = false;
    std::string why;
    if (readable) {
      if (datagrams_) {
        w.buf.resize(helloBytes_);
        ssize_t got = ::recv(w.conn.get(), w.buf.data(), helloBytes_, MSG_DONTWAIT | MSG_TRUNC);
        if (got < 0 && (errno == EAGAIN || errno == EINTR)) {
          w.buf.clear();
        } else if (got != static_cast<ssize_t>(helloBytes_)) {
          drop = true;
          why = got <= 0 ? "closed before its request" : cat("malformed request of ", got, " bytes");
        } else {
          ready.push_back({std::move(w.conn), std::move(w.buf)});
          continue;
        }
      } else {
        size_t have = w.buf.size();
        w.buf.resize(helloBytes_);
        ssize_t got = ::recv(w.conn.get(), w.buf.data() + have, helloBytes_ - have, MSG_DONTWAIT);
        if (got > 0) {
          w.buf.resize(have + static_cast<size_t>(got));
          if (w.buf.size() == helloBytes_) {
            ready.push_back({std::move(w.conn), std::move(w.buf)});
            continue;
          }
        } else {
          w.buf.resize(have);
          if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            drop = true;
            why = cat("closed after ", have, " of ", helloBytes_, " hello bytes");
          }
        }
      }
    }
    if (!drop && msLeft(w.deadline) == 0) {
      drop = true;
      why = cat("no hello within ", kHandshakeDeadlineMs, " ms (", w.buf.size(), " of ", helloBytes_, " bytes)");
    }
    if (drop) {
      if (log_) log_->refused(why);
      continue;  // closed by the Fd
    }
    keep.push_back(std::move(w));
  }
  waiting_ = std::move(keep);
  return ready;
}

}  // namespace kvcomm::detail
