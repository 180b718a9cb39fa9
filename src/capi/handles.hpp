// The C ABI's handles: the structs behind the opaque pointers, the registry of live ones, and the lookups every call
// makes. A handle is registered when a call hands it out and retired by its *Destroy, so a call given NULL, a
// destroyed handle, a pointer kvcomm never handed out, or a handle of another type refuses it (InvalidArgumentError
// naming the argument) instead of reading freed or foreign memory. Each handle remembers its rank, which the call's
// error messages name (CallFrame).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "capi/polled_status.hpp"
#include "common/check.hpp"
#include "kvcomm/arena.hpp"
#include "kvcomm/barrier.hpp"
#include "kvcomm/comm.hpp"
#include "kvcomm/converted_fetch.hpp"
#include "kvcomm/endpoint.hpp"
#include "kvcomm/fetch.hpp"
#include "kvcomm/kvcomm.h"
#include "kvcomm/publish.hpp"
#include "kvcomm/symm.hpp"

struct kvcommComm {
  explicit kvcommComm(kvcomm::Communicator c) : comm(std::move(c)), rank(comm.rank()) {}
  kvcomm::Communicator comm;
  int rank;
};
struct kvcommParallelGroups {
  explicit kvcommParallelGroups(kvcomm::ParallelGroups l)
      : layout(std::move(l)), rank(kvcomm::ParallelGroups::rankOf(layout.spec, layout.coord)) {}
  kvcomm::ParallelGroups layout;
  int rank;  ///< in the world the layout was made from
};
struct kvcommBuffer {
  explicit kvcommBuffer(kvcomm::SymmetricBuffer b) : buffer(std::move(b)), rank(buffer.rank()) {}
  kvcomm::SymmetricBuffer buffer;
  int rank;
};
struct kvcommPublisher {
  kvcommPublisher(kvcomm::Publisher p, int r)
      : owned(std::make_shared<kvcomm::Publisher>(std::move(p))), publisher(*owned), rank(r) {}
  std::shared_ptr<kvcomm::Publisher> owned;  // shared with the handles on its barrier (kvcommPublisherBarrier)
  kvcomm::Publisher& publisher;
  int rank;
};
struct kvcommBarrier {
  explicit kvcommBarrier(kvcomm::Barrier b)
      : owner(std::make_shared<kvcomm::Barrier>(std::move(b))),
        barrier(*static_cast<kvcomm::Barrier*>(owner.get())),
        rank(barrier.communicator().rank()) {}
  /// A publisher's barrier: the handle keeps the publisher (which owns the barrier) alive.
  explicit kvcommBarrier(std::shared_ptr<kvcomm::Publisher> p)
      : owner(p), barrier(p->barrier()), rank(barrier.communicator().rank()) {}
  std::shared_ptr<void> owner;  // what owns `barrier`: the barrier itself, or its publisher
  kvcomm::Barrier& barrier;
  int rank;
};
struct kvcommFetcher {
  kvcommFetcher(kvcomm::Fetcher f, int r) : fetcher(std::move(f)), rank(r) {}
  kvcomm::Fetcher fetcher;
  int rank;
};
struct kvcommFetchPlan {
  kvcommFetchPlan(kvcomm::FetchPlan p, int r) : plan(std::move(p)), rank(r) {}
  kvcomm::FetchPlan plan;
  int rank;
};
struct kvcommFetchOperation {
  kvcommFetchOperation(kvcomm::FetchOperation o, int r) : op(std::move(o)), rank(r) {}
  kvcomm::FetchOperation op;
  int rank;
  kvcomm::capi::PolledStatus status;
};
// Arenas belong to no communicator: their handles name no rank (-1, "[rank ?]" in messages).
// The failures of the last grow(), kept so that their text can be read by a separate call.
struct kvcommArena {
  explicit kvcommArena(kvcomm::Arena a) : arena(std::move(a)) {}
  kvcomm::Arena arena;
  int rank = -1;
  std::mutex mu;
  std::string lastGrowthFailures;
};
struct kvcommArenaPin {
  explicit kvcommArenaPin(kvcomm::ArenaPin p) : pin(std::move(p)) {}
  kvcomm::ArenaPin pin;
  int rank = -1;
  std::mutex mu;  ///< ArenaPin itself is not thread-safe: release() and the queries are serialised here
};
struct kvcommArenaImport {
  explicit kvcommArenaImport(kvcomm::ArenaImport i) : import(std::move(i)) {}
  kvcomm::ArenaImport import;
  int rank = -1;
};
// A message receive() took that did not fit the caller's array: it is handed out first by the next receive.
struct kvcommArenaSession {
  explicit kvcommArenaSession(kvcomm::ArenaSession s) : session(std::move(s)) {}
  kvcomm::ArenaSession session;
  int rank = -1;
  std::mutex mu;
  std::optional<std::vector<uint8_t>> pending;
};
struct kvcommArenaServer {
  explicit kvcommArenaServer(kvcomm::ArenaServer s) : server(std::move(s)) {}
  kvcomm::ArenaServer server;
  int rank = -1;
};

