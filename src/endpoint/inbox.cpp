#include "endpoint/inbox.hpp"

#include <chrono>

namespace kvcomm::detail {

Inbox::Delivery Inbox::deliver(NotifyMessage&& m, uint64_t registration) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return Delivery::Closed;
  uint64_t& last = lastSequence_[m.sender];
  if (m.sequence <= last) return Delivery::Duplicate;
  if (queue_.size() >= capacity_) return Delivery::Full;
  last = m.sequence;
  queue_.push_back(Notification{m.sender, std::move(m.senderName), registration, std::move(m.message)});
  cv_.notify_all();
  return Delivery::Delivered;
}

std::vector<Notification> Inbox::take(int64_t timeoutMs) {
  std::unique_lock<std::mutex> lock(mu_);
  auto ready = [&] { return closed_ || !queue_.empty(); };
  if (timeoutMs < 0 || timeoutMs >= 1000000000000ll)  // no bound (and no overflow of the deadline)
    cv_.wait(lock, ready);
  else if (timeoutMs > 0)
    cv_.wait_for(lock, std::chrono::milliseconds(timeoutMs), ready);
  std::vector<Notification> out(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()));
  queue_.clear();
  return out;
}

void Inbox::close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  cv_.notify_all();
}

}  // namespace kvcomm::detail
