#include "common/env.hpp"

#include <strings.h>
#include <cstdlib>

namespace kvcomm::env {

int64_t getInt(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long long x = std::strtoll(v, &end, 10);
  return (end && *end == '\0') ? static_cast<int64_t>(x) : fallback;
}

std::string getString(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v && *v) ? std::string(v) : fallback;
}

DirectMode direct() {
  std::string v = getString("KVCOMM_DIRECT", "auto");
  if (v == "1" || strcasecmp(v.c_str(), "on") == 0 || strcasecmp(v.c_str(), "force") == 0) return DirectMode::Force;
  if (v == "0" || strcasecmp(v.c_str(), "off") == 0) return DirectMode::Off;
  return DirectMode::Auto;
}

int logLevel() {
  std::string v = getString("KVCOMM_LOG_LEVEL", "warn");
  if (strcasecmp(v.c_str(), "error") == 0) return 0;
  if (strcasecmp(v.c_str(), "info") == 0) return 2;
  if (strcasecmp(v.c_str(), "debug") == 0) return 3;
  return 1;
}

int64_t bootstrapTimeoutMs() {
  return getInt("KVCOMM_BOOTSTRAP_TIMEOUT_MS", 120000);
}
int64_t barrierTimeoutMs() {
  return getInt("KVCOMM_BARRIER_TIMEOUT_MS", 10000);
}
int64_t livenessTimeoutMs() {
  return getInt("KVCOMM_LIVENESS_TIMEOUT_MS", 4000);
}
std::string socketIfname() {
  return getString("KVCOMM_SOCKET_IFNAME", "");
}
std::string handleType() {
  return getString("KVCOMM_HANDLE_TYPE", "auto");
}

bool multicastRequested() {
  return getInt("KVCOMM_MULTICAST", 0) == 1;
}

std::string multicastRefusal() {
  if (getString("NCCL_NVLS_ENABLE", "") == "0") return "NCCL_NVLS_ENABLE=0 is set";
  if (getString("TORCH_SYMM_MEM_DISABLE_MULTICAST", "") == "1") return "TORCH_SYMM_MEM_DISABLE_MULTICAST=1 is set";
  if (getString("NVSHMEM_DISABLE_NVLS", "") == "1") return "NVSHMEM_DISABLE_NVLS=1 is set";
  if (!multicastRequested()) return "KVCOMM_MULTICAST=1 is not set (multicast is opt-in)";
  return "";
}

}  // namespace kvcomm::env
