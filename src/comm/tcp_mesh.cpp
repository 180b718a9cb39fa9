#include "comm/tcp_mesh.hpp"

#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/check.hpp"
#include "common/env.hpp"
#include "common/log.hpp"

namespace kvcomm::detail {

namespace {

Hello makeHello(HelloKind kind, int rank, int size, const Nonce& nonce) {
  Hello h{};
  h.magic = kWireMagic;
  h.version = kProtocolVersionWire;
  h.kind = static_cast<uint32_t>(kind);
  h.rank = rank;
  h.size = size;
  h.nonce = nonce;
  return h;
}

// Bounded wait slice of a blocked send, so an abort or a death reported meanwhile stops it promptly.
constexpr int kSendSliceMs = 100;

// How long a receive that saw its peer's connection close waits for rank 0's word on that peer (its Gone notice
// follows the peer's Bye within a round trip), so that it names the rank that went first.
constexpr int kGoneSettleMs = 1000;

// How long a receive from a rank that left still waits for frames on its data connection (they come before its end
// of stream, which follows its goodbye at once unless it never connected to us).
constexpr int kLeftDrainMs = 1000;

constexpr const char* kLeftReason = "it left the group (destroyed its communicator, or its process exited normally)";

}  // namespace

TcpMesh::TcpMesh(int rank, int size, const Nonce& nonce, Fd listener, int64_t timeoutMs)
    : rank_(rank),
      size_(size),
      nonce_(nonce),
      listener_(std::move(listener)),
      timeoutMs_(timeoutMs),
      pid_(static_cast<int>(getpid())),
      outboundPolled_(static_cast<size_t>(size), 0),
      gone_(static_cast<size_t>(size)),
      outboundClosed_(static_cast<size_t>(size)),
      dead_(static_cast<size_t>(size), 0),
      left_(static_cast<size_t>(size), 0),
      leftWhy_(static_cast<size_t>(size)),
      leftAt_(static_cast<size_t>(size)),
      refusals_(cat("mesh rank ", rank, " listener")) {
  setNonBlocking(listener_.get(), true);
  listenAddr_ = localAddress(listener_.get());
  for (int p = 0; p < size; ++p) outbound_.push_back(std::make_unique<Outbound>());
  acceptor_ = std::make_unique<Acceptor>(listener_.get(), &refusals_);
  pending_ = std::make_unique<PendingHandshakes>(sizeof(Hello), false, &refusals_);
  wake_.reset(KVCOMM_CHECK_SYS(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)));
}

TcpMesh::~TcpMesh() {
  if (static_cast<int>(getpid()) != pid_) {
    (void)thread_.release();  // a forked child: the progress thread lives in the parent only
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof(one));
  if (thread_ && thread_->joinable()) thread_->join();
  // Goodbyes first, so that our connections closing next is not taken for a death.
  WatchMsg bye = makeWatch(WatchKind::Bye, rank_, false, "");
  if (watch_) sendWatch(watch_.get(), bye);
  for (auto& in : inbound_)
    if (in->watch) sendWatch(in->fd.get(), bye);
}

SockAddr TcpMesh::listenAddress() const {
  return listenAddr_;
}

void TcpMesh::start(std::vector<SockAddr> addrs) {
  KVCOMM_CHECK_ARG(addrs.size() == static_cast<size_t>(size_), "TcpMesh::start", addrs.size(),
                   " addresses for a mesh of ", size_);
  for (size_t r = 0; r < addrs.size(); ++r)
    KVCOMM_CHECK_ARG(addrs[r].valid(), "TcpMesh::start", "rank ", r, "'s mesh address (", addrs[r].toString(),
                     ") is not a valid IPv4/IPv6 address");
  addrs_ = std::move(addrs);
  if (rank_ != 0) {
    auto deadline = deadlineIn(timeoutMs_);
    Fd conn = connectTcp(addrs_[0], deadline, "rank 0 (liveness watch)");
    setLivenessTimeout(conn.get(), env::livenessTimeoutMs());
    Hello hello = makeHello(HelloKind::Watch, rank_, size_, nonce_);
    sendAll(conn.get(), &hello, sizeof(hello), deadline, "liveness hello to rank 0");
    setNonBlocking(conn.get(), true);
    watch_ = std::move(conn);
  }
  thread_ = std::make_unique<std::thread>([this] { progressLoop(); });
}

