// kvcomm: errors. Every failure in the C++ API is a kvcomm::Error (or a subclass) whose message names the call,
// the rank and the cause.
#pragma once

#include <stdexcept>
#include <string>

#include "kvcomm/api.hpp"

namespace kvcomm {

/// What kind of failure an Error reports.
enum class ErrorCode {
  InvalidArgument,  ///< The caller passed something wrong (sizes, ranges, tokens); nothing was changed.
  Unsupported,      ///< The requested mode cannot run here (no GPU, no P2P, handle type not available).
  SystemError,      ///< An operating-system call failed (errno is kept).
  CudaError,        ///< A CUDA driver or runtime call failed.
  NetworkError,     ///< A socket or transport failed, or a peer closed its connection.
  RemoteError,      ///< Another rank reported a failure during a collective step.
  Timeout,          ///< A bounded wait expired (peer never arrived, root unreachable).
  Aborted,          ///< The operation was stopped because the object is closing.
  InternalError,    ///< A kvcomm invariant broke: a bug; please report it.
};

/// Short name of an error code ("InvalidArgument", ...).
KVCOMM_API const char* errorCodeName(ErrorCode code) noexcept;

/// Base of every exception kvcomm throws. what() is "kvcomm [rank R] <call>: <cause>".
class KVCOMM_API Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message);
  /// The failure's category.
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

/// The caller passed an invalid value; nothing was changed.
class KVCOMM_API InvalidArgumentError : public Error {
 public:
  explicit InvalidArgumentError(const std::string& message) : Error(ErrorCode::InvalidArgument, message) {}
};

/// An operating-system call failed.
class KVCOMM_API SystemError : public Error {
 public:
  SystemError(const std::string& message, int err) : Error(ErrorCode::SystemError, message), errno_(err) {}
  /// The errno the call left.
  int sysErrno() const noexcept { return errno_; }

 private:
  int errno_;
};

/// A CUDA driver or runtime call failed.
class KVCOMM_API CudaError : public Error {
 public:
  CudaError(const std::string& message, int result) : Error(ErrorCode::CudaError, message), result_(result) {}
  /// The CUresult or cudaError_t value.
  int result() const noexcept { return result_; }

 private:
  int result_;
};

/// A socket or transport failed, or a peer went away.
class KVCOMM_API NetworkError : public Error {
 public:
  explicit NetworkError(const std::string& message, ErrorCode code = ErrorCode::NetworkError) : Error(code, message) {}
};

}  // namespace kvcomm
