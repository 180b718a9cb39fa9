#include <cstring>

#include "common/check.hpp"
#include "kvcomm/error.hpp"
#include "kvcomm/version.hpp"

namespace kvcomm {

const char* errorCodeName(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::InvalidArgument:
      return "InvalidArgument";
    case ErrorCode::Unsupported:
      return "Unsupported";
    case ErrorCode::SystemError:
      return "SystemError";
    case ErrorCode::CudaError:
      return "CudaError";
    case ErrorCode::NetworkError:
      return "NetworkError";
    case ErrorCode::RemoteError:
      return "RemoteError";
    case ErrorCode::Timeout:
      return "Timeout";
    case ErrorCode::Aborted:
      return "Aborted";
    case ErrorCode::InternalError:
      return "InternalError";
    case ErrorCode::Busy:
      return "Busy";
  }
  return "Unknown";
}

int version() noexcept {
  return kVersion;
}

Error::Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}

namespace detail {

namespace {
thread_local int tlsRank = -1;
}

int currentRank() noexcept {
  return tlsRank;
}

RankScope::RankScope(int rank) noexcept : previous_(tlsRank) {
  tlsRank = rank;
}
RankScope::~RankScope() {
  tlsRank = previous_;
}

std::string formatMessage(const std::string& call, const std::string& cause, const char* file, int line) {
  std::string rank = tlsRank >= 0 ? std::to_string(tlsRank) : std::string("?");
  const char* base = std::strrchr(file, '/');
  return cat("kvcomm [rank ", rank, "] ", call, ": ", cause, " (", base ? base + 1 : file, ":", line, ")");
}

void throwFormatted(ErrorCode code, const std::string& msg, int detail) {
  switch (code) {
    case ErrorCode::InvalidArgument:
      throw InvalidArgumentError(msg);
    case ErrorCode::NetworkError:
    case ErrorCode::Timeout:
    case ErrorCode::RemoteError:
      throw NetworkError(msg, code);
    case ErrorCode::SystemError:
      throw SystemError(msg, detail);
    case ErrorCode::CudaError:
      throw CudaError(msg, detail);
    default:
      throw Error(code, msg);
  }
}

void throwError(ErrorCode code, const std::string& call, const std::string& cause, const char* file, int line,
                int detail) {
  throwFormatted(code, formatMessage(call, cause, file, line), detail);
}

void throwSystem(const std::string& call, int err, const char* file, int line) {
  throw SystemError(formatMessage(call, cat(std::strerror(err), " (errno ", err, ")"), file, line), err);
}

}  // namespace detail
}  // namespace kvcomm
