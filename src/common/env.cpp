#include "common/env.hpp"

#include <strings.h>

#include <cerrno>
#include <cstdlib>
#include <initializer_list>

#include "common/check.hpp"

namespace kvcomm::env {

using detail::cat;

namespace {

/// The value of `name`, or "" when unset (empty counts as unset: `export KVCOMM_X=` clears a knob).
std::string raw(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

[[noreturn]] void reject(const char* name, const std::string& value, const std::string& accepted) {
  KVCOMM_THROW(InvalidArgument, "environment", name, "='", value, "' is not accepted (accepted: ", accepted, ")");
}

bool is(const std::string& v, std::initializer_list<const char*> words) {
  for (const char* w : words)
    if (strcasecmp(v.c_str(), w) == 0) return true;
  return false;
}

int64_t integer(const char* name, int64_t fallback, int64_t lo, int64_t hi, const std::string& accepted) {
  std::string v = raw(name);
  if (v.empty()) return fallback;
  // strtoll skips leading whitespace: only a sign or a digit may start the value ("optional sign and nothing else").
  if (!(v[0] == '+' || v[0] == '-' || (v[0] >= '0' && v[0] <= '9'))) reject(name, v, accepted);
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (*end != '\0' || end == v.c_str() || errno == ERANGE || x < lo || x > hi) reject(name, v, accepted);
  return static_cast<int64_t>(x);
}

int parseLogLevel(const std::string& v) {
  if (v.empty() || is(v, {"warn"})) return 1;
  if (is(v, {"error"})) return 0;
  if (is(v, {"info"})) return 2;
  if (is(v, {"debug"})) return 3;
  return -1;
}

}  // namespace

int choice(const WordKnob& knob) {
  std::string v = raw(knob.name);
  if (v.empty()) return 0;
  for (int i = 0; i < 4; ++i)
    for (const char* w : knob.choices[i])
      if (w && strcasecmp(v.c_str(), w) == 0) return i;
  reject(knob.name, v, knob.accepted);
}

const char* word(const WordKnob& knob, int i) noexcept {
  return i >= 0 && i < 4 && knob.choices[i][0] ? knob.choices[i][0] : "?";
}

int logLevel() {
  std::string v = raw("KVCOMM_LOG_LEVEL");
  int level = parseLogLevel(v);
  if (level < 0) reject("KVCOMM_LOG_LEVEL", v, "error, warn, info or debug");
  return level;
}

int logLevelOrWarn() noexcept {
  const char* v = std::getenv("KVCOMM_LOG_LEVEL");
  int level = parseLogLevel(v ? v : "");
  return level < 0 ? 1 : level;
}

int64_t bootstrapTimeoutMs() {
  return integer("KVCOMM_BOOTSTRAP_TIMEOUT_MS", 120000, INT64_MIN, kMaxTimeoutMs,
                 cat("an integer number of milliseconds up to ", kMaxTimeoutMs, "; negative for no bound"));
}

int64_t barrierTimeoutMs() {
  return integer("KVCOMM_BARRIER_TIMEOUT_MS", 10000, 0, kMaxBarrierTimeoutMs,
                 cat("an integer number of milliseconds from 0 to ", kMaxBarrierTimeoutMs));
}

int64_t livenessTimeoutMs() {
  return integer("KVCOMM_LIVENESS_TIMEOUT_MS", 4000, INT64_MIN, kMaxTimeoutMs,
                 cat("an integer number of milliseconds up to ", kMaxTimeoutMs,
                     "; 0 or negative leaves it to the system's TCP timeouts"));
}

std::string socketIfname() {
  std::string v = raw("KVCOMM_SOCKET_IFNAME");
  // IFNAMSIZ is 16 with the terminating NUL; names never hold '/' or white space.
  if (v.size() > 15 || v.find_first_of("/ \t\n:") != std::string::npos)
    reject("KVCOMM_SOCKET_IFNAME", v, "a network interface name of 1 to 15 characters, without '/', ':' or spaces");
  return v;
}

HandleType handleType() {
  std::string v = raw("KVCOMM_HANDLE_TYPE");
  if (v.empty() || is(v, {"auto"})) return HandleType::Auto;
  if (is(v, {"posix_fd"})) return HandleType::PosixFd;
  if (is(v, {"fabric"})) return HandleType::Fabric;
  if (is(v, {"ipc", "cuda_ipc", "legacy"})) return HandleType::Ipc;
  reject("KVCOMM_HANDLE_TYPE", v, "auto, posix_fd, fabric, or ipc (also cuda_ipc, legacy)");
}

int64_t fallbackPackMaxBytes() {
  return integer("KVCOMM_FALLBACK_PACK_MAX_BYTES", 256 << 10, 0, INT64_MAX, "an integer number of bytes >= 0");
}

int64_t fetchCopyEngineMinBytes() {
  return integer("KVCOMM_FETCH_CE_MIN_BYTES", 4ll << 20, 0, INT64_MAX, "an integer number of bytes >= 0");
}

int64_t fetchNetTimeoutMs() {
  return integer("KVCOMM_FETCH_NET_TIMEOUT_MS", 3000, 100, kMaxBarrierTimeoutMs,
                 cat("an integer number of milliseconds from 100 to ", kMaxBarrierTimeoutMs));
}

int fetchTcpConnections() {
  return static_cast<int>(integer("KVCOMM_FETCH_TCP_CONNECTIONS", 4, 1, 16, "an integer from 1 to 16"));
}

bool dependentLaunch() {
  return integer("KVCOMM_PDL", 1, 0, 1, "0 or 1") == 1;
}

bool multicastRequested() {
  return integer("KVCOMM_MULTICAST", 0, 0, 1, "0 or 1") == 1;
}

std::string multicastRefusal() {
  if (raw("NCCL_NVLS_ENABLE") == "0") return "NCCL_NVLS_ENABLE=0 is set";
  if (raw("TORCH_SYMM_MEM_DISABLE_MULTICAST") == "1") return "TORCH_SYMM_MEM_DISABLE_MULTICAST=1 is set";
  if (raw("NVSHMEM_DISABLE_NVLS") == "1") return "NVSHMEM_DISABLE_NVLS=1 is set";
  try {
    if (!multicastRequested()) return "KVCOMM_MULTICAST=1 is not set (multicast is opt-in)";
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void validate() {
  choice(kDirect);
  logLevel();
  bootstrapTimeoutMs();
  barrierTimeoutMs();
  livenessTimeoutMs();
  socketIfname();
  handleType();
  choice(kFetchPath);
  fetchCopyEngineMinBytes();
  fallbackPackMaxBytes();
  choice(kFetchTransport);
  fetchNetTimeoutMs();
  fetchTcpConnections();
  multicastRequested();
  dependentLaunch();
}

}  // namespace kvcomm::env
