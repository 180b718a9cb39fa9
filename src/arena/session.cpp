#include "arena/session.hpp"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "arena/cuda_support.hpp"
#include "arena/imported_arena.hpp"
#include "arena/owned_arena.hpp"
#include "arena/reactor.hpp"
#include "common/check.hpp"
#include "common/env.hpp"
#include "common/log.hpp"
#include "symm/fd_exchange.hpp"

namespace kvcomm::detail::arena {

namespace {

Message leaseMessage(MsgType type, uint32_t seq, uint64_t arenaId, uint64_t leaseId) {
  Message m;
  m.type = type;
  m.seq = seq;
  m.lease = LeaseBody{arenaId, leaseId};
  return m;
}

}  // namespace

OutMessage outMessage(const Message& m, std::vector<Fd> fds) {
  return OutMessage{encode(m), std::move(fds)};
}

SessionLink::~SessionLink() {
  if (session) session->requestClose("closed by this process (no handle or import refers to the session any more)");
}

Session::Session(Fd sock, int peerPid, uint32_t peerUid, Role role, std::weak_ptr<Reactor> reactor, bool established,
                 Clock::time_point handshakeDeadline, int64_t requestTimeoutMs)
    : role_(role),
      sock_(std::move(sock)),
      peerPid_(peerPid),
      peerUid_(peerUid),
      reactor_(std::move(reactor)),
      handshakeDeadline_(handshakeDeadline),
      requestTimeoutMs_(requestTimeoutMs),
      established_(established) {
#ifdef SYS_pidfd_open
  // The pidfd polls readable when the peer exits, even if a child it forked still holds its end of the socket.
  int p = static_cast<int>(syscall(SYS_pidfd_open, peerPid, 0));  // close-on-exec by definition
  if (p >= 0) pidfd_.reset(p);
#endif
}

Session::~Session() = default;

std::string Session::peerName() const {
  return cat("pid ", peerPid_);
}

bool Session::alive() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !lost_;
}

std::string Session::lostReason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lostReason_;
}

bool Session::established() const {
  std::lock_guard<std::mutex> lock(mu_);
  return established_;
}

void Session::throwLost(const char* call) const {
  KVCOMM_THROW(NetworkError, call, "the session with ", peerName(), " ended: ", lostReason_);
}

bool Session::enqueue(OutMessage m) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (lost_) return false;
    outq_.push_back(std::move(m));
    if (outq_.size() > kMaxQueued) overflow_ = true;
  }
  if (auto r = reactor_.lock()) r->wake();
  return true;
}

bool Session::enqueue(std::vector<OutMessage> ms) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (lost_) return false;
    for (auto& m : ms) outq_.push_back(std::move(m));
    if (outq_.size() > kMaxQueued) overflow_ = true;
  }
  if (auto r = reactor_.lock()) r->wake();
  return true;
}

std::shared_ptr<ImportedArena> Session::import(const ArenaCapability& cap, const ImportOptions& options,
                                               const std::shared_ptr<SessionLink>& link) {
  const char* call = "ArenaSession::import";
  std::unique_lock<std::mutex> lock(mu_);
  if (lost_) throwLost(call);
  uint32_t seq = nextSeq_++;
  PendingImport& p = pendingImports_[seq];
  p.options = options;
  p.ctx = currentCudaContext();
  p.link = link;
  Message m;
  m.type = MsgType::Import;
  m.seq = seq;
  m.import.arenaId = cap.arenaId;
  m.import.generation = cap.generation;
  std::memcpy(m.import.token, cap.token, sizeof(cap.token));
  outq_.push_back(outMessage(m));
  if (auto r = reactor_.lock()) r->wake();
  int64_t ms = options.timeoutMs >= 0 ? options.timeoutMs : requestTimeoutMs_;
  ms = std::min<int64_t>(ms, env::kMaxTimeoutMs);  // wait_for(huge) would wrap into the past: 10^12 ms is forever
  if (!cv_.wait_for(lock, std::chrono::milliseconds(ms), [&] { return p.done; })) {
    pendingImports_.erase(seq);  // a grant arriving later is released by the session thread
    KVCOMM_THROW(Timeout, call, "the owner (", peerName(), ") did not answer the import of arena ",
                 arenaName(cap.arenaId), " within ", ms, " ms");
  }
  PendingImport done = std::move(p);
  pendingImports_.erase(seq);
  lock.unlock();
  if (done.result) return done.result;
  if (done.code == ErrorCode::InvalidArgument && done.error.rfind("kvcomm ", 0) != 0)
    KVCOMM_THROW(InvalidArgument, call, peerName(), " refused the capability for arena ", arenaName(cap.arenaId), ": ",
                 done.error);
  throwFormatted(done.code, done.error);
}