// Endpoints belong to no communicator either. Notifications taken from the endpoint but not yet handed out (one that
// did not fit the caller's array stays first) wait in `taken`.
struct kvcommEndpoint {
  explicit kvcommEndpoint(kvcomm::Endpoint e) : endpoint(std::move(e)) {}
  kvcomm::Endpoint endpoint;
  int rank = -1;
  std::mutex mu;
  std::deque<kvcomm::Notification> taken;
};
struct kvcommRegistration {
  explicit kvcommRegistration(kvcomm::Registration r) : registration(std::move(r)) {}
  kvcomm::Registration registration;
  int rank = -1;
};
struct kvcommRemoteMemory {
  explicit kvcommRemoteMemory(kvcomm::RemoteMemory r) : remote(std::move(r)) {}
  kvcomm::RemoteMemory remote;
  int rank = -1;
};
struct kvcommConvertedFetcher {
  kvcommConvertedFetcher(kvcomm::ConvertedFetcher f, int r) : fetcher(std::move(f)), rank(r) {}
  kvcomm::ConvertedFetcher fetcher;
  int rank;
};
struct kvcommTransfer {
  explicit kvcommTransfer(kvcomm::Transfer t) : transfer(std::move(t)) {}
  kvcomm::Transfer transfer;
  int rank = -1;
  kvcomm::capi::PolledStatus status;
};

namespace kvcomm::capi {

/// The C call running on this thread (calls nest when a bootstrap callback calls kvcomm): the rank of the handle it
/// looked up last is the rank its error messages name ("kvcomm [rank R] call: ..."), those of the C++ layer below
/// and the C layer's own checks alike.
class CallFrame {
 public:
  CallFrame() noexcept : outer_(current_) { current_ = this; }
  ~CallFrame() { current_ = outer_; }
  CallFrame(const CallFrame&) = delete;
  CallFrame& operator=(const CallFrame&) = delete;
  /// Names `rank` in the current call's errors (no-op outside a call or for a negative rank).
  static void nameRank(int rank) noexcept {
    if (current_ && rank >= 0) current_->rank_.emplace(rank);
  }

