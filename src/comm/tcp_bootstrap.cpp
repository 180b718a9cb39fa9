// TcpBootstrap: phase 1, every rank dials the root named by the unique id and presents magic, version and nonce;
// phase 2, the root answers each with the table of mesh addresses; afterwards all traffic is point to point.
#include <arpa/inet.h>
#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>

#include "comm/tcp_mesh.hpp"
#include "common/check.hpp"
#include "common/env.hpp"
#include "common/log.hpp"
#include "common/wait_reporter.hpp"
#include "kvcomm/bootstrap.hpp"
#include "kvcomm/limits.hpp"

namespace kvcomm {

using detail::cat;
using detail::Clock;
using detail::Fd;
using detail::Hello;
using detail::HelloKind;
using detail::HelloReply;
using detail::IdWire;
using detail::SockAddr;

Bootstrap::~Bootstrap() = default;

void Bootstrap::barrier() {
  std::vector<char> bytes(static_cast<size_t>(size()));
  allgather(bytes.data(), 1);
}

namespace {

// Listeners opened by createUniqueId in this process, adopted by the rank-0 TcpBootstrap of the same id.
std::mutex registryMu;
std::map<std::array<uint8_t, 16>, Fd>& registry() {
  static std::map<std::array<uint8_t, 16>, Fd> r;
  return r;
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
    KVCOMM_THROW(InvalidArgument, "UniqueId::fromString", "character ", static_cast<int>(static_cast<uint8_t>(c)),
                 " is not a hex digit");
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
  std::shared_ptr<detail::GroupHealth> health;
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

// How much longer than its timeout a joined rank waits for the root's table or verdict.
constexpr int kRootVerdictGraceMs = 1000;

// Phase 1 and 2 on the root: hellos are read concurrently (each connection gets at most kHandshakeDeadlineMs to
// present its hello, at most kMaxPendingHandshakes wait at once), so idle or hostile connections never delay a
// rank; strays are refused with a reason; once size-1 ranks joined, each gets the table.
std::vector<SockAddr> rootRendezvous(int listener, const IdWire& w, int size, Clock::time_point deadline,
                                     int64_t timeoutMs) {
  detail::setNonBlocking(listener, true);
  detail::RefusalLog log("TcpBootstrap root");
  detail::Acceptor acceptor(listener, &log);
  detail::PendingHandshakes pending(sizeof(Hello), false, &log);
  std::vector<SockAddr> table(static_cast<size_t>(size));
  table[0] = detail::idAddress(w);
  std::vector<Fd> conns(static_cast<size_t>(size));
  std::vector<bool> joined(static_cast<size_t>(size), false);
  joined[0] = true;
  int count = 1;
  detail::WaitReporter progress(timeoutMs);
  auto missing = [&] {
    std::string m;
    int listed = 0;
    for (int r = 1; r < size && listed < 16; ++r)
      if (!joined[static_cast<size_t>(r)]) m += (listed++ ? "," : "") + std::to_string(r);
    return m + (size - count > listed ? ",..." : "");
  };
  // Every rank that joined hears why the root gives up (instead of its own timeout with bytes missing).
  auto giveUp = [&](const std::string& why) {
    HelloReply reply = detail::refusalReply(cat("the bootstrap root gave up: ", why));
    for (int r = 1; r < size; ++r)
      if (conns[static_cast<size_t>(r)])
        (void)::send(conns[static_cast<size_t>(r)].get(), &reply, sizeof(reply), MSG_NOSIGNAL | MSG_DONTWAIT);
  };
  while (count < size) {
    if (progress.due())
      progress.report(cat("bootstrap root (rank 0) at ", table[0].toString(), ": ", count, " of ", size,
                          " ranks joined; waiting for rank(s) ", missing(),
                          " (are they started, with this unique id and size ", size, "?)"));
    std::vector<pollfd> pfds{{acceptor.pollFd(), POLLIN, 0}};
    pending.pollFds(pfds);
    // A joined rank never sends before the table: a readable connection is one that closed (the process was
    // interrupted). It is no longer counted, so a restarted rank can take its place and the table never goes to it.
    const size_t firstJoined = pfds.size();
    std::vector<int> joinedRanks;
    for (int r = 1; r < size; ++r)
      if (conns[static_cast<size_t>(r)]) {
        pfds.push_back({conns[static_cast<size_t>(r)].get(), POLLIN, 0});
        joinedRanks.push_back(r);
      }
    int wait = pfds[0].fd < 0 ? 100 : detail::msLeft(deadline);
    if (wait < 0 || wait > progress.msUntilNext()) wait = std::max(1, progress.msUntilNext());
    int next = pending.msToNextDeadline();
    if (next >= 0) wait = std::min(wait, next + 1);
    int rc = poll(pfds.data(), pfds.size(), wait);
    if (rc < 0 && errno != EINTR) detail::throwSystem("poll(root listener)", errno, __FILE__, __LINE__);
    if (rc > 0)
      for (size_t i = 0; i < joinedRanks.size(); ++i) {
        if (pfds[firstJoined + i].revents == 0) continue;
        int r = joinedRanks[i];
        char byte;
        bool spoke = ::recv(conns[static_cast<size_t>(r)].get(), &byte, 1, MSG_DONTWAIT | MSG_PEEK) > 0;
        KVCOMM_WARN("bootstrap root: rank ", r, " joined and then ",
                    spoke ? "sent bytes outside the protocol" : "left (its connection closed)", " before all ", size,
                    " ranks joined; dropped, waiting for rank ", r, " again");
        conns[static_cast<size_t>(r)].reset();
        joined[static_cast<size_t>(r)] = false;
        --count;
      }
    if (rc > 0 || pending.size() > 0) {
      for (auto& r : pending.progress(pfds.data() + 1, firstJoined - 1)) {
        Hello h;
        std::memcpy(&h, r.hello.data(), sizeof(h));
        std::string why = detail::rootHelloRefusal(h, w.nonce, size, joined);
        if (!why.empty()) {
          HelloReply reply = detail::refusalReply(why);
          (void)::send(r.conn.get(), &reply, sizeof(reply), MSG_NOSIGNAL | MSG_DONTWAIT);
          log.refused(why);
          continue;
        }
        table[static_cast<size_t>(h.rank)] = h.listenAddr;
        conns[static_cast<size_t>(h.rank)] = std::move(r.conn);
        joined[static_cast<size_t>(h.rank)] = true;
        ++count;
      }
    }
    if (rc > 0 && pfds[0].revents)
      for (Fd c = acceptor.next(); c; c = acceptor.next()) pending.add(std::move(c));
    if (count < size && detail::msLeft(deadline) == 0) {
      std::string why = cat("only ", count, " of ", size, " ranks joined (missing: ", missing(),
                            ") before the timeout (KVCOMM_BOOTSTRAP_TIMEOUT_MS)");
      giveUp(why);
      KVCOMM_THROW(Timeout, "TcpBootstrap(root)", why);
    }
  }
  HelloReply ok{};
  for (int r = 1; r < size; ++r) {
    int fd = conns[static_cast<size_t>(r)].get();
    try {
      detail::sendAll(fd, &ok, sizeof(ok), deadline, cat("reply to rank ", r));
      detail::sendAll(fd, table.data(), table.size() * sizeof(SockAddr), deadline, cat("table to rank ", r));
    } catch (const Error& e) {
      std::string why =
          cat("rank ", r, " left after all ", size, " ranks had joined, before it got the table (", e.what(), ")");
      giveUp(why);
      KVCOMM_THROW(NetworkError, "TcpBootstrap(root)", why);
    }
  }
  return table;
}

}  // namespace

TcpBootstrap::TcpBootstrap(const UniqueId& id, int rank, int size, int64_t timeoutMs) : impl_(new Impl) {
  detail::RankScope scope(rank);
  KVCOMM_CHECK_ARG(size <= limits::kMaxRanks, "TcpBootstrap", "size ", size, " exceeds kvcomm::limits::kMaxRanks (",
                   limits::kMaxRanks, ")");
  KVCOMM_CHECK_ARG(size > 0 && rank >= 0 && rank < size, "TcpBootstrap", "rank ", rank, " / size ", size,
                   " is not a valid pair");
  env::validate();
  IdWire w = detail::decodeUniqueId(id);
  if (timeoutMs < 0) timeoutMs = env::bootstrapTimeoutMs();
  auto deadline = detail::deadlineIn(timeoutMs);
  impl_->rank = rank;
  impl_->size = size;
  for (int r = 0; r < size; ++r) impl_->members.push_back(r);
  SockAddr rootAddr = detail::idAddress(w);
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
    std::string giveUp = timeoutMs < 0 ? std::string("waits without a timeout (a negative bootstrap timeout)")
                                       : cat("gives up after the bootstrap timeout, ", timeoutMs, " ms");
    Fd root = detail::connectTcp(rootAddr, deadline, "bootstrap root",
                                 cat("is rank 0 running, with this unique id? An id left from an earlier run names a "
                                     "root that is gone; ",
                                     giveUp));
    // The mesh listens only on the interface that reaches the root (never the wildcard address).
    SockAddr bound, local = detail::localAddress(root.get());
    local.setPort(0);
    listener = detail::listenTcp(local, &bound);
    Hello h{};
    h.magic = detail::kWireMagic;
    h.version = kProtocolVersion;
    h.kind = static_cast<uint32_t>(HelloKind::Root);
    h.rank = rank;
    h.size = size;
    h.nonce = w.nonce;
    h.listenAddr = bound;
    detail::sendAll(root.get(), &h, sizeof(h), deadline, "hello to root");
    // The root answers once every rank has joined: report while waiting, so a missing rank is not a silent hang.
    HelloReply reply{};
    detail::WaitReporter progress(timeoutMs);
    pollfd answer{root.get(), POLLIN, 0};
    // The root's verdict (the table, or why it gave up) may come a moment after our own timeout when we started
    // first: wait a little longer for it, so a rank says what the root knows instead of "timed out".
    const Clock::time_point verdict =
        detail::msLeft(deadline) < 0 ? deadline : deadline + std::chrono::milliseconds(kRootVerdictGraceMs);
    while (detail::msLeft(verdict) != 0) {
      int waitMs = detail::msLeft(verdict);
      if (waitMs < 0 || waitMs > progress.msUntilNext()) waitMs = std::max(1, progress.msUntilNext());
      int rc = poll(&answer, 1, waitMs);
      if (rc > 0 || (rc < 0 && errno != EINTR)) break;  // data, end of stream or an error: recvAll reports it
      if (progress.due())
        progress.report(cat("rank ", rank, " joined the bootstrap root at ", rootAddr.toString(),
                            "; the root answers when all ", size, " ranks have joined (are they all started?)"));
    }
    if (detail::msLeft(verdict) == 0 && poll(&answer, 1, 0) == 0)
      KVCOMM_THROW(Timeout, "TcpBootstrap", "rank ", rank, " joined the bootstrap root at ", rootAddr.toString(),
                   " but the root sent no table within ", timeoutMs, " ms: not all ", size,
                   " ranks joined it (the root names the missing ones; are they all started, with this id and size?)");
    try {
      detail::recvAll(root.get(), &reply, sizeof(reply), verdict, cat("bootstrap root at ", rootAddr.toString()));
    } catch (const Error& e) {
      KVCOMM_THROW(NetworkError, "TcpBootstrap", "rank ", rank, " lost the bootstrap root at ", rootAddr.toString(),
                   " before it sent the table (rank 0 exited or failed: see its error): ", e.what());
    }
    if (reply.status != 0) {
      reply.message[sizeof(reply.message) - 1] = '\0';
      KVCOMM_THROW(NetworkError, "TcpBootstrap", "the root at ", rootAddr.toString(), " refused rank ", rank, ": ",
                   reply.message);
    }
    table.resize(static_cast<size_t>(size));
    detail::recvAll(root.get(), table.data(), table.size() * sizeof(SockAddr), verdict, "address table");
  }
  impl_->mesh = std::make_shared<detail::TcpMesh>(rank, size, w.nonce, std::move(listener), timeoutMs);
  impl_->mesh->start(std::move(table));
  impl_->health = std::make_shared<detail::GroupHealth>(impl_->members);
  impl_->mesh->watchGroup(impl_->health);
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
  impl_->health->check("TcpBootstrap::allgather");
  impl_->mesh->allgather(impl_->members, impl_->rank, data, bytesPerRank, detail::makeTag(0, impl_->seq++),
                         impl_->health.get());
}

CallbackBootstrap::CallbackBootstrap(int rank, int size, AllgatherFn allgather)
    : rank_(rank), size_(size), allgather_(std::move(allgather)) {
  KVCOMM_CHECK_ARG(size <= limits::kMaxRanks, "CallbackBootstrap", "size ", size,
                   " exceeds kvcomm::limits::kMaxRanks (", limits::kMaxRanks, ")");
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