uint32_t TcpMesh::nextWorldGroupId() {
  std::lock_guard<std::mutex> lock(mu_);
  return ++worldGroups_;
}

void TcpMesh::watchGroup(const std::shared_ptr<GroupHealth>& group) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(groups_, [](const std::weak_ptr<GroupHealth>& w) { return w.expired(); });
  groups_.push_back(group);
  for (int p : goneOrder_) {  // in the order they went, so the group's first gone is everyone's
    if (dead_[static_cast<size_t>(p)])
      group->memberDied(p, gone_[static_cast<size_t>(p)]);
    else
      group->memberLeft(p, leftWhy_[static_cast<size_t>(p)]);
  }
}

void TcpMesh::wakeAll() {
  std::lock_guard<std::mutex> lock(mu_);
  cv_.notify_all();
}

std::string TcpMesh::goneReason(int peer) {
  std::lock_guard<std::mutex> lock(mu_);
  return gone_.at(static_cast<size_t>(peer));
}

size_t TcpMesh::pendingConnections() {
  std::lock_guard<std::mutex> lock(mu_);
  return pendingCount_;
}

size_t TcpMesh::inboundConnections() {
  std::lock_guard<std::mutex> lock(mu_);
  return inbound_.size();
}

void TcpMesh::notifyLocked() {
  cv_.notify_all();
}

// ---- progress thread ----------------------------------------------------------------------------------------------

void TcpMesh::progressLoop() {
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
    }
    try {
      progressOnce(1000);
    } catch (const std::exception& e) {
      KVCOMM_WARN("mesh rank ", rank_, ": progress: ", e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

void TcpMesh::progressOnce(int timeoutMs) {
  // Phase 1: what to watch (inbound_ and pending_ change only on this thread; outbound fds come from senders).
  std::vector<pollfd> pfds;
  std::vector<int> outPeers;
  pfds.push_back({wake_.get(), POLLIN, 0});
  pfds.push_back({acceptor_->pollFd(), POLLIN, 0});
  pfds.push_back({watch_ ? watch_.get() : -1, POLLIN, 0});
  size_t nIn = inbound_.size();
  for (auto& in : inbound_) pfds.push_back({in->fd.get(), POLLIN, 0});
  size_t pendingAt = pfds.size();
  pending_->pollFds(pfds);
  size_t nPending = pfds.size() - pendingAt;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int p = 0; p < size_; ++p)
      if (outboundPolled_[static_cast<size_t>(p)]) {
        pfds.push_back({outbound_[static_cast<size_t>(p)]->fd.get(), POLLIN, 0});
        outPeers.push_back(p);
      }
  }
  int wait = pfds[1].fd < 0 ? 100 : timeoutMs;
  int next = pending_->msToNextDeadline();
  if (next >= 0) wait = std::min(wait, next + 1);
  int rc = poll(pfds.data(), pfds.size(), wait);
  if (rc < 0) {
    if (errno == EINTR) return;
    throwSystem("poll(mesh)", errno, __FILE__, __LINE__);
  }
  // Phase 2: I/O without the lock; each handler takes it to publish what it found.
  if (pfds[0].revents) {
    uint64_t v;
    (void)!::read(wake_.get(), &v, sizeof(v));
  }
  std::vector<size_t> closed;
  for (size_t i = 0; i < nIn; ++i)
    if (pfds[3 + i].revents && !readInbound(*inbound_[i])) closed.push_back(i);
  for (auto& r : pending_->progress(pfds.data() + pendingAt, nPending)) admit(std::move(r.conn), r.hello);
  for (size_t i = 0; i < outPeers.size(); ++i)
    if (pfds[pendingAt + nPending + i].revents) readOutbound(outPeers[i]);
  if (pfds[2].revents) readWatch();
  if (pfds[1].revents) acceptAll();
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t k = closed.size(); k-- > 0;) inbound_.erase(inbound_.begin() + static_cast<ptrdiff_t>(closed[k]));
  pendingCount_ = pending_->size();
  notifyLocked();
}

