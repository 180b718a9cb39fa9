// Handle exchange, our own: each process serves exported fds on an abstract Unix socket (random name, published
// through the group's allgather). A request is served only to the same uid and the pid the token was issued for
// (SO_PEERCRED), with a one-use 128-bit token per (buffer, generation, requester); fds travel with SCM_RIGHTS.
// Why not pidfd_getfd: it needs ptrace rights over the exporter, which containers and Yama often deny.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/fd.hpp"
#include "symm/memory_backend.hpp"

namespace kvcomm::detail {

using Token = std::array<uint8_t, 16>;

/// Fds exported for one rendezvous step, with what each maps.
struct ExportSet {
  std::vector<PieceMeta> metas;
  std::vector<Fd> fds;
};

/// The process's fd server (started on first use; re-created in a forked child).
class FdServer {
 public:
  static FdServer& instance();
  /// Abstract socket name (without the leading NUL).
  const std::string& name() const { return name_; }
  /// Issues a one-use token for `requesterRank` (process `pid`, user `uid`) to fetch `set`.
  Token offer(uint64_t bufferId, uint64_t generation, int requesterRank, int pid, uint32_t uid,
              std::shared_ptr<const ExportSet> set);
  /// Expires every token of (bufferId, generation); the fds close once no token refers to them.
  void retire(uint64_t bufferId, uint64_t generation);
  /// Tokens still live (tests).
  size_t liveTokens();

 private:
  FdServer();
  void serve();
  void handle(int conn);

  struct Entry {
    uint64_t bufferId, generation;
    int requesterRank, pid;
    uint32_t uid;
    std::shared_ptr<const ExportSet> set;
  };
  std::string name_;
  Fd listener_;
  int pid_;
  std::mutex mu_;
  std::map<Token, Entry> entries_;
  std::thread thread_;
};

/// Fetches the set behind `token` from the server `serverName`. Throws NetworkError carrying the server's reason
/// when refused (forged, replayed or expired token; wrong process) — no fd is kept then.
ExportSet fetchFds(const std::string& serverName, const Token& token, uint64_t bufferId, uint64_t generation,
                   int requesterRank, int64_t timeoutMs);

/// Sends `payload` with `fds` attached (SCM_RIGHTS) as one SOCK_SEQPACKET message.
void sendWithFds(int sock, const void* payload, size_t len, const int* fds, size_t nfds);
/// Receives one message expecting at most `maxFds` fds; on truncation (MSG_CTRUNC) closes whatever arrived and
/// throws NetworkError. Returns the received fds; `*len` is the payload length.
std::vector<Fd> recvWithFds(int sock, void* payload, size_t* len, size_t maxFds);

/// sendWithFds for event loops: never blocks. Returns false, having sent nothing, when the socket cannot take the
/// message now (EAGAIN: the peer's queue is full); the caller retries when the socket polls writable. Throws
/// NetworkError on any other failure (the peer closed the connection, ...).
bool trySendWithFds(int sock, const void* payload, size_t len, const int* fds, size_t nfds);

}  // namespace kvcomm::detail
