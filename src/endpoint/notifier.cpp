#include "endpoint/notifier.hpp"

#include <future>
#include <vector>

#include "common/check.hpp"
#include "endpoint/notify_wire.hpp"
#include "fetch/transport/net/wire.hpp"
#include "fetch/transport/tcp/tcp_client.hpp"
#include "kvcomm/error.hpp"

namespace kvcomm::detail {

namespace {

NotifyOutcome closedOutcome() {
  return {ErrorCode::Aborted, "the endpoint closed before the notification was sent"};
}

ErrorCode refusalCode(WireStatus s) {
  switch (s) {
    case WireStatus::Busy:
      return ErrorCode::Busy;
    case WireStatus::Unsupported:
      return ErrorCode::Unsupported;
    default:
      return ErrorCode::InvalidArgument;  // stale, unregistered, forged: the metadata is refused
  }
}

}  // namespace

std::atomic<int>& notifyLoseReplies() {
  static std::atomic<int> n{0};
  return n;
}

void Notifier::post(NotifyJob job) {
  std::unique_lock<std::mutex> lock(mu_);
  if (closed_) {
    lock.unlock();
    if (job.done) job.done(closedOutcome());
    return;
  }
  std::unique_ptr<Channel>& slot = channels_[job.target.endpointId];
  if (!slot) slot = std::make_unique<Channel>();
  Channel& ch = *slot;
  ch.queue.push_back(std::move(job));
  if (!ch.running) {
    // The previous worker has set running = false as its last step: joining it returns at once.
    if (ch.worker.joinable()) ch.worker.join();
    ch.running = true;
    ch.worker = std::thread([this, &ch] { run(ch); });
  }
}

NotifyOutcome Notifier::send(NotifyTarget target, std::string message) {
  auto outcome = std::make_shared<std::promise<NotifyOutcome>>();
  std::future<NotifyOutcome> f = outcome->get_future();
  NotifyJob job;
  job.target = std::move(target);
  job.message = std::move(message);
  job.done = [outcome](const NotifyOutcome& o) { outcome->set_value(o); };
  post(std::move(job));
  return f.get();
}

void Notifier::run(Channel& ch) {
  for (;;) {
    NotifyJob job;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (ch.queue.empty() || closed_) {
        ch.running = false;
        cv_.notify_all();
        return;
      }
      job = std::move(ch.queue.front());
      ch.queue.pop_front();
    }
    if (job.await && !job.await()) continue;
    NotifyOutcome outcome = deliver(ch, job);
    if (job.done) job.done(outcome);
  }
}

NotifyOutcome Notifier::deliver(Channel& ch, const NotifyJob& job) {
  NotifyMessage m;
  m.sender = self_;
  m.sequence = ch.nextSequence++;
  m.senderName = selfName_;
  m.message = job.message;
  std::vector<uint8_t> body;
  try {
    body = encodeNotify(m);
  } catch (const Error& e) {
    return {e.code(), e.what()};
  }
  // Twice at most: a connection that broke (idle-closed by the server, reset) is replaced once, and the resend's
  // sequence number lets the receiver drop it if the first one arrived.
  NotifyOutcome failure;
  for (int attempt = 0; attempt < 2; ++attempt) {
    Fd& fd = ch.connections[job.target.regionId];
    try {
      if (!fd) fd = connectHello(job.target.ctx, 1).fd;
      ControlAnswer a =
          controlRequest(fd.get(), kControlNotify, job.target.generation, body, timeoutMs_, job.target.who);
      if (attempt == 0 && notifyLoseReplies().load() > 0 && notifyLoseReplies().fetch_sub(1) > 0)
        KVCOMM_THROW(NetworkError, "Endpoint notification", job.target.who, ": the acknowledgement was lost (test)");
      if (a.status == WireStatus::Ok) return {};
      if (a.status == WireStatus::Closing) fd = Fd();  // the server ends the connection after it
      return {refusalCode(a.status),
              cat(job.target.who, " refused the notification: ", wireStatusName(a.status), ": ", a.why)};
    } catch (const NetworkError& e) {
      fd = Fd();
      failure = {e.code(), cat("the notification could not be delivered to ", job.target.who, ": ", e.what())};
    } catch (const Error& e) {
      // Refused at the hello: the capability (revoked, forged), the registration (unregistered), the endpoint
      // (restarted): the metadata is refused.
      fd = Fd();
      return {ErrorCode::InvalidArgument, cat("the notification was refused: ", e.what())};
    }
  }
  return failure;
}

void Notifier::forget(uint64_t endpointId) {
  std::unique_ptr<Channel> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = channels_.find(endpointId);
    if (it == channels_.end() || it->second->running || !it->second->queue.empty()) return;
    gone = std::move(it->second);
    channels_.erase(it);
  }
  if (gone->worker.joinable()) gone->worker.join();
}

void Notifier::close() {
  std::map<uint64_t, std::unique_ptr<Channel>> all;
  std::vector<NotifyJob> dropped;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (closed_ && channels_.empty()) return;
    closed_ = true;
    for (auto& [id, ch] : channels_) {
      for (NotifyJob& j : ch->queue) dropped.push_back(std::move(j));
      ch->queue.clear();
    }
    cv_.wait(lock, [&] {
      for (auto& [id, ch] : channels_)
        if (ch->running) return false;
      return true;
    });
    all.swap(channels_);
  }
  for (NotifyJob& j : dropped)
    if (j.done) j.done(closedOutcome());
  for (auto& [id, ch] : all)
    if (ch->worker.joinable()) ch->worker.join();
}

}  // namespace kvcomm::detail
