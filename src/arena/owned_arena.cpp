#include "arena/owned_arena.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "arena/cuda_support.hpp"
#include "arena/session.hpp"
#include "common/check.hpp"
#include "common/env.hpp"
#include "common/log.hpp"
#include "common/socket.hpp"
#include "kvlayout/kv_layout.hpp"

namespace kvcomm::detail::arena {

namespace {

// The arenas of this process by id, for Import requests. Leaked on purpose: arenas may be destroyed during static
// destruction.
struct Registry {
  std::mutex mu;
  std::map<uint64_t, std::weak_ptr<OwnedArena>> arenas;
};
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

void unregister(uint64_t id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.arenas.erase(id);
}

// Grant/Grown pieces: batches of at most kPiecesPerMessage descriptors.
void appendPieces(std::vector<OutMessage>& out, uint64_t arenaId, uint64_t leaseId, ExportSet& set) {
  for (size_t i = 0; i < set.metas.size(); i += kPiecesPerMessage) {
    size_t k = std::min(kPiecesPerMessage, set.metas.size() - i);
    Message m;
    m.type = MsgType::Pieces;
    m.pieces = PiecesBody{arenaId, leaseId, static_cast<uint32_t>(k), i + k == set.metas.size() ? 1u : 0u};
    m.metas.assign(set.metas.begin() + static_cast<ptrdiff_t>(i), set.metas.begin() + static_cast<ptrdiff_t>(i + k));
    std::vector<Fd> fds;
    for (size_t j = i; j < i + k; ++j) fds.push_back(std::move(set.fds[j]));
    out.push_back(outMessage(m, std::move(fds)));
  }
}

std::string plural(size_t n, const char* word) {
  return cat(n, " ", word, n == 1 ? "" : "s");
}

}  // namespace

std::vector<WireRegion> toWire(const KvLayout& layout) {
  std::vector<WireRegion> out;
  for (const KvRegion& r : layout.regions)
    out.push_back(WireRegion{r.offset, r.blockBytes, r.blockStride, r.numBlocks});
  return out;
}

KvLayout fromWire(const std::vector<WireRegion>& regions, uint64_t version) {
  KvLayout l;
  l.version = version;
  for (const WireRegion& w : regions)
    l.regions.push_back(KvRegion{static_cast<size_t>(w.offset), static_cast<size_t>(w.blockBytes),
                                 static_cast<size_t>(w.blockStride), static_cast<size_t>(w.numBlocks)});
  return l;
}

size_t layoutExtent(const KvLayout& layout, size_t limit, const char* call) {
  KVCOMM_CHECK_ARG(layout.regions.size() <= kMaxRegions, call, "a layout of ", layout.regions.size(),
                   " regions (an arena's layout has at most ", kMaxRegions, ")");
  validateLayout(
      layout, limit, [](uint64_t, uint64_t) { return true; }, call);
  uint64_t end = 0;
  for (size_t j = 0; j < layout.regions.size(); ++j)
    end = std::max<uint64_t>(end, layout.regions[j].offset + regionExtent(layout.regions[j], call, j));
  return static_cast<size_t>(end);
}

std::shared_ptr<OwnedArena> OwnedArena::create(const KvLayout& layout, const ArenaOptions& options) {
  const char* call = "Arena::create";
  KVCOMM_CHECK_ENUM(options.kind, MemoryKind::Host, call, "options.kind");
  size_t extent = layoutExtent(layout, kMaxCapacity, call);
  KVCOMM_CHECK_ARG(options.capacity == 0 || options.capacity >= extent, call, "capacity ", options.capacity,
                   " is smaller than the layout's extent ", extent);
  MemoryKind kind = resolveKind(options.kind);
  std::shared_ptr<OwnedArena> core(new OwnedArena);
  core->mem_ = std::make_unique<OwnerMemory>(kind, options.legacyIpc, options.capacity, extent);
  core->layout_ = layout;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  do {
    randomBytes(&core->id_, sizeof(core->id_));
  } while (core->id_ == 0 || r.arenas.count(core->id_));
  r.arenas[core->id_] = core;
  return core;
}

std::shared_ptr<OwnedArena> OwnedArena::find(uint64_t id) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.arenas.find(id);
  return it == r.arenas.end() ? nullptr : it->second.lock();
}

OwnedArena::~OwnedArena() {
  unregister(id_);
  try {
    CudaContextScope scope(mem_ ? mem_->context() : nullptr);
    mem_.reset();
  } catch (const std::exception& e) {
    KVCOMM_WARN("releasing arena ", arenaName(id_), ": ", e.what());
    mem_.reset();
  }
}

void OwnedArena::checkUsable(const char* call) const {
  KVCOMM_CHECK_ARG(!freed_, call, "arena ", arenaName(id_), " was freed");
}

