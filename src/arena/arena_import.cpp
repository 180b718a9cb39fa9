// The public ArenaImport over the importer's core (arena/imported_arena.hpp), and legacy IPC opens.
#include "arena/cuda_support.hpp"
#include "arena/imported_arena.hpp"
#include "arena/owned_arena.hpp"
#include "common/check.hpp"
#include "kvcomm/arena.hpp"

namespace kvcomm {

using detail::arena::ImportedArena;

namespace {

ImportedArena& coreOf(const std::shared_ptr<ArenaImport::Impl>& impl, const char* call) {
  KVCOMM_CHECK_ARG(impl != nullptr, call, "the import is empty (moved from, or default-constructed)");
  return *impl->core;
}

}  // namespace

ArenaImport::ArenaImport() = default;
ArenaImport::ArenaImport(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
ArenaImport::~ArenaImport() = default;
ArenaImport::ArenaImport(ArenaImport&&) noexcept = default;
ArenaImport& ArenaImport::operator=(ArenaImport&&) noexcept = default;

ArenaImport ArenaImport::openIpc(const ArenaIpcHandle& handle, const KvLayout& layout) {
  const char* call = "ArenaImport::openIpc";
  size_t extent = detail::arena::layoutExtent(layout, detail::arena::kMaxCapacity, call);
  void* ctx = detail::arena::currentCudaContext();
  KVCOMM_CHECK_ARG(ctx != nullptr, call,
                   "no current CUDA context: call cudaSetDevice (or kvcomm::useLocalDevice) before opening a CUDA IPC "
                   "handle");
  // The driver maps the whole allocation; the layout says how much of it this process uses.
  auto mem = std::make_unique<detail::arena::ImportedMemory>(handle.bytes, extent);
  std::vector<detail::PieceMeta> none;
  std::vector<detail::Fd> noFds;
  mem->map(none, noFds, extent);
  auto impl = std::make_shared<Impl>();
  impl->core = std::make_shared<ImportedArena>(std::move(mem), layout, ctx);
  return ArenaImport(std::move(impl));
}

void* ArenaImport::data() const {
  return coreOf(impl_, "ArenaImport::data").data();
}
size_t ArenaImport::bytes() const {
  return coreOf(impl_, "ArenaImport::bytes").bytes();
}
size_t ArenaImport::capacity() const {
  return coreOf(impl_, "ArenaImport::capacity").capacity();
}
MemoryKind ArenaImport::kind() const {
  return coreOf(impl_, "ArenaImport::kind").kind();
}
std::string ArenaImport::handleType() const {
  return coreOf(impl_, "ArenaImport::handleType").handleType();
}
uint64_t ArenaImport::arenaId() const {
  return coreOf(impl_, "ArenaImport::arenaId").arenaId();
}
uint64_t ArenaImport::generation() const {
  return coreOf(impl_, "ArenaImport::generation").generation();
}
KvLayout ArenaImport::layout() const {
  return coreOf(impl_, "ArenaImport::layout").layout();
}
int ArenaImport::ownerPid() const {
  return coreOf(impl_, "ArenaImport::ownerPid").ownerPid();
}
bool ArenaImport::ownerAlive() const {
  return coreOf(impl_, "ArenaImport::ownerAlive").ownerAlive();
}
std::string ArenaImport::ownerLostReason() const {
  return coreOf(impl_, "ArenaImport::ownerLostReason").ownerLostReason();
}
void ArenaImport::check() const {
  coreOf(impl_, "ArenaImport::check").check("ArenaImport::check");
}
size_t ArenaImport::operations() const {
  return coreOf(impl_, "ArenaImport::operations").operations();
}
ArenaPin ArenaImport::pin(size_t offset, size_t bytes) {
  return ArenaPin(coreOf(impl_, "ArenaImport::pin").pin(offset, bytes, "ArenaImport::pin"));
}
void ArenaImport::write(size_t offset, const void* src, size_t bytes) {
  coreOf(impl_, "ArenaImport::write").copyIn(offset, src, bytes);
}
void ArenaImport::read(size_t offset, void* dst, size_t bytes) const {
  coreOf(impl_, "ArenaImport::read").copyOut(offset, dst, bytes);
}
void ArenaImport::close(int64_t timeoutMs) {
  coreOf(impl_, "ArenaImport::close").close(timeoutMs);
}
bool ArenaImport::closed() const {
  return coreOf(impl_, "ArenaImport::closed").closed();
}

}  // namespace kvcomm
