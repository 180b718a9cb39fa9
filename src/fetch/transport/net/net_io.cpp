#include "fetch/transport/net/net_io.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/check.hpp"

namespace kvcomm::detail {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kSliceMs = 50;  // how often a wait looks at the stop flag

// Waits for `events` on `fd` until `deadline`; Ok when ready.
IoResult waitFor(int fd, short events, Clock::time_point deadline, const std::atomic<bool>* stop) {
  for (;;) {
    if (stop && stop->load(std::memory_order_relaxed)) return IoResult::Stopped;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return IoResult::Timeout;
    pollfd p{fd, events, 0};
    int rc = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, kSliceMs)));
    if (rc > 0) return IoResult::Ok;  // ready, or an error/hang-up the next call reports
    if (rc < 0 && errno != EINTR) return IoResult::Error;
  }
}

Clock::time_point after(int64_t ms) {
  return ms < 0 ? Clock::time_point::max() : Clock::now() + std::chrono::milliseconds(ms);
}

// Drops `n` consumed bytes from the front of iov[*first..count).
void consume(iovec* iov, int count, int* first, size_t n) {
  while (n > 0 && *first < count) {
    iovec& v = iov[*first];
    size_t k = std::min(n, v.iov_len);
    v.iov_base = static_cast<char*>(v.iov_base) + k;
    v.iov_len -= k;
    n -= k;
    if (v.iov_len == 0) ++*first;
  }
  while (*first < count && iov[*first].iov_len == 0) ++*first;
}

// The I/O is tried first and polled for only when the socket has nothing (or no room): one system call per message
// when data is there, which is what small fetches' latency is made of.
IoResult readInto(int fd, iovec* iov, int count, int64_t firstMs, int64_t stallMs, const std::atomic<bool>* stop,
                  int* err, uint64_t* got) {
  int first = 0;
  consume(iov, count, &first, 0);
  auto deadline = after(firstMs < 0 ? stallMs : firstMs);
  while (first < count) {
    if (stop && stop->load(std::memory_order_relaxed)) return IoResult::Stopped;
    msghdr m{};
    m.msg_iov = iov + first;
    m.msg_iovlen = static_cast<size_t>(count - first);
    ssize_t n = ::recvmsg(fd, &m, MSG_DONTWAIT);
    if (n == 0) return IoResult::Closed;
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        IoResult w = waitFor(fd, POLLIN, deadline, stop);
        if (w != IoResult::Ok) return w;
        continue;
      }
      if (errno == EINTR) continue;
      *err = errno;
      return errno == ECONNRESET ? IoResult::Closed : IoResult::Error;
    }
    if (got) *got += static_cast<uint64_t>(n);
    consume(iov, count, &first, static_cast<size_t>(n));
    deadline = after(stallMs);
  }
  return IoResult::Ok;
}

}  // namespace

const char* ioResultText(IoResult r) {
  switch (r) {
    case IoResult::Ok:
      return "ok";
    case IoResult::Closed:
      return "connection closed by the peer";
    case IoResult::Timeout:
      return "no progress before the deadline";
    case IoResult::Stopped:
      return "stopped";
    case IoResult::Error:
      return "socket error";
  }
  return "?";
}

Fd connectOnce(const SockAddr& addr, int64_t timeoutMs, std::string* why) {
  Fd fd(::socket(addr.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) {
    *why = cat("socket: ", std::strerror(errno));
    return Fd();
  }
  int err = ::connect(fd.get(), addr.sa(), addr.len) == 0 ? 0 : errno;
  if (err == EINPROGRESS) {
    IoResult r = waitFor(fd.get(), POLLOUT, after(timeoutMs), nullptr);
    if (r == IoResult::Timeout) {
      *why = cat("connect to ", addr.toString(), ": no answer in ", timeoutMs, " ms");
      return Fd();
    }
    socklen_t len = sizeof(err);
    getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
  }
  if (err != 0) {
    *why = cat("connect to ", addr.toString(), ": ", std::strerror(err));
    return Fd();
  }
  int one = 1;
  setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

IoResult waitReadable(int fd, int64_t ms, const std::atomic<bool>* stop) {
  return waitFor(fd, POLLIN, after(ms), stop);
}

IoResult readExact(int fd, void* buf, size_t n, int64_t firstMs, int64_t stallMs, const std::atomic<bool>* stop,
                   int* err) {
  iovec v{buf, n};
  return readInto(fd, &v, 1, firstMs, stallMs, stop, err, nullptr);
}

IoResult writeAll(int fd, iovec* iov, int count, int64_t stallMs, const std::atomic<bool>* stop, int* err, bool more) {
  int first = 0;
  consume(iov, count, &first, 0);
  auto deadline = after(stallMs);
  while (first < count) {
    if (stop && stop->load(std::memory_order_relaxed)) return IoResult::Stopped;
    msghdr m{};
    m.msg_iov = iov + first;
    m.msg_iovlen = static_cast<size_t>(count - first);
    ssize_t n = ::sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT | (more ? MSG_MORE : 0));
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        IoResult w = waitFor(fd, POLLOUT, deadline, stop);
        if (w != IoResult::Ok) return w;
        continue;
      }
      if (errno == EINTR) continue;
      *err = errno;
      return errno == EPIPE || errno == ECONNRESET ? IoResult::Closed : IoResult::Error;
    }
    consume(iov, count, &first, static_cast<size_t>(n));
    deadline = after(stallMs);
  }
  return IoResult::Ok;
}

IoResult sendSegments(int fd, SegmentCursor& cursor, const char* base, uint64_t limit, int64_t stallMs,
                      const std::atomic<bool>* stop, int* err, const void* head, size_t headBytes) {
  iovec iov[kIovBatch];
  while (limit > 0 || headBytes > 0) {
    int count = 0;
    uint64_t off = 0, len = 0;
    if (headBytes > 0) {  // the header leaves with the first segments
      iov[count++] = {const_cast<void*>(head), headBytes};
      headBytes = 0;
    }
    while (count < kIovBatch && limit > 0 && cursor.take(limit, &off, &len)) {
      iov[count++] = {const_cast<char*>(base) + off, static_cast<size_t>(len)};
      limit -= len;
    }
    if (count == 0) break;
    IoResult r = writeAll(fd, iov, count, stallMs, stop, err);
    if (r != IoResult::Ok) return r;
  }
  return IoResult::Ok;
}

IoResult recvSegments(int fd, SegmentCursor& cursor, char* base, uint64_t limit, int64_t stallMs,
                      const std::atomic<bool>* stop, int* err, uint64_t* received) {
  iovec iov[kIovBatch];
  while (limit > 0) {
    int count = 0;
    uint64_t off = 0, len = 0;
    while (count < kIovBatch && limit > 0 && cursor.take(limit, &off, &len)) {
      iov[count++] = {base + off, static_cast<size_t>(len)};
      limit -= len;
    }
    if (count == 0) break;
    IoResult r = readInto(fd, iov, count, stallMs, stallMs, stop, err, received);
    if (r != IoResult::Ok) return r;
  }
  return IoResult::Ok;
}

}  // namespace kvcomm::detail
