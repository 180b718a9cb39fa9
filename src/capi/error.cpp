// C ABI: result names, the thread's last error, version; the boundary's shared checks (capi.hpp), the handle
// refusals (handles.hpp) and the agreement of kvcomm.h's limit macros with the limit table.
#include <algorithm>
#include <climits>
#include <cstdio>
#include <new>

#include "capi/capi.hpp"
#include "comm/agreement.hpp"
#include "common/check.hpp"
#include "kvcomm/arena.hpp"
#include "kvcomm/device/barrier.hpp"
#include "kvcomm/device/symm_device.hpp"
#include "kvcomm/version.hpp"

static_assert(KVCOMM_VERSION == kvcomm::kVersion, "kvcomm.h and version.hpp disagree on the version");
static_assert(sizeof(kvcommUniqueId) == sizeof(kvcomm::UniqueId::bytes), "unique id size");

// One limit table: kvcomm.h's macros and kvcomm/limits.hpp (the layers below assert their own constants against it).
namespace lim = kvcomm::limits;
static_assert(KVCOMM_MAX_FETCH_REGIONS == lim::kMaxFetchRegions, "fetch regions");
static_assert(KVCOMM_MAX_RANKS == lim::kMaxRanks, "ranks");
static_assert(KVCOMM_MAX_FETCH_REQUESTS == lim::kMaxFetchRequests, "fetch requests");
static_assert(KVCOMM_MAX_FETCH_PAIRS == lim::kMaxFetchPairs, "fetch pairs");
static_assert(KVCOMM_MAX_PUBLISH_TENSORS == lim::kMaxPublishTensors, "publish tensors");
static_assert(KVCOMM_MAX_BARRIER_LANES == lim::kMaxBarrierLanes && lim::kMaxBarrierLanes == kvcomm::kMaxBarrierLanes,
              "barrier lanes");
static_assert(KVCOMM_MAX_HANDLE_PEERS == lim::kMaxHandlePeers && lim::kMaxHandlePeers == kvcomm::kMaxHandlePeers,
              "handle peers");
static_assert(KVCOMM_MAX_BUFFER_RANGES == lim::kMaxBufferRanges, "buffer ranges");
static_assert(KVCOMM_MAX_ARENA_REGIONS == lim::kMaxArenaRegions && lim::kMaxArenaRegions == kvcomm::Arena::kMaxRegions,
              "arena regions");

