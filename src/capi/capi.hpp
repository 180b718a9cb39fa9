// The C ABI's boundary: guard(), which runs a C call's body and turns every exception into a result code plus the
// thread's last-error message, and the checks every call shares (pointers, counts against the limit table, the
// arguments of collective calls). Handles are in handles.hpp, enum conversions in enums.hpp. Only src/capi includes
// this.
#pragma once

#include <cstring>
#include <exception>
#include <functional>
#include <new>
#include <string>
#include <utility>

#include "capi/enums.hpp"
#include "capi/handles.hpp"
#include "common/check.hpp"
#include "kvcomm/device_error.hpp"
#include "kvcomm/error.hpp"
#include "kvcomm/fetch.hpp"
#include "kvcomm/kv_contents.hpp"
#include "kvcomm/kv_layout.hpp"
#include "kvcomm/kvcomm.h"
#include "kvcomm/limits.hpp"

namespace kvcomm::capi {

/// Records `message` as the calling thread's last error (never throws, never allocates).
void setLastError(const char* message) noexcept;
/// Records "kvcomm [rank R] call: cause more" (R: the rank the current call named, else "?"); never throws or
/// allocates.
void setLastError(const char* call, const char* cause, const char* more = "") noexcept;
/// The calling thread's last error ("" if none).
const char* lastError() noexcept;

/// Runs `body` as C call `call`; any exception becomes a result code and the thread's last error, naming the rank
/// of the handle the call used (see CallFrame). Nothing escapes.
template <typename F>
kvcommResult_t guard(const char* call, F&& body) noexcept {
  CallFrame frame;
  try {
    body();
    return kvcommSuccess;
  } catch (const Error& e) {
    setLastError(e.what());
    return toResult(e.code());
  } catch (const std::bad_alloc&) {
    setLastError(call, "out of host memory");
    return kvcommSystemError;
  } catch (const std::exception& e) {
    setLastError(call, "unexpected exception: ", e.what());
    return kvcommInternalError;
  } catch (...) {
    setLastError(call, "unexpected exception of unknown type");
    return kvcommInternalError;
  }
}

/// Throws InvalidArgumentError naming `call` when `p` is null.
void requireNonNull(const void* p, const char* call, const char* what);

/// Throws InvalidArgumentError naming `call`, the count `what` and its limit (`limitName`, the kvcomm.h macro) when
/// `n` exceeds `limit`: every count is checked with this before anything is sized by it.
void checkCount(size_t n, size_t limit, const char* call, const char* what, const char* limitName);

/// Runs `convert` (the C arguments' checks and conversions of a collective call) on every member and votes on the
/// outcome, so that a bad argument on one member fails the call on every member, naming that member and argument,
/// instead of leaving the others waiting in the collective.
void agreeOnArguments(Communicator& comm, const char* call, const std::function<void()>& convert);

/// The shape of every C getter: under guard(), refuses a null `out` (named `outName`) and stores `read(call)` there.
/// `read` looks the handle up itself (use()), so a null, destroyed or foreign handle is refused by the same checks as
/// everywhere else, and nothing is written on failure.
template <typename Out, typename Read>
kvcommResult_t query(const char* call, Out* out, const char* outName, Read&& read) noexcept {
  return guard(call, [&] {
    requireNonNull(out, call, outName);
    *out = read(call);
  });
}

/// Copies `s` into `text` (NUL-terminated, truncated) and reports the full size in *needed.
void copyString(const std::string& s, char* text, size_t textBytes, size_t* needed, const char* call);

/// Copies the `bytes` of a device handle into `out` when `outBytes` holds them (else InvalidArgument); *needed gets
/// the size.
void copyHandle(const void* handle, size_t bytes, void* out, size_t outBytes, size_t* needed, const char* call);

/// A layout from C regions (at most `limit`, the limit table's `limitName`) and the engine's version.
KvLayout layoutOf(const kvcommKvRegion* regions, size_t n, uint64_t version, size_t limit, const char* limitName,
                  const char* call);
/// layoutOf() for fetch layouts (fetchers, endpoints, KV contents): at most KVCOMM_MAX_FETCH_REGIONS regions.
KvLayout fetchLayoutOf(const kvcommKvRegion* regions, size_t n, uint64_t version, const char* call);
/// The list pattern for a layout: min(count, capacity) regions written, *count = the full count, *version (if not
/// NULL) the engine's version.
void copyLayout(const KvLayout& l, kvcommKvRegion* regions, size_t capacity, size_t* count, uint64_t* version,
                const char* call);
/// The C form of a plan's info.
void toC(const FetchPlanInfo& i, kvcommFetchPlanInfo* out);

/// The C form of a device error.
void toC(const DeviceError& e, kvcommDeviceError* out);

/// kvcomm*PollError of an object with device errors (publisher, barrier, fetcher): `object(call)` looks it up (and
/// refuses a bad handle), then its first error is read, cleared and copied into *error.
template <typename Object>
kvcommResult_t pollDeviceError(const char* call, kvcommDeviceError* error, Object&& object) noexcept {
  return guard(call, [&] {
    auto& o = object(call);
    requireNonNull(error, call, "error");
    toC(o.pollError(), error);
  });
}
/// kvcomm*CheckErrors of the same objects: the recorded error, if any, as the call's result and message.
template <typename Object>
kvcommResult_t checkDeviceErrors(const char* call, Object&& object) noexcept {
  return guard(call, [&] { object(call).checkErrors(); });
}

/// The KvDescription of `n` C contents (each field checked: order an enumerator, replicated 0 or 1), `what` naming
/// the array in errors; at most KVCOMM_MAX_FETCH_REGIONS.
KvDescription descriptionOf(const kvcommKvContents* c, size_t n, const char* call, const std::string& what);

}  // namespace kvcomm::capi
