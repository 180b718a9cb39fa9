// C ABI: endpoints (kvcomm::Endpoint): registrations and their metadata, peers connected from metadata, polled and
// device-id transfers, notifications. Endpoints have no rank: their handles name none ("[rank ?]").
#include <algorithm>
#include <cstring>
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

namespace {

kvcomm::Endpoint& getEndpoint(kvcommEndpoint_t endpoint, const char* call) {
  return use(endpoint, call, "endpoint").endpoint;
}
kvcomm::Registration& getRegistration(kvcommRegistration_t registration, const char* call,
                                      const char* what = "registration") {
  return use(registration, call, what).registration;
}
kvcomm::RemoteMemory& getRemote(kvcommRemoteMemory_t remote, const char* call) {
  return use(remote, call, "remote").remote;
}
kvcommTransfer& getTransfer(kvcommTransfer_t transfer, const char* call) {
  return use(transfer, call, "transfer");
}

kvcomm::RegisterOptions registerOptions(kvcommAccess_t access, const char* call) {
  kvcomm::RegisterOptions o;
  o.access = fromC(access, call, "access");
  return o;
}

void checkMessage(const void* message, size_t bytes, const char* call, const char* what, const char* sizeName) {
  KVCOMM_CHECK_ARG(message != nullptr || bytes == 0, call, what, " is NULL but ", sizeName, " is ", bytes);
  KVCOMM_CHECK_ARG(bytes <= kvcomm::kMaxNotificationBytes, call, sizeName, " ", bytes,
                   " is past KVCOMM_MAX_NOTIFICATION_BYTES (", kvcomm::kMaxNotificationBytes, ")");
}

kvcomm::TransferOptions transferOptionsOf(const kvcommTransferOptions* o, const char* call) {
  kvcomm::TransferOptions out;
  if (o) {
    out.via = fromC(o->via, call, "options->via");
    checkMessage(o->notify, o->notifyBytes, call, "options->notify", "options->notifyBytes");
    if (o->notify) out.notify = std::string(static_cast<const char*>(o->notify), o->notifyBytes);
  }
  return out;
}

// read() and write() share their checks: the ids are counted against the limit table before anything reads them.
kvcommResult_t transfer(const char* call, bool push, kvcommEndpoint_t endpoint, kvcommRegistration_t local,
                        kvcommRemoteMemory_t remote, const int64_t* remoteBlocks, const int64_t* localBlocks,
                        size_t count, const kvcommTransferOptions* options, kvcommTransfer_t* out) {
  return guard(call, [&] {
    kvcomm::Endpoint& e = getEndpoint(endpoint, call);
    const kvcomm::Registration& l = getRegistration(local, call, "local");
    const kvcomm::RemoteMemory& r = getRemote(remote, call);
    requireNonNull(out, call, "transfer");
    kvcomm::capi::checkCount(count, lim::kMaxFetchPairs, call, "count", "KVCOMM_MAX_FETCH_PAIRS");
    KVCOMM_CHECK_ARG(count == 0 || (remoteBlocks != nullptr && localBlocks != nullptr), call, count,
                     " pairs but remoteBlocks or localBlocks is NULL");
    kvcomm::TransferOptions o = transferOptionsOf(options, call);
    kvcomm::Transfer t =
        push ? e.write(l, r, remoteBlocks, localBlocks, count, o) : e.read(l, r, remoteBlocks, localBlocks, count, o);
    *out = kvcomm::capi::adopt<kvcommTransfer>(std::move(t));
  });
}

kvcommResult_t deviceTransfer(const char* call, bool push, kvcommEndpoint_t endpoint, kvcommRegistration_t local,
                              kvcommRemoteMemory_t remote, const kvcommDeviceTransferBatch* batch,
                              kvcommStream_t stream) {
  return guard(call, [&] {
    kvcomm::Endpoint& e = getEndpoint(endpoint, call);
    const kvcomm::Registration& l = getRegistration(local, call, "local");
    const kvcomm::RemoteMemory& r = getRemote(remote, call);
    requireNonNull(batch, call, "batch");
    kvcomm::capi::checkCount(batch->count, lim::kMaxFetchPairs, call, "batch->count", "KVCOMM_MAX_FETCH_PAIRS");
    KVCOMM_CHECK_ARG(batch->count == 0 || (batch->remoteBlocks != nullptr && batch->localBlocks != nullptr), call,
                     "batch->count is ", batch->count, " but batch->remoteBlocks or batch->localBlocks is NULL");
    kvcomm::DeviceTransferBatch b{batch->remoteBlocks, batch->localBlocks, batch->count};
    if (push)
      e.writeDevice(l, r, b, stream);
    else
      e.readDevice(l, r, b, stream);
  });
}

}  // namespace

