// The notifications an endpoint received and has not handed out yet. Filled by its TCP server's connection threads
// (control requests kControlNotify), drained by Endpoint::notifications(). Each sender's notifications carry
// sequence numbers (endpoint/notify_wire.hpp): one that was delivered already (a resend after a lost reply) is
// acknowledged and dropped, so each is delivered once, in the order its sender sent it.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "endpoint/notify_wire.hpp"
#include "kvcomm/endpoint.hpp"

namespace kvcomm::detail {

class Inbox {
 public:
  /// At most `capacity` notifications wait to be taken; more are refused (the sender learns it).
  explicit Inbox(size_t capacity) : capacity_(capacity) {}

  enum class Delivery { Delivered, Duplicate, Full, Closed };
  /// `m` arrived at registration `registration`.
  Delivery deliver(NotifyMessage&& m, uint64_t registration);
  /// Everything received so far, oldest first; waits up to `timeoutMs` (< 0: no bound) for the first when there is
  /// none. Empty at the bound or once closed.
  std::vector<Notification> take(int64_t timeoutMs);
  /// Wakes waiters; later deliveries are refused.
  void close();

 private:
  const size_t capacity_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  std::deque<Notification> queue_;
  std::map<uint64_t, uint64_t> lastSequence_;  // by sender endpoint id
};

}  // namespace kvcomm::detail
