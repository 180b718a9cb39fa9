// Long waits say what they wait for: a bounded wait (bootstrap connect, the root waiting for ranks to join) logs a
// warning shortly after it starts and then every few seconds, instead of staying silent until its timeout expires.
#pragma once

#include <cstdint>
#include <string>

#include "common/socket.hpp"

namespace kvcomm::detail {

class WaitReporter {
 public:
  /// A wait bounded by `timeoutMs` (< 0: unbounded). The first report is due after min(3 s, timeoutMs / 2), so a short
  /// timeout still reports before it expires; later reports every 10 s.
  explicit WaitReporter(int64_t timeoutMs);
  /// Whether a report is due now.
  bool due() const;
  /// Logs `text` at WARN level, prefixed with the time waited so far ("still waiting after 3 s: text"), and schedules
  /// the next report.
  void report(const std::string& text);
  /// Milliseconds until the next report (to cap a poll timeout); 0 when one is due.
  int msUntilNext() const;
  /// Seconds since the wait started.
  double secondsWaited() const;

 private:
  Clock::time_point start_;
  Clock::time_point next_;
};

}  // namespace kvcomm::detail