void Session::closeLease(uint64_t arenaId, uint64_t leaseId, Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  if (lost_) return;
  uint32_t seq = nextSeq_++;
  pendingCloses_[seq] = false;
  outq_.push_back(outMessage(leaseMessage(MsgType::Close, seq, arenaId, leaseId)));
  if (auto r = reactor_.lock()) r->wake();
  bool acked = cv_.wait_until(lock, deadline, [&] { return pendingCloses_[seq] || lost_; });
  pendingCloses_.erase(seq);
  if (!acked)
    KVCOMM_WARN("ArenaImport::close: the owner (", peerName(), ") did not acknowledge the end of lease ", leaseId,
                " of arena ", arenaName(arenaId), " in time; it is dropped when the session ends");
}

void Session::sendUser(const void* data, size_t bytes) {
  const char* call = "ArenaSession::send";
  KVCOMM_CHECK_ARG(bytes <= kMaxUserBytes, call, "a message of ", bytes, " bytes (at most ", kMaxUserBytes, ")");
  KVCOMM_CHECK_ARG(data != nullptr || bytes == 0, call, "data is null");
  Message m;
  m.type = MsgType::User;
  if (bytes) m.user.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (lost_) throwLost(call);
  outq_.push_back(outMessage(m));
  if (outq_.size() > kMaxQueued) overflow_ = true;
  if (auto r = reactor_.lock()) r->wake();
}

std::vector<uint8_t> Session::receiveUser(int64_t timeoutMs) {
  const char* call = "ArenaSession::receive";
  std::unique_lock<std::mutex> lock(mu_);
  auto ready = [&] { return !inbox_.empty() || lost_; };
  if (timeoutMs < 0 || timeoutMs > env::kMaxTimeoutMs)  // wait_for(huge) would wrap into the past
    cv_.wait(lock, ready);
  else if (!cv_.wait_for(lock, std::chrono::milliseconds(timeoutMs), ready))
    KVCOMM_THROW(Timeout, call, "no message from ", peerName(), " within ", timeoutMs, " ms");
  if (inbox_.empty()) throwLost(call);
  bool wasFull = inbox_.size() >= kMaxInbox;
  std::vector<uint8_t> m = std::move(inbox_.front());
  inbox_.pop_front();
  lock.unlock();
  if (wasFull)
    if (auto r = reactor_.lock()) r->wake();  // reading resumes
  return m;
}

void Session::requestClose(const std::string& reason) {
  std::shared_ptr<Reactor> r = reactor_.lock();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (lost_ || closeRequested_) return;
    closeRequested_ = true;
    closeReason_ = reason;
    Message bye;
    bye.type = MsgType::Bye;
    outq_.push_back(outMessage(bye));
  }
  if (!r) return;
  r->wake();
  if (r->onThread()) return;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::seconds(2), [&] { return lost_; });
}

void Session::addLease(uint64_t arenaId, uint64_t leaseId, std::weak_ptr<OwnedArena> arena) {
  std::lock_guard<std::mutex> lock(mu_);
  leases_[{arenaId, leaseId}] = std::move(arena);
}

void Session::removeLease(uint64_t arenaId, uint64_t leaseId) {
  std::lock_guard<std::mutex> lock(mu_);
  leases_.erase({arenaId, leaseId});
}

void Session::removeImport(uint64_t arenaId, uint64_t leaseId) {
  std::lock_guard<std::mutex> lock(mu_);
  imports_.erase({arenaId, leaseId});
}

short Session::pollEvents() const {
  std::lock_guard<std::mutex> lock(mu_);
  short ev = 0;
  if (inbox_.size() < kMaxInbox) ev |= POLLIN;
  if (!outq_.empty()) ev |= POLLOUT;
  return ev;
}