void TcpMesh::acceptAll() {
  while (true) {
    Fd c = acceptor_->next();
    if (!c) break;
    pending_->add(std::move(c));
  }
  std::lock_guard<std::mutex> lock(mu_);
  pendingCount_ = pending_->size();
}

void TcpMesh::admit(Fd conn, const std::vector<char>& helloBytes) {
  Hello h;
  std::memcpy(&h, helloBytes.data(), sizeof(h));
  std::string why = meshHelloRefusal(h, nonce_, size_);
  bool watch = h.kind == static_cast<uint32_t>(HelloKind::Watch);
  if (why.empty() && watch && (rank_ != 0 || h.rank == 0)) why = "liveness connections go to world rank 0 only";
  if (why.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (dead_[static_cast<size_t>(h.rank)]) why = cat("rank ", h.rank, " was declared dead");
  }
  if (!why.empty()) {
    HelloReply reply = refusalReply(why);
    (void)::send(conn.get(), &reply, sizeof(reply), MSG_NOSIGNAL | MSG_DONTWAIT);
    refusals_.refused(why);
    return;
  }
  if (watch) setLivenessTimeout(conn.get(), env::livenessTimeoutMs());
  auto in = std::make_unique<Inbound>();
  in->fd = std::move(conn);
  in->rank = h.rank;
  in->watch = watch;
  std::lock_guard<std::mutex> lock(mu_);
  inbound_.push_back(std::move(in));
}

