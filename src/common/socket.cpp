#include "common/socket.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/random.h>

#include <climits>
#include <cstring>
#include <thread>

#include "common/check.hpp"
#include "common/env.hpp"
#include "common/wait_reporter.hpp"

namespace kvcomm::detail {

Clock::time_point deadlineIn(int64_t ms) {
  // Beyond kMaxTimeoutMs (31 years) now + ms could overflow the clock's nanoseconds and land in the past.
  if (ms < 0 || ms > env::kMaxTimeoutMs) return Clock::time_point::max();
  return Clock::now() + std::chrono::milliseconds(ms);
}

int msLeft(Clock::time_point deadline) {
  if (deadline == Clock::time_point::max()) return -1;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left < 0) return 0;
  return left > INT_MAX ? INT_MAX : static_cast<int>(left);
}

uint16_t SockAddr::port() const {
  if (storage.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (storage.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return 0;
}

void SockAddr::setPort(uint16_t port) {
  if (storage.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons(port);
  if (storage.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons(port);
}

bool SockAddr::valid() const {
  return (storage.ss_family == AF_INET && len == sizeof(sockaddr_in)) ||
         (storage.ss_family == AF_INET6 && len == sizeof(sockaddr_in6));
}

std::string SockAddr::toString() const {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (storage.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, buf, sizeof(buf));
    return cat(buf, ":", port());
  }
  if (storage.ss_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr, buf, sizeof(buf));
    return cat("[", buf, "]:", port());
  }
  return "<no address>";
}

SockAddr SockAddr::parse(const std::string& text) {
  SockAddr out;
  auto colon = text.rfind(':');
  KVCOMM_CHECK_ARG(colon != std::string::npos, "SockAddr::parse", "address '", text, "' has no :port");
  std::string host = text.substr(0, colon);
  std::string digits = text.substr(colon + 1);
  bool numeric = !digits.empty() && digits.size() <= 5 && digits.find_first_not_of("0123456789") == std::string::npos;
  int port = numeric ? std::stoi(digits) : -1;
  KVCOMM_CHECK_ARG(port >= 0 && port < 65536, "SockAddr::parse", "bad port in '", text, "'");
  if (!host.empty() && host.front() == '[' && host.back() == ']') {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&out.storage);
    in6->sin6_family = AF_INET6;
    KVCOMM_CHECK_ARG(inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), &in6->sin6_addr) == 1,
                     "SockAddr::parse", "bad IPv6 address '", host, "'");
    out.len = sizeof(sockaddr_in6);
  } else {
    auto* in4 = reinterpret_cast<sockaddr_in*>(&out.storage);
    in4->sin_family = AF_INET;
    KVCOMM_CHECK_ARG(inet_pton(AF_INET, host.c_str(), &in4->sin_addr) == 1, "SockAddr::parse", "bad IPv4 address '",
                     host, "'");
    out.len = sizeof(sockaddr_in);
  }
  out.setPort(static_cast<uint16_t>(port));
  return out;
}

SockAddr pickLocalAddress(const std::string& ifnameArg) {
  std::string ifname = ifnameArg.empty() ? env::socketIfname() : ifnameArg;
  ifaddrs* list = nullptr;
  KVCOMM_CHECK_SYS(getifaddrs(&list));
  SockAddr found, loopback;
  for (ifaddrs* it = list; it; it = it->ifa_next) {
    if (!it->ifa_addr || it->ifa_addr->sa_family != AF_INET || !(it->ifa_flags & IFF_UP)) continue;
    SockAddr a;
    std::memcpy(&a.storage, it->ifa_addr, sizeof(sockaddr_in));
    a.len = sizeof(sockaddr_in);
    a.setPort(0);
    if (!ifname.empty()) {
      if (ifname == it->ifa_name) {
        found = a;
        break;
      }
      continue;
    }
    if (it->ifa_flags & IFF_LOOPBACK) {
      if (!loopback.len) loopback = a;
    } else if (!found.len) {
      found = a;
    }
  }
  freeifaddrs(list);
  if (!ifname.empty())
    KVCOMM_CHECK_ARG(found.len != 0, "pickLocalAddress", "interface '", ifname,
                     "' (KVCOMM_SOCKET_IFNAME) has no IPv4 address or is down");
  if (found.len) return found;
  if (loopback.len) return loopback;
  return SockAddr::parse("127.0.0.1:0");
}

void setNonBlocking(int fd, bool on) {
  int flags = KVCOMM_CHECK_SYS(fcntl(fd, F_GETFL));
  KVCOMM_CHECK_SYS(fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK)));
}

Fd listenTcp(const SockAddr& addr, SockAddr* bound) {
  Fd fd(KVCOMM_CHECK_SYS(socket(addr.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0)));
  int one = 1;
  KVCOMM_CHECK_SYS(setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)));
  if (bind(fd.get(), addr.sa(), addr.len) != 0)
    throwSystem(cat("bind(", addr.toString(), ")"), errno, __FILE__, __LINE__);
  KVCOMM_CHECK_SYS(listen(fd.get(), 1024));
  if (bound) {
    bound->len = sizeof(bound->storage);
    KVCOMM_CHECK_SYS(getsockname(fd.get(), bound->sa(), &bound->len));
  }
  return fd;
}

