#include "symm/fd_exchange.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>

#include "common/check.hpp"
#include "common/log.hpp"
#include "common/socket.hpp"
#include "kvcomm/bootstrap.hpp"

namespace kvcomm::detail {

sockaddr_un abstractAddress(const std::string& name, socklen_t* len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  KVCOMM_CHECK_ARG(name.size() + 1 < sizeof(a.sun_path), "unix socket", "socket name too long");
  a.sun_path[0] = '\0';
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

void sendPlain(int sock, const void* data, size_t len, const char* what) {
  ssize_t n = ::send(sock, data, len, MSG_NOSIGNAL);
  if (n != static_cast<ssize_t>(len))
    KVCOMM_THROW(NetworkError, what, "send of ", len, " bytes failed: ", n < 0 ? std::strerror(errno) : "short");
}

// Waits until `sock` is readable, in slices of at most 100 ms that run `stopIf`; Timeout at `deadline`.
void waitReadable(int sock, Clock::time_point deadline, const std::function<void()>& stopIf, const char* what) {
  while (true) {
    if (stopIf) stopIf();
    int left = msLeft(deadline);
    if (left == 0) KVCOMM_THROW(Timeout, what, "the peer did not answer in time");
    pollfd p{sock, POLLIN, 0};
    int rc = poll(&p, 1, left < 0 ? 100 : std::min(left, 100));
    if (rc > 0) return;
    if (rc < 0 && errno != EINTR) throwSystem("poll(fd exchange)", errno, __FILE__, __LINE__);
  }
}

size_t recvPlain(int sock, void* data, size_t len, const char* what) {
  ssize_t n = ::recv(sock, data, len, MSG_DONTWAIT);
  if (n < 0) KVCOMM_THROW(NetworkError, what, "recv failed: ", std::strerror(errno));
  if (n == 0) KVCOMM_THROW(NetworkError, what, "the peer closed the connection");
  return static_cast<size_t>(n);
}

namespace {

// One sendmsg of `payload` with `fds` attached (SCM_RIGHTS); returns sendmsg's result, errno as it left it.
ssize_t sendmsgWithFds(int sock, const void* payload, size_t len, const int* fds, size_t nfds, int flags) {
  iovec iov{const_cast<void*>(payload), len};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * nfds));
  if (nfds > 0) {
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
  }
  return sendmsg(sock, &msg, MSG_NOSIGNAL | flags);
}

}  // namespace

void sendWithFds(int sock, const void* payload, size_t len, const int* fds, size_t nfds) {
  ssize_t n = sendmsgWithFds(sock, payload, len, fds, nfds, 0);
  if (n != static_cast<ssize_t>(len))
    KVCOMM_THROW(NetworkError, "sendmsg(SCM_RIGHTS)", n < 0 ? std::strerror(errno) : "short send");
}

bool trySendWithFds(int sock, const void* payload, size_t len, const int* fds, size_t nfds) {
  ssize_t n = sendmsgWithFds(sock, payload, len, fds, nfds, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;  // nothing was sent: retry when writable
  if (n != static_cast<ssize_t>(len))
    KVCOMM_THROW(NetworkError, "sendmsg(SCM_RIGHTS)", n < 0 ? std::strerror(errno) : "short send");
  return true;
}

std::vector<Fd> recvWithFds(int sock, void* payload, size_t* len, size_t maxFds) {
  iovec iov{payload, *len};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * (maxFds ? maxFds : 1)));
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  if (n < 0) KVCOMM_THROW(NetworkError, "recvmsg(SCM_RIGHTS)", std::strerror(errno));
  if (n == 0) KVCOMM_THROW(NetworkError, "recvmsg(SCM_RIGHTS)", "the peer closed the connection");
  std::vector<Fd> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds.emplace_back(fd);  // owned from here: closed on any error below
    }
  }
  if (msg.msg_flags & MSG_CTRUNC)
    KVCOMM_THROW(NetworkError, "recvmsg(SCM_RIGHTS)", "descriptors were truncated (MSG_CTRUNC): expected at most ",
                 maxFds, ", the sender attached more (or RLIMIT_NOFILE is exhausted); ", fds.size(),
                 " received descriptors were closed");
  if (msg.msg_flags & MSG_TRUNC) KVCOMM_THROW(NetworkError, "recvmsg(SCM_RIGHTS)", "payload truncated");
  *len = static_cast<size_t>(n);
  return fds;
}