bool TcpMesh::readInbound(Inbound& in) {
  char chunk[65536];
  bool eof = false;
  std::string error;
  while (true) {
    ssize_t n = ::recv(in.fd.get(), chunk, sizeof(chunk), MSG_DONTWAIT);
    if (n > 0) {
      if (in.watch)
        in.watchBuf.insert(in.watchBuf.end(), chunk, chunk + n);
      else
        in.frames.append(chunk, static_cast<size_t>(n));
      if (static_cast<size_t>(n) < sizeof(chunk)) break;  // drained for now; poll again
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n < 0 && errno == EINTR) continue;
    eof = true;
    if (n < 0) error = cat("connection error: ", std::strerror(errno));
    break;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (in.watch) {
    size_t off = 0;
    for (; in.watchBuf.size() - off >= sizeof(WatchMsg); off += sizeof(WatchMsg)) {
      WatchMsg m;
      if (decodeWatch(in.watchBuf.data() + off, size_, &m) && m.kind == static_cast<uint32_t>(WatchKind::Bye) &&
          !in.bye) {
        in.bye = true;
        memberGone(in.rank, kLeftReason, false, true);
      }
    }
    in.watchBuf.erase(in.watchBuf.begin(), in.watchBuf.begin() + static_cast<ptrdiff_t>(off));
    if (eof && !in.bye) {
      // (After a Bye the data connection's own end of stream says "gone", in order with its last frames.)
      memberGone(in.rank,
                 error.empty()
                     ? "its process died (its liveness connection closed without a goodbye: killed or crashed)"
                     : cat("its process died or its host is unreachable (liveness connection: ", error, ")"),
                 true, true);
    }
    return !eof;
  }
  try {
    uint64_t tag;
    std::vector<char> payload;
    while (in.frames.next(&tag, &payload)) stash_[{in.rank, tag}].push_back(std::move(payload));
  } catch (const Error& e) {
    peerGone(in.rank, e.what());
    return false;
  }
  if (eof)
    peerGone(in.rank, error.empty() ? "its connection closed (process exited or destroyed its communicator)" : error);
  return !eof;
}

void TcpMesh::readOutbound(int peer) {
  int fd;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fd = outbound_[static_cast<size_t>(peer)]->fd.get();
  }
  HelloReply reply{};
  ssize_t n = ::recv(fd, &reply, sizeof(reply), MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  std::string why;
  if (n <= 0) {
    why = n == 0 ? "it closed our connection (process exited or destroyed its communicator)"
                 : cat("connection error: ", std::strerror(errno));
  } else if (static_cast<size_t>(n) >= sizeof(int32_t) && reply.status != 0) {
    size_t len = std::min(sizeof(reply.message), static_cast<size_t>(n) - sizeof(int32_t));
    why = cat("it refused our connection: ", std::string(reply.message, strnlen(reply.message, len)));
  } else {
    return;  // nothing is ever sent on this direction otherwise: ignore
  }
  // Only sends learn from this: a receive must first get the frames the peer sent on its own connection before
  // closing, so "gone" for receives comes from that connection's end of stream (or a death).
  std::lock_guard<std::mutex> lock(mu_);
  outboundPolled_[static_cast<size_t>(peer)] = 0;
  if (outboundClosed_[static_cast<size_t>(peer)].empty()) outboundClosed_[static_cast<size_t>(peer)] = why;
}

void TcpMesh::readWatch() {
  char chunk[4096];
  bool eof = false;
  while (true) {
    ssize_t n = ::recv(watch_.get(), chunk, sizeof(chunk), MSG_DONTWAIT);
    if (n > 0) {
      watchBuf_.insert(watchBuf_.end(), chunk, chunk + n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n < 0 && errno == EINTR) continue;
    eof = true;
    break;
  }
  std::lock_guard<std::mutex> lock(mu_);
  size_t off = 0;
  for (; watchBuf_.size() - off >= sizeof(WatchMsg); off += sizeof(WatchMsg)) {
    WatchMsg m;
    if (!decodeWatch(watchBuf_.data() + off, size_, &m)) {
      HelloReply r;
      std::memcpy(&r, watchBuf_.data() + off, sizeof(r));
      r.message[sizeof(r.message) - 1] = '\0';
      if (r.status == 1) KVCOMM_WARN("mesh rank ", rank_, ": rank 0 refused the liveness connection: ", r.message);
      continue;
    }
    if (m.kind == static_cast<uint32_t>(WatchKind::Bye)) {
      rootBye_ = true;
      memberGone(0, kLeftReason, false, false);
    } else if (m.dead) {
      memberGone(m.rank, cat(m.reason, " (reported by rank 0)"), true, false);
    } else {
      memberGone(m.rank, cat(m.reason, " (reported by rank 0)"), false, false);
    }
  }
  watchBuf_.erase(watchBuf_.begin(), watchBuf_.begin() + static_cast<ptrdiff_t>(off));
  if (eof) {
    if (!rootBye_)
      memberGone(0, "its process died or its host is unreachable (its liveness connection closed without a goodbye)",
                 true, false);
    watch_.reset();
  }
}

void TcpMesh::peerGone(int peer, const std::string& why) {
  std::string& g = gone_[static_cast<size_t>(peer)];
  if (g.empty()) g = why;
}

const std::string& TcpMesh::whyGoneLocked(int peer) const {
  const auto p = static_cast<size_t>(peer);
  if (left_[p] && !dead_[p]) return leftWhy_[p];
  return gone_[p].empty() ? outboundClosed_[p] : gone_[p];
}

bool TcpMesh::isReportedLocked(int peer) const {
  if (dead_[static_cast<size_t>(peer)] || left_[static_cast<size_t>(peer)]) return true;
  return rank_ != 0 && (dead_[0] || left_[0]);  // rank 0 is gone: no word will come
}

void TcpMesh::throwGoneLocked(int peer, const GroupHealth* group, const char* call) const {
  int first = -1;
  for (int p : goneOrder_)
    if (!group || group->containsMeshRank(p)) {
      first = p;
      break;
    }
  const std::string& why = whyGoneLocked(peer);
  if (first < 0 || first == peer) KVCOMM_THROW(NetworkError, call, "rank ", peer, " is gone: ", why);
  KVCOMM_THROW(NetworkError, call, "rank ", first, " is gone: ", whyGoneLocked(first), " (the first to go; rank ", peer,
               ", waited for here, is gone too: ", why, ")");
}

void TcpMesh::memberGone(int peer, const std::string& why, bool died, bool relay) {
  const auto p = static_cast<size_t>(peer);
  if (peer == rank_ || dead_[p] || left_[p]) return;
  if (died) {
    dead_[p] = 1;
    gone_[p] = why;
  } else {
    // Not gone_: frames it sent before leaving may still be on their way on its data connection, whose end of
    // stream (after them) sets gone_; a receive gives that connection kLeftDrainMs from here.
    left_[p] = 1;
    leftWhy_[p] = why;
    leftAt_[p] = Clock::now();
  }
  goneOrder_.push_back(peer);
  KVCOMM_INFO("mesh rank ", rank_, ": rank ", peer, died ? " is gone: " : " left: ", why);
  std::erase_if(groups_, [](const std::weak_ptr<GroupHealth>& w) { return w.expired(); });
  for (auto& w : groups_)
    if (auto g = w.lock()) died ? g->memberDied(peer, why) : g->memberLeft(peer, why);
  if (relay && rank_ == 0) {
    WatchMsg m = makeWatch(WatchKind::Gone, peer, died, why);
    for (auto& in : inbound_)
      if (in->watch && in->rank != peer) sendWatch(in->fd.get(), m);
  }
  notifyLocked();
}

void TcpMesh::sendWatch(int fd, const WatchMsg& m) {
  // Small and rare: the socket buffer always has room unless the peer stopped reading, and then it is dying.
  (void)::send(fd, &m, sizeof(m), MSG_NOSIGNAL | MSG_DONTWAIT);
}

// ---- callers ------------------------------------------------------------------------------------------------------

void TcpMesh::checkSendable(int peer, const GroupHealth* group) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto p = static_cast<size_t>(peer);
  if (!dead_[p] && !left_[p] && outboundClosed_[p].empty()) return;
  settleLocked(lock, peer);
  throwGoneLocked(peer, group, "TcpMesh::send");
}

void TcpMesh::settleLocked(std::unique_lock<std::mutex>& lock, int peer) {
  cv_.wait_until(lock, Clock::now() + std::chrono::milliseconds(kGoneSettleMs),
                 [&] { return stop_ || isReportedLocked(peer); });
}

[[noreturn]] void TcpMesh::throwPeerGone(int peer, const char* call) {
  std::string why;
  {
    std::lock_guard<std::mutex> lock(mu_);
    why = gone_[static_cast<size_t>(peer)];
  }
  KVCOMM_THROW(NetworkError, call, "rank ", peer, " is gone: ", why);
}

int TcpMesh::outboundFd(int peer, const GroupHealth* group, Clock::time_point deadline) {
  Outbound& o = *outbound_[static_cast<size_t>(peer)];
  if (o.broken)
    KVCOMM_THROW(NetworkError, "TcpMesh::send", "the connection to rank ", peer,
                 " broke when an earlier send to it was interrupted (abort, death or timeout)");
  if (o.fd) return o.fd.get();
  checkSendable(peer, group);
  auto stopIf = [&] {
    if (group) group->check("TcpMesh::send (connect)");
    checkSendable(peer, group);
  };
  Fd conn = connectTcp(addrs_[static_cast<size_t>(peer)], deadline, cat("rank ", peer), "", stopIf);
  Hello hello = makeHello(HelloKind::Mesh, rank_, size_, nonce_);
  sendAll(conn.get(), &hello, sizeof(hello), deadline, cat("hello to rank ", peer));
  setNonBlocking(conn.get(), true);
  {
    std::lock_guard<std::mutex> lock(mu_);
    o.fd = std::move(conn);
    outboundPolled_[static_cast<size_t>(peer)] = 1;
  }
  uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof(one));
  return o.fd.get();
}

