// The public Arena and ArenaPin over the owner's core (arena/owned_arena.hpp).
#include "kvcomm/arena.hpp"

#include "arena/arena_access.hpp"
#include "arena/owned_arena.hpp"
#include "arena/pin.hpp"
#include "common/check.hpp"

namespace kvcomm {

using detail::arena::OwnedArena;

struct Arena::Impl {
  std::shared_ptr<OwnedArena> core;
  ~Impl() {
    if (core) core->release();
  }
};

namespace {

OwnedArena& coreOf(const std::shared_ptr<Arena::Impl>& impl, const char* call) {
  KVCOMM_CHECK_ARG(impl != nullptr, call, "the arena is empty (moved from, or default-constructed)");
  return *impl->core;
}

}  // namespace

std::vector<detail::Piece> detail::ArenaAccess::pieces(const Arena& arena) {
  if (!arena.impl_ || arena.freed()) return {};
  return arena.impl_->core->pieces();
}

// ---- ArenaPin ----

ArenaPin::ArenaPin() = default;
ArenaPin::ArenaPin(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ArenaPin::~ArenaPin() {
  release();
}
ArenaPin::ArenaPin(ArenaPin&&) noexcept = default;
ArenaPin& ArenaPin::operator=(ArenaPin&& o) noexcept {
  if (this != &o) {
    release();
    impl_ = std::move(o.impl_);
  }
  return *this;
}
void* ArenaPin::data() const {
  return impl_ ? impl_->data : nullptr;
}
size_t ArenaPin::offset() const {
  return impl_ ? impl_->offset : 0;
}
size_t ArenaPin::bytes() const {
  return impl_ ? impl_->bytes : 0;
}
void ArenaPin::release() {
  if (!impl_) return;
  std::unique_ptr<Impl> p = std::move(impl_);
  if (p->host) p->host->unpin(p->id);
}

// ---- Arena ----

Arena::Arena() = default;
Arena::Arena(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
Arena::~Arena() = default;
Arena::Arena(Arena&&) noexcept = default;
Arena& Arena::operator=(Arena&&) noexcept = default;

Arena Arena::create(const KvLayout& layout, const ArenaOptions& options) {
  auto impl = std::make_shared<Impl>();
  impl->core = OwnedArena::create(layout, options);
  return Arena(std::move(impl));
}

void* Arena::data() const {
  return coreOf(impl_, "Arena::data").data();
}
size_t Arena::bytes() const {
  return coreOf(impl_, "Arena::bytes").bytes();
}
size_t Arena::capacity() const {
  return coreOf(impl_, "Arena::capacity").capacity();
}
size_t Arena::granularity() const {
  return coreOf(impl_, "Arena::granularity").granularity();
}
MemoryKind Arena::kind() const {
  return coreOf(impl_, "Arena::kind").kind();
}
std::string Arena::handleType() const {
  return coreOf(impl_, "Arena::handleType").handleType();
}
int Arena::device() const {
  return coreOf(impl_, "Arena::device").device();
}
uint64_t Arena::id() const {
  return coreOf(impl_, "Arena::id").id();
}
uint64_t Arena::generation() const {
  return coreOf(impl_, "Arena::generation").generation();
}
KvLayout Arena::layout() const {
  return coreOf(impl_, "Arena::layout").layout();
}
size_t Arena::leases() const {
  return coreOf(impl_, "Arena::leases").leases();
}
size_t Arena::operations() const {
  return coreOf(impl_, "Arena::operations").operations();
}
std::vector<int> Arena::importers() const {
  return coreOf(impl_, "Arena::importers").importers();
}
size_t Arena::liveCapabilities() const {
  return coreOf(impl_, "Arena::liveCapabilities").liveCapabilities();
}
ArenaCapability Arena::offer(int pid, uint32_t uid, int64_t ttlMs) {
  return coreOf(impl_, "Arena::offer").offer(pid, uid, ttlMs);
}
void Arena::revokeCapabilities() {
  coreOf(impl_, "Arena::revokeCapabilities").revokeCapabilities();
}
ArenaGrowth Arena::grow(size_t newBytes, int64_t timeoutMs) {
  return coreOf(impl_, "Arena::grow").grow(newBytes, nullptr, timeoutMs);
}
ArenaGrowth Arena::grow(const KvLayout& layout, int64_t timeoutMs) {
  return coreOf(impl_, "Arena::grow").grow(0, &layout, timeoutMs);
}
void Arena::shrink(size_t newBytes, int64_t waitMs) {
  coreOf(impl_, "Arena::shrink").shrink(newBytes, nullptr, waitMs);
}
void Arena::shrink(const KvLayout& layout, int64_t waitMs) {
  coreOf(impl_, "Arena::shrink").shrink(0, &layout, waitMs);
}
void Arena::free(int64_t waitMs) {
  coreOf(impl_, "Arena::free").free(waitMs);
}
bool Arena::freed() const {
  return coreOf(impl_, "Arena::freed").freed();
}
ArenaPin Arena::pin(size_t offset, size_t bytes) {
  return ArenaPin(coreOf(impl_, "Arena::pin").pin(offset, bytes, "Arena::pin"));
}
void Arena::write(size_t offset, const void* src, size_t bytes) {
  coreOf(impl_, "Arena::write").copyIn(offset, src, bytes);
}
void Arena::read(size_t offset, void* dst, size_t bytes) const {
  coreOf(impl_, "Arena::read").copyOut(offset, dst, bytes);
}
ArenaIpcHandle Arena::ipcHandle() const {
  return coreOf(impl_, "Arena::ipcHandle").ipcHandle();
}

}  // namespace kvcomm
