#include "arena/imported_arena.hpp"

#include <cstring>

#include "arena/cuda_support.hpp"
#include "arena/owned_arena.hpp"
#include "common/check.hpp"
#include "common/env.hpp"
#include "common/log.hpp"

namespace kvcomm::detail::arena {

ImportedArena::ImportedArena(std::shared_ptr<SessionLink> link, const GrantBody& grant, KvLayout layout,
                             std::unique_ptr<ImportedMemory> mem, OwnerLoss policy, void* ctx, int ownerPid)
    : link_(std::move(link)),
      mem_(std::move(mem)),
      arenaId_(grant.arenaId),
      leaseId_(grant.leaseId),
      ownerPid_(ownerPid),
      policy_(policy),
      ctx_(ctx),
      kind_(mem_->kind()),
      handles_(mem_->handles()),
      capacity_(mem_->capacity()),
      layout_(std::move(layout)),
      generation_(grant.generation),
      bytes_(mem_->mapped()) {}

ImportedArena::ImportedArena(std::unique_ptr<ImportedMemory> mem, KvLayout layout, void* ctx)
    : mem_(std::move(mem)),
      ctx_(ctx),
      kind_(mem_->kind()),
      handles_(mem_->handles()),
      capacity_(mem_->capacity()),
      layout_(std::move(layout)),
      generation_(1),
      bytes_(mem_->mapped()),
      ownerNotified_(true) {}

ImportedArena::~ImportedArena() {
  std::shared_ptr<SessionLink> link;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != State::Closed) link = finishLocked(true);
    if (!link) link = std::move(link_);
  }
  if (link && link->session) link->session->removeImport(arenaId_, leaseId_);
}

std::shared_ptr<SessionLink> ImportedArena::finishLocked(bool notify) noexcept {
  try {
    CudaContextScope scope(ctx_);
    mem_->release();
  } catch (const std::exception& e) {
    KVCOMM_WARN("closing the import of arena ", arenaName(arenaId_), ": ", e.what());
    mem_->release();
  }
  state_ = State::Closed;
  if (notify && !ownerNotified_ && !ownerGone_ && link_ && link_->session) {
    Message m;
    m.type = MsgType::Close;
    m.lease = LeaseBody{arenaId_, leaseId_};
    try {
      link_->session->enqueue(outMessage(m));  // the owner drops the lease; nobody waits for its acknowledgement
    } catch (const std::exception& e) {
      KVCOMM_WARN("telling the owner of arena ", arenaName(arenaId_), " that the import closed failed: ", e.what());
    }
  }
  ownerNotified_ = true;
  cv_.notify_all();
  return std::move(link_);
}

void* ImportedArena::data() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mem_->base();
}
size_t ImportedArena::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mem_->base() ? bytes_ : 0;
}
size_t ImportedArena::capacity() const {
  return capacity_;
}
MemoryKind ImportedArena::kind() const {
  return kind_;
}
std::string ImportedArena::handleType() const {
  return handleKindName(handles_);
}
uint64_t ImportedArena::generation() const {
  std::lock_guard<std::mutex> lock(mu_);
  return generation_;
}
KvLayout ImportedArena::layout() const {
  std::lock_guard<std::mutex> lock(mu_);
  return layout_;
}
bool ImportedArena::ownerAlive() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !ownerGone_;
}
std::string ImportedArena::ownerLostReason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lostReason_;
}
bool ImportedArena::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_ == State::Closed;
}
size_t ImportedArena::operations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pins_.size();
}

void ImportedArena::check(const char* call) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (ownerGone_)
    KVCOMM_THROW(NetworkError, call, "arena ", arenaName(arenaId_), ": ", lostReason_,
                 state_ == State::Closed ? "" : " (the mapping stays readable until close())");
  KVCOMM_CHECK_ARG(state_ != State::Closed, call, "the import of arena ", arenaName(arenaId_), " is closed");
}

std::unique_ptr<ArenaPin::Impl> ImportedArena::pin(size_t offset, size_t bytes, const char* call) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ownerGone_) KVCOMM_THROW(NetworkError, call, "arena ", arenaName(arenaId_), ": ", lostReason_);
  KVCOMM_CHECK_ARG(state_ != State::Closed, call, "the import of arena ", arenaName(arenaId_), " is closed");
  if (state_ == State::Closing) KVCOMM_THROW(Aborted, call, "the import of arena ", arenaName(arenaId_), " is closing");
  size_t end = 0;
  KVCOMM_CHECK_ARG(bytes > 0 && !__builtin_add_overflow(offset, bytes, &end) && end <= bytes_, call, "[", offset, ", +",
                   bytes, ") is not inside the ", bytes_, " bytes mapped");
  auto p = std::make_unique<ArenaPin::Impl>();
  p->host = shared_from_this();
  p->id = nextPin_++;
  p->data = mem_->base() + offset;
  p->offset = offset;
  p->bytes = bytes;
  pins_[p->id] = {offset, bytes};
  return p;
}

