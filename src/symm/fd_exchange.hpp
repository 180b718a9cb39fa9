// Handle exchange, our own: each process serves exported fds on an abstract Unix socket (random name, published
// through the group's allgather). A request is served only to the same uid (checked before anything is read) and the
// pid the token was issued for (SO_PEERCRED), with a one-use 128-bit token per (buffer, generation, requester); fds
// travel with SCM_RIGHTS.
// Why not pidfd_getfd: it needs ptrace rights over the exporter, which containers and Yama often deny.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/fd.hpp"
#include "common/internal_api.hpp"
#include "common/listener.hpp"
#include "symm/memory_backend.hpp"

namespace kvcomm::detail {

using Token = std::array<uint8_t, 16>;

/// Fds exported for one rendezvous step, with what each maps.
struct ExportSet {
  std::vector<PieceMeta> metas;
  std::vector<Fd> fds;
};

/// Wire format: one request datagram; then one reply datagram, the piece table (count PieceMeta) and the fds in
/// batches of at most kFdBatch (each batch a uint32 count with SCM_RIGHTS).
inline constexpr uint32_t kFdMagic = 0x4b564644;  // "KVFD"
inline constexpr size_t kFdBatch = 64;            // fds per SCM_RIGHTS message (well under SCM_MAX_FD)
inline constexpr uint32_t kMaxExportPieces = 1u << 16;

struct FdRequest {
  uint32_t magic;
  uint32_t version;
  Token token;
  uint64_t bufferId;
  uint64_t generation;
  int32_t requesterRank;
  int32_t reserved;
};

struct FdReply {
  uint32_t magic;
  int32_t status;  // 0 = granted
  uint32_t count;  // pieces (and fds) that follow
  char message[244];
};

/// Decodes a request datagram of `len` bytes; returns why it is malformed ("" when well-formed).
std::string decodeFdRequest(const void* bytes, size_t len, FdRequest* out);
/// Decodes a reply datagram; throws NetworkError when malformed or refused (carrying the server's reason).
FdReply decodeFdReply(const void* bytes, size_t len, const std::string& server);

/// One-use tokens and what each grants (thread-safe).
class TokenTable {
 public:
  Token offer(uint64_t bufferId, uint64_t generation, int requesterRank, int pid, uint32_t uid,
              std::shared_ptr<const ExportSet> set);
  void retire(uint64_t bufferId, uint64_t generation);
  size_t live();
  /// The set `req` asks for, consuming its token, when it was issued for exactly this request and the process
  /// (`pid`, `uid`) presenting it; otherwise null and `*why` says what was wrong.
  std::shared_ptr<const ExportSet> take(const FdRequest& req, int pid, uint32_t uid, std::string* why);

 private:
  struct Entry {
    uint64_t bufferId, generation;
    int requesterRank, pid;
    uint32_t uid;
    std::shared_ptr<const ExportSet> set;
  };
  std::mutex mu_;
  std::map<Token, Entry> entries_;
};

/// The process's fd server (started on first use; re-created in a forked child). Its thread serves every
/// connection concurrently: the peer's uid is checked (SO_PEERCRED) before anything is read, a request must
/// arrive within kHandshakeDeadlineMs and at most kMaxPendingHandshakes connections wait at once, so idle or
/// hostile connections never delay a rendezvous.
class FdServer {
 public:
  KVCOMM_INTERNAL_API static FdServer& instance();
  /// Abstract socket name (without the leading NUL).
  const std::string& name() const { return name_; }
  /// Issues a one-use token for `requesterRank` (process `pid`, user `uid`) to fetch `set`.
  KVCOMM_INTERNAL_API Token offer(uint64_t bufferId, uint64_t generation, int requesterRank, int pid, uint32_t uid,
                                  std::shared_ptr<const ExportSet> set);
  /// Expires every token of (bufferId, generation); the fds close once no token refers to them.
  KVCOMM_INTERNAL_API void retire(uint64_t bufferId, uint64_t generation);
  /// Tokens still live (tests).
  KVCOMM_INTERNAL_API size_t liveTokens();
  /// Connections refused so far (tests).
  uint64_t refusedConnections() const { return refusals_.count(); }

 private:
  FdServer();
  void serve();
  void answer(Fd conn, const std::vector<char>& request);

  std::string name_;
  Fd listener_;
  int pid_;
  TokenTable tokens_;
  RefusalLog refusals_;
  std::unique_ptr<Acceptor> acceptor_;
  std::thread thread_;
};

/// Fetches the set behind `token` from the server `serverName`. Throws NetworkError carrying the server's reason
/// when refused (forged, replayed or expired token; wrong process) — no fd is kept then. `stopIf` (optional) runs
/// at least every 100 ms while waiting and may throw to give up early (an aborted or broken group).
KVCOMM_INTERNAL_API ExportSet fetchFds(const std::string& serverName, const Token& token, uint64_t bufferId,
                                       uint64_t generation, int requesterRank, int64_t timeoutMs,
                                       const std::function<void()>& stopIf = {});

/// The address of abstract Unix socket `name` (no leading NUL); *len is its length for bind/connect.
sockaddr_un abstractAddress(const std::string& name, socklen_t* len);
/// One SOCK_SEQPACKET message of `len` bytes; NetworkError naming `what` when it cannot go whole.
void sendPlain(int sock, const void* data, size_t len, const char* what);
/// One message (up to `len` bytes) without waiting; NetworkError when the peer closed or recv failed.
size_t recvPlain(int sock, void* data, size_t len, const char* what);
/// Waits until `sock` is readable, in slices of at most 100 ms that run `stopIf`; Timeout at `deadline`.
void waitReadable(int sock, Clock::time_point deadline, const std::function<void()>& stopIf, const char* what);

/// The piece table (`metas`) as one message, then `fds` in batches of at most kFdBatch (each a uint32 count with
/// SCM_RIGHTS): how the fd server and an endpoint's share server hand memory over.
void sendPieces(int sock, const std::vector<PieceMeta>& metas, const std::vector<Fd>& fds);
/// Receives what sendPieces sent for `count` pieces (0: nothing); NetworkError naming `from` when short or malformed,
/// Timeout at `deadline`.
ExportSet recvPieces(int sock, uint32_t count, Clock::time_point deadline, const std::function<void()>& stopIf,
                     const std::string& from);

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
