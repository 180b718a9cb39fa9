// TCP socket helpers used by the bootstrap: addresses, bounded connect, bounded send/receive.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "common/fd.hpp"

namespace kvcomm::detail {

using Clock = std::chrono::steady_clock;

/// A deadline `ms` milliseconds from now (ms < 0, or above env::kMaxTimeoutMs = 10^12: no deadline, never a wrapped
/// one in the past).
Clock::time_point deadlineIn(int64_t ms);
/// Milliseconds left until `deadline`, clamped to [0, INT_MAX]; -1 when the deadline is "never".
int msLeft(Clock::time_point deadline);

/// A socket address (IPv4 or IPv6) in a fixed-size, trivially copyable form, so it can travel in allgathers.
struct SockAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;

  const sockaddr* sa() const { return reinterpret_cast<const sockaddr*>(&storage); }
  sockaddr* sa() { return reinterpret_cast<sockaddr*>(&storage); }
  uint16_t port() const;
  void setPort(uint16_t port);
  std::string toString() const;
  /// An IPv4 or IPv6 address whose length matches its family (what a peer sent may be neither).
  bool valid() const;
  /// Parses "a.b.c.d:port" or "[v6]:port".
  static SockAddr parse(const std::string& text);
};

/// IPv4 address to advertise: `ifname` (or KVCOMM_SOCKET_IFNAME) if given, else the first interface that is up and
/// not loopback, else 127.0.0.1. Port 0.
SockAddr pickLocalAddress(const std::string& ifname = "");

/// A listening TCP socket bound to `addr` (port 0 = any); `bound` receives the actual address.
Fd listenTcp(const SockAddr& addr, SockAddr* bound);

/// Connects to `addr`, retrying refused/unreachable attempts until `deadline`; throws Timeout naming `what`. While it
/// retries it logs what it connects to and the last error every few seconds (WaitReporter), followed by `hint`.
/// `stopIf` (optional) runs at least every 100 ms while waiting and may throw to give up early.
Fd connectTcp(const SockAddr& addr, Clock::time_point deadline, const std::string& what, const std::string& hint = "",
              const std::function<void()>& stopIf = {});

/// Turns a silent peer (host lost, cable pulled) into a connection error within about `ms` milliseconds: TCP
/// keepalive probes while idle and TCP_USER_TIMEOUT while data is unacknowledged. `ms` <= 0 leaves the defaults.
void setLivenessTimeout(int fd, int64_t ms);

/// Writes/reads exactly `len` bytes before `deadline` (blocking sockets are polled). Throws NetworkError on EOF or
/// error and Timeout on expiry; `what` names the peer in the message.
void sendAll(int fd, const void* buf, size_t len, Clock::time_point deadline, const std::string& what);
void recvAll(int fd, void* buf, size_t len, Clock::time_point deadline, const std::string& what);

/// Local address of a connected socket.
SockAddr localAddress(int fd);

/// Cryptographically random bytes (getrandom).
void randomBytes(void* out, size_t len);

void setNonBlocking(int fd, bool on);

}  // namespace kvcomm::detail