void* OwnedArena::data() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mem_->base();
}
std::vector<Piece> OwnedArena::pieces() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mem_->pieces();
}
size_t OwnedArena::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mem_->bytes();
}
size_t OwnedArena::capacity() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mem_->capacity();
}
size_t OwnedArena::granularity() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mem_->granularity();
}
MemoryKind OwnedArena::kind() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mem_->kind();
}
std::string OwnedArena::handleType() const {
  std::lock_guard<std::mutex> lock(mu_);
  return handleKindName(mem_->handles());
}
int OwnedArena::device() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mem_->device();
}
uint64_t OwnedArena::generation() const {
  std::lock_guard<std::mutex> lock(mu_);
  return generation_;
}
KvLayout OwnedArena::layout() const {
  std::lock_guard<std::mutex> lock(mu_);
  return layout_;
}
size_t OwnedArena::leases() const {
  std::lock_guard<std::mutex> lock(mu_);
  return leases_.size();
}
size_t OwnedArena::operations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pins_.size();
}
std::vector<int> OwnedArena::importers() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<int> out;
  for (const auto& kv : leases_) out.push_back(kv.second.pid);
  return out;
}
size_t OwnedArena::liveCapabilities() const {
  std::lock_guard<std::mutex> lock(mu_);
  return caps_.live();
}
bool OwnedArena::freed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return freed_;
}

ArenaCapability OwnedArena::offer(int pid, uint32_t uid, int64_t ttlMs) {
  std::lock_guard<std::mutex> lock(mu_);
  checkUsable("Arena::offer");
  return caps_.issue(id_, generation_, pid, uid, ttlMs);
}

void OwnedArena::revokeCapabilities() {
  std::lock_guard<std::mutex> lock(mu_);
  caps_.revokeAll("revoked by the owner");
}

template <typename Pred>
bool OwnedArena::waitFor(std::unique_lock<std::mutex>& lock, int64_t waitMs, Pred done) {
  if (waitMs < 0 || waitMs > env::kMaxTimeoutMs) {  // wait_for(huge) would wrap into the past
    cv_.wait(lock, done);
    return true;
  }
  return cv_.wait_for(lock, std::chrono::milliseconds(waitMs), done);
}

std::string OwnedArena::busyReason() const {
  std::string pids;
  for (const auto& kv : leases_) pids += cat(pids.empty() ? "" : ", ", kv.second.pid);
  return cat("arena ", arenaName(id_), " is busy: ", plural(leases_.size(), "lease"),
             leases_.empty() ? "" : cat(" (importer pids ", pids, ")"), " and ", plural(pins_.size(), "operation"),
             " in flight; importers must close() their imports and operations end "
             "(or pass a wait bound) before its memory can be released");
}

ArenaGrowth OwnedArena::grow(size_t newBytes, const KvLayout* layout, int64_t timeoutMs) {
  const char* call = "Arena::grow";
  std::unique_lock<std::mutex> lock(mu_);
  checkUsable(call);
  size_t target = newBytes;
  if (layout) target = std::max(layoutExtent(*layout, mem_->capacity(), call), mem_->bytes());
  KVCOMM_CHECK_ARG(target >= mem_->bytes(), call, "newBytes ", newBytes, " is below the ", mem_->bytes(),
                   " bytes backed now (use shrink())");
  KVCOMM_CHECK_ARG(target <= mem_->capacity(), call, "newBytes ", target, " exceeds the capacity ", mem_->capacity(),
                   " (reserve more with ArenaOptions::capacity)");
  size_t before = mem_->bytes();
  size_t first = 0;
  {
    CudaContextScope scope(mem_->context());
    first = mem_->grow(target);
  }
  ArenaGrowth out;
  if (mem_->bytes() == before && !layout) {
    out.generation = generation_;
    out.importersUpdated = leases_.size();
    return out;
  }
  ++generation_;
  if (layout) layout_ = *layout;
  caps_.revokeAll(cat("issued before the arena grew to generation ", generation_, "; ask the owner for a new one"));
  out.generation = generation_;
  // Tell every importer, with the new chunks' descriptors, while the lock keeps grants and growths in one order.
  std::vector<uint64_t> told;
  for (auto& [leaseId, lease] : leases_) {
    std::shared_ptr<Session> s = lease.session.lock();
    if (!s) continue;
    std::vector<OutMessage> msgs;
    Message g;
    g.type = MsgType::Grown;
    ExportSet set;
    try {
      CudaContextScope scope(mem_->context());
      set = mem_->exportPieces(first);
    } catch (const std::exception& e) {
      out.failures.push_back(cat("pid ", lease.pid, ": exporting the new chunks failed: ", e.what()));
      continue;
    }
    g.grown = GrownBody{
        id_, leaseId, generation_, mem_->bytes(), layout_.version, 0, static_cast<uint32_t>(set.metas.size())};
    g.regions = toWire(layout_);
    msgs.push_back(outMessage(g));
    appendPieces(msgs, id_, leaseId, set);
    lease.growFailure.clear();
    if (s->enqueue(std::move(msgs))) told.push_back(leaseId);
  }
  uint64_t gen = generation_;
  auto settled = [&] {
    for (uint64_t id : told) {
      auto it = leases_.find(id);
      if (it != leases_.end() && it->second.mappedGeneration < gen && it->second.growFailure.empty()) return false;
    }
    return true;
  };
  waitFor(lock, timeoutMs < 0 ? 10000 : timeoutMs, settled);
  for (uint64_t id : told) {
    auto it = leases_.find(id);
    if (it == leases_.end()) continue;  // the importer closed or died meanwhile
    if (it->second.mappedGeneration >= gen)
      ++out.importersUpdated;
    else if (!it->second.growFailure.empty())
      out.failures.push_back(cat("pid ", it->second.pid, ": ", it->second.growFailure));
    else
      out.failures.push_back(cat("pid ", it->second.pid, ": did not map generation ", gen, " in time"));
  }
  return out;
}