std::string decodeFdRequest(const void* bytes, size_t len, FdRequest* out) {
  if (len != sizeof(FdRequest)) return cat("malformed request (", len, " bytes, expected ", sizeof(FdRequest), ")");
  std::memcpy(out, bytes, sizeof(FdRequest));
  if (out->magic != kFdMagic) return "malformed request (bad magic)";
  if (out->version != kProtocolVersion) return cat("protocol version ", out->version, " != ", kProtocolVersion);
  return "";
}

FdReply decodeFdReply(const void* bytes, size_t len, const std::string& server) {
  FdReply r{};
  if (len != sizeof(FdReply))
    KVCOMM_THROW(NetworkError, "fetchFds", "malformed reply from fd server ", server, " (", len, " bytes)");
  std::memcpy(&r, bytes, sizeof(r));
  r.message[sizeof(r.message) - 1] = '\0';
  if (r.magic != kFdMagic) KVCOMM_THROW(NetworkError, "fetchFds", "malformed reply from fd server ", server);
  if (r.status != 0) KVCOMM_THROW(NetworkError, "fetchFds", "fd server ", server, " refused: ", r.message);
  if (r.count > kMaxExportPieces)
    KVCOMM_THROW(NetworkError, "fetchFds", "fd server ", server, " announced ", r.count, " pieces (at most ",
                 kMaxExportPieces, ")");
  return r;
}

Token TokenTable::offer(uint64_t bufferId, uint64_t generation, int requesterRank, int pid, uint32_t uid,
                        std::shared_ptr<const ExportSet> set) {
  Token t;
  randomBytes(t.data(), t.size());
  std::lock_guard<std::mutex> lock(mu_);
  entries_[t] = Entry{bufferId, generation, requesterRank, pid, uid, std::move(set)};
  return t;
}

void TokenTable::retire(uint64_t bufferId, uint64_t generation) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(entries_,
                [&](const auto& kv) { return kv.second.bufferId == bufferId && kv.second.generation == generation; });
}

size_t TokenTable::live() {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

std::shared_ptr<const ExportSet> TokenTable::take(const FdRequest& req, int pid, uint32_t uid, std::string* why) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(req.token);
  if (it == entries_.end()) {
    *why = "token refused: never issued, already used, or expired";
  } else if (it->second.bufferId != req.bufferId || it->second.generation != req.generation ||
             it->second.requesterRank != req.requesterRank) {
    *why = "token refused: issued for another buffer, generation or rank";
  } else if (it->second.pid != pid || it->second.uid != uid) {
    *why = cat("token refused: issued to pid ", it->second.pid, ", presented by pid ", pid);
  } else {
    auto set = it->second.set;
    entries_.erase(it);  // one use
    return set;
  }
  return nullptr;
}

FdServer& FdServer::instance() {
  static std::mutex mu;
  static FdServer* server = nullptr;  // leaked on purpose: its thread may outlive static destruction
  std::lock_guard<std::mutex> lock(mu);
  if (!server || server->pid_ != getpid()) server = new FdServer();  // a forked child has no server thread
  return *server;
}

