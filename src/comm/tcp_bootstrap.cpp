// TcpBootstrap: phase 1, every rank dials the root named by the unique id and presents magic, version and nonce;
// phase 2, the root answers each with the table of mesh addresses; afterwards all traffic is point to point.
#include <arpa/inet.h>
#include <poll.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "comm/tcp_mesh.hpp"
#include "common/check.hpp"
#include "common/env.hpp"
#include "common/log.hpp"
#include "common/wait_reporter.hpp"
#include "kvcomm/bootstrap.hpp"

namespace kvcomm {

using detail::cat;
using detail::Clock;
using detail::Fd;
using detail::Hello;
using detail::HelloKind;
using detail::HelloReply;
using detail::SockAddr;

Bootstrap::~Bootstrap() = default;

void Bootstrap::barrier() {
  std::vector<char> bytes(static_cast<size_t>(size()));
  allgather(bytes.data(), 1);
}

namespace {

struct IdWire {
  uint32_t magic;
  uint32_t version;
  std::array<uint8_t, 16> nonce;
  uint16_t family;
  uint16_t port;
  uint8_t addr[16];
};
static_assert(sizeof(IdWire) <= sizeof(UniqueId::bytes));

IdWire decode(const UniqueId& id) {
  IdWire w;
  std::memcpy(&w, id.bytes.data(), sizeof(w));
  KVCOMM_CHECK_ARG(w.magic == detail::kWireMagic && (w.family == AF_INET || w.family == AF_INET6), "TcpBootstrap",
                   "the unique id is not a kvcomm id (bad magic or address family)");
  return w;
}

SockAddr addressOf(const IdWire& w) {
  SockAddr a;
  if (w.family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&a.storage);
    in->sin_family = AF_INET;
    std::memcpy(&in->sin_addr, w.addr, 4);
    a.len = sizeof(sockaddr_in);
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
    in6->sin6_family = AF_INET6;
    std::memcpy(&in6->sin6_addr, w.addr, 16);
    a.len = sizeof(sockaddr_in6);
  }
  a.setPort(w.port);
  return a;
}

// Listeners opened by createUniqueId in this process, adopted by the rank-0 TcpBootstrap of the same id.
std::mutex registryMu;
std::map<std::array<uint8_t, 16>, Fd>& registry() {
  static std::map<std::array<uint8_t, 16>, Fd> r;
  return r;
}

SockAddr anyAddress(int family) {
  return SockAddr::parse(family == AF_INET6 ? "[::]:0" : "0.0.0.0:0");
}

}  // namespace

std::string UniqueId::toString() const {
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (uint8_t b : bytes) {
    s.push_back(hex[b >> 4]);
    s.push_back(hex[b & 15]);
  }
  return s;
}

UniqueId UniqueId::fromString(const std::string& text) {
  UniqueId id;
  KVCOMM_CHECK_ARG(text.size() == 2 * id.bytes.size(), "UniqueId::fromString", "expected ", 2 * id.bytes.size(),
                   " hex characters, got ", text.size());
  auto nib = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    KVCOMM_THROW(InvalidArgument, "UniqueId::fromString", "'", c, "' is not a hex digit");
  };
  for (size_t i = 0; i < id.bytes.size(); ++i)
    id.bytes[i] = static_cast<uint8_t>(nib(text[2 * i]) << 4 | nib(text[2 * i + 1]));
  return id;
}

struct TcpBootstrap::Impl {
  int rank = 0;
  int size = 0;
  uint32_t seq = 0;
  std::vector<int> members;
  std::shared_ptr<detail::TcpMesh> mesh;
};

UniqueId TcpBootstrap::createUniqueId(const std::string& ifname) {
  SockAddr bound;
  Fd listener = detail::listenTcp(detail::pickLocalAddress(ifname), &bound);
  IdWire w{};
  w.magic = detail::kWireMagic;
  w.version = kProtocolVersion;
  detail::randomBytes(w.nonce.data(), w.nonce.size());
  w.family = bound.storage.ss_family;
  w.port = bound.port();
  if (w.family == AF_INET)
    std::memcpy(w.addr, &reinterpret_cast<sockaddr_in*>(&bound.storage)->sin_addr, 4);
  else
    std::memcpy(w.addr, &reinterpret_cast<sockaddr_in6*>(&bound.storage)->sin6_addr, 16);
  {
    std::lock_guard<std::mutex> lock(registryMu);
    registry()[w.nonce] = std::move(listener);
  }
  UniqueId id;
  std::memcpy(id.bytes.data(), &w, sizeof(w));
  return id;
}

