// C ABI: arenas (Arena, ArenaPin, ArenaImport, ArenaSession, ArenaServer). Arenas belong to no communicator, so their
// handles name no rank. Layouts come in as kvcommKvRegion arrays (the fetch layout's C form) counted against
// KVCOMM_MAX_ARENA_REGIONS; capabilities and IPC handles are the C++ structs' bytes.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "capi/capi.hpp"
#include "common/check.hpp"

using kvcomm::capi::fromC;
using kvcomm::capi::guard;
using kvcomm::capi::query;
using kvcomm::capi::requireNonNull;
using kvcomm::capi::use;
namespace lim = kvcomm::limits;

static_assert(KVCOMM_MAX_ARENA_REGIONS == lim::kMaxArenaRegions, "arena regions");
static_assert(KVCOMM_ARENA_MAX_MESSAGE_BYTES == kvcomm::ArenaSession::kMaxMessageBytes, "arena message bytes");
static_assert(KVCOMM_ARENA_DEFAULT_TTL_MS == kvcomm::Arena::kDefaultTtlMs, "capability time to live");
static_assert(sizeof(kvcommArenaIpcHandle) == sizeof(kvcomm::ArenaIpcHandle) &&
                  KVCOMM_ARENA_IPC_HANDLE_BYTES == sizeof(kvcomm::ArenaIpcHandle::bytes),
              "IPC handle bytes");
// The C capability is the C++ one, field by field (the same 48 bytes a C caller may send as they are).
static_assert(sizeof(kvcommArenaCapability) == sizeof(kvcomm::ArenaCapability), "capability size");
static_assert(offsetof(kvcommArenaCapability, arenaId) == offsetof(kvcomm::ArenaCapability, arenaId) &&
                  offsetof(kvcommArenaCapability, generation) == offsetof(kvcomm::ArenaCapability, generation) &&
                  offsetof(kvcommArenaCapability, token) == offsetof(kvcomm::ArenaCapability, token) &&
                  offsetof(kvcommArenaCapability, importerPid) == offsetof(kvcomm::ArenaCapability, importerPid) &&
                  offsetof(kvcommArenaCapability, importerUid) == offsetof(kvcomm::ArenaCapability, importerUid) &&
                  offsetof(kvcommArenaCapability, expiresAtMs) == offsetof(kvcomm::ArenaCapability, expiresAtMs),
              "capability layout");

namespace {

kvcomm::Arena& getArena(kvcommArena_t arena, const char* call) {
  return use(arena, call, "arena").arena;
}
kvcomm::ArenaImport& getImport(kvcommArenaImport_t import, const char* call) {
  return use(import, call, "import").import;
}
kvcomm::ArenaSession& getSession(kvcommArenaSession_t session, const char* call) {
  return use(session, call, "session").session;
}
kvcomm::ArenaServer& getServer(kvcommArenaServer_t server, const char* call) {
  return use(server, call, "server").server;
}

kvcomm::KvLayout layoutOf(const kvcommKvRegion* regions, size_t n, uint64_t version, const char* call) {
  return kvcomm::capi::layoutOf(regions, n, version, lim::kMaxArenaRegions, "KVCOMM_MAX_ARENA_REGIONS", call);
}

kvcomm::ArenaCapability capabilityOf(const kvcommArenaCapability* c) {
  kvcomm::ArenaCapability out;
  out.arenaId = c->arenaId;
  out.generation = c->generation;
  std::memcpy(out.token, c->token, sizeof(out.token));
  out.importerPid = c->importerPid;
  out.importerUid = c->importerUid;
  out.expiresAtMs = c->expiresAtMs;
  return out;
}

void toC(const kvcomm::ArenaCapability& c, kvcommArenaCapability* out) {
  kvcommArenaCapability r{};
  r.arenaId = c.arenaId;
  r.generation = c.generation;
  std::memcpy(r.token, c.token, sizeof(r.token));
  r.importerPid = c.importerPid;
  r.importerUid = c.importerUid;
  r.expiresAtMs = c.expiresAtMs;
  *out = r;
}

// Records the growth's failures on the handle and fills the C struct (when given).
void record(kvcommArena& h, const kvcomm::ArenaGrowth& g, kvcommArenaGrowth* out) {
  std::string text;
  for (const std::string& f : g.failures) text += (text.empty() ? "" : "\n") + f;
  {
    std::lock_guard<std::mutex> lock(h.mu);
    h.lastGrowthFailures = std::move(text);
  }
  if (out) {
    kvcommArenaGrowth c{};
    c.generation = g.generation;
    c.importersUpdated = g.importersUpdated;
    c.numFailures = g.failures.size();
    *out = c;
  }
}

void checkCopy(const void* p, size_t bytes, const char* call, const char* what) {
  KVCOMM_CHECK_ARG(p != nullptr || bytes == 0, call, what, " is NULL but bytes is ", bytes);
}

kvcommResult_t makePin(kvcommArenaPin_t* pin, const char* call, const std::function<kvcomm::ArenaPin()>& make) {
  return guard(call, [&] {
    requireNonNull(pin, call, "pin");
    kvcomm::ArenaPin p = make();
    *pin = kvcomm::capi::adopt<kvcommArenaPin>(std::move(p));
  });
}

template <typename Read>
kvcommResult_t pinQuery(kvcommArenaPin_t pin, const char* call, void* out, const char* outName, Read&& read) {
  return guard(call, [&] {
    auto& p = use(pin, call, "pin");
    requireNonNull(out, call, outName);
    std::lock_guard<std::mutex> lock(p.mu);
    read(p.pin);
  });
}

}  // namespace