void OwnedArena::shrink(size_t newBytes, const KvLayout* layout, int64_t waitMs) {
  const char* call = "Arena::shrink";
  std::unique_lock<std::mutex> lock(mu_);
  checkUsable(call);
  size_t target = layout ? layoutExtent(*layout, mem_->capacity(), call) : newBytes;
  size_t kept = mem_->shrinkTarget(target);
  if (!layout) {
    size_t extent = layoutExtent(layout_, mem_->capacity(), call);
    KVCOMM_CHECK_ARG(extent <= kept, call, "the arena's layout ends at byte ", extent, ", beyond the ", kept,
                     " bytes that would be kept; pass the smaller layout with shrink(layout)");
  }
  size_t end = mem_->bytes();
  // Refused while any lease exists, also when no chunk would be released (a layout change must not reach importers
  // behind their back either): one rule, as documented.
  auto idle = [&] {
    if (!leases_.empty()) return false;
    for (const auto& kv : pins_)
      if (kv.second.offset + kv.second.bytes > kept && kv.second.offset < end) return false;
    return true;
  };
  if (!waitFor(lock, waitMs, idle)) KVCOMM_THROW(Busy, call, busyReason());
  if (kept >= end && !layout) return;  // nothing to release, nothing changes
  if (kept < end) {
    CudaContextScope scope(mem_->context());
    mem_->shrink(target);
  }
  ++generation_;
  if (layout) layout_ = *layout;
  caps_.revokeAll(cat("issued before the arena shrank to generation ", generation_, "; ask the owner for a new one"));
}

void OwnedArena::free(int64_t waitMs) {
  std::unique_lock<std::mutex> lock(mu_);
  if (freed_) return;
  if (!waitFor(lock, waitMs, [&] { return leases_.empty() && pins_.empty(); }))
    KVCOMM_THROW(Busy, "Arena::free", busyReason());
  caps_.revokeAll("the arena was freed");
  freed_ = true;
  unregister(id_);
  try {
    CudaContextScope scope(mem_->context());
    mem_->release();
  } catch (const std::exception& e) {
    KVCOMM_WARN("Arena::free: ", e.what());
    mem_->release();
  }
}

std::unique_ptr<ArenaPin::Impl> OwnedArena::pin(size_t offset, size_t bytes, const char* call) {
  std::lock_guard<std::mutex> lock(mu_);
  checkUsable(call);
  size_t end = 0;
  KVCOMM_CHECK_ARG(bytes > 0 && !__builtin_add_overflow(offset, bytes, &end) && end <= mem_->bytes(), call, "[", offset,
                   ", +", bytes, ") is not inside the arena's ", mem_->bytes(), " bytes");
  auto p = std::make_unique<ArenaPin::Impl>();
  p->host = shared_from_this();
  p->id = nextPin_++;
  p->data = mem_->base() + offset;
  p->offset = offset;
  p->bytes = bytes;
  pins_[p->id] = PinRange{offset, bytes};
  return p;
}

void OwnedArena::unpin(uint64_t id) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  pins_.erase(id);
  cv_.notify_all();
}

void OwnedArena::copyIn(size_t offset, const void* src, size_t bytes) {
  if (bytes == 0) return;
  PinGuard g{pin(offset, bytes, "Arena::write")};
  if (kind() == MemoryKind::Host)
    std::memcpy(g.pin->data, src, bytes);
  else
    copyToDevice(mem_->context(), g.pin->data, src, bytes);
}

