#include "arena/capability_table.hpp"

#include <cstring>

#include "common/check.hpp"
#include "common/socket.hpp"

namespace kvcomm::detail::arena {

ArenaCapability CapabilityTable::issue(uint64_t arenaId, uint64_t generation, int pid, uint32_t uid, int64_t ttlMs) {
  KVCOMM_CHECK_ARG(pid > 0, "Arena::offer", "pid ", pid, " is not a process id");
  KVCOMM_CHECK_ARG(ttlMs > 0 && ttlMs <= 86400000, "Arena::offer", "time to live ", ttlMs, " ms: pass 1 ms to one day");
  Clock::time_point now = Clock::now();
  expire(now);
  ArenaCapability c;
  c.arenaId = arenaId;
  c.generation = generation;
  c.importerPid = pid;
  c.importerUid = uid;
  Token t;
  do {
    randomBytes(t.data(), t.size());
  } while (live_.count(t) || spent_.count(t));
  std::memcpy(c.token, t.data(), t.size());
  auto wall = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::system_clock::now().time_since_epoch() + std::chrono::milliseconds(ttlMs));
  c.expiresAtMs = static_cast<uint64_t>(wall.count());
  live_[t] = Entry{generation, pid, uid, now + std::chrono::milliseconds(ttlMs), ttlMs};
  return c;
}

void CapabilityTable::expire(Clock::time_point now) {
  for (auto it = live_.begin(); it != live_.end();) {
    if (it->second.expires <= now) {
      auto late = std::chrono::duration_cast<std::chrono::milliseconds>(now - it->second.expires).count();
      Token t = it->first;
      int64_t ttl = it->second.ttlMs;
      it = live_.erase(it);
      spend(t, cat("expired ", late, " ms ago (its time to live was ", ttl, " ms); ask the owner for a new one"));
    } else {
      ++it;
    }
  }
}

void CapabilityTable::spend(const Token& t, std::string reason) {
  if (!spent_.count(t)) {
    spentOrder_.push_back(t);
    if (spentOrder_.size() > kRemembered) {
      spent_.erase(spentOrder_.front());
      spentOrder_.pop_front();
    }
  }
  spent_[t] = std::move(reason);
}

std::string CapabilityTable::take(const uint8_t token[16], uint64_t presentedGeneration, uint64_t currentGeneration,
                                  int pid, uint32_t uid) {
  Token t;
  std::memcpy(t.data(), token, t.size());
  // An expired token is reported as expired however late it comes, so look before expire() moves it.
  Clock::time_point now = Clock::now();
  expire(now);
  auto it = live_.find(t);
  if (it == live_.end()) {
    auto s = spent_.find(t);
    if (s != spent_.end()) return cat("token refused: ", s->second);
    return "token refused: it was never issued for this arena (forged, or issued by another owner)";
  }
  const Entry& e = it->second;
  if (e.pid != pid || e.uid != uid)
    return cat("token refused: issued to pid ", e.pid, " (uid ", e.uid, "), presented by pid ", pid, " (uid ", uid,
               ")");
  if (presentedGeneration != e.generation)
    return cat("token refused: issued for generation ", e.generation, ", presented for generation ",
               presentedGeneration);
  if (e.generation != currentGeneration) {
    std::string why = cat("issued at generation ", e.generation, " but the arena is at generation ", currentGeneration,
                          " (it grew or shrank since); ask the owner for a new one");
    live_.erase(it);
    spend(t, why);
    return cat("token refused: ", why);
  }
  live_.erase(it);
  spend(t, "already used (capabilities are one-use; ask the owner for a new one)");
  return "";
}

void CapabilityTable::revokeAll(const std::string& reason) {
  for (auto& kv : live_) spend(kv.first, reason);
  live_.clear();
}

size_t CapabilityTable::live() {
  expire(Clock::now());
  return live_.size();
}

}  // namespace kvcomm::detail::arena