namespace {

// Phase 1 and 2 on the root: accept size-1 valid hellos, refuse strays with a reason, answer with the table.
std::vector<SockAddr> rootRendezvous(int listener, const IdWire& w, int size, Clock::time_point deadline,
                                     int64_t timeoutMs) {
  std::vector<SockAddr> table(static_cast<size_t>(size));
  table[0] = addressOf(w);
  std::vector<Fd> conns(static_cast<size_t>(size));
  int joined = 1;
  auto refuse = [](Fd& c, const std::string& why) {
    HelloReply r{};
    r.status = 1;
    std::snprintf(r.message, sizeof(r.message), "%s", why.c_str());
    (void)::send(c.get(), &r, sizeof(r), MSG_NOSIGNAL | MSG_DONTWAIT);
    KVCOMM_WARN("TcpBootstrap root refused a rank: ", why);
  };
  detail::WaitReporter progress(timeoutMs);
  auto missing = [&] {
    std::string m;
    int listed = 0;
    for (int r = 1; r < size && listed < 16; ++r)
      if (!conns[static_cast<size_t>(r)]) m += (listed++ ? "," : "") + std::to_string(r);
    return m + (size - joined > listed ? ",..." : "");
  };
  while (joined < size) {
    if (progress.due())
      progress.report(cat("bootstrap root (rank 0) at ", addressOf(w).toString(), ": ", joined, " of ", size,
                          " ranks joined; waiting for rank(s) ", missing(),
                          " (are they started, with this unique id and size ", size, "?)"));
    pollfd p{listener, POLLIN, 0};
    int waitMs = detail::msLeft(deadline);
    if (waitMs < 0 || waitMs > progress.msUntilNext()) waitMs = std::max(1, progress.msUntilNext());
    int rc = poll(&p, 1, waitMs);
    if (rc == 0 && detail::msLeft(deadline) != 0) continue;  // a report is due, not the deadline
    if (rc == 0)
      KVCOMM_THROW(Timeout, "TcpBootstrap(root)", "only ", joined, " of ", size, " ranks joined (missing: ", missing(),
                   ") before the timeout (KVCOMM_BOOTSTRAP_TIMEOUT_MS)");
    if (rc < 0) {
      if (errno == EINTR) continue;
      detail::throwSystem("poll(root listener)", errno, __FILE__, __LINE__);
    }
    int cfd = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (cfd < 0) continue;
    Fd c(cfd);
    Hello h{};
    try {
      auto helloDeadline = std::min(deadline, detail::deadlineIn(5000));
      detail::recvAll(c.get(), &h, sizeof(h), helloDeadline, "hello");
    } catch (const Error& e) {
      KVCOMM_WARN("TcpBootstrap root: dropped a connection without a hello: ", e.what());
      continue;
    }
    if (h.magic != detail::kWireMagic) {
      refuse(c, "bad magic (not a kvcomm bootstrap)");
    } else if (h.version != kProtocolVersion) {
      refuse(c, cat("protocol version mismatch: this rank speaks ", h.version, ", the root speaks ", kProtocolVersion));
    } else if (h.nonce != w.nonce) {
      refuse(c, "nonce mismatch: the unique id belongs to another group (stale or forged id)");
    } else if (h.kind != static_cast<uint32_t>(HelloKind::Root)) {
      refuse(c, "mesh connection before the group formed");
    } else if (h.size != size) {
      refuse(c, cat("size mismatch: rank ", h.rank, " says size ", h.size, ", the root says ", size));
    } else if (h.rank <= 0 || h.rank >= size) {
      refuse(c, cat("rank ", h.rank, " out of range [1, ", size, ")"));
    } else if (conns[static_cast<size_t>(h.rank)]) {
      refuse(c, cat("rank ", h.rank, " already joined"));
    } else {
      table[static_cast<size_t>(h.rank)] = h.listenAddr;
      conns[static_cast<size_t>(h.rank)] = std::move(c);
      ++joined;
    }
  }
  HelloReply ok{};
  for (int r = 1; r < size; ++r) {
    int fd = conns[static_cast<size_t>(r)].get();
    detail::sendAll(fd, &ok, sizeof(ok), deadline, cat("reply to rank ", r));
    detail::sendAll(fd, table.data(), table.size() * sizeof(SockAddr), deadline, cat("table to rank ", r));
  }
  return table;
}

}  // namespace