namespace kvcomm::capi {

namespace {
// A fixed buffer, not a std::string: recording an error must never allocate (it reports out-of-memory too).
thread_local char tlsLastError[1024] = "";
}  // namespace

const char* lastError() noexcept {
  return tlsLastError;
}

void setLastError(const char* message) noexcept {
  std::snprintf(tlsLastError, sizeof(tlsLastError), "%s", message ? message : "");
}

void setLastError(const char* call, const char* cause, const char* more) noexcept {
  const int rank = detail::currentRank();
  char rankText[16] = "?";
  if (rank >= 0) std::snprintf(rankText, sizeof(rankText), "%d", rank);
  std::snprintf(tlsLastError, sizeof(tlsLastError), "kvcomm [rank %s] %s: %s%s", rankText, call, cause,
                more ? more : "");
}

const char* handleTypeName(HandleType t) noexcept {
  switch (t) {
    case HandleType::Comm:
      return HandleTraits<kvcommComm>::name;
    case HandleType::ParallelGroups:
      return HandleTraits<kvcommParallelGroups>::name;
    case HandleType::Buffer:
      return HandleTraits<kvcommBuffer>::name;
    case HandleType::Publisher:
      return HandleTraits<kvcommPublisher>::name;
    case HandleType::Barrier:
      return HandleTraits<kvcommBarrier>::name;
    case HandleType::Fetcher:
      return HandleTraits<kvcommFetcher>::name;
    case HandleType::FetchPlan:
      return HandleTraits<kvcommFetchPlan>::name;
    case HandleType::FetchOperation:
      return HandleTraits<kvcommFetchOperation>::name;
    case HandleType::Arena:
      return HandleTraits<kvcommArena>::name;
    case HandleType::ArenaPin:
      return HandleTraits<kvcommArenaPin>::name;
    case HandleType::ArenaImport:
      return HandleTraits<kvcommArenaImport>::name;
    case HandleType::ArenaSession:
      return HandleTraits<kvcommArenaSession>::name;
    case HandleType::ArenaServer:
      return HandleTraits<kvcommArenaServer>::name;
    case HandleType::Endpoint:
      return HandleTraits<kvcommEndpoint>::name;
    case HandleType::Registration:
      return HandleTraits<kvcommRegistration>::name;
    case HandleType::RemoteMemory:
      return HandleTraits<kvcommRemoteMemory>::name;
    case HandleType::Transfer:
      return HandleTraits<kvcommTransfer>::name;
    case HandleType::ConvertedFetcher:
      return HandleTraits<kvcommConvertedFetcher>::name;
  }
  return "handle";
}

void refuseHandle(const void* h, HandleType t, const char* call, const char* what) {
  KVCOMM_CHECK_ARG(h != nullptr, call, what, " is NULL");
  std::optional<HandleType> live = HandleRegistry::instance().find(h);
  if (live)
    KVCOMM_THROW(InvalidArgument, call, what, " ", h, " is a ", handleTypeName(*live), ", not a ", handleTypeName(t));
  KVCOMM_THROW(InvalidArgument, call, what, " ", h, " is not a live ", handleTypeName(t),
               " (destroyed, or never returned by kvcomm)");
}

void requireNonNull(const void* p, const char* call, const char* what) {
  KVCOMM_CHECK_ARG(p != nullptr, call, what, " is NULL");
}

void checkCount(size_t n, size_t limit, const char* call, const char* what, const char* limitName) {
  KVCOMM_CHECK_ARG(n <= limit, call, what, " ", n, " exceeds ", limitName, " (", limit, ")");
}

void agreeOnArguments(Communicator& comm, const char* call, const std::function<void()>& convert) {
  detail::allSucceed(comm, call, convert);
}

void copyString(const std::string& s, char* text, size_t textBytes, size_t* needed, const char* call) {
  KVCOMM_CHECK_ARG(text != nullptr || textBytes == 0, call, "text is NULL but textBytes is ", textBytes);
  if (needed) *needed = s.size() + 1;
  if (textBytes == 0) return;
  size_t n = std::min(s.size(), textBytes - 1);
  std::memcpy(text, s.data(), n);
  text[n] = '\0';
}

void copyHandle(const void* handle, size_t bytes, void* out, size_t outBytes, size_t* needed, const char* call) {
  KVCOMM_CHECK_ARG(out != nullptr || outBytes == 0, call, "handle is NULL but handleBytes is ", outBytes);
  if (out != nullptr || outBytes != 0)
    KVCOMM_CHECK_ARG(outBytes >= bytes, call, "handleBytes ", outBytes, " is smaller than the handle (", bytes,
                     " bytes)");
  if (needed) *needed = bytes;
  if (out != nullptr) std::memcpy(out, handle, bytes);
}

void toC(const DeviceError& e, kvcommDeviceError* out) {
  kvcommDeviceError c{};
  c.kind = toC<kvcommDeviceErrorKind_t>(e.kind);
  c.tokenIndex = e.tokenIndex;
  c.slot = e.slot;
  c.tensor = e.tensor;
  c.rank = e.rank;
  c.peer = e.peer;
  c.lane = e.lane;
  *out = c;
}

}  // namespace kvcomm::capi

using kvcomm::capi::guard;

extern "C" {

const char* kvcommGetErrorString(kvcommResult_t result) {
  const auto* e = kvcomm::capi::entryOf(result);
  return e ? e->cpp : "Unknown";
}

const char* kvcommGetLastError(void) {
  return kvcomm::capi::lastError();
}

kvcommResult_t kvcommGetVersion(int* version) {
  return guard("kvcommGetVersion", [&] {
    kvcomm::capi::requireNonNull(version, "kvcommGetVersion", "version");
    *version = kvcomm::version();
  });
}

}  // extern "C"
