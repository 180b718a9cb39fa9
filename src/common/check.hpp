// Internal error helpers: every check carries the call text, the rank and the cause.
#pragma once

#include <cerrno>
#include <cstdint>
#include <sstream>
#include <string>

#include "common/internal_api.hpp"
#include "kvcomm/error.hpp"

namespace kvcomm::detail {

/// Rank of the calling thread's current kvcomm operation (-1 when unknown). Public entry points set it with
/// RankScope so that errors raised deep in a layer still name the rank.
KVCOMM_INTERNAL_API int currentRank() noexcept;

/// Sets the rank reported by errors for the lifetime of the scope (restores the previous one).
class KVCOMM_INTERNAL_API RankScope {
 public:
  explicit RankScope(int rank) noexcept;
  ~RankScope();
  RankScope(const RankScope&) = delete;
  RankScope& operator=(const RankScope&) = delete;

 private:
  int previous_;
};

/// "kvcomm [rank R] call: cause (file:line)".
KVCOMM_INTERNAL_API std::string formatMessage(const std::string& call, const std::string& cause, const char* file,
                                              int line);

/// Throws the Error subclass of `code`; `detail` is the CUresult (CudaError) or errno (SystemError) it carries.
[[noreturn]] KVCOMM_INTERNAL_API void throwError(ErrorCode code, const std::string& call, const std::string& cause,
                                                 const char* file, int line, int detail = 0);
/// Throws the Error subclass of `code` with `message` as it is (already formatted).
[[noreturn]] void throwFormatted(ErrorCode code, const std::string& message, int detail = 0);
[[noreturn]] KVCOMM_INTERNAL_API void throwSystem(const std::string& call, int err, const char* file, int line);

/// Concatenates anything streamable.
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

/// "0x..." of an id (registrations, endpoints) in messages.
inline std::string hexId(uint64_t v) {
  return cat("0x", std::hex, v);
}

}  // namespace kvcomm::detail

/// Throws InvalidArgumentError naming `call` unless `cond` holds.
#define KVCOMM_CHECK_ARG(cond, call, ...)                                                                          \
  do {                                                                                                             \
    if (!(cond))                                                                                                   \
      ::kvcomm::detail::throwError(::kvcomm::ErrorCode::InvalidArgument, call, ::kvcomm::detail::cat(__VA_ARGS__), \
                                   __FILE__, __LINE__);                                                            \
  } while (0)

/// Throws InvalidArgumentError naming `call`, the argument `what` and its value unless the scoped enum `value` is
/// one of its enumerators, numbered 0 to `last` (a value cast from an integer the API does not define: the C++ API
/// refuses it as the C API does, instead of treating it as some other enumerator).
#define KVCOMM_CHECK_ENUM(value, last, call, what)                                                                     \
  KVCOMM_CHECK_ARG(                                                                                                    \
      static_cast<long long>(value) >= 0 && static_cast<long long>(value) <= static_cast<long long>(last), call, what, \
      " ", static_cast<long long>(value), " is not a valid value (0 to " #last " = ", static_cast<long long>(last),    \
      ")")

/// Throws an Error of `code` naming `call`.
#define KVCOMM_THROW(code, call, ...) \
  ::kvcomm::detail::throwError(::kvcomm::ErrorCode::code, call, ::kvcomm::detail::cat(__VA_ARGS__), __FILE__, __LINE__)

/// Evaluates a system call returning -1 on failure; throws SystemError with errno and the call text.
#define KVCOMM_CHECK_SYS(expr)                                                             \
  ([&]() {                                                                                 \
    auto kvcommRet_ = (expr);                                                              \
    if (kvcommRet_ == -1) ::kvcomm::detail::throwSystem(#expr, errno, __FILE__, __LINE__); \
    return kvcommRet_;                                                                     \
  }())