TcpBootstrap::TcpBootstrap(const UniqueId& id, int rank, int size, int64_t timeoutMs) : impl_(new Impl) {
  detail::RankScope scope(rank);
  KVCOMM_CHECK_ARG(size > 0 && rank >= 0 && rank < size, "TcpBootstrap", "rank ", rank, " / size ", size,
                   " is not a valid pair");
  env::validate();
  IdWire w = decode(id);
  KVCOMM_CHECK_ARG(w.version == kProtocolVersion, "TcpBootstrap", "the unique id was made by protocol version ",
                   w.version, ", this library speaks ", kProtocolVersion);
  if (timeoutMs < 0) timeoutMs = env::bootstrapTimeoutMs();
  auto deadline = detail::deadlineIn(timeoutMs);
  impl_->rank = rank;
  impl_->size = size;
  for (int r = 0; r < size; ++r) impl_->members.push_back(r);
  SockAddr rootAddr = addressOf(w);
  Fd listener;
  std::vector<SockAddr> table;
  if (rank == 0) {
    {
      std::lock_guard<std::mutex> lock(registryMu);
      auto it = registry().find(w.nonce);
      if (it != registry().end()) {
        listener = std::move(it->second);
        registry().erase(it);
      }
    }
    if (!listener) listener = detail::listenTcp(rootAddr, nullptr);
    table = rootRendezvous(listener.get(), w, size, deadline, timeoutMs);
  } else {
    SockAddr bound;
    listener = detail::listenTcp(anyAddress(rootAddr.storage.ss_family), &bound);
    std::string giveUp = timeoutMs < 0 ? std::string("waits without a timeout (a negative bootstrap timeout)")
                                       : cat("gives up after the bootstrap timeout, ", timeoutMs, " ms");
    Fd root = detail::connectTcp(rootAddr, deadline, "bootstrap root",
                                 cat("is rank 0 running, with this unique id? An id left from an earlier run names a "
                                     "root that is gone; ",
                                     giveUp));
    Hello h{};
    h.magic = detail::kWireMagic;
    h.version = kProtocolVersion;
    h.kind = static_cast<uint32_t>(HelloKind::Root);
    h.rank = rank;
    h.size = size;
    h.nonce = w.nonce;
    h.listenAddr = detail::localAddress(root.get());  // the address the root saw us on is reachable from it
    h.listenAddr.setPort(bound.port());
    detail::sendAll(root.get(), &h, sizeof(h), deadline, "hello to root");
    // The root answers once every rank has joined: report while waiting, so a missing rank is not a silent hang.
    HelloReply reply{};
    detail::WaitReporter progress(timeoutMs);
    pollfd answer{root.get(), POLLIN, 0};
    while (detail::msLeft(deadline) != 0) {
      int waitMs = detail::msLeft(deadline);
      if (waitMs < 0 || waitMs > progress.msUntilNext()) waitMs = std::max(1, progress.msUntilNext());
      int rc = poll(&answer, 1, waitMs);
      if (rc > 0 || (rc < 0 && errno != EINTR)) break;  // data, end of stream or an error: recvAll reports it
      if (progress.due())
        progress.report(cat("rank ", rank, " joined the bootstrap root at ", rootAddr.toString(),
                            "; the root answers when all ", size, " ranks have joined (are they all started?)"));
    }
    detail::recvAll(root.get(), &reply, sizeof(reply), deadline, cat("bootstrap root at ", rootAddr.toString()));
    if (reply.status != 0) {
      reply.message[sizeof(reply.message) - 1] = '\0';
      KVCOMM_THROW(NetworkError, "TcpBootstrap", "the root at ", rootAddr.toString(), " refused rank ", rank, ": ",
                   reply.message);
    }
    table.resize(static_cast<size_t>(size));
    detail::recvAll(root.get(), table.data(), table.size() * sizeof(SockAddr), deadline, "address table");
  }
  impl_->mesh = std::make_shared<detail::TcpMesh>(rank, size, w.nonce, std::move(listener), timeoutMs);
  impl_->mesh->setAddresses(std::move(table));
}

TcpBootstrap::~TcpBootstrap() = default;
int TcpBootstrap::rank() const {
  return impl_->rank;
}
int TcpBootstrap::size() const {
  return impl_->size;
}
std::shared_ptr<detail::TcpMesh> TcpBootstrap::mesh() const {
  return impl_->mesh;
}

void TcpBootstrap::allgather(void* data, size_t bytesPerRank) {
  detail::RankScope scope(impl_->rank);
  impl_->mesh->allgather(impl_->members, impl_->rank, data, bytesPerRank, detail::makeTag(0, impl_->seq++));
}

CallbackBootstrap::CallbackBootstrap(int rank, int size, AllgatherFn allgather)
    : rank_(rank), size_(size), allgather_(std::move(allgather)) {
  KVCOMM_CHECK_ARG(size > 0 && rank >= 0 && rank < size, "CallbackBootstrap", "rank ", rank, " / size ", size,
                   " is not a valid pair");
  KVCOMM_CHECK_ARG(static_cast<bool>(allgather_), "CallbackBootstrap", "the allgather callback is empty");
}

void CallbackBootstrap::allgather(void* data, size_t bytesPerRank) {
  std::vector<char> mine(static_cast<char*>(data) + static_cast<size_t>(rank_) * bytesPerRank,
                         static_cast<char*>(data) + static_cast<size_t>(rank_ + 1) * bytesPerRank);
  allgather_(mine.data(), data, bytesPerRank);
}

}  // namespace kvcomm
