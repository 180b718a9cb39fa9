// The public ArenaServer and ArenaSession: where processes meet (a Unix socket address), the client's side of the
// handshake, and the session calls over arena/session.hpp.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <thread>

#include "arena/imported_arena.hpp"
#include "arena/reactor.hpp"
#include "arena/session.hpp"
#include "common/check.hpp"
#include "common/log.hpp"
#include "common/socket.hpp"
#include "kvcomm/arena.hpp"
#include "symm/fd_exchange.hpp"

namespace kvcomm {

using detail::Fd;
using detail::arena::Clock;
using detail::arena::Reactor;
using detail::arena::ReactorThread;
using detail::arena::Session;

namespace {

constexpr int64_t kDefaultTimeoutMs = 10000;

struct Address {
  sockaddr_un addr{};
  socklen_t len = 0;
  bool abstract = false;
  std::string path;  // filesystem path, or the abstract name
};

Address parseAddress(const std::string& text, const char* call) {
  Address a;
  a.addr.sun_family = AF_UNIX;
  KVCOMM_CHECK_ARG(!text.empty(), call, "an empty address (\"@name\" for an abstract socket, or a filesystem path)");
  a.abstract = text[0] == '@';
  a.path = a.abstract ? text.substr(1) : text;
  KVCOMM_CHECK_ARG(!a.path.empty() && a.path.size() + 1 < sizeof(a.addr.sun_path), call, "address \"", text,
                   "\": a name of 1 to ", sizeof(a.addr.sun_path) - 2, " characters");
  KVCOMM_CHECK_ARG(a.path.find('\0') == std::string::npos, call, "address \"", text, "\" contains a NUL byte");
  if (a.abstract) {
    a.addr.sun_path[0] = '\0';
    std::memcpy(a.addr.sun_path + 1, a.path.data(), a.path.size());
    a.len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + a.path.size());
  } else {
    std::memcpy(a.addr.sun_path, a.path.data(), a.path.size());
    a.len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + a.path.size() + 1);
  }
  return a;
}

// A filesystem socket lives in a directory only its owner may enter: the directory's mode is the access control.
void checkDirectory(const std::string& path, const char* call) {
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0) detail::throwSystem(detail::cat("stat(", dir, ")"), errno, __FILE__, __LINE__);
  KVCOMM_CHECK_ARG(S_ISDIR(st.st_mode), call, dir, " is not a directory");
  KVCOMM_CHECK_ARG(st.st_uid == geteuid() && (st.st_mode & 077) == 0, call, "directory ", dir, " has mode ", std::oct,
                   (st.st_mode & 0777), std::dec, " and owner uid ", st.st_uid,
                   ": an arena socket needs a directory of mode 0700 owned by this user (uid ", geteuid(),
                   "), so that no other user can connect");
}

Fd seqpacketSocket(bool nonBlocking) {
  return Fd(KVCOMM_CHECK_SYS(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | (nonBlocking ? SOCK_NONBLOCK : 0), 0)));
}

std::shared_ptr<ArenaSession::Impl> makeLink(std::shared_ptr<ReactorThread> thread, std::shared_ptr<Session> s) {
  auto impl = std::make_shared<ArenaSession::Impl>();
  impl->thread = std::move(thread);
  impl->session = std::move(s);
  return impl;
}

Session& sessionOf(const std::shared_ptr<ArenaSession::Impl>& impl, const char* call) {
  KVCOMM_CHECK_ARG(impl != nullptr && impl->session, call, "the session is empty (moved from, or default-constructed)");
  return *impl->session;
}

}  // namespace

// ---- ArenaSession ----