 private:
  inline static thread_local CallFrame* current_ = nullptr;
  CallFrame* outer_;
  std::optional<detail::RankScope> rank_;
};

enum class HandleType : uint8_t {
  Comm,
  ParallelGroups,
  Buffer,
  Publisher,
  Barrier,
  Fetcher,
  FetchPlan,
  FetchOperation,
  Arena,
  ArenaPin,
  ArenaImport,
  ArenaSession,
  ArenaServer,
  Endpoint,
  Registration,
  RemoteMemory,
  Transfer,
  ConvertedFetcher
};

/// The C type name of each handle struct.
template <typename H>
struct HandleTraits;
#define KVCOMM_CAPI_HANDLE(Struct, Type, CName)          \
  template <>                                            \
  struct HandleTraits<Struct> {                          \
    static constexpr HandleType type = HandleType::Type; \
    static constexpr const char* name = CName;           \
  }
KVCOMM_CAPI_HANDLE(kvcommComm, Comm, "kvcommComm_t");
KVCOMM_CAPI_HANDLE(kvcommParallelGroups, ParallelGroups, "kvcommParallelGroups_t");
KVCOMM_CAPI_HANDLE(kvcommBuffer, Buffer, "kvcommBuffer_t");
KVCOMM_CAPI_HANDLE(kvcommPublisher, Publisher, "kvcommPublisher_t");
KVCOMM_CAPI_HANDLE(kvcommBarrier, Barrier, "kvcommBarrier_t");
KVCOMM_CAPI_HANDLE(kvcommFetcher, Fetcher, "kvcommFetcher_t");
KVCOMM_CAPI_HANDLE(kvcommFetchPlan, FetchPlan, "kvcommFetchPlan_t");
KVCOMM_CAPI_HANDLE(kvcommFetchOperation, FetchOperation, "kvcommFetchOperation_t");
KVCOMM_CAPI_HANDLE(kvcommArena, Arena, "kvcommArena_t");
KVCOMM_CAPI_HANDLE(kvcommArenaPin, ArenaPin, "kvcommArenaPin_t");
KVCOMM_CAPI_HANDLE(kvcommArenaImport, ArenaImport, "kvcommArenaImport_t");
KVCOMM_CAPI_HANDLE(kvcommArenaSession, ArenaSession, "kvcommArenaSession_t");
KVCOMM_CAPI_HANDLE(kvcommArenaServer, ArenaServer, "kvcommArenaServer_t");
KVCOMM_CAPI_HANDLE(kvcommEndpoint, Endpoint, "kvcommEndpoint_t");
KVCOMM_CAPI_HANDLE(kvcommRegistration, Registration, "kvcommRegistration_t");
KVCOMM_CAPI_HANDLE(kvcommRemoteMemory, RemoteMemory, "kvcommRemoteMemory_t");
KVCOMM_CAPI_HANDLE(kvcommTransfer, Transfer, "kvcommTransfer_t");
KVCOMM_CAPI_HANDLE(kvcommConvertedFetcher, ConvertedFetcher, "kvcommConvertedFetcher_t");
#undef KVCOMM_CAPI_HANDLE

/// C type name of a handle type.
const char* handleTypeName(HandleType t) noexcept;

/// Every handle the C ABI handed out and did not destroy yet, with its type. Never destroyed (handles may be
/// destroyed from atexit handlers and other static destructors).
class HandleRegistry {
 public:
  static HandleRegistry& instance() {
    static HandleRegistry* r = new HandleRegistry;
    return *r;
  }
  void add(const void* h, HandleType t) {
    std::lock_guard<std::mutex> lock(mu_);
    live_.emplace(h, t);
  }
  /// The type `h` is live as, if it is live.
  std::optional<HandleType> find(const void* h) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(h);
    if (it == live_.end()) return std::nullopt;
    return it->second;
  }
  /// Unregisters `h` when it is live as `t`; false otherwise.
  bool remove(const void* h, HandleType t) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(h);
    if (it == live_.end() || it->second != t) return false;
    live_.erase(it);
    return true;
  }

 private:
  mutable std::mutex mu_;
  std::unordered_map<const void*, HandleType> live_;
};

/// Throws InvalidArgumentError naming `call` and argument `what`: `h` is NULL, or not live as a `T`.
[[noreturn]] void refuseHandle(const void* h, HandleType t, const char* call, const char* what);

/// A new handle, registered (the caller stores it in the C output only once every fallible step is done).
template <typename H, typename... Args>
H* adopt(Args&&... args) {
  auto h = std::make_unique<H>(std::forward<Args>(args)...);
  HandleRegistry::instance().add(h.get(), HandleTraits<H>::type);
  return h.release();
}
/// The live handle `h`, argument `what` of `call`; refuses NULL, destroyed and foreign pointers, and names the
/// handle's rank in the call's messages.
template <typename H>
H& use(H* h, const char* call, const char* what) {
  if (h == nullptr || HandleRegistry::instance().find(h) != HandleTraits<H>::type)
    refuseHandle(h, HandleTraits<H>::type, call, what);
  CallFrame::nameRank(h->rank);
  return *h;
}

/// Destroys a live handle (NULL: no-op); a destroyed or foreign one is refused like use() does.
template <typename H>
void retire(H* h, const char* call, const char* what) {
  if (h == nullptr) return;
  if (!HandleRegistry::instance().remove(h, HandleTraits<H>::type)) refuseHandle(h, HandleTraits<H>::type, call, what);
  CallFrame::nameRank(h->rank);
  delete h;
}

}  // namespace kvcomm::capi