void TcpMesh::send(int peer, uint64_t tag, const void* data, size_t len, const GroupHealth* group) {
  KVCOMM_CHECK_ARG(peer >= 0 && peer < size_, "TcpMesh::send", "peer ", peer, " out of range [0, ", size_, ")");
  if (peer == rank_) {
    const char* p = static_cast<const char*>(data);
    std::lock_guard<std::mutex> lock(mu_);
    stash_[{peer, tag}].emplace_back(p, p + len);
    notifyLocked();
    return;
  }
  Outbound& o = *outbound_[static_cast<size_t>(peer)];
  std::lock_guard<std::mutex> sendLock(o.sendMu);
  auto deadline = deadlineIn(timeoutMs_);
  int fd = outboundFd(peer, group, deadline);
  FrameHeader fh{tag, len};
  const char* parts[2] = {reinterpret_cast<const char*>(&fh), static_cast<const char*>(data)};
  size_t sizes[2] = {sizeof(fh), len};
  bool started = false;
  try {
    for (int part = 0; part < 2; ++part) {
      const char* p = parts[part];
      size_t left = sizes[part];
      while (left > 0) {
        ssize_t w = ::send(fd, p, left, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
          started = true;
          p += w;
          left -= static_cast<size_t>(w);
          continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
          std::string why = cat("send failed: ", std::strerror(errno));
          {
            std::lock_guard<std::mutex> lock(mu_);
            if (outboundClosed_[static_cast<size_t>(peer)].empty()) outboundClosed_[static_cast<size_t>(peer)] = why;
          }
          checkSendable(peer, group);
        }
        // The peer's buffer is full: its progress thread drains it unless it is dead, hung or aborted.
        if (group) group->check("TcpMesh::send");
        checkSendable(peer, group);
        if (msLeft(deadline) == 0)
          KVCOMM_THROW(Timeout, "TcpMesh::send", "rank ", peer, " did not drain ", left, " bytes within ", timeoutMs_,
                       " ms");
        pollfd pf{fd, POLLOUT, 0};
        int slice = msLeft(deadline);
        (void)poll(&pf, 1, slice < 0 ? kSendSliceMs : std::min(slice, kSendSliceMs));
      }
    }
  } catch (...) {
    if (started) o.broken = true;  // half a frame went out: later frames would be misparsed
    throw;
  }
}

