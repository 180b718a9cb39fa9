// C ABI: unique ids and the two bootstraps (TCP id; the engine's allgather as a C function pointer).
#include <memory>

#include "capi/capi.hpp"
#include "common/check.hpp"

using kvcomm::capi::guard;
using kvcomm::capi::requireNonNull;

namespace {

kvcomm::UniqueId fromC(const kvcommUniqueId& id) {
  kvcomm::UniqueId u;
  std::memcpy(u.bytes.data(), id.internal, sizeof(id.internal));
  return u;
}

void toC(const kvcomm::UniqueId& u, kvcommUniqueId* id) {
  std::memcpy(id->internal, u.bytes.data(), sizeof(id->internal));
}

// Publishes a new communicator through `out` only once it is fully built: on failure *out stays untouched.
void publish(kvcomm::Communicator comm, kvcommComm_t* out) {
  *out = kvcomm::capi::adopt<kvcommComm>(std::move(comm));
}

// A world's size against the limit table and this rank inside it, before the bootstrap sizes anything by them.
void checkWorld(int rank, int size, const char* call) {
  KVCOMM_CHECK_ARG(size > 0 && size <= kvcomm::limits::kMaxRanks, call, "size ", size,
                   " outside [1, KVCOMM_MAX_RANKS (", kvcomm::limits::kMaxRanks, ")]");
  KVCOMM_CHECK_ARG(rank >= 0 && rank < size, call, "rank ", rank, " outside [0, ", size, ")");
}

}  // namespace

extern "C" {

kvcommResult_t kvcommGetUniqueId(kvcommUniqueId* id, const char* ifname) {
  return guard("kvcommGetUniqueId", [&] {
    requireNonNull(id, "kvcommGetUniqueId", "id");
    toC(kvcomm::TcpBootstrap::createUniqueId(ifname ? ifname : ""), id);
  });
}

kvcommResult_t kvcommUniqueIdToString(const kvcommUniqueId* id, char* text, size_t textBytes) {
  return guard("kvcommUniqueIdToString", [&] {
    requireNonNull(id, "kvcommUniqueIdToString", "id");
    requireNonNull(text, "kvcommUniqueIdToString", "text");
    KVCOMM_CHECK_ARG(textBytes > KVCOMM_UNIQUE_ID_STRING_LEN, "kvcommUniqueIdToString", "textBytes ", textBytes,
                     " cannot hold ", KVCOMM_UNIQUE_ID_STRING_LEN, " characters and a NUL");
    std::string s = fromC(*id).toString();
    std::memcpy(text, s.c_str(), s.size() + 1);
  });
}

kvcommResult_t kvcommUniqueIdFromString(const char* text, kvcommUniqueId* id) {
  return guard("kvcommUniqueIdFromString", [&] {
    requireNonNull(text, "kvcommUniqueIdFromString", "text");
    requireNonNull(id, "kvcommUniqueIdFromString", "id");
    toC(kvcomm::UniqueId::fromString(text), id);
  });
}

kvcommResult_t kvcommCommInitTcp(kvcommComm_t* comm, const kvcommUniqueId* id, int rank, int size, int64_t timeoutMs) {
  return guard("kvcommCommInitTcp", [&] {
    requireNonNull(comm, "kvcommCommInitTcp", "comm");
    requireNonNull(id, "kvcommCommInitTcp", "id");
    checkWorld(rank, size, "kvcommCommInitTcp");
    kvcomm::capi::CallFrame::nameRank(rank);
    auto boot = std::make_shared<kvcomm::TcpBootstrap>(fromC(*id), rank, size, timeoutMs);
    publish(kvcomm::Communicator::create(std::move(boot)), comm);
  });
}

kvcommResult_t kvcommCommInitCallback(kvcommComm_t* comm, int rank, int size, kvcommAllgatherFn allgather, void* user) {
  return guard("kvcommCommInitCallback", [&] {
    requireNonNull(comm, "kvcommCommInitCallback", "comm");
    KVCOMM_CHECK_ARG(allgather != nullptr, "kvcommCommInitCallback", "allgather is NULL");
    checkWorld(rank, size, "kvcommCommInitCallback");
    kvcomm::capi::CallFrame::nameRank(rank);
    // The callback and `user` are promised for the duration of this call only: the bootstrap the communicator keeps
    // refuses to call them afterwards.
    auto live = std::make_shared<bool>(true);
    auto fn = [allgather, user, live, rank](const void* send, void* recv, size_t bytes) {
      kvcomm::detail::RankScope scope(rank);
      if (!*live)
        KVCOMM_THROW(InternalError, "kvcommCommInitCallback", "the allgather callback is used after its init call");
      int rc = allgather(send, recv, bytes, user);
      if (rc != 0) KVCOMM_THROW(RemoteError, "kvcommCommInitCallback", "the allgather callback returned ", rc);
    };
    struct Expire {
      std::shared_ptr<bool> flag;
      ~Expire() { *flag = false; }
    } expire{live};
    auto boot = std::make_shared<kvcomm::CallbackBootstrap>(rank, size, fn);
    publish(kvcomm::Communicator::create(std::move(boot)), comm);
  });
}

}  // extern "C"
