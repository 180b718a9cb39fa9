// C ABI: SymmetricBuffer (create/adopt, growth, commit/release, pointers and tables).
#include <vector>

#include "capi/capi.hpp"
#include "common/check.hpp"

using kvcomm::capi::fromC;
using kvcomm::capi::guard;
using kvcomm::capi::query;
using kvcomm::capi::requireNonNull;
using kvcomm::capi::use;

namespace {

kvcomm::SymmetricBuffer& get(kvcommBuffer_t buffer, const char* call) {
  return use(buffer, call, "buffer").buffer;
}

std::vector<kvcomm::Range> rangesOf(const kvcommRange* ranges, size_t n, const char* call) {
  KVCOMM_CHECK_ARG(ranges != nullptr || n == 0, call, "ranges is NULL but numRanges is ", n);
  kvcomm::capi::checkCount(n, kvcomm::limits::kMaxBufferRanges, call, "numRanges", "KVCOMM_MAX_BUFFER_RANGES");
  std::vector<kvcomm::Range> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = {ranges[i].offset, ranges[i].bytes};
  return out;
}

}  // namespace

extern "C" {

kvcommResult_t kvcommBufferCreate(kvcommComm_t comm, size_t capacity, size_t initialBytes, kvcommMemoryKind_t kind,
                                  kvcommBuffer_t* buffer) {
  return guard("kvcommBufferCreate", [&] {
    const char* call = "kvcommBufferCreate";
    auto& c = use(comm, call, "comm").comm;
    kvcomm::MemoryKind k{};
    kvcomm::capi::agreeOnArguments(c, call, [&] {
      requireNonNull(buffer, call, "buffer");
      k = fromC(kind, call, "kind");
    });
    *buffer = kvcomm::capi::adopt<kvcommBuffer>(kvcomm::SymmetricBuffer::create(c, capacity, initialBytes, k));
  });
}

kvcommResult_t kvcommBufferAdopt(kvcommComm_t comm, void* base, size_t reservedBytes, kvcommMemoryKind_t kind,
                                 kvcommBuffer_t* buffer) {
  return guard("kvcommBufferAdopt", [&] {
    const char* call = "kvcommBufferAdopt";
    auto& c = use(comm, call, "comm").comm;
    kvcomm::MemoryKind k{};
    kvcomm::capi::agreeOnArguments(c, call, [&] {
      requireNonNull(buffer, call, "buffer");
      k = fromC(kind, call, "kind");
    });
    *buffer = kvcomm::capi::adopt<kvcommBuffer>(kvcomm::SymmetricBuffer::adopt(c, base, reservedBytes, k));
  });
}

kvcommResult_t kvcommBufferDestroy(kvcommBuffer_t buffer) {
  return guard("kvcommBufferDestroy", [&] { kvcomm::capi::retire(buffer, "kvcommBufferDestroy", "buffer"); });
}

kvcommResult_t kvcommBufferGrow(kvcommBuffer_t buffer, size_t newBytes) {
  return guard("kvcommBufferGrow", [&] { get(buffer, "kvcommBufferGrow").grow(newBytes); });
}

kvcommResult_t kvcommBufferCommit(kvcommBuffer_t buffer, const kvcommRange* ranges, size_t numRanges) {
  return guard("kvcommBufferCommit", [&] {
    const char* call = "kvcommBufferCommit";
    auto& b = get(buffer, call);
    std::vector<kvcomm::Range> r;
    kvcomm::capi::agreeOnArguments(b.communicator(), call, [&] { r = rangesOf(ranges, numRanges, call); });
    b.commit(r);
  });
}

kvcommResult_t kvcommBufferRelease(kvcommBuffer_t buffer, const kvcommRange* ranges, size_t numRanges) {
  return guard("kvcommBufferRelease", [&] {
    const char* call = "kvcommBufferRelease";
    auto& b = get(buffer, call);
    std::vector<kvcomm::Range> r;
    kvcomm::capi::agreeOnArguments(b.communicator(), call, [&] { r = rangesOf(ranges, numRanges, call); });
    b.release(r);
  });
}

kvcommResult_t kvcommBufferClose(kvcommBuffer_t buffer) {
  return guard("kvcommBufferClose", [&] { get(buffer, "kvcommBufferClose").close(); });
}

kvcommResult_t kvcommBufferLocal(kvcommBuffer_t buffer, void** ptr) {
  return query("kvcommBufferLocal", ptr, "ptr", [&](const char* call) { return get(buffer, call).local(); });
}

kvcommResult_t kvcommBufferPeer(kvcommBuffer_t buffer, int rank, void** ptr) {
  return guard("kvcommBufferPeer", [&] {
    auto& b = get(buffer, "kvcommBufferPeer");
    requireNonNull(ptr, "kvcommBufferPeer", "ptr");
    KVCOMM_CHECK_ARG(rank >= 0 && rank < b.size(), "kvcommBufferPeer", "rank ", rank, " outside [0, ", b.size(), ")");
    *ptr = b.peer(rank);
  });
}

kvcommResult_t kvcommBufferIsMapped(kvcommBuffer_t buffer, int rank, int* mapped) {
  return guard("kvcommBufferIsMapped", [&] {
    auto& b = get(buffer, "kvcommBufferIsMapped");
    requireNonNull(mapped, "kvcommBufferIsMapped", "mapped");
    KVCOMM_CHECK_ARG(rank >= 0 && rank < b.size(), "kvcommBufferIsMapped", "rank ", rank, " outside [0, ", b.size(),
                     ")");
    *mapped = b.isMapped(rank) ? 1 : 0;
  });
}

kvcommResult_t kvcommBufferRank(kvcommBuffer_t buffer, int* rank) {
  return query("kvcommBufferRank", rank, "rank", [&](const char* call) { return get(buffer, call).rank(); });
}

kvcommResult_t kvcommBufferSize(kvcommBuffer_t buffer, int* size) {
  return query("kvcommBufferSize", size, "size", [&](const char* call) { return get(buffer, call).size(); });
}

kvcommResult_t kvcommBufferCapacity(kvcommBuffer_t buffer, size_t* bytes) {
  return query("kvcommBufferCapacity", bytes, "bytes", [&](const char* call) { return get(buffer, call).capacity(); });
}

kvcommResult_t kvcommBufferMappedBytes(kvcommBuffer_t buffer, size_t* bytes) {
  return query("kvcommBufferMappedBytes", bytes, "bytes",
               [&](const char* call) { return get(buffer, call).mappedBytes(); });
}

kvcommResult_t kvcommBufferIsBacked(kvcommBuffer_t buffer, size_t offset, size_t bytes, int* backed) {
  return query("kvcommBufferIsBacked", backed, "backed",
               [&](const char* call) { return get(buffer, call).isBacked(offset, bytes) ? 1 : 0; });
}

kvcommResult_t kvcommBufferBackedRanges(kvcommBuffer_t buffer, kvcommRange* ranges, size_t capacity, size_t* count) {
  return guard("kvcommBufferBackedRanges", [&] {
    auto& b = get(buffer, "kvcommBufferBackedRanges");
    requireNonNull(count, "kvcommBufferBackedRanges", "count");
    KVCOMM_CHECK_ARG(ranges != nullptr || capacity == 0, "kvcommBufferBackedRanges", "ranges is NULL");
    auto all = b.backedRanges();
    for (size_t i = 0; i < all.size() && i < capacity; ++i) ranges[i] = {all[i].offset, all[i].bytes};
    *count = all.size();
  });
}

kvcommResult_t kvcommBufferGeneration(kvcommBuffer_t buffer, uint64_t* generation) {
  return query("kvcommBufferGeneration", generation, "generation",
               [&](const char* call) { return get(buffer, call).generation(); });
}

kvcommResult_t kvcommBufferGranularity(kvcommBuffer_t buffer, size_t* bytes) {
  return query("kvcommBufferGranularity", bytes, "bytes",
               [&](const char* call) { return get(buffer, call).granularity(); });
}

kvcommResult_t kvcommBufferKind(kvcommBuffer_t buffer, kvcommMemoryKind_t* kind) {
  return query("kvcommBufferKind", kind, "kind",
               [&](const char* call) { return kvcomm::capi::toC<kvcommMemoryKind_t>(get(buffer, call).kind()); });
}

kvcommResult_t kvcommBufferAdopted(kvcommBuffer_t buffer, int* adopted) {
  return query("kvcommBufferAdopted", adopted, "adopted",
               [&](const char* call) { return get(buffer, call).adopted() ? 1 : 0; });
}

kvcommResult_t kvcommBufferHandleType(kvcommBuffer_t buffer, char* text, size_t textBytes, size_t* needed) {
  return guard("kvcommBufferHandleType", [&] {
    auto& b = get(buffer, "kvcommBufferHandleType");
    kvcomm::capi::copyString(b.handleType(), text, textBytes, needed, "kvcommBufferHandleType");
  });
}

kvcommResult_t kvcommBufferComm(kvcommBuffer_t buffer, kvcommComm_t* comm) {
  return query("kvcommBufferComm", comm, "comm",
               [&](const char* call) { return kvcomm::capi::adopt<kvcommComm>(get(buffer, call).communicator()); });
}

kvcommResult_t kvcommBufferPeerTable(kvcommBuffer_t buffer, const uint64_t** table) {
  return query("kvcommBufferPeerTable", table, "table",
               [&](const char* call) { return get(buffer, call).peerTable(); });
}

kvcommResult_t kvcommBufferBackedBitmap(kvcommBuffer_t buffer, const uint64_t** bitmap) {
  return query("kvcommBufferBackedBitmap", bitmap, "bitmap",
               [&](const char* call) { return get(buffer, call).backedBitmap(); });
}

}  // extern "C"