void TcpMesh::recv(int peer, uint64_t tag, void* data, size_t len, const GroupHealth* group) {
  KVCOMM_CHECK_ARG(peer >= 0 && peer < size_, "TcpMesh::recv", "peer ", peer, " out of range [0, ", size_, ")");
  auto deadline = deadlineIn(timeoutMs_);
  std::vector<char> msg;
  {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      auto it = stash_.find({peer, tag});
      if (it != stash_.end() && !it->second.empty()) {
        msg = std::move(it->second.front());
        it->second.pop_front();
        if (it->second.empty()) stash_.erase(it);
        break;
      }
      if (group && !group->healthy()) {
        lock.unlock();
        group->check("TcpMesh::recv");  // throws: a group never becomes healthy again
        lock.lock();
      }
      if (!gone_[static_cast<size_t>(peer)].empty()) {
        settleLocked(lock, peer);
        throwGoneLocked(peer, group, "TcpMesh::recv");
      }
      if (left_[static_cast<size_t>(peer)] &&
          Clock::now() - leftAt_[static_cast<size_t>(peer)] > std::chrono::milliseconds(kLeftDrainMs))
        throwGoneLocked(peer, group, "TcpMesh::recv");  // it never had a data connection to us, or it hangs
      int left = msLeft(deadline);
      if (left == 0)
        KVCOMM_THROW(Timeout, "TcpMesh::recv", "no message from rank ", peer, " within ", timeoutMs_,
                     " ms (is it alive and in the same collective?)");
      cv_.wait_for(lock, std::chrono::milliseconds(left < 0 ? 1000 : std::min(left, 1000)));
    }
  }
  if (msg.size() != len)
    KVCOMM_THROW(InternalError, "TcpMesh::recv", "message from rank ", peer, " has ", msg.size(), " bytes, expected ",
                 len, " (ranks called collectives in a different order?)");
  if (len) std::memcpy(data, msg.data(), len);
}

void TcpMesh::allgather(const std::vector<int>& members, int me, void* data, size_t bytesPerRank, uint64_t tag,
                        const GroupHealth* group) {
  size_t n = members.size();
  if (n <= 1) return;
  char* base = static_cast<char*>(data);
  int next = members[(static_cast<size_t>(me) + 1) % n];
  int prev = members[(static_cast<size_t>(me) + n - 1) % n];
  for (size_t s = 0; s + 1 < n; ++s) {
    size_t sendIdx = (static_cast<size_t>(me) + n - s) % n;
    size_t recvIdx = (static_cast<size_t>(me) + 2 * n - s - 1) % n;
    send(next, tag, base + sendIdx * bytesPerRank, bytesPerRank, group);
    recv(prev, tag, base + recvIdx * bytesPerRank, bytesPerRank, group);
  }
}

}  // namespace kvcomm::detail