void Session::protocolError(const std::string& why) {
  KVCOMM_DEBUG("arena session with ", peerName(), ": protocol error: ", printable(why));
  lose(cat("protocol error from ", peerName(), ": ", printable(why)));
}

bool Session::onReadable() {
  if (finished()) return false;
  std::vector<uint8_t> buf(kMaxMessage);
  size_t len = buf.size();
  std::vector<Fd> fds;
  try {
    fds = recvWithFds(sock_.get(), buf.data(), &len, kPiecesPerMessage);
  } catch (const std::exception& e) {
    lose(cat("its connection closed or failed (", e.what(), ")"));
    return false;
  }
  Message m;
  std::string why = decode(buf.data(), len, fds.size(), &m);
  if (!why.empty()) {
    protocolError(why);  // the descriptors that came with it close here
    return false;
  }
  bool before = established();
  try {
    dispatch(m, fds);
  } catch (const std::exception& e) {
    lose(cat("handling a ", msgTypeName(m.type), " message failed: ", e.what()));
    return false;
  }
  return !before && role_ == Role::Server && !finished() && established();
}

void Session::dispatch(Message& m, std::vector<Fd>& fds) {
  if (collecting_.what != MsgType::Bye && m.type != MsgType::Pieces)
    return protocolError(
        cat("a ", msgTypeName(m.type), " message in the middle of the pieces of a ", msgTypeName(collecting_.what)));
  if (!established()) {
    if (role_ != Role::Server || m.type != MsgType::Hello)
      return protocolError(cat("expected Hello, received ", msgTypeName(m.type)));
    if (m.hello.pid != peerPid_) {
      std::lock_guard<std::mutex> lock(mu_);
      Message r;
      r.type = MsgType::Refused;
      r.reason = cat("the hello names pid ", m.hello.pid, " but the socket belongs to pid ", peerPid_,
                     " (another PID namespace?)");
      outq_.push_back(outMessage(r));
      closeRequested_ = true;
      closeReason_ = r.reason;
      return;
    }
    Message w;
    w.type = MsgType::Welcome;
    w.hello = HelloBody{static_cast<int32_t>(getpid()), static_cast<uint32_t>(geteuid()), 0};
    std::lock_guard<std::mutex> lock(mu_);
    established_ = true;
    outq_.push_back(outMessage(w));
    return;
  }
  switch (m.type) {
    case MsgType::Hello:
    case MsgType::Welcome:
    case MsgType::Refused:
      return protocolError(cat("an unexpected ", msgTypeName(m.type), " after the handshake"));
    case MsgType::Import: {
      std::shared_ptr<OwnedArena> arena = OwnedArena::find(m.import.arenaId);
      if (arena) return arena->admit(shared_from_this(), m);
      Message d;
      d.type = MsgType::Deny;
      d.seq = m.seq;
      d.reason = cat("no arena ", arenaName(m.import.arenaId), " in pid ", getpid(),
                     ": it was freed or released, or never existed");
      enqueue(outMessage(d));
      return;
    }
    case MsgType::Grant:
    case MsgType::Grown: {
      collecting_ = Collecting{};
      collecting_.what = m.type;
      collecting_.seq = m.seq;
      collecting_.regions = std::move(m.regions);
      if (m.type == MsgType::Grant) {
        collecting_.grant = m.grant;
        collecting_.arenaId = m.grant.arenaId;
        collecting_.leaseId = m.grant.leaseId;
        collecting_.expected = m.grant.numPieces;
      } else {
        collecting_.grown = m.grown;
        collecting_.arenaId = m.grown.arenaId;
        collecting_.leaseId = m.grown.leaseId;
        collecting_.expected = m.grown.numPieces;
      }
      break;  // completes below when no piece follows
    }
    case MsgType::Pieces: {
      Collecting& c = collecting_;
      if (c.what == MsgType::Bye) return protocolError("pieces that no Grant or Grown announced");
      if (m.pieces.arenaId != c.arenaId || m.pieces.leaseId != c.leaseId)
        return protocolError("pieces of another arena or lease than the one announced");
      if (c.metas.size() + m.metas.size() > c.expected)
        return protocolError(cat("more pieces than the ", c.expected, " announced"));
      for (size_t i = 0; i < m.metas.size(); ++i) {
        c.metas.push_back(m.metas[i]);
        c.fds.push_back(std::move(fds[i]));
      }
      if ((m.pieces.last == 1) != (c.metas.size() == c.expected))
        return protocolError(cat("the last flag does not match the ", c.expected, " pieces announced"));
      break;
    }
    case MsgType::Deny: {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = pendingImports_.find(m.seq);
      if (it != pendingImports_.end()) {
        it->second.done = true;
        it->second.error = printable(m.reason);
        it->second.code = ErrorCode::InvalidArgument;
        cv_.notify_all();
      }
      return;
    }
    case MsgType::GrowAck: {
      if (auto arena = OwnedArena::find(m.growAck.arenaId))
        arena->onGrowAck(m.growAck.leaseId, m.growAck.generation, m.growAck.ok == 1, printable(m.reason), this);
      return;
    }
    case MsgType::Close: {
      if (auto arena = OwnedArena::find(m.lease.arenaId))
        arena->dropLease(m.lease.leaseId, cat("closed by the importer (", peerName(), ")"), this);
      removeLease(m.lease.arenaId, m.lease.leaseId);
      enqueue(outMessage(leaseMessage(MsgType::CloseAck, m.seq, m.lease.arenaId, m.lease.leaseId)));
      return;
    }
    case MsgType::CloseAck: {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = pendingCloses_.find(m.seq);
      if (it != pendingCloses_.end()) {
        it->second = true;
        cv_.notify_all();
      }
      return;
    }
    case MsgType::Revoked: {
      std::shared_ptr<ImportedArena> imp;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = imports_.find({m.revoked.arenaId, m.revoked.leaseId});
        if (it != imports_.end()) imp = it->second.lock();
      }
      if (imp) imp->ownerLost(cat("the owner (", peerName(), ") released the arena: ", printable(m.reason)));
      return;
    }
    case MsgType::User: {
      std::lock_guard<std::mutex> lock(mu_);
      inbox_.push_back(std::move(m.user));
      cv_.notify_all();
      return;
    }
    case MsgType::Bye:
      return lose(cat(peerName(), " ended the session"));
  }
  // A Grant, Grown or Pieces message: finish once every announced piece is here.
  if (collecting_.what != MsgType::Bye && collecting_.metas.size() == collecting_.expected) {
    Collecting c = std::move(collecting_);
    collecting_ = Collecting{};
    if (c.what == MsgType::Grant)
      finishGrant(c);
    else
      finishGrown(c);
  }
}

