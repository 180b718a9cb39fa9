// C ABI: result names, the thread's last error, version.
#include <algorithm>
#include <cstdio>
#include <new>

#include "capi/capi.hpp"
#include "common/check.hpp"
#include "kvcomm/version.hpp"

static_assert(KVCOMM_VERSION == kvcomm::kVersion, "kvcomm.h and version.hpp disagree on the version");
static_assert(sizeof(kvcommUniqueId) == sizeof(kvcomm::UniqueId::bytes), "unique id size");

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

kvcommResult_t toResult(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::InvalidArgument:
      return kvcommInvalidArgument;
    case ErrorCode::Unsupported:
      return kvcommUnsupported;
    case ErrorCode::SystemError:
      return kvcommSystemError;
    case ErrorCode::CudaError:
      return kvcommCudaError;
    case ErrorCode::NetworkError:
      return kvcommNetworkError;
    case ErrorCode::RemoteError:
      return kvcommRemoteError;
    case ErrorCode::Timeout:
      return kvcommTimeout;
    case ErrorCode::Aborted:
      return kvcommAborted;
    case ErrorCode::InternalError:
      return kvcommInternalError;
    case ErrorCode::Busy:
      return kvcommBusy;
  }
  return kvcommInternalError;
}

kvcommResult_t invalid(const char* call, const std::string& cause) noexcept {
  try {
    setLastError(detail::cat("kvcomm [rank ?] ", call, ": ", cause).c_str());
  } catch (...) {
    setLastError(call);
  }
  return kvcommInvalidArgument;
}

void requireNonNull(const void* p, const char* call, const char* what) {
  KVCOMM_CHECK_ARG(p != nullptr, call, what, " is NULL");
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
  if (needed) *needed = bytes;
  if (out == nullptr && outBytes == 0) return;  // a size query
  KVCOMM_CHECK_ARG(outBytes >= bytes, call, "handleBytes ", outBytes, " is smaller than the handle (", bytes,
                   " bytes)");
  std::memcpy(out, handle, bytes);
}

void toC(const DeviceError& e, kvcommDeviceError* out) {
  out->kind = static_cast<kvcommDeviceErrorKind_t>(e.kind);
  out->tokenIndex = e.tokenIndex;
  out->slot = e.slot;
  out->tensor = e.tensor;
  out->rank = e.rank;
  out->peer = e.peer;
  out->lane = e.lane;
}

MemoryKind kindOf(kvcommMemoryKind_t kind, const char* call) {
  switch (kind) {
    case kvcommMemoryAuto:
      return MemoryKind::Auto;
    case kvcommMemoryCuda:
      return MemoryKind::Cuda;
    case kvcommMemoryHost:
      return MemoryKind::Host;
  }
  KVCOMM_THROW(InvalidArgument, call, "kind ", static_cast<int>(kind), " is not a kvcommMemoryKind_t");
}

kvcommMemoryKind_t toC(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::Cuda:
      return kvcommMemoryCuda;
    case MemoryKind::Host:
      return kvcommMemoryHost;
    case MemoryKind::Auto:
      break;
  }
  return kvcommMemoryAuto;
}

}  // namespace kvcomm::capi

static_assert(static_cast<int>(kvcomm::DeviceErrorKind::BlockOutOfRange) == kvcommDeviceErrorBlockOutOfRange &&
                  static_cast<int>(kvcomm::DeviceErrorKind::BarrierTimeout) == kvcommDeviceErrorBarrierTimeout &&
                  static_cast<int>(kvcomm::DeviceErrorKind::SlotOutOfRange) == kvcommDeviceErrorSlotOutOfRange &&
                  static_cast<int>(kvcomm::DeviceErrorKind::PeerFailed) == kvcommDeviceErrorPeerFailed &&
                  static_cast<int>(kvcomm::DeviceErrorKind::LaneOutOfRange) == kvcommDeviceErrorLaneOutOfRange,
              "kvcommDeviceErrorKind_t mirrors kvcomm::DeviceErrorKind");

using kvcomm::capi::guard;

extern "C" {

const char* kvcommGetErrorString(kvcommResult_t result) {
  switch (result) {
    case kvcommSuccess:
      return "Success";
    case kvcommInvalidArgument:
      return "InvalidArgument";
    case kvcommUnsupported:
      return "Unsupported";
    case kvcommSystemError:
      return "SystemError";
    case kvcommCudaError:
      return "CudaError";
    case kvcommNetworkError:
      return "NetworkError";
    case kvcommRemoteError:
      return "RemoteError";
    case kvcommTimeout:
      return "Timeout";
    case kvcommAborted:
      return "Aborted";
    case kvcommInternalError:
      return "InternalError";
    case kvcommBusy:
      return "Busy";
    case kvcommNumResults:
      break;
  }
  return "Unknown";
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