extern "C" {

kvcommResult_t kvcommEndpointOptionsInit(kvcommEndpointOptions* options) {
  return guard("kvcommEndpointOptionsInit", [&] {
    requireNonNull(options, "kvcommEndpointOptionsInit", "options");
    kvcomm::EndpointOptions d;
    options->name = nullptr;
    options->tcpAddress = nullptr;
    options->timeoutMs = d.timeoutMs;
    options->connectionsPerPeer = d.connectionsPerPeer;
    options->maxQueuedNotifications = d.maxQueuedNotifications;
  });
}

kvcommResult_t kvcommTransferOptionsInit(kvcommTransferOptions* options) {
  return guard("kvcommTransferOptionsInit", [&] {
    requireNonNull(options, "kvcommTransferOptionsInit", "options");
    *options = kvcommTransferOptions{};
    options->via = kvcommTransferViaAuto;
  });
}

kvcommResult_t kvcommEndpointCreate(const kvcommEndpointOptions* options, kvcommEndpoint_t* endpoint) {
  const char* call = "kvcommEndpointCreate";
  return guard(call, [&] {
    requireNonNull(endpoint, call, "endpoint");
    kvcomm::EndpointOptions o;
    if (options) {
      o.name = options->name ? options->name : "";
      o.tcpAddress = options->tcpAddress ? options->tcpAddress : "";
      o.timeoutMs = options->timeoutMs;
      o.connectionsPerPeer = options->connectionsPerPeer;
      o.maxQueuedNotifications = options->maxQueuedNotifications;
    }
    *endpoint = kvcomm::capi::adopt<kvcommEndpoint>(kvcomm::Endpoint::create(o));
  });
}

kvcommResult_t kvcommEndpointDestroy(kvcommEndpoint_t endpoint) {
  return guard("kvcommEndpointDestroy", [&] {
    if (endpoint) getEndpoint(endpoint, "kvcommEndpointDestroy").close();
    kvcomm::capi::retire(endpoint, "kvcommEndpointDestroy", "endpoint");
  });
}

kvcommResult_t kvcommEndpointClose(kvcommEndpoint_t endpoint) {
  return guard("kvcommEndpointClose", [&] { getEndpoint(endpoint, "kvcommEndpointClose").close(); });
}

kvcommResult_t kvcommEndpointId(kvcommEndpoint_t endpoint, uint64_t* id) {
  return query("kvcommEndpointId", id, "id", [&](const char* call) { return getEndpoint(endpoint, call).id(); });
}

kvcommResult_t kvcommEndpointAddress(kvcommEndpoint_t endpoint, char* text, size_t textBytes, size_t* needed) {
  const char* call = "kvcommEndpointAddress";
  return guard(call,
               [&] { kvcomm::capi::copyString(getEndpoint(endpoint, call).address(), text, textBytes, needed, call); });
}

// ---- registrations ------------------------------------------------------------------------------------------------

namespace {

kvcommResult_t registerMemory(const char* call, kvcommEndpoint_t endpoint, void* base, size_t bytes,
                              kvcommMemoryKind_t kind, int device, const kvcommKvRegion* regions, size_t numRegions,
                              uint64_t version, kvcommAccess_t access, const kvcommKvContents* contents,
                              size_t numContents, kvcommRegistration_t* registration) {
  return guard(call, [&] {
    kvcomm::Endpoint& e = getEndpoint(endpoint, call);
    requireNonNull(registration, call, "registration");
    kvcomm::MemoryKind k = fromC(kind, call, "kind");
    KVCOMM_CHECK_ARG(k != kvcomm::MemoryKind::Auto, call,
                     "kind kvcommMemoryAuto: say which memory it is (kvcommMemoryHost or kvcommMemoryCuda)");
    kvcomm::KvLayout l = kvcomm::capi::fetchLayoutOf(regions, numRegions, version, call);
    kvcomm::RegisterOptions o = registerOptions(access, call);
    o.contents = kvcomm::capi::descriptionOf(contents, numContents, call, "contents");
    *registration = kvcomm::capi::adopt<kvcommRegistration>(e.registerMemory(base, bytes, k, l, device, o));
  });
}

}  // namespace

kvcommResult_t kvcommEndpointRegister(kvcommEndpoint_t endpoint, void* base, size_t bytes, kvcommMemoryKind_t kind,
                                      int device, const kvcommKvRegion* regions, size_t numRegions, uint64_t version,
                                      kvcommAccess_t access, kvcommRegistration_t* registration) {
  return registerMemory("kvcommEndpointRegister", endpoint, base, bytes, kind, device, regions, numRegions, version,
                        access, nullptr, 0, registration);
}

kvcommResult_t kvcommEndpointRegisterDescribed(kvcommEndpoint_t endpoint, void* base, size_t bytes,
                                               kvcommMemoryKind_t kind, int device, const kvcommKvRegion* regions,
                                               size_t numRegions, uint64_t version, kvcommAccess_t access,
                                               const kvcommKvContents* contents, size_t numContents,
                                               kvcommRegistration_t* registration) {
  const char* call = "kvcommEndpointRegisterDescribed";
  if (numContents == 0)  // described must mean described
    return guard(call, [&] { KVCOMM_THROW(InvalidArgument, call, "numContents is 0: use kvcommEndpointRegister"); });
  return registerMemory(call, endpoint, base, bytes, kind, device, regions, numRegions, version, access, contents,
                        numContents, registration);
}

kvcommResult_t kvcommEndpointRegisterArena(kvcommEndpoint_t endpoint, kvcommArena_t arena, kvcommAccess_t access,
                                           kvcommRegistration_t* registration) {
  const char* call = "kvcommEndpointRegisterArena";
  return guard(call, [&] {
    kvcomm::Endpoint& e = getEndpoint(endpoint, call);
    kvcomm::Arena& a = use(arena, call, "arena").arena;
    requireNonNull(registration, call, "registration");
    kvcomm::RegisterOptions o = registerOptions(access, call);
    *registration = kvcomm::capi::adopt<kvcommRegistration>(e.registerArena(a, o));
  });
}

kvcommResult_t kvcommEndpointRegisterBuffer(kvcommEndpoint_t endpoint, kvcommBuffer_t buffer,
                                            const kvcommKvRegion* regions, size_t numRegions, uint64_t version,
                                            kvcommAccess_t access, kvcommRegistration_t* registration) {
  const char* call = "kvcommEndpointRegisterBuffer";
  return guard(call, [&] {
    kvcomm::Endpoint& e = getEndpoint(endpoint, call);
    const kvcomm::SymmetricBuffer& b = use(buffer, call, "buffer").buffer;
    kvcomm::capi::CallFrame::nameRank(-1);
    requireNonNull(registration, call, "registration");
    kvcomm::KvLayout l = kvcomm::capi::fetchLayoutOf(regions, numRegions, version, call);
    kvcomm::RegisterOptions o = registerOptions(access, call);
    *registration = kvcomm::capi::adopt<kvcommRegistration>(e.registerBuffer(b, l, o));
  });
}

kvcommResult_t kvcommEndpointUnregister(kvcommEndpoint_t endpoint, kvcommRegistration_t registration,
                                        int64_t timeoutMs) {
  const char* call = "kvcommEndpointUnregister";
  return guard(call, [&] {
    kvcomm::Endpoint& e = getEndpoint(endpoint, call);
    e.unregister(getRegistration(registration, call), timeoutMs);
  });
}

kvcommResult_t kvcommRegistrationDestroy(kvcommRegistration_t registration) {
  return guard("kvcommRegistrationDestroy",
               [&] { kvcomm::capi::retire(registration, "kvcommRegistrationDestroy", "registration"); });
}

kvcommResult_t kvcommRegistrationMetadata(kvcommRegistration_t registration, void* metadata, size_t capacity,
                                          size_t* bytes) {
  const char* call = "kvcommRegistrationMetadata";
  return guard(call, [&] {
    const kvcomm::Registration& r = getRegistration(registration, call);
    requireNonNull(bytes, call, "bytes");
    KVCOMM_CHECK_ARG(metadata != nullptr || capacity == 0, call, "metadata is NULL but capacity is ", capacity);
    std::vector<uint8_t> md = r.metadata();
    *bytes = md.size();
    if (md.size() <= capacity) std::memcpy(metadata, md.data(), md.size());
  });
}

kvcommResult_t kvcommRegistrationRevoke(kvcommRegistration_t registration) {
  return guard("kvcommRegistrationRevoke", [&] { getRegistration(registration, "kvcommRegistrationRevoke").revoke(); });
}

kvcommResult_t kvcommRegistrationId(kvcommRegistration_t registration, uint64_t* id) {
  return query("kvcommRegistrationId", id, "id",
               [&](const char* call) { return getRegistration(registration, call).id(); });
}

kvcommResult_t kvcommRegistrationGeneration(kvcommRegistration_t registration, uint64_t* generation) {
  return query("kvcommRegistrationGeneration", generation, "generation",
               [&](const char* call) { return getRegistration(registration, call).generation(); });
}

kvcommResult_t kvcommRegistrationRegistered(kvcommRegistration_t registration, int* registered) {
  return query("kvcommRegistrationRegistered", registered, "registered",
               [&](const char* call) { return getRegistration(registration, call).registered() ? 1 : 0; });
}

// ---- peers --------------------------------------------------------------------------------------------------------

kvcommResult_t kvcommEndpointConnect(kvcommEndpoint_t endpoint, const void* metadata, size_t bytes,
                                     kvcommRemoteMemory_t* remote) {
  const char* call = "kvcommEndpointConnect";
  return guard(call, [&] {
    kvcomm::Endpoint& e = getEndpoint(endpoint, call);
    requireNonNull(remote, call, "remote");
    KVCOMM_CHECK_ARG(metadata != nullptr || bytes == 0, call, "metadata is NULL but bytes is ", bytes);
    *remote = kvcomm::capi::adopt<kvcommRemoteMemory>(e.connect(metadata, bytes));
  });
}

kvcommResult_t kvcommEndpointDisconnect(kvcommEndpoint_t endpoint, kvcommRemoteMemory_t remote) {
  const char* call = "kvcommEndpointDisconnect";
  return guard(call, [&] {
    kvcomm::Endpoint& e = getEndpoint(endpoint, call);
    e.disconnect(getRemote(remote, call));
  });
}

kvcommResult_t kvcommRemoteMemoryDestroy(kvcommRemoteMemory_t remote) {
  return guard("kvcommRemoteMemoryDestroy",
               [&] { kvcomm::capi::retire(remote, "kvcommRemoteMemoryDestroy", "remote"); });
}

kvcommResult_t kvcommRemoteMemoryId(kvcommRemoteMemory_t remote, uint64_t* id, uint64_t* generation) {
  const char* call = "kvcommRemoteMemoryId";
  return guard(call, [&] {
    const kvcomm::RemoteMemory& r = getRemote(remote, call);
    requireNonNull(id, call, "id");
    requireNonNull(generation, call, "generation");
    *id = r.id();
    *generation = r.generation();
  });
}

kvcommResult_t kvcommRemoteMemoryLayout(kvcommRemoteMemory_t remote, kvcommKvRegion* regions, size_t capacity,
                                        size_t* count, uint64_t* version) {
  const char* call = "kvcommRemoteMemoryLayout";
  return guard(call, [&] {
    kvcomm::capi::copyLayout(getRemote(remote, call).layout(), regions, capacity, count, version, call);
  });
}

kvcommResult_t kvcommRemoteMemoryKind(kvcommRemoteMemory_t remote, kvcommMemoryKind_t* kind, kvcommAccess_t* access) {
  const char* call = "kvcommRemoteMemoryKind";
  return guard(call, [&] {
    const kvcomm::RemoteMemory& r = getRemote(remote, call);
    if (kind) *kind = kvcomm::capi::toC<kvcommMemoryKind_t>(r.kind());
    if (access) *access = kvcomm::capi::toC<kvcommAccess_t>(r.access());
  });
}

kvcommResult_t kvcommRemoteMemoryPeerName(kvcommRemoteMemory_t remote, char* text, size_t textBytes, size_t* needed) {
  const char* call = "kvcommRemoteMemoryPeerName";
  return guard(call,
               [&] { kvcomm::capi::copyString(getRemote(remote, call).peerName(), text, textBytes, needed, call); });
}

// ---- transfers ----------------------------------------------------------------------------------------------------

kvcommResult_t kvcommEndpointRead(kvcommEndpoint_t endpoint, kvcommRegistration_t local, kvcommRemoteMemory_t remote,
                                  const int64_t* remoteBlocks, const int64_t* localBlocks, size_t count,
                                  const kvcommTransferOptions* options, kvcommTransfer_t* transfer) {
  return ::transfer("kvcommEndpointRead", false, endpoint, local, remote, remoteBlocks, localBlocks, count, options,
                    transfer);
}

kvcommResult_t kvcommEndpointWrite(kvcommEndpoint_t endpoint, kvcommRegistration_t local, kvcommRemoteMemory_t remote,
                                   const int64_t* remoteBlocks, const int64_t* localBlocks, size_t count,
                                   const kvcommTransferOptions* options, kvcommTransfer_t* transfer) {
  return ::transfer("kvcommEndpointWrite", true, endpoint, local, remote, remoteBlocks, localBlocks, count, options,
                    transfer);
}

kvcommResult_t kvcommTransferTest(kvcommTransfer_t transfer, kvcommFetchStatus* status) {
  const char* call = "kvcommTransferTest";
  return guard(call, [&] {
    kvcommTransfer& t = getTransfer(transfer, call);
    requireNonNull(status, call, "status");
    t.status.record(t.transfer.test(), status);
  });
}

kvcommResult_t kvcommTransferWait(kvcommTransfer_t transfer, int64_t timeoutMs, kvcommFetchStatus* status) {
  const char* call = "kvcommTransferWait";
  return guard(call, [&] {
    kvcommTransfer& t = getTransfer(transfer, call);
    requireNonNull(status, call, "status");
    t.status.record(t.transfer.wait(timeoutMs), status);
  });
}

kvcommResult_t kvcommTransferFailedBlocks(kvcommTransfer_t transfer, int64_t* blocks, size_t capacity, size_t* count) {
  const char* call = "kvcommTransferFailedBlocks";
  return guard(call, [&] { getTransfer(transfer, call).status.failedBlocks(blocks, capacity, count, call); });
}

kvcommResult_t kvcommTransferError(kvcommTransfer_t transfer, char* text, size_t textBytes, size_t* needed) {
  const char* call = "kvcommTransferError";
  return guard(call, [&] { getTransfer(transfer, call).status.error(text, textBytes, needed, call); });
}

kvcommResult_t kvcommTransferGetInfo(kvcommTransfer_t transfer, kvcommFetchPlanInfo* info) {
  const char* call = "kvcommTransferGetInfo";
  return guard(call, [&] {
    kvcommTransfer& t = getTransfer(transfer, call);
    requireNonNull(info, call, "info");
    kvcomm::capi::toC(t.transfer.info(), info);
  });
}

kvcommResult_t kvcommTransferTransport(kvcommTransfer_t transfer, kvcommFetchTransport_t* transport) {
  return query("kvcommTransferTransport", transport, "transport", [&](const char* call) {
    return kvcomm::capi::toC<kvcommFetchTransport_t>(getTransfer(transfer, call).transfer.transport());
  });
}

kvcommResult_t kvcommTransferDestroy(kvcommTransfer_t transfer) {
  return guard("kvcommTransferDestroy", [&] { kvcomm::capi::retire(transfer, "kvcommTransferDestroy", "transfer"); });
}

kvcommResult_t kvcommEndpointReadDevice(kvcommEndpoint_t endpoint, kvcommRegistration_t local,
                                        kvcommRemoteMemory_t remote, const kvcommDeviceTransferBatch* batch,
                                        kvcommStream_t stream) {
  return deviceTransfer("kvcommEndpointReadDevice", false, endpoint, local, remote, batch, stream);
}

kvcommResult_t kvcommEndpointWriteDevice(kvcommEndpoint_t endpoint, kvcommRegistration_t local,
                                         kvcommRemoteMemory_t remote, const kvcommDeviceTransferBatch* batch,
                                         kvcommStream_t stream) {
  return deviceTransfer("kvcommEndpointWriteDevice", true, endpoint, local, remote, batch, stream);
}

kvcommResult_t kvcommEndpointPollError(kvcommEndpoint_t endpoint, kvcommRegistration_t local,
                                       kvcommRemoteMemory_t remote, kvcommDeviceError* error) {
  const char* call = "kvcommEndpointPollError";
  return guard(call, [&] {
    kvcomm::Endpoint& e = getEndpoint(endpoint, call);
    const kvcomm::Registration& l = getRegistration(local, call, "local");
    const kvcomm::RemoteMemory& r = getRemote(remote, call);
    requireNonNull(error, call, "error");
    kvcomm::capi::toC(e.pollError(l, r), error);
  });
}

// ---- notifications ------------------------------------------------------------------------------------------------

kvcommResult_t kvcommEndpointNotify(kvcommEndpoint_t endpoint, kvcommRemoteMemory_t remote, const void* message,
                                    size_t bytes) {
  const char* call = "kvcommEndpointNotify";
  return guard(call, [&] {
    kvcomm::Endpoint& e = getEndpoint(endpoint, call);
    const kvcomm::RemoteMemory& r = getRemote(remote, call);
    checkMessage(message, bytes, call, "message", "bytes");
    e.notify(r, std::string(static_cast<const char*>(message), bytes));
  });
}

kvcommResult_t kvcommEndpointNextNotification(kvcommEndpoint_t endpoint, int64_t timeoutMs, kvcommNotification* info,
                                              void* message, size_t capacity, int* received) {
  const char* call = "kvcommEndpointNextNotification";
  return guard(call, [&] {
    kvcommEndpoint& h = use(endpoint, call, "endpoint");
    requireNonNull(info, call, "info");
    requireNonNull(received, call, "received");
    KVCOMM_CHECK_ARG(message != nullptr || capacity == 0, call, "message is NULL but capacity is ", capacity);
    // One taker at a time per handle: notifications the endpoint handed over wait here in order, and one that did
    // not fit stays first for the next call.
    std::lock_guard<std::mutex> lock(h.mu);
    if (h.taken.empty())
      for (kvcomm::Notification& n : h.endpoint.notifications(timeoutMs)) h.taken.push_back(std::move(n));
    *received = 0;
    if (h.taken.empty()) return;
    const kvcomm::Notification& n = h.taken.front();
    kvcommNotification c{};
    c.from = n.from;
    size_t name = std::min(n.fromName.size(), sizeof(c.fromName) - 1);
    std::memcpy(c.fromName, n.fromName.data(), name);
    c.registration = n.registration;
    c.messageBytes = n.message.size();
    *info = c;
    *received = 1;
    if (n.message.size() > capacity) return;
    if (!n.message.empty()) std::memcpy(message, n.message.data(), n.message.size());
    h.taken.pop_front();
  });
}

}  // extern "C"