void Session::finishGrant(Collecting& c) {
  PendingImport want;
  bool waiting = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pendingImports_.find(c.seq);
    if (it != pendingImports_.end() && !it->second.done) {
      want.options = it->second.options;
      want.ctx = it->second.ctx;
      want.link = it->second.link;
      waiting = true;
    }
  }
  std::shared_ptr<SessionLink> link = want.link.lock();
  std::shared_ptr<ImportedArena> core;
  std::string error;
  ErrorCode code = ErrorCode::InternalError;
  if (waiting && link) {
    try {
      CudaContextScope scope(want.ctx);
      KvLayout layout = fromWire(c.regions, c.grant.layoutVersion);
      layoutExtent(layout, c.grant.bytes, "ArenaSession::import (the owner's layout)");
      auto handles = static_cast<HandleKind>(c.grant.handleKind);
      std::unique_ptr<ImportedMemory> mem =
          handles == HandleKind::CudaIpc
              ? std::make_unique<ImportedMemory>(c.grant.ipcHandle, c.grant.capacity)
              : std::make_unique<ImportedMemory>(handles, c.grant.capacity, c.grant.granularity);
      mem->map(c.metas, c.fds, c.grant.bytes);
      core = std::make_shared<ImportedArena>(link, c.grant, std::move(layout), std::move(mem), want.options.onOwnerLoss,
                                             want.ctx, peerPid_);
    } catch (const Error& e) {
      error = e.what();
      code = e.code();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  c.fds.clear();  // what was not imported closes here
  bool delivered = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pendingImports_.find(c.seq);
    if (it != pendingImports_.end() && !it->second.done) {
      it->second.done = true;
      it->second.result = core;
      it->second.error = error;
      it->second.code = code;
      delivered = core != nullptr;
      if (core) imports_[{c.grant.arenaId, c.grant.leaseId}] = core;
      cv_.notify_all();
    }
  }
  // Nobody took the import (the caller gave up, or mapping failed): the owner drops the lease. A mapped import
  // nobody took tells the owner itself when it is destroyed.
  if (!core) enqueue(outMessage(leaseMessage(MsgType::Close, 0, c.grant.arenaId, c.grant.leaseId)));
  (void)delivered;
}

