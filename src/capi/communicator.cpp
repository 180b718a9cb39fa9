// C ABI: communicator handles, split, collectives, topology.
#include <algorithm>

#include "capi/capi.hpp"
#include "common/check.hpp"

using kvcomm::capi::guard;
using kvcomm::capi::query;
using kvcomm::capi::requireNonNull;
using kvcomm::capi::use;

namespace {

kvcomm::Communicator& get(kvcommComm_t comm, const char* call) {
  return use(comm, call, "comm").comm;
}

void checkMember(kvcomm::Communicator& c, int r, const char* call) {
  KVCOMM_CHECK_ARG(r >= 0 && r < c.size(), call, "rank ", r, " outside [0, ", c.size(), ")");
}

template <size_t N>
void copyField(char (&dst)[N], const std::string& s) {
  size_t n = std::min(s.size(), N - 1);
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

}  // namespace

extern "C" {

kvcommResult_t kvcommCommDestroy(kvcommComm_t comm) {
  return guard("kvcommCommDestroy", [&] { kvcomm::capi::retire(comm, "kvcommCommDestroy", "comm"); });
}

kvcommResult_t kvcommCommRank(kvcommComm_t comm, int* rank) {
  return query("kvcommCommRank", rank, "rank", [&](const char* call) { return get(comm, call).rank(); });
}

kvcommResult_t kvcommCommSize(kvcommComm_t comm, int* size) {
  return query("kvcommCommSize", size, "size", [&](const char* call) { return get(comm, call).size(); });
}

kvcommResult_t kvcommCommWorldRank(kvcommComm_t comm, int rank, int* worldRank) {
  return query("kvcommCommWorldRank", worldRank, "worldRank",
               [&](const char* call) { return get(comm, call).worldRank(rank); });
}

kvcommResult_t kvcommCommId(kvcommComm_t comm, uint64_t* id) {
  return query("kvcommCommId", id, "id", [&](const char* call) { return get(comm, call).id(); });
}

kvcommResult_t kvcommCommAbort(kvcommComm_t comm) {
  return guard("kvcommCommAbort", [&] { get(comm, "kvcommCommAbort").abort(); });
}

kvcommResult_t kvcommCommHealth(kvcommComm_t comm, int* healthy, int* failedRank) {
  return guard("kvcommCommHealth", [&] {
    auto& c = get(comm, "kvcommCommHealth");
    if (healthy) *healthy = c.healthy() ? 1 : 0;
    if (failedRank) *failedRank = c.failedRank();
  });
}

kvcommResult_t kvcommCommSplit(kvcommComm_t comm, int color, int key, kvcommComm_t* out) {
  return guard("kvcommCommSplit", [&] {
    auto& c = get(comm, "kvcommCommSplit");
    requireNonNull(out, "kvcommCommSplit", "out");
    auto child = c.split(color, key);
    *out = child ? kvcomm::capi::adopt<kvcommComm>(std::move(*child)) : nullptr;
  });
}

kvcommResult_t kvcommCommAllgather(kvcommComm_t comm, void* data, size_t bytesPerRank) {
  return guard("kvcommCommAllgather", [&] {
    auto& c = get(comm, "kvcommCommAllgather");
    KVCOMM_CHECK_ARG(data != nullptr || bytesPerRank == 0, "kvcommCommAllgather", "data is NULL");
    KVCOMM_CHECK_ARG(bytesPerRank <= SIZE_MAX / static_cast<size_t>(c.size()), "kvcommCommAllgather", "bytesPerRank ",
                     bytesPerRank, " times ", c.size(), " members overflows the address space");
    c.allgather(data, bytesPerRank);
  });
}

kvcommResult_t kvcommCommBarrier(kvcommComm_t comm) {
  return guard("kvcommCommBarrier", [&] { get(comm, "kvcommCommBarrier").barrier(); });
}

kvcommResult_t kvcommCommSend(kvcommComm_t comm, const void* data, size_t bytes, int peer, uint32_t tag) {
  return guard("kvcommCommSend", [&] {
    auto& c = get(comm, "kvcommCommSend");
    KVCOMM_CHECK_ARG(data != nullptr || bytes == 0, "kvcommCommSend", "data is NULL");
    c.send(data, bytes, peer, tag);
  });
}

kvcommResult_t kvcommCommRecv(kvcommComm_t comm, void* data, size_t bytes, int peer, uint32_t tag) {
  return guard("kvcommCommRecv", [&] {
    auto& c = get(comm, "kvcommCommRecv");
    KVCOMM_CHECK_ARG(data != nullptr || bytes == 0, "kvcommCommRecv", "data is NULL");
    c.recv(data, bytes, peer, tag);
  });
}

kvcommResult_t kvcommCommNumHosts(kvcommComm_t comm, int* numHosts) {
  return query("kvcommCommNumHosts", numHosts, "numHosts",
               [&](const char* call) { return get(comm, call).topology().numHosts; });
}

kvcommResult_t kvcommCommMember(kvcommComm_t comm, int rank, kvcommMemberInfo* info) {
  return guard("kvcommCommMember", [&] {
    auto& c = get(comm, "kvcommCommMember");
    requireNonNull(info, "kvcommCommMember", "info");
    checkMember(c, rank, "kvcommCommMember");
    const kvcomm::MemberInfo& m = c.topology().members[static_cast<size_t>(rank)];
    kvcommMemberInfo out{};
    out.rank = m.rank;
    out.worldRank = m.worldRank;
    out.pid = m.pid;
    out.hostIndex = m.hostIndex;
    out.localRank = m.localRank;
    out.localSize = m.localSize;
    out.gpuDevice = m.gpu.device;
    copyField(out.hostname, m.hostname);
    copyField(out.gpuUuid, m.gpu.uuid);
    copyField(out.gpuPciBusId, m.gpu.pciBusId);
    *info = out;
  });
}

kvcommResult_t kvcommCommSameHost(kvcommComm_t comm, int a, int b, int* same) {
  return guard("kvcommCommSameHost", [&] {
    auto& c = get(comm, "kvcommCommSameHost");
    requireNonNull(same, "kvcommCommSameHost", "same");
    checkMember(c, a, "kvcommCommSameHost");
    checkMember(c, b, "kvcommCommSameHost");
    *same = c.topology().sameHost(a, b) ? 1 : 0;
  });
}

kvcommResult_t kvcommCommCanAccessPeer(kvcommComm_t comm, int a, int b, int* canAccess) {
  return guard("kvcommCommCanAccessPeer", [&] {
    auto& c = get(comm, "kvcommCommCanAccessPeer");
    requireNonNull(canAccess, "kvcommCommCanAccessPeer", "canAccess");
    checkMember(c, a, "kvcommCommCanAccessPeer");
    checkMember(c, b, "kvcommCommCanAccessPeer");
    *canAccess = c.topology().canAccessPeer(a, b) ? 1 : 0;
  });
}

kvcommResult_t kvcommCommTopologyString(kvcommComm_t comm, char* text, size_t textBytes, size_t* needed) {
  return guard("kvcommCommTopologyString", [&] {
    auto& c = get(comm, "kvcommCommTopologyString");
    kvcomm::capi::copyString(c.topology().toString(), text, textBytes, needed, "kvcommCommTopologyString");
  });
}

}  // extern "C"