SockAddr localAddress(int fd) {
  SockAddr a;
  a.len = sizeof(a.storage);
  KVCOMM_CHECK_SYS(getsockname(fd, a.sa(), &a.len));
  return a;
}

Fd connectTcp(const SockAddr& addr, Clock::time_point deadline, const std::string& what, const std::string& hint,
              const std::function<void()>& stopIf) {
  std::string lastError = "no attempt made";
  int backoffMs = 10;
  WaitReporter progress(msLeft(deadline));
  constexpr int kSliceMs = 100;
  auto slice = [&](int ms) { return stopIf ? std::min(ms < 0 ? kSliceMs : ms, kSliceMs) : ms; };
  while (true) {
    if (stopIf) stopIf();
    Fd fd(KVCOMM_CHECK_SYS(socket(addr.storage.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0)));
    setNonBlocking(fd.get(), true);
    int rc = connect(fd.get(), addr.sa(), addr.len);
    int err = rc == 0 ? 0 : errno;
    while (err == EINPROGRESS) {
      pollfd p{fd.get(), POLLOUT, 0};
      int prc = poll(&p, 1, slice(msLeft(deadline)));
      if (prc > 0) {
        socklen_t len = sizeof(err);
        getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
      } else if (prc < 0 && errno != EINTR) {
        err = errno;
      } else if (msLeft(deadline) == 0) {
        err = ETIMEDOUT;
      } else if (stopIf) {
        stopIf();
      }
    }
    if (err == 0) {
      setNonBlocking(fd.get(), false);
      int one = 1;
      setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return fd;
    }
    lastError = cat(std::strerror(err), " (errno ", err, ")");
    if (msLeft(deadline) == 0) break;
    if (progress.due())
      progress.report(cat("connecting to ", what, " at ", addr.toString(), " (last error: ", lastError, ")",
                          hint.empty() ? "" : "; ", hint));
    for (int waited = 0, want = std::min(backoffMs, std::max(1, msLeft(deadline))); waited < want;) {
      int step = slice(want - waited);
      std::this_thread::sleep_for(std::chrono::milliseconds(step));
      waited += step;
      if (stopIf) stopIf();
    }
    backoffMs = std::min(backoffMs * 2, 500);
  }
  KVCOMM_THROW(Timeout, cat("connect(", what, " at ", addr.toString(), ")"),
               "could not connect before the deadline; last error: ", lastError);
}

void setLivenessTimeout(int fd, int64_t ms) {
  if (ms <= 0) return;
  int secs = static_cast<int>(std::max<int64_t>(1, ms / 1000));
  int idle = std::max(1, secs / 4), interval = std::max(1, secs / 4);
  int count = std::max(1, (secs - idle) / interval);
  int one = 1;
  unsigned int user = static_cast<unsigned int>(std::min<int64_t>(ms, INT_MAX));
  KVCOMM_CHECK_SYS(setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one)));
  KVCOMM_CHECK_SYS(setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle)));
  KVCOMM_CHECK_SYS(setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval)));
  KVCOMM_CHECK_SYS(setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count)));
  KVCOMM_CHECK_SYS(setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user, sizeof(user)));
}

void sendAll(int fd, const void* buf, size_t len, Clock::time_point deadline, const std::string& what) {
  const char* p = static_cast<const char*>(buf);
  while (len > 0) {
    pollfd pf{fd, POLLOUT, 0};
    int prc = poll(&pf, 1, msLeft(deadline));
    if (prc == 0) KVCOMM_THROW(Timeout, cat("send(", what, ")"), "timed out with ", len, " bytes unsent");
    if (prc < 0) {
      if (errno == EINTR) continue;
      throwSystem(cat("poll(send ", what, ")"), errno, __FILE__, __LINE__);
    }
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      KVCOMM_THROW(NetworkError, cat("send(", what, ")"), std::strerror(errno), " (peer gone?)");
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
}

void recvAll(int fd, void* buf, size_t len, Clock::time_point deadline, const std::string& what) {
  char* p = static_cast<char*>(buf);
  while (len > 0) {
    pollfd pf{fd, POLLIN, 0};
    int prc = poll(&pf, 1, msLeft(deadline));
    if (prc == 0) KVCOMM_THROW(Timeout, cat("recv(", what, ")"), "timed out with ", len, " bytes missing");
    if (prc < 0) {
      if (errno == EINTR) continue;
      throwSystem(cat("poll(recv ", what, ")"), errno, __FILE__, __LINE__);
    }
    ssize_t n = ::recv(fd, p, len, 0);
    if (n == 0) KVCOMM_THROW(NetworkError, cat("recv(", what, ")"), "connection closed by peer");
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      KVCOMM_THROW(NetworkError, cat("recv(", what, ")"), std::strerror(errno));
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
}

void randomBytes(void* out, size_t len) {
  char* p = static_cast<char*>(out);
  while (len > 0) {
    ssize_t n = getrandom(p, len, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throwSystem("getrandom", errno, __FILE__, __LINE__);
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
}

}  // namespace kvcomm::detail