extern "C" {

// ---- options ----------------------------------------------------------------------------------------------------

kvcommResult_t kvcommArenaOptionsInit(kvcommArenaOptions* options) {
  return guard("kvcommArenaOptionsInit", [&] {
    requireNonNull(options, "kvcommArenaOptionsInit", "options");
    kvcomm::ArenaOptions d;
    options->kind = kvcomm::capi::toC<kvcommMemoryKind_t>(d.kind);
    options->capacity = d.capacity;
    options->legacyIpc = d.legacyIpc ? 1 : 0;
  });
}

kvcommResult_t kvcommArenaImportOptionsInit(kvcommArenaImportOptions* options) {
  return guard("kvcommArenaImportOptionsInit", [&] {
    requireNonNull(options, "kvcommArenaImportOptionsInit", "options");
    kvcomm::ImportOptions d;
    options->onOwnerLoss = kvcomm::capi::toC<kvcommArenaOwnerLoss_t>(d.onOwnerLoss);
    options->timeoutMs = d.timeoutMs;
  });
}

kvcommResult_t kvcommArenaSessionOptionsInit(kvcommArenaSessionOptions* options) {
  return guard("kvcommArenaSessionOptionsInit", [&] {
    requireNonNull(options, "kvcommArenaSessionOptionsInit", "options");
    options->timeoutMs = kvcomm::ArenaSessionOptions{}.timeoutMs;
  });
}

kvcommResult_t kvcommArenaServerOptionsInit(kvcommArenaServerOptions* options) {
  return guard("kvcommArenaServerOptionsInit", [&] {
    requireNonNull(options, "kvcommArenaServerOptionsInit", "options");
    kvcomm::ArenaServerOptions d;
    options->maxSessions = d.maxSessions;
    options->maxPendingHandshakes = d.maxPendingHandshakes;
    options->handshakeTimeoutMs = d.handshakeTimeoutMs;
    options->requestTimeoutMs = d.requestTimeoutMs;
  });
}

// ---- the owner's arena --------------------------------------------------------------------------------------------

kvcommResult_t kvcommArenaCreate(const kvcommKvRegion* regions, size_t numRegions, uint64_t version,
                                 const kvcommArenaOptions* options, kvcommArena_t* arena) {
  const char* call = "kvcommArenaCreate";
  return guard(call, [&] {
    requireNonNull(arena, call, "arena");
    KVCOMM_CHECK_ARG(regions != nullptr, call, "regions is NULL (numRegions ", numRegions, ")");
    kvcomm::KvLayout l = layoutOf(regions, numRegions, version, call);
    kvcomm::ArenaOptions o;
    if (options) {
      o.kind = fromC(options->kind, call, "options->kind");
      o.capacity = options->capacity;
      KVCOMM_CHECK_ARG(options->legacyIpc == 0 || options->legacyIpc == 1, call, "options->legacyIpc ",
                       options->legacyIpc, " is not 0 or 1");
      o.legacyIpc = options->legacyIpc == 1;
    }
    *arena = kvcomm::capi::adopt<kvcommArena>(kvcomm::Arena::create(l, o));
  });
}

kvcommResult_t kvcommArenaDestroy(kvcommArena_t arena) {
  return guard("kvcommArenaDestroy", [&] { kvcomm::capi::retire(arena, "kvcommArenaDestroy", "arena"); });
}

kvcommResult_t kvcommArenaData(kvcommArena_t arena, void** data) {
  return query("kvcommArenaData", data, "data", [&](const char* call) { return getArena(arena, call).data(); });
}

kvcommResult_t kvcommArenaBytes(kvcommArena_t arena, size_t* bytes) {
  return query("kvcommArenaBytes", bytes, "bytes", [&](const char* call) { return getArena(arena, call).bytes(); });
}

kvcommResult_t kvcommArenaCapacity(kvcommArena_t arena, size_t* bytes) {
  return query("kvcommArenaCapacity", bytes, "bytes",
               [&](const char* call) { return getArena(arena, call).capacity(); });
}

kvcommResult_t kvcommArenaGranularity(kvcommArena_t arena, size_t* bytes) {
  return query("kvcommArenaGranularity", bytes, "bytes",
               [&](const char* call) { return getArena(arena, call).granularity(); });
}

kvcommResult_t kvcommArenaKind(kvcommArena_t arena, kvcommMemoryKind_t* kind) {
  return query("kvcommArenaKind", kind, "kind",
               [&](const char* call) { return kvcomm::capi::toC<kvcommMemoryKind_t>(getArena(arena, call).kind()); });
}

kvcommResult_t kvcommArenaHandleType(kvcommArena_t arena, char* text, size_t textBytes, size_t* needed) {
  const char* call = "kvcommArenaHandleType";
  return guard(call,
               [&] { kvcomm::capi::copyString(getArena(arena, call).handleType(), text, textBytes, needed, call); });
}

kvcommResult_t kvcommArenaDevice(kvcommArena_t arena, int* device) {
  return query("kvcommArenaDevice", device, "device", [&](const char* call) { return getArena(arena, call).device(); });
}

kvcommResult_t kvcommArenaId(kvcommArena_t arena, uint64_t* id) {
  return query("kvcommArenaId", id, "id", [&](const char* call) { return getArena(arena, call).id(); });
}

kvcommResult_t kvcommArenaGeneration(kvcommArena_t arena, uint64_t* generation) {
  return query("kvcommArenaGeneration", generation, "generation",
               [&](const char* call) { return getArena(arena, call).generation(); });
}

kvcommResult_t kvcommArenaLayout(kvcommArena_t arena, kvcommKvRegion* regions, size_t capacity, size_t* count,
                                 uint64_t* version) {
  const char* call = "kvcommArenaLayout";
  return guard(call, [&] {
    auto& a = getArena(arena, call);
    kvcomm::capi::copyLayout(a.layout(), regions, capacity, count, version, call);
  });
}

kvcommResult_t kvcommArenaLeases(kvcommArena_t arena, size_t* leases) {
  return query("kvcommArenaLeases", leases, "leases", [&](const char* call) { return getArena(arena, call).leases(); });
}

kvcommResult_t kvcommArenaOperations(kvcommArena_t arena, size_t* operations) {
  return query("kvcommArenaOperations", operations, "operations",
               [&](const char* call) { return getArena(arena, call).operations(); });
}

kvcommResult_t kvcommArenaImporters(kvcommArena_t arena, int* pids, size_t capacity, size_t* count) {
  const char* call = "kvcommArenaImporters";
  return guard(call, [&] {
    auto& a = getArena(arena, call);
    requireNonNull(count, call, "count");
    KVCOMM_CHECK_ARG(pids != nullptr || capacity == 0, call, "pids is NULL but capacity is ", capacity);
    std::vector<int> p = a.importers();
    std::copy_n(p.begin(), std::min(capacity, p.size()), pids);
    *count = p.size();
  });
}

kvcommResult_t kvcommArenaLiveCapabilities(kvcommArena_t arena, size_t* count) {
  return query("kvcommArenaLiveCapabilities", count, "count",
               [&](const char* call) { return getArena(arena, call).liveCapabilities(); });
}

kvcommResult_t kvcommArenaFreed(kvcommArena_t arena, int* freed) {
  return query("kvcommArenaFreed", freed, "freed",
               [&](const char* call) { return getArena(arena, call).freed() ? 1 : 0; });
}

kvcommResult_t kvcommArenaOffer(kvcommArena_t arena, int pid, uint32_t uid, int64_t ttlMs,
                                kvcommArenaCapability* capability) {
  const char* call = "kvcommArenaOffer";
  return guard(call, [&] {
    auto& a = getArena(arena, call);
    requireNonNull(capability, call, "capability");
    toC(a.offer(pid, uid, ttlMs), capability);
  });
}

kvcommResult_t kvcommArenaRevokeCapabilities(kvcommArena_t arena) {
  return guard("kvcommArenaRevokeCapabilities",
               [&] { getArena(arena, "kvcommArenaRevokeCapabilities").revokeCapabilities(); });
}

kvcommResult_t kvcommArenaGrow(kvcommArena_t arena, size_t newBytes, int64_t timeoutMs, kvcommArenaGrowth* growth) {
  const char* call = "kvcommArenaGrow";
  return guard(call, [&] {
    auto& h = use(arena, call, "arena");
    record(h, h.arena.grow(newBytes, timeoutMs), growth);
  });
}

kvcommResult_t kvcommArenaGrowLayout(kvcommArena_t arena, const kvcommKvRegion* regions, size_t numRegions,
                                     uint64_t version, int64_t timeoutMs, kvcommArenaGrowth* growth) {
  const char* call = "kvcommArenaGrowLayout";
  return guard(call, [&] {
    auto& h = use(arena, call, "arena");
    KVCOMM_CHECK_ARG(regions != nullptr, call, "regions is NULL (numRegions ", numRegions, ")");
    record(h, h.arena.grow(layoutOf(regions, numRegions, version, call), timeoutMs), growth);
  });
}

kvcommResult_t kvcommArenaGrowthFailures(kvcommArena_t arena, char* text, size_t textBytes, size_t* needed) {
  const char* call = "kvcommArenaGrowthFailures";
  return guard(call, [&] {
    auto& h = use(arena, call, "arena");
    std::string f;
    {
      std::lock_guard<std::mutex> lock(h.mu);
      f = h.lastGrowthFailures;
    }
    kvcomm::capi::copyString(f, text, textBytes, needed, call);
  });
}

kvcommResult_t kvcommArenaShrink(kvcommArena_t arena, size_t newBytes, int64_t waitMs) {
  return guard("kvcommArenaShrink", [&] { getArena(arena, "kvcommArenaShrink").shrink(newBytes, waitMs); });
}

kvcommResult_t kvcommArenaShrinkLayout(kvcommArena_t arena, const kvcommKvRegion* regions, size_t numRegions,
                                       uint64_t version, int64_t waitMs) {
  const char* call = "kvcommArenaShrinkLayout";
  return guard(call, [&] {
    auto& a = getArena(arena, call);
    KVCOMM_CHECK_ARG(regions != nullptr, call, "regions is NULL (numRegions ", numRegions, ")");
    a.shrink(layoutOf(regions, numRegions, version, call), waitMs);
  });
}

kvcommResult_t kvcommArenaFree(kvcommArena_t arena, int64_t waitMs) {
  return guard("kvcommArenaFree", [&] { getArena(arena, "kvcommArenaFree").free(waitMs); });
}

kvcommResult_t kvcommArenaWrite(kvcommArena_t arena, size_t offset, const void* src, size_t bytes) {
  const char* call = "kvcommArenaWrite";
  return guard(call, [&] {
    auto& a = getArena(arena, call);
    checkCopy(src, bytes, call, "src");
    a.write(offset, src, bytes);
  });
}

kvcommResult_t kvcommArenaRead(kvcommArena_t arena, size_t offset, void* dst, size_t bytes) {
  const char* call = "kvcommArenaRead";
  return guard(call, [&] {
    auto& a = getArena(arena, call);
    checkCopy(dst, bytes, call, "dst");
    a.read(offset, dst, bytes);
  });
}

kvcommResult_t kvcommArenaPinCreate(kvcommArena_t arena, size_t offset, size_t bytes, kvcommArenaPin_t* pin) {
  const char* call = "kvcommArenaPinCreate";
  return makePin(pin, call, [&] { return getArena(arena, call).pin(offset, bytes); });
}

kvcommResult_t kvcommArenaGetIpcHandle(kvcommArena_t arena, kvcommArenaIpcHandle* handle) {
  const char* call = "kvcommArenaGetIpcHandle";
  return guard(call, [&] {
    auto& a = getArena(arena, call);
    requireNonNull(handle, call, "handle");
    kvcomm::ArenaIpcHandle h = a.ipcHandle();
    std::memcpy(handle->bytes, h.bytes, sizeof(h.bytes));
  });
}

// ---- pins ---------------------------------------------------------------------------------------------------------

kvcommResult_t kvcommArenaPinDestroy(kvcommArenaPin_t pin) {
  return guard("kvcommArenaPinDestroy", [&] { kvcomm::capi::retire(pin, "kvcommArenaPinDestroy", "pin"); });
}

kvcommResult_t kvcommArenaPinRelease(kvcommArenaPin_t pin) {
  return guard("kvcommArenaPinRelease", [&] {
    auto& p = use(pin, "kvcommArenaPinRelease", "pin");
    std::lock_guard<std::mutex> lock(p.mu);
    p.pin.release();
  });
}

kvcommResult_t kvcommArenaPinData(kvcommArenaPin_t pin, void** data) {
  return pinQuery(pin, "kvcommArenaPinData", data, "data", [&](const kvcomm::ArenaPin& p) { *data = p.data(); });
}

kvcommResult_t kvcommArenaPinOffset(kvcommArenaPin_t pin, size_t* offset) {
  return pinQuery(pin, "kvcommArenaPinOffset", offset, "offset",
                  [&](const kvcomm::ArenaPin& p) { *offset = p.offset(); });
}

kvcommResult_t kvcommArenaPinBytes(kvcommArenaPin_t pin, size_t* bytes) {
  return pinQuery(pin, "kvcommArenaPinBytes", bytes, "bytes", [&](const kvcomm::ArenaPin& p) { *bytes = p.bytes(); });
}

// ---- imports ------------------------------------------------------------------------------------------------------

kvcommResult_t kvcommArenaImportOpenIpc(const kvcommArenaIpcHandle* handle, const kvcommKvRegion* regions,
                                        size_t numRegions, uint64_t version, kvcommArenaImport_t* import) {
  const char* call = "kvcommArenaImportOpenIpc";
  return guard(call, [&] {
    requireNonNull(handle, call, "handle");
    requireNonNull(import, call, "import");
    KVCOMM_CHECK_ARG(regions != nullptr, call, "regions is NULL (numRegions ", numRegions, ")");
    kvcomm::KvLayout l = layoutOf(regions, numRegions, version, call);
    kvcomm::ArenaIpcHandle h;
    std::memcpy(h.bytes, handle->bytes, sizeof(h.bytes));
    *import = kvcomm::capi::adopt<kvcommArenaImport>(kvcomm::ArenaImport::openIpc(h, l));
  });
}

kvcommResult_t kvcommArenaImportDestroy(kvcommArenaImport_t import) {
  return guard("kvcommArenaImportDestroy", [&] { kvcomm::capi::retire(import, "kvcommArenaImportDestroy", "import"); });
}

kvcommResult_t kvcommArenaImportData(kvcommArenaImport_t import, void** data) {
  return query("kvcommArenaImportData", data, "data", [&](const char* call) { return getImport(import, call).data(); });
}

kvcommResult_t kvcommArenaImportBytes(kvcommArenaImport_t import, size_t* bytes) {
  return query("kvcommArenaImportBytes", bytes, "bytes",
               [&](const char* call) { return getImport(import, call).bytes(); });
}

kvcommResult_t kvcommArenaImportCapacity(kvcommArenaImport_t import, size_t* bytes) {
  return query("kvcommArenaImportCapacity", bytes, "bytes",
               [&](const char* call) { return getImport(import, call).capacity(); });
}

kvcommResult_t kvcommArenaImportKind(kvcommArenaImport_t import, kvcommMemoryKind_t* kind) {
  return query("kvcommArenaImportKind", kind, "kind",
               [&](const char* call) { return kvcomm::capi::toC<kvcommMemoryKind_t>(getImport(import, call).kind()); });
}

kvcommResult_t kvcommArenaImportHandleType(kvcommArenaImport_t import, char* text, size_t textBytes, size_t* needed) {
  const char* call = "kvcommArenaImportHandleType";
  return guard(call,
               [&] { kvcomm::capi::copyString(getImport(import, call).handleType(), text, textBytes, needed, call); });
}

kvcommResult_t kvcommArenaImportArenaId(kvcommArenaImport_t import, uint64_t* id) {
  return query("kvcommArenaImportArenaId", id, "id",
               [&](const char* call) { return getImport(import, call).arenaId(); });
}

kvcommResult_t kvcommArenaImportGeneration(kvcommArenaImport_t import, uint64_t* generation) {
  return query("kvcommArenaImportGeneration", generation, "generation",
               [&](const char* call) { return getImport(import, call).generation(); });
}

kvcommResult_t kvcommArenaImportLayout(kvcommArenaImport_t import, kvcommKvRegion* regions, size_t capacity,
                                       size_t* count, uint64_t* version) {
  const char* call = "kvcommArenaImportLayout";
  return guard(call, [&] {
    auto& i = getImport(import, call);
    kvcomm::capi::copyLayout(i.layout(), regions, capacity, count, version, call);
  });
}

kvcommResult_t kvcommArenaImportOwnerPid(kvcommArenaImport_t import, int* pid) {
  return query("kvcommArenaImportOwnerPid", pid, "pid",
               [&](const char* call) { return getImport(import, call).ownerPid(); });
}

kvcommResult_t kvcommArenaImportOwnerAlive(kvcommArenaImport_t import, int* alive) {
  return query("kvcommArenaImportOwnerAlive", alive, "alive",
               [&](const char* call) { return getImport(import, call).ownerAlive() ? 1 : 0; });
}

kvcommResult_t kvcommArenaImportOwnerLostReason(kvcommArenaImport_t import, char* text, size_t textBytes,
                                                size_t* needed) {
  const char* call = "kvcommArenaImportOwnerLostReason";
  return guard(call, [&] {
    kvcomm::capi::copyString(getImport(import, call).ownerLostReason(), text, textBytes, needed, call);
  });
}

kvcommResult_t kvcommArenaImportCheck(kvcommArenaImport_t import) {
  return guard("kvcommArenaImportCheck", [&] { getImport(import, "kvcommArenaImportCheck").check(); });
}

kvcommResult_t kvcommArenaImportOperations(kvcommArenaImport_t import, size_t* operations) {
  return query("kvcommArenaImportOperations", operations, "operations",
               [&](const char* call) { return getImport(import, call).operations(); });
}

kvcommResult_t kvcommArenaImportPinCreate(kvcommArenaImport_t import, size_t offset, size_t bytes,
                                          kvcommArenaPin_t* pin) {
  const char* call = "kvcommArenaImportPinCreate";
  return makePin(pin, call, [&] { return getImport(import, call).pin(offset, bytes); });
}

kvcommResult_t kvcommArenaImportWrite(kvcommArenaImport_t import, size_t offset, const void* src, size_t bytes) {
  const char* call = "kvcommArenaImportWrite";
  return guard(call, [&] {
    auto& i = getImport(import, call);
    checkCopy(src, bytes, call, "src");
    i.write(offset, src, bytes);
  });
}

kvcommResult_t kvcommArenaImportRead(kvcommArenaImport_t import, size_t offset, void* dst, size_t bytes) {
  const char* call = "kvcommArenaImportRead";
  return guard(call, [&] {
    auto& i = getImport(import, call);
    checkCopy(dst, bytes, call, "dst");
    i.read(offset, dst, bytes);
  });
}

kvcommResult_t kvcommArenaImportClose(kvcommArenaImport_t import, int64_t timeoutMs) {
  return guard("kvcommArenaImportClose", [&] { getImport(import, "kvcommArenaImportClose").close(timeoutMs); });
}

kvcommResult_t kvcommArenaImportClosed(kvcommArenaImport_t import, int* closed) {
  return query("kvcommArenaImportClosed", closed, "closed",
               [&](const char* call) { return getImport(import, call).closed() ? 1 : 0; });
}

// ---- sessions -----------------------------------------------------------------------------------------------------

kvcommResult_t kvcommArenaSessionConnect(const char* address, const kvcommArenaSessionOptions* options,
                                         kvcommArenaSession_t* session) {
  const char* call = "kvcommArenaSessionConnect";
  return guard(call, [&] {
    requireNonNull(address, call, "address");
    requireNonNull(session, call, "session");
    kvcomm::ArenaSessionOptions o;
    if (options) o.timeoutMs = options->timeoutMs;
    *session = kvcomm::capi::adopt<kvcommArenaSession>(kvcomm::ArenaSession::connect(address, o));
  });
}

kvcommResult_t kvcommArenaSessionDestroy(kvcommArenaSession_t session) {
  return guard("kvcommArenaSessionDestroy",
               [&] { kvcomm::capi::retire(session, "kvcommArenaSessionDestroy", "session"); });
}

kvcommResult_t kvcommArenaSessionPeerPid(kvcommArenaSession_t session, int* pid) {
  return query("kvcommArenaSessionPeerPid", pid, "pid",
               [&](const char* call) { return getSession(session, call).peerPid(); });
}

kvcommResult_t kvcommArenaSessionPeerUid(kvcommArenaSession_t session, uint32_t* uid) {
  return query("kvcommArenaSessionPeerUid", uid, "uid",
               [&](const char* call) { return getSession(session, call).peerUid(); });
}

kvcommResult_t kvcommArenaSessionAlive(kvcommArenaSession_t session, int* alive) {
  return query("kvcommArenaSessionAlive", alive, "alive",
               [&](const char* call) { return getSession(session, call).alive() ? 1 : 0; });
}

kvcommResult_t kvcommArenaSessionLostReason(kvcommArenaSession_t session, char* text, size_t textBytes,
                                            size_t* needed) {
  const char* call = "kvcommArenaSessionLostReason";
  return guard(
      call, [&] { kvcomm::capi::copyString(getSession(session, call).lostReason(), text, textBytes, needed, call); });
}

kvcommResult_t kvcommArenaSessionOffer(kvcommArenaSession_t session, kvcommArena_t arena, int64_t ttlMs,
                                       kvcommArenaCapability* capability) {
  const char* call = "kvcommArenaSessionOffer";
  return guard(call, [&] {
    auto& s = getSession(session, call);
    auto& a = getArena(arena, call);
    requireNonNull(capability, call, "capability");
    toC(s.offer(a, ttlMs), capability);
  });
}

kvcommResult_t kvcommArenaSessionImport(kvcommArenaSession_t session, const kvcommArenaCapability* capability,
                                        const kvcommArenaImportOptions* options, kvcommArenaImport_t* import) {
  const char* call = "kvcommArenaSessionImport";
  return guard(call, [&] {
    auto& s = getSession(session, call);
    requireNonNull(capability, call, "capability");
    requireNonNull(import, call, "import");
    kvcomm::ImportOptions o;
    if (options) {
      o.onOwnerLoss = fromC(options->onOwnerLoss, call, "options->onOwnerLoss");
      o.timeoutMs = options->timeoutMs;
    }
    kvcomm::ArenaImport i = s.import(capabilityOf(capability), o);
    *import = kvcomm::capi::adopt<kvcommArenaImport>(std::move(i));
  });
}

kvcommResult_t kvcommArenaSessionSend(kvcommArenaSession_t session, const void* data, size_t bytes) {
  const char* call = "kvcommArenaSessionSend";
  return guard(call, [&] {
    auto& s = getSession(session, call);
    checkCopy(data, bytes, call, "data");
    KVCOMM_CHECK_ARG(bytes <= KVCOMM_ARENA_MAX_MESSAGE_BYTES, call, "bytes ", bytes,
                     " exceeds KVCOMM_ARENA_MAX_MESSAGE_BYTES (", KVCOMM_ARENA_MAX_MESSAGE_BYTES, ")");
    s.send(data, bytes);
  });
}

kvcommResult_t kvcommArenaSessionReceive(kvcommArenaSession_t session, int64_t timeoutMs, void* data, size_t capacity,
                                         size_t* bytes) {
  const char* call = "kvcommArenaSessionReceive";
  return guard(call, [&] {
    auto& h = use(session, call, "session");
    requireNonNull(bytes, call, "bytes");
    KVCOMM_CHECK_ARG(data != nullptr || capacity == 0, call, "data is NULL but capacity is ", capacity);
    // One receiver at a time per handle: a message that did not fit stays first in line for the next call.
    std::lock_guard<std::mutex> lock(h.mu);
    if (!h.pending) h.pending = h.session.receive(timeoutMs);
    const std::vector<uint8_t>& m = *h.pending;
    *bytes = m.size();
    if (m.size() > capacity) return;
    if (!m.empty()) std::memcpy(data, m.data(), m.size());
    h.pending.reset();
  });
}

kvcommResult_t kvcommArenaSessionClose(kvcommArenaSession_t session) {
  return guard("kvcommArenaSessionClose", [&] { getSession(session, "kvcommArenaSessionClose").close(); });
}

// ---- servers ------------------------------------------------------------------------------------------------------

kvcommResult_t kvcommArenaServerListen(const char* address, const kvcommArenaServerOptions* options,
                                       kvcommArenaServer_t* server) {
  const char* call = "kvcommArenaServerListen";
  return guard(call, [&] {
    requireNonNull(server, call, "server");
    kvcomm::ArenaServerOptions o;
    if (options) {
      o.maxSessions = options->maxSessions;
      o.maxPendingHandshakes = options->maxPendingHandshakes;
      o.handshakeTimeoutMs = options->handshakeTimeoutMs;
      o.requestTimeoutMs = options->requestTimeoutMs;
    }
    *server = kvcomm::capi::adopt<kvcommArenaServer>(kvcomm::ArenaServer::listen(address ? address : "", o));
  });
}

kvcommResult_t kvcommArenaServerDestroy(kvcommArenaServer_t server) {
  return guard("kvcommArenaServerDestroy", [&] { kvcomm::capi::retire(server, "kvcommArenaServerDestroy", "server"); });
}

kvcommResult_t kvcommArenaServerAddress(kvcommArenaServer_t server, char* text, size_t textBytes, size_t* needed) {
  const char* call = "kvcommArenaServerAddress";
  return guard(call,
               [&] { kvcomm::capi::copyString(getServer(server, call).address(), text, textBytes, needed, call); });
}

kvcommResult_t kvcommArenaServerAccept(kvcommArenaServer_t server, int64_t timeoutMs, kvcommArenaSession_t* session) {
  const char* call = "kvcommArenaServerAccept";
  return guard(call, [&] {
    auto& s = getServer(server, call);
    requireNonNull(session, call, "session");
    kvcomm::ArenaSession a = s.accept(timeoutMs);
    *session = kvcomm::capi::adopt<kvcommArenaSession>(std::move(a));
  });
}

kvcommResult_t kvcommArenaServerSessions(kvcommArenaServer_t server, size_t* sessions) {
  return query("kvcommArenaServerSessions", sessions, "sessions",
               [&](const char* call) { return getServer(server, call).sessions(); });
}

kvcommResult_t kvcommArenaServerRefusedConnections(kvcommArenaServer_t server, uint64_t* refused) {
  return query("kvcommArenaServerRefusedConnections", refused, "refused",
               [&](const char* call) { return getServer(server, call).refusedConnections(); });
}

kvcommResult_t kvcommArenaServerClose(kvcommArenaServer_t server) {
  return guard("kvcommArenaServerClose", [&] { getServer(server, "kvcommArenaServerClose").close(); });
}

}  // extern "C"