void OwnedArena::copyOut(size_t offset, void* dst, size_t bytes) {
  if (bytes == 0) return;
  PinGuard g{pin(offset, bytes, "Arena::read")};
  if (kind() == MemoryKind::Host)
    std::memcpy(dst, g.pin->data, bytes);
  else
    copyFromDevice(mem_->context(), dst, g.pin->data, bytes);
}

ArenaIpcHandle OwnedArena::ipcHandle() const {
  std::lock_guard<std::mutex> lock(mu_);
  checkUsable("Arena::ipcHandle");
  ArenaIpcHandle h;
  CudaContextScope scope(mem_->context());
  mem_->ipcHandle(h.bytes);
  return h;
}

void OwnedArena::release() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (freed_ || released_) return;
  released_ = true;
  caps_.revokeAll("the owner released the arena");
  unregister(id_);
  for (auto& [leaseId, lease] : leases_) {
    std::shared_ptr<Session> s = lease.session.lock();
    if (!s) continue;
    Message m;
    m.type = MsgType::Revoked;
    m.revoked = RevokedBody{id_, leaseId};
    m.reason = "its Arena handle was destroyed without free(); this mapping stays valid until the import is closed";
    try {
      s->enqueue(outMessage(m));
    } catch (const std::exception& e) {
      KVCOMM_WARN("Arena: telling pid ", lease.pid, " that arena ", arenaName(id_), " is released failed: ", e.what());
    }
  }
  if (!leases_.empty())
    KVCOMM_INFO("arena ", arenaName(id_), " released with ", plural(leases_.size(), "lease"),
                "; the importers keep the memory until they close their imports");
  leases_.clear();
}

void OwnedArena::admit(const std::shared_ptr<Session>& session, const Message& request) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string why;
  if (freed_ || released_)
    why = cat("arena ", arenaName(id_), " was ", freed_ ? "freed" : "released");
  else
    why = caps_.take(request.import.token, request.import.generation, generation_, session->peerPid(),
                     session->peerUid());
  std::vector<OutMessage> msgs;
  uint64_t leaseId = 0;
  if (why.empty()) {
    try {
      Message g;
      g.type = MsgType::Grant;
      g.seq = request.seq;
      leaseId = nextLease_++;
      GrantBody& b = g.grant;
      b.arenaId = id_;
      b.generation = generation_;
      b.leaseId = leaseId;
      b.capacity = mem_->capacity();
      b.bytes = mem_->bytes();
      b.granularity = mem_->granularity();
      b.layoutVersion = layout_.version;
      b.handleKind = static_cast<uint32_t>(mem_->handles());
      b.device = mem_->device();
      g.regions = toWire(layout_);
      CudaContextScope scope(mem_->context());
      ExportSet set;
      if (mem_->handles() == HandleKind::CudaIpc)
        mem_->ipcHandle(b.ipcHandle);
      else
        set = mem_->exportPieces(0);
      b.numPieces = static_cast<uint32_t>(set.metas.size());
      msgs.push_back(outMessage(g));
      appendPieces(msgs, id_, leaseId, set);
    } catch (const std::exception& e) {
      why = cat("exporting arena ", arenaName(id_), " failed: ", e.what());
      msgs.clear();
    }
  }
  if (!why.empty()) {
    KVCOMM_DEBUG("arena import refused to pid ", session->peerPid(), ": ", why);
    Message d;
    d.type = MsgType::Deny;
    d.seq = request.seq;
    d.reason = why;
    session->enqueue(outMessage(d));
    return;
  }
  // The lease exists from the grant on: the memory is the importer's to map from now until it closes or dies.
  leases_[leaseId] = Lease{session, session->peerPid(), generation_, ""};
  session->addLease(id_, leaseId, weak_from_this());
  if (!session->enqueue(std::move(msgs))) {
    leases_.erase(leaseId);
    session->removeLease(id_, leaseId);
  }
}

void OwnedArena::dropLease(uint64_t leaseId, const std::string& why, const Session* from) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = leases_.find(leaseId);
  if (it == leases_.end()) return;
  std::shared_ptr<Session> holder = it->second.session.lock();
  if (holder && holder.get() != from) return;  // only the session that holds a lease may end it
  KVCOMM_INFO("arena ", arenaName(id_), ": lease ", leaseId, " of pid ", it->second.pid, " ended: ", why);
  leases_.erase(it);
  cv_.notify_all();
}

void OwnedArena::onGrowAck(uint64_t leaseId, uint64_t generation, bool ok, const std::string& reason,
                           const Session* from) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = leases_.find(leaseId);
  if (it == leases_.end() || it->second.session.lock().get() != from) return;
  if (ok)
    it->second.mappedGeneration = std::max(it->second.mappedGeneration, generation);
  else
    it->second.growFailure = reason.empty() ? "mapping the growth failed" : reason;
  cv_.notify_all();
}

}  // namespace kvcomm::detail::arena
