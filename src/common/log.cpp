#include "common/log.hpp"

#include <unistd.h>

#include <cstdio>

#include "common/env.hpp"

namespace kvcomm::detail {

void logLine(int level, const std::string& text) {
  if (level > env::logLevelOrWarn()) return;
  static const char* names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
  int rank = currentRank();
  std::fprintf(stderr, "kvcomm %s [pid %d rank %d] %s\n", names[level], static_cast<int>(getpid()), rank, text.c_str());
}

}  // namespace kvcomm::detail
