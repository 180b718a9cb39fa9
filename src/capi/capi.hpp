// The C ABI's boundary: handle structs (each owns one C++ handle) and guard(), which turns every exception into a
// result code plus the thread's last-error message. Only src/capi includes this.
#pragma once

#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <string>
#include <utility>

#include "kvcomm/barrier.hpp"
#include "kvcomm/comm.hpp"
#include "kvcomm/device_error.hpp"
#include "kvcomm/error.hpp"
#include "kvcomm/fetch.hpp"
#include "kvcomm/kvcomm.h"
#include "kvcomm/ops.hpp"
#include "kvcomm/symm.hpp"

struct kvcommComm {
  kvcomm::Communicator comm;
};
struct kvcommLayout {
  kvcomm::Layout layout;
};
struct kvcommBuffer {
  kvcomm::SymmetricBuffer buffer;
};
struct kvcommPublisher {
  kvcomm::Publisher publisher;
};
struct kvcommBarrier {
  kvcomm::Barrier barrier;
};
struct kvcommFetcher {
  kvcomm::Fetcher fetcher;
};
struct kvcommFetchPlan {
  kvcomm::FetchPlan plan;
};
// The status of the last test()/wait(), kept so that its failed blocks and error can be read by separate calls.
struct kvcommFetchOperation {
  kvcomm::FetchOperation op;
  std::mutex mu;
  kvcomm::FetchStatus last;
};

namespace kvcomm::capi {

/// Records `message` as the calling thread's last error (never throws).
void setLastError(const char* message) noexcept;
/// The calling thread's last error ("" if none).
const char* lastError() noexcept;
/// The result code of an error code.
kvcommResult_t toResult(ErrorCode code) noexcept;
/// Records and returns an InvalidArgument failure of `call` (for checks made at the boundary itself).
kvcommResult_t invalid(const char* call, const std::string& cause) noexcept;

/// Runs `body`; any exception becomes a result code and the thread's last error. Nothing escapes.
template <typename F>
kvcommResult_t guard(const char* call, F&& body) noexcept {
  try {
    body();
    return kvcommSuccess;
  } catch (const Error& e) {
    setLastError(e.what());
    return toResult(e.code());
  } catch (const std::bad_alloc&) {
    setLastError("kvcomm: out of host memory");
    return kvcommSystemError;
  } catch (const std::exception& e) {
    try {
      setLastError((std::string("kvcomm ") + call + ": unexpected exception: " + e.what()).c_str());
    } catch (...) {
      setLastError("kvcomm: unexpected exception");
    }
    return kvcommInternalError;
  } catch (...) {
    setLastError("kvcomm: unexpected non-standard exception");
    return kvcommInternalError;
  }
}

/// Throws InvalidArgumentError naming `call` when `p` is null.
void requireNonNull(const void* p, const char* call, const char* what);

/// The shape of every C getter: under guard(), refuses a null `out` (named `outName`) and stores `read(call)` there.
/// `read` looks the handle up itself, so a null or empty handle is reported by the same checks as everywhere else.
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

/// The C form of a device error.
void toC(const DeviceError& e, kvcommDeviceError* out);

/// The C++ memory kind of a C one (InvalidArgument for values outside the enum).
MemoryKind kindOf(kvcommMemoryKind_t kind, const char* call);
/// The C memory kind of a resolved C++ one.
kvcommMemoryKind_t toC(MemoryKind kind);

}  // namespace kvcomm::capi