FdServer::FdServer() : pid_(getpid()), refusals_("fd server") {
  uint8_t rnd[8];
  randomBytes(rnd, sizeof(rnd));
  char hex[17];
  for (int i = 0; i < 8; ++i) std::snprintf(hex + 2 * i, 3, "%02x", rnd[i]);
  name_ = cat("kvcomm-", pid_, "-", hex);
  listener_.reset(KVCOMM_CHECK_SYS(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0)));
  socklen_t len;
  sockaddr_un a = abstractAddress(name_, &len);
  KVCOMM_CHECK_SYS(bind(listener_.get(), reinterpret_cast<sockaddr*>(&a), len));
  KVCOMM_CHECK_SYS(listen(listener_.get(), 256));
  // Made here, not on the thread: every descriptor the server holds exists once instance() returns.
  acceptor_ = std::make_unique<Acceptor>(listener_.get(), &refusals_);
  thread_ = std::thread([this] { serve(); });
  thread_.detach();
}

Token FdServer::offer(uint64_t bufferId, uint64_t generation, int requesterRank, int pid, uint32_t uid,
                      std::shared_ptr<const ExportSet> set) {
  return tokens_.offer(bufferId, generation, requesterRank, pid, uid, std::move(set));
}
void FdServer::retire(uint64_t bufferId, uint64_t generation) {
  tokens_.retire(bufferId, generation);
}
size_t FdServer::liveTokens() {
  return tokens_.live();
}

