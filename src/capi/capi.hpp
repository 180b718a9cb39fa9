// The C ABI's boundary: handle structs (each owns one C++ handle) and guard(), which turns every exception into a
// result code plus the thread's last-error message. Only src/capi includes this.
#pragma once

#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <utility>

#include "kvcomm/comm.hpp"
#include "kvcomm/error.hpp"
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

/// Copies `s` into `text` (NUL-terminated, truncated) and reports the full size in *needed.
void copyString(const std::string& s, char* text, size_t textBytes, size_t* needed, const char* call);

}  // namespace kvcomm::capi