ArenaSession::ArenaSession() = default;
ArenaSession::ArenaSession(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
ArenaSession::~ArenaSession() = default;
ArenaSession::ArenaSession(ArenaSession&&) noexcept = default;
ArenaSession& ArenaSession::operator=(ArenaSession&&) noexcept = default;

ArenaSession ArenaSession::connect(const std::string& address, const ArenaSessionOptions& options) {
  const char* call = "ArenaSession::connect";
  Address a = parseAddress(address, call);
  int64_t timeoutMs = options.timeoutMs >= 0 ? options.timeoutMs : kDefaultTimeoutMs;
  Clock::time_point deadline = detail::deadlineIn(timeoutMs);  // above 10^12 ms: no bound (never a wrapped one)
  Fd sock;
  // The server may not be up yet: retry what means "not there (yet)" until the deadline.
  while (true) {
    sock = seqpacketSocket(false);
    if (::connect(sock.get(), reinterpret_cast<const sockaddr*>(&a.addr), a.len) == 0) break;
    int err = errno;
    bool notYet = err == ENOENT || err == ECONNREFUSED || err == EAGAIN;
    if (!notYet || Clock::now() >= deadline)
      KVCOMM_THROW(NetworkError, call, "connecting to the arena server at ", address, " failed: ", std::strerror(err),
                   notYet ? detail::cat(" (for ", timeoutMs, " ms)") : std::string());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ucred cred{};
  socklen_t clen = sizeof(cred);
  KVCOMM_CHECK_SYS(getsockopt(sock.get(), SOL_SOCKET, SO_PEERCRED, &cred, &clen));
  if (cred.uid != geteuid())
    KVCOMM_THROW(NetworkError, call, "the arena server at ", address, " (pid ", cred.pid, ") runs as uid ", cred.uid,
                 ", not this process's uid ", geteuid(), "; refusing to talk to it");
  detail::arena::Message hello;
  hello.type = detail::arena::MsgType::Hello;
  hello.hello = detail::arena::HelloBody{static_cast<int32_t>(getpid()), static_cast<uint32_t>(geteuid()), 0};
  std::vector<uint8_t> bytes = detail::arena::encode(hello);
  detail::sendWithFds(sock.get(), bytes.data(), bytes.size(), nullptr, 0);
  // The answer: Welcome, or Refused with the server's reason.
  pollfd p{sock.get(), POLLIN, 0};
  int rc = poll(&p, 1, detail::msLeft(deadline));  // -1 (no deadline): wait for the answer
  if (rc == 0)
    KVCOMM_THROW(Timeout, call, "the arena server at ", address, " (pid ", cred.pid, ") did not answer within ",
                 timeoutMs, " ms");
  if (rc < 0) detail::throwSystem("poll(arena handshake)", errno, __FILE__, __LINE__);
  std::vector<uint8_t> buf(detail::arena::kMaxMessage);
  size_t len = buf.size();
  std::vector<Fd> fds;
  try {
    fds = detail::recvWithFds(sock.get(), buf.data(), &len, 0);
  } catch (const Error& e) {
    KVCOMM_THROW(NetworkError, call, "the arena server at ", address, " closed the connection during the handshake (",
                 e.what(), ")");
  }
  detail::arena::Message reply;
  std::string why = detail::arena::decode(buf.data(), len, fds.size(), &reply);
  if (!why.empty())
    KVCOMM_THROW(NetworkError, call, "malformed handshake answer from ", address, ": ", detail::arena::printable(why));
  if (reply.type == detail::arena::MsgType::Refused)
    KVCOMM_THROW(NetworkError, call, "the arena server at ", address, " (pid ", cred.pid,
                 ") refused this process: ", detail::arena::printable(reply.reason));
  if (reply.type != detail::arena::MsgType::Welcome || reply.hello.pid != cred.pid)
    KVCOMM_THROW(NetworkError, call, "unexpected handshake answer from ", address, ": ",
                 detail::arena::msgTypeName(reply.type));
  KVCOMM_CHECK_SYS(fcntl(sock.get(), F_SETFL, fcntl(sock.get(), F_GETFL) | O_NONBLOCK));
  auto reactor = std::make_shared<Reactor>();
  auto session = std::make_shared<Session>(std::move(sock), cred.pid, cred.uid, Session::Role::Client, reactor, true,
                                           Clock::now(), timeoutMs);
  reactor->add(session);
  auto thread = std::make_shared<ReactorThread>(reactor);
  return ArenaSession(makeLink(std::move(thread), std::move(session)));
}

int ArenaSession::peerPid() const {
  return sessionOf(impl_, "ArenaSession::peerPid").peerPid();
}
uint32_t ArenaSession::peerUid() const {
  return sessionOf(impl_, "ArenaSession::peerUid").peerUid();
}
bool ArenaSession::alive() const {
  return sessionOf(impl_, "ArenaSession::alive").alive();
}
std::string ArenaSession::lostReason() const {
  return sessionOf(impl_, "ArenaSession::lostReason").lostReason();
}

ArenaCapability ArenaSession::offer(Arena& arena, int64_t ttlMs) {
  Session& s = sessionOf(impl_, "ArenaSession::offer");
  return arena.offer(s.peerPid(), s.peerUid(), ttlMs);
}

ArenaImport ArenaSession::import(const ArenaCapability& capability, const ImportOptions& options) {
  Session& s = sessionOf(impl_, "ArenaSession::import");
  KVCOMM_CHECK_ENUM(options.onOwnerLoss, OwnerLoss::Release, "ArenaSession::import", "options.onOwnerLoss");
  std::shared_ptr<detail::arena::SessionLink> link = impl_;
  auto impl = std::make_shared<ArenaImport::Impl>();
  impl->core = s.import(capability, options, link);
  return ArenaImport(std::move(impl));
}

void ArenaSession::send(const void* data, size_t bytes) {
  sessionOf(impl_, "ArenaSession::send").sendUser(data, bytes);
}

std::vector<uint8_t> ArenaSession::receive(int64_t timeoutMs) {
  return sessionOf(impl_, "ArenaSession::receive").receiveUser(timeoutMs);
}

void ArenaSession::close() {
  sessionOf(impl_, "ArenaSession::close").requestClose("closed by this process (ArenaSession::close)");
}

// ---- ArenaServer ----

struct ArenaServer::Impl {
  std::shared_ptr<ReactorThread> thread;
  std::string address;
  std::string unlinkPath;  // filesystem socket this server created
  bool closed = false;
  ~Impl() { close(); }
  void close() {
    if (closed || !thread) return;
    closed = true;
    thread->reactor()->shutdown("the arena server closed");
    if (!unlinkPath.empty() && ::unlink(unlinkPath.c_str()) != 0 && errno != ENOENT)
      KVCOMM_WARN("ArenaServer::close: unlink(", unlinkPath, "): ", std::strerror(errno));
  }
};

ArenaServer::ArenaServer() = default;
ArenaServer::ArenaServer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
ArenaServer::~ArenaServer() = default;
ArenaServer::ArenaServer(ArenaServer&&) noexcept = default;
ArenaServer& ArenaServer::operator=(ArenaServer&&) noexcept = default;

ArenaServer ArenaServer::listen(const std::string& address, const ArenaServerOptions& options) {
  const char* call = "ArenaServer::listen";
  KVCOMM_CHECK_ARG(options.maxSessions > 0 && options.maxPendingHandshakes > 0, call,
                   "maxSessions and maxPendingHandshakes must be positive");
  std::string text = address;
  if (text.empty()) {
    uint8_t rnd[8];
    detail::randomBytes(rnd, sizeof(rnd));
    char hex[17];
    for (int i = 0; i < 8; ++i) std::snprintf(hex + 2 * i, 3, "%02x", rnd[i]);
    text = detail::cat("@kvcomm-arena-", getpid(), "-", hex);
  }
  Address a = parseAddress(text, call);
  auto impl = std::make_shared<Impl>();
  impl->address = text;
  Fd listener = seqpacketSocket(true);
  if (!a.abstract) {
    checkDirectory(a.path, call);
    struct stat st {};
    if (lstat(a.path.c_str(), &st) == 0) {
      KVCOMM_CHECK_ARG(S_ISSOCK(st.st_mode), call, a.path, " exists and is not a socket");
      Fd probe = seqpacketSocket(false);
      KVCOMM_CHECK_ARG(::connect(probe.get(), reinterpret_cast<const sockaddr*>(&a.addr), a.len) != 0, call,
                       "another arena server is listening at ", a.path);
      KVCOMM_CHECK_SYS(::unlink(a.path.c_str()));  // a stale socket of a server that is gone
    }
  }
  if (bind(listener.get(), reinterpret_cast<const sockaddr*>(&a.addr), a.len) != 0)
    detail::throwSystem(detail::cat("bind(arena server at ", text, ")"), errno, __FILE__, __LINE__);
  if (!a.abstract) impl->unlinkPath = a.path;
  KVCOMM_CHECK_SYS(::listen(listener.get(), 256));
  auto reactor = std::make_shared<Reactor>();
  reactor->setListener(std::move(listener), options);
  impl->thread = std::make_shared<ReactorThread>(reactor);
  return ArenaServer(std::move(impl));
}

std::string ArenaServer::address() const {
  KVCOMM_CHECK_ARG(impl_ != nullptr, "ArenaServer::address", "the server is empty");
  return impl_->address;
}

ArenaSession ArenaServer::accept(int64_t timeoutMs) {
  const char* call = "ArenaServer::accept";
  KVCOMM_CHECK_ARG(impl_ != nullptr, call, "the server is empty");
  if (impl_->closed) KVCOMM_THROW(Aborted, call, "the server is closed");
  const Clock::time_point deadline = detail::deadlineIn(timeoutMs);  // negative or above 10^12 ms: no bound
  std::shared_ptr<Session> s = impl_->thread->reactor()->nextAccepted(deadline, deadline != Clock::time_point::max());
  if (!s) KVCOMM_THROW(Timeout, call, "no client completed a handshake within ", timeoutMs, " ms");
  return ArenaSession(makeLink(impl_->thread, std::move(s)));
}

size_t ArenaServer::sessions() const {
  KVCOMM_CHECK_ARG(impl_ != nullptr, "ArenaServer::sessions", "the server is empty");
  return impl_->thread->reactor()->sessions();
}

uint64_t ArenaServer::refusedConnections() const {
  KVCOMM_CHECK_ARG(impl_ != nullptr, "ArenaServer::refusedConnections", "the server is empty");
  return impl_->thread->reactor()->refused();
}

void ArenaServer::close() {
  if (impl_) impl_->close();
}

}  // namespace kvcomm