void Session::finishGrown(Collecting& c) {
  std::shared_ptr<ImportedArena> imp;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = imports_.find({c.arenaId, c.leaseId});
    if (it != imports_.end()) imp = it->second.lock();
  }
  Message ack;
  if (imp) {
    ack = imp->applyGrowth(c.grown, c.regions, c.metas, c.fds);
  } else {
    ack.type = MsgType::GrowAck;
    ack.growAck = GrowAckBody{c.arenaId, c.leaseId, c.grown.generation, 0, 0};
    ack.reason = "the import is closed";
  }
  c.fds.clear();
  enqueue(outMessage(ack));
}

void Session::onWritable() {
  std::unique_lock<std::mutex> lock(mu_);
  try {
    while (!outq_.empty() && sock_.valid()) {
      OutMessage& m = outq_.front();
      std::vector<int> raw;
      for (const Fd& f : m.fds) raw.push_back(f.get());
      if (!trySendWithFds(sock_.get(), m.bytes.data(), m.bytes.size(), raw.data(), raw.size())) return;
      outq_.pop_front();  // our copies of the descriptors close; the peer holds its own
    }
  } catch (const std::exception& e) {
    lock.unlock();
    lose(cat("sending to it failed (", e.what(), ")"));
  }
}

void Session::onPeerExit() {
  // Whatever it sent before it died is still read (a Close, say), then the session ends.
  while (!finished()) {
    pollfd p{sock_.get(), POLLIN, 0};
    if (poll(&p, 1, 0) <= 0 || !(p.revents & (POLLIN | POLLHUP | POLLERR))) break;
    onReadable();
  }
  if (!finished()) lose(cat("process ", peerPid_, " exited"));
}

void Session::service() {
  bool close = false, over = false;
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (lost_) return;
    close = closeRequested_;
    over = overflow_;
    reason = closeReason_;
  }
  if (over) return lose(cat(peerName(), " does not read its messages (more than ", kMaxQueued, " queued)"));
  if (close) {
    onWritable();  // the Bye (or a refusal) goes out if the socket takes it
    lose(reason);
  }
}

void Session::lose(const std::string& reason) {
  std::map<std::pair<uint64_t, uint64_t>, std::weak_ptr<OwnedArena>> leases;
  std::map<std::pair<uint64_t, uint64_t>, std::weak_ptr<ImportedArena>> imports;
  std::deque<OutMessage> dropped;
  // The descriptors close before anyone is told the session ended: whoever waited for that sees them gone.
  sock_.reset();
  pidfd_.reset();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (lost_) return;
    lost_ = true;
    lostReason_ = reason;
    leases.swap(leases_);
    imports.swap(imports_);
    dropped.swap(outq_);
    for (auto& [seq, p] : pendingImports_)
      if (!p.done) {
        p.done = true;
        p.code = ErrorCode::NetworkError;
        p.error = formatMessage("ArenaSession::import", cat("the session with ", peerName(), " ended: ", reason),
                                __FILE__, __LINE__);
      }
    for (auto& [seq, acked] : pendingCloses_) acked = true;  // nobody is left to acknowledge
    cv_.notify_all();
  }
  collecting_ = Collecting{};
  dropped.clear();
  KVCOMM_DEBUG("arena session with ", peerName(), " ended: ", reason);
  for (auto& [key, weak] : leases)
    if (auto arena = weak.lock())
      arena->dropLease(key.second, cat("importer ", peerName(), " is gone: ", reason), this);
  for (auto& [key, weak] : imports)
    if (auto imp = weak.lock()) imp->ownerLost(cat("the owner (", peerName(), ") is gone: ", reason));
}

}  // namespace kvcomm::detail::arena
