// One arena's capabilities: one-use 128-bit random tokens, each bound to the generation it was issued at and to one
// importer process (pid and uid), with an expiry. A token is consumed by the import that uses it; tokens that were
// used, expired or revoked are remembered (a bounded number) so that a second presentation gets the precise reason.
// Not thread-safe: the arena's lock guards it.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <string>

#include "kvcomm/arena.hpp"

namespace kvcomm::detail::arena {

class CapabilityTable {
 public:
  using Clock = std::chrono::steady_clock;
  using Token = std::array<uint8_t, 16>;
  /// Spent tokens remembered for their reason.
  static constexpr size_t kRemembered = 4096;

  /// Issues a token for (arenaId, generation, pid, uid) living `ttlMs` milliseconds.
  ArenaCapability issue(uint64_t arenaId, uint64_t generation, int pid, uint32_t uid, int64_t ttlMs);

  /// Checks a presented capability against the process presenting it (pid, uid from SO_PEERCRED) and the arena's
  /// current generation. Returns "" and consumes the token when it is valid; otherwise why it is refused. A token
  /// presented by the wrong process is kept (its rightful importer may still use it); an expired or stale one is
  /// spent.
  std::string take(const uint8_t token[16], uint64_t presentedGeneration, uint64_t currentGeneration, int pid,
                   uint32_t uid);

  /// Spends every live token with `reason` (the arena freed, grew, or its owner revoked them).
  void revokeAll(const std::string& reason);
  /// Live (issued, unused, unexpired) tokens.
  size_t live();

 private:
  struct Entry {
    uint64_t generation;
    int pid;
    uint32_t uid;
    Clock::time_point expires;
    int64_t ttlMs;
  };
  void expire(Clock::time_point now);
  void spend(const Token& t, std::string reason);

  std::map<Token, Entry> live_;
  std::map<Token, std::string> spent_;
  std::deque<Token> spentOrder_;
};

}  // namespace kvcomm::detail::arena