void ImportedArena::unpin(uint64_t id) noexcept {
  std::shared_ptr<SessionLink> link;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pins_.erase(id);
    if (pins_.empty() && state_ != State::Closed) {
      if (closeWhenIdle_)
        link = finishLocked(true);
      else if (ownerGone_ && policy_ == OwnerLoss::Release)
        link = finishLocked(false);
    }
    cv_.notify_all();
  }
  if (link && link->session) link->session->removeImport(arenaId_, leaseId_);
}

void ImportedArena::copyIn(size_t offset, const void* src, size_t bytes) {
  if (bytes == 0) return;
  PinGuard g{pin(offset, bytes, "ArenaImport::write")};
  if (kind_ == MemoryKind::Host)
    std::memcpy(g.pin->data, src, bytes);
  else
    copyToDevice(ctx_, g.pin->data, src, bytes);
}

void ImportedArena::copyOut(size_t offset, void* dst, size_t bytes) {
  if (bytes == 0) return;
  PinGuard g{pin(offset, bytes, "ArenaImport::read")};
  if (kind_ == MemoryKind::Host)
    std::memcpy(dst, g.pin->data, bytes);
  else
    copyFromDevice(ctx_, dst, g.pin->data, bytes);
}

void ImportedArena::close(int64_t timeoutMs) {
  const char* call = "ArenaImport::close";
  std::unique_lock<std::mutex> lock(mu_);
  if (state_ != State::Closed) {
    state_ = State::Closing;
    auto drained = [&] { return pins_.empty() || state_ == State::Closed; };
    if (timeoutMs < 0 || timeoutMs > env::kMaxTimeoutMs)  // wait_for(huge) would wrap into the past
      cv_.wait(lock, drained);
    else if (!cv_.wait_for(lock, std::chrono::milliseconds(timeoutMs), drained))
      KVCOMM_THROW(Timeout, call, pins_.size(), " operation(s) on arena ", arenaName(arenaId_),
                   " still in flight after ", timeoutMs,
                   " ms; the import stays closing (new pins are refused) until they end");
  }
  bool tell = !ownerNotified_ && !ownerGone_;
  ownerNotified_ = true;  // told below, and waited for
  std::shared_ptr<SessionLink> link = state_ != State::Closed ? finishLocked(false) : std::move(link_);
  lock.unlock();
  if (link && link->session) {
    if (tell)
      link->session->closeLease(arenaId_, leaseId_,
                                Clock::now() + std::chrono::milliseconds(link->session->requestTimeoutMs()));
    link->session->removeImport(arenaId_, leaseId_);
  }
}

void ImportedArena::closeWhenIdle() noexcept {
  std::shared_ptr<SessionLink> link;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ == State::Closed) return;
    if (pins_.empty()) {
      link = finishLocked(true);
    } else {
      closeWhenIdle_ = true;
      state_ = State::Closing;
    }
  }
  if (link && link->session) link->session->removeImport(arenaId_, leaseId_);
}

Message ImportedArena::applyGrowth(const GrownBody& grown, const std::vector<WireRegion>& regions,
                                   const std::vector<PieceMeta>& metas, std::vector<Fd>& fds) {
  Message ack;
  ack.type = MsgType::GrowAck;
  ack.growAck = GrowAckBody{arenaId_, leaseId_, grown.generation, 0, 0};
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != State::Live || ownerGone_) {
    ack.reason = "the import is closing or closed";
    return ack;
  }
  try {
    CudaContextScope scope(ctx_);
    KvLayout layout = fromWire(regions, grown.layoutVersion);
    layoutExtent(layout, static_cast<size_t>(grown.bytes), "arena growth (the owner's new layout)");
    mem_->map(metas, fds, static_cast<size_t>(grown.bytes));
    bytes_ = mem_->mapped();
    layout_ = std::move(layout);
    generation_ = grown.generation;
    ack.growAck.ok = 1;
  } catch (const std::exception& e) {
    ack.reason = e.what();
    KVCOMM_WARN("mapping the growth of arena ", arenaName(arenaId_), " to generation ", grown.generation,
                " failed: ", e.what());
  }
  return ack;
}

void ImportedArena::ownerLost(const std::string& why) {
  std::shared_ptr<SessionLink> link;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ownerGone_) return;
    ownerGone_ = true;
    lostReason_ = why;
    ownerNotified_ = true;  // nobody is left to tell
    if (policy_ == OwnerLoss::Release && state_ != State::Closed && pins_.empty()) link = finishLocked(false);
    cv_.notify_all();
  }
  KVCOMM_INFO("arena ", arenaName(arenaId_), ": ", why);
  if (link && link->session) link->session->removeImport(arenaId_, leaseId_);
}

}  // namespace kvcomm::detail::arena
