#include "common/wait_reporter.hpp"

#include <algorithm>
#include <cstdio>

#include "common/log.hpp"

namespace kvcomm::detail {

namespace {
constexpr int64_t kFirstReportMs = 3000;
constexpr int64_t kReportEveryMs = 10000;
}  // namespace

WaitReporter::WaitReporter(int64_t timeoutMs) : start_(Clock::now()) {
  int64_t first = timeoutMs < 0 ? kFirstReportMs : std::min(kFirstReportMs, timeoutMs / 2);
  // A wait that expires at once (timeout 0 or 1 ms) has nothing to report before its error.
  next_ = first > 0 ? start_ + std::chrono::milliseconds(first) : Clock::time_point::max();
}

bool WaitReporter::due() const {
  return Clock::now() >= next_;
}

int WaitReporter::msUntilNext() const {
  return msLeft(next_);
}

double WaitReporter::secondsWaited() const {
  return std::chrono::duration<double>(Clock::now() - start_).count();
}

void WaitReporter::report(const std::string& text) {
  char waited[32];
  std::snprintf(waited, sizeof(waited), "%.1f", secondsWaited());
  KVCOMM_WARN("still waiting after ", waited, " s: ", text);
  next_ = Clock::now() + std::chrono::milliseconds(kReportEveryMs);
}

}  // namespace kvcomm::detail
