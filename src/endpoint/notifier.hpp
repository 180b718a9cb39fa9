// The sending side of an endpoint's notifications: one channel per receiving endpoint, which sends that receiver's
// notifications one at a time, in the order they were posted, as control requests (kControlNotify) over TCP
// connections to its registrations (the hello presents the registration's capability). Each notification carries
// the next sequence number of the channel; one whose reply is lost (the connection broke) is sent once more with the
// same number over a new connection, and the receiver delivers it once (endpoint/inbox.hpp).
//
// A channel's worker thread runs while it has notifications to send: a transfer's notification waits on it until
// the transfer's bytes have moved (or is dropped when the transfer failed), so one peer's slow transfer delays only
// that peer's later notifications.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/fd.hpp"
#include "fetch/transport/net/net_context.hpp"
#include "kvcomm/error.hpp"

namespace kvcomm::detail {

/// Where a notification goes: a registration of the receiving endpoint, as its metadata describes it.
struct NotifyTarget {
  uint64_t endpointId = 0;  ///< the receiving endpoint (the channel)
  uint64_t regionId = 0;    ///< the registration whose connection carries it
  uint64_t generation = 0;
  NetContext ctx;   ///< member 1: the registration (descriptor, capability, name)
  std::string who;  ///< how errors name the receiver
};

/// How a notification ended: delivered (error empty), or why not and as which error a caller throws it (a refusal
/// of the metadata: InvalidArgument; a full inbox: Busy; no answer: NetworkError; closing: Aborted).
struct NotifyOutcome {
  ErrorCode code = ErrorCode::InternalError;
  std::string error;
};

struct NotifyJob {
  NotifyTarget target;
  std::string message;
  /// Blocks until the notification may go (a transfer's bytes moved); false drops it (the transfer failed or was
  /// cancelled) and `done` is not called. Unset: it goes at once.
  std::function<bool()> await;
  /// Called by the channel's worker once the receiver acknowledged it, or with why it was not delivered.
  std::function<void(const NotifyOutcome&)> done;
};

/// Tests: the first acknowledgement of each of the next n notifications is thrown away as if the connection broke
/// before it arrived (the notification is sent again).
std::atomic<int>& notifyLoseReplies();

class Notifier {
 public:
  Notifier(uint64_t self, std::string selfName, int64_t timeoutMs)
      : self_(self), selfName_(std::move(selfName)), timeoutMs_(timeoutMs) {}
  ~Notifier() { close(); }
  Notifier(const Notifier&) = delete;
  Notifier& operator=(const Notifier&) = delete;

  /// Queues `job` behind the receiver's earlier ones. After close(): `done` is called at once with why.
  void post(NotifyJob job);
  /// Posts and waits for the outcome.
  NotifyOutcome send(NotifyTarget target, std::string message);
  /// Drops the receiver's channel and its connections when it has nothing queued.
  void forget(uint64_t endpointId);
  /// Ends every channel: notifications still queued are not sent (their `done` says so), the one being sent ends
  /// within the network timeout; joins the workers. Idempotent.
  void close();

 private:
  struct Channel {
    std::deque<NotifyJob> queue;
    bool running = false;
    std::thread worker;
    uint64_t nextSequence = 1;
    std::map<uint64_t, Fd> connections;  // by registration id; the worker's alone while it runs
  };
  void run(Channel& ch);
  NotifyOutcome deliver(Channel& ch, const NotifyJob& job);

  const uint64_t self_;
  const std::string selfName_;
  const int64_t timeoutMs_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  std::map<uint64_t, std::unique_ptr<Channel>> channels_;  // by receiving endpoint id
};

}  // namespace kvcomm::detail