void FdServer::serve() {
  Acceptor& acceptor = *acceptor_;
  PendingHandshakes pending(sizeof(FdRequest), true, &refusals_);
  const uint32_t myUid = getuid();
  while (true) {
    try {
      std::vector<pollfd> pfds{{acceptor.pollFd(), POLLIN, 0}};
      pending.pollFds(pfds);
      int wait = pfds[0].fd < 0 ? 100 : pending.msToNextDeadline();
      int rc = poll(pfds.data(), pfds.size(), wait < 0 ? -1 : wait + 1);
      if (rc < 0 && errno != EINTR) throwSystem("poll(fd server)", errno, __FILE__, __LINE__);
      for (auto& r : pending.progress(pfds.data() + 1, pfds.size() - 1)) answer(std::move(r.conn), r.hello);
      if (rc > 0 && pfds[0].revents)
        for (Fd c = acceptor.next(); c; c = acceptor.next()) {
          // Credentials come from the kernel at connect time: another user is refused before a byte is read.
          ucred cred{};
          socklen_t clen = sizeof(cred);
          if (getsockopt(c.get(), SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0 || cred.uid != myUid) {
            FdReply reply{};
            reply.magic = kFdMagic;
            reply.status = 1;
            std::snprintf(reply.message, sizeof(reply.message), "uid %u is not this process's uid", cred.uid);
            (void)::send(c.get(), &reply, sizeof(reply), MSG_NOSIGNAL | MSG_DONTWAIT);
            refusals_.refused(cat("uid ", cred.uid, " (pid ", cred.pid, ") is not this process's uid"));
            continue;
          }
          pending.add(std::move(c));
        }
    } catch (const std::exception& e) {
      KVCOMM_WARN("fd server ", name_, ": ", e.what());
    }
  }
}

void FdServer::answer(Fd conn, const std::vector<char>& request) {
  ucred cred{};
  socklen_t clen = sizeof(cred);
  KVCOMM_CHECK_SYS(getsockopt(conn.get(), SOL_SOCKET, SO_PEERCRED, &cred, &clen));
  FdRequest req{};
  std::string why = decodeFdRequest(request.data(), request.size(), &req);
  std::shared_ptr<const ExportSet> set;
  if (why.empty()) set = tokens_.take(req, cred.pid, cred.uid, &why);
  FdReply reply{};
  reply.magic = kFdMagic;
  // The requester holds a valid token from now on (or gets a short refusal): blocking sends, bounded at 1 s each.
  setNonBlocking(conn.get(), false);
  timeval tv{1, 0};
  setsockopt(conn.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (!set) {
    reply.status = 1;
    std::snprintf(reply.message, sizeof(reply.message), "%s", why.c_str());
    KVCOMM_DEBUG("fd server refused pid ", cred.pid, ": ", why);
    sendPlain(conn.get(), &reply, sizeof(reply), "fd server reply");
    return;
  }
  reply.count = static_cast<uint32_t>(set->fds.size());
  sendPlain(conn.get(), &reply, sizeof(reply), "fd server reply");
  if (reply.count == 0) return;  // closing the connection: the client reads end of stream
  sendPieces(conn.get(), set->metas, set->fds);
}

void sendPieces(int sock, const std::vector<PieceMeta>& metas, const std::vector<Fd>& fds) {
  sendPlain(sock, metas.data(), metas.size() * sizeof(PieceMeta), "piece table");
  for (size_t i = 0; i < fds.size(); i += kFdBatch) {
    size_t k = std::min(kFdBatch, fds.size() - i);
    std::vector<int> raw;
    for (size_t j = 0; j < k; ++j) raw.push_back(fds[i + j].get());
    uint32_t count = static_cast<uint32_t>(k);
    sendWithFds(sock, &count, sizeof(count), raw.data(), raw.size());
  }
}

ExportSet recvPieces(int sock, uint32_t count, Clock::time_point deadline, const std::function<void()>& stopIf,
                     const std::string& from) {
  ExportSet out;
  if (count == 0) return out;
  out.metas.resize(count);
  const size_t want = count * sizeof(PieceMeta);
  waitReadable(sock, deadline, stopIf, "piece table");
  if (recvPlain(sock, out.metas.data(), want, "piece table") != want)
    KVCOMM_THROW(NetworkError, "piece table", "short piece table from ", from);
  while (out.fds.size() < count) {
    uint32_t n = 0;
    size_t plen = sizeof(n);
    size_t expect = std::min<size_t>(kFdBatch, count - out.fds.size());
    waitReadable(sock, deadline, stopIf, "piece descriptors");
    auto fds = recvWithFds(sock, &n, &plen, expect);
    if (fds.size() != n || n != expect)
      KVCOMM_THROW(NetworkError, "piece descriptors", "expected ", expect, " descriptors in a batch from ", from,
                   ", received ", fds.size());
    for (auto& f : fds) out.fds.push_back(std::move(f));
  }
  return out;
}

ExportSet fetchFds(const std::string& serverName, const Token& token, uint64_t bufferId, uint64_t generation,
                   int requesterRank, int64_t timeoutMs, const std::function<void()>& stopIf) {
  auto deadline = deadlineIn(timeoutMs);
  Fd sock(KVCOMM_CHECK_SYS(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0)));
  socklen_t len;
  sockaddr_un a = abstractAddress(serverName, &len);
  if (connect(sock.get(), reinterpret_cast<sockaddr*>(&a), len) != 0)
    KVCOMM_THROW(NetworkError, cat("connect(fd server ", serverName, ")"), std::strerror(errno),
                 " (peer process gone, or in another network namespace?)");
  FdRequest req{kFdMagic, kProtocolVersion, token, bufferId, generation, requesterRank, 0};
  sendPlain(sock.get(), &req, sizeof(req), "fd request");
  char raw[sizeof(FdReply) + 1];
  waitReadable(sock.get(), deadline, stopIf, "fetchFds");
  FdReply reply = decodeFdReply(raw, recvPlain(sock.get(), raw, sizeof(raw), "fd reply"), serverName);
  if (reply.count == 0) return ExportSet{};
  ExportSet out = recvPieces(sock.get(), reply.count, deadline, stopIf, cat("fd server ", serverName));
  // End of stream means the server closed its end: no transient descriptor outlives the exchange on either side.
  char tail;
  waitReadable(sock.get(), deadline, stopIf, "fetchFds");
  ssize_t n2 = ::recv(sock.get(), &tail, 1, 0);
  if (n2 != 0) KVCOMM_THROW(NetworkError, "fetchFds", "fd server ", serverName, " sent more than it announced");
  return out;
}

}  // namespace kvcomm::detail
