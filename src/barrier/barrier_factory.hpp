// The library's own shapes of a Barrier beside Barrier::create: a fallback publisher's collective barrier, and a
// barrier that checks its owner's state before every call (a publisher's: its buffer must still be open).
#pragma once

#include <functional>
#include <string>

#include "kvcomm/barrier.hpp"

namespace kvcomm::detail {

struct BarrierFactory {
  /// A barrier without a signal area that synchronises by `run` (a collective over `comm`): sync() and signal() run
  /// it, wait() only checks its lane (the signal synchronised), deviceHandle() throws InvalidArgumentError with
  /// `noHandleWhy`, pollError() finds nothing (the collective's failures throw at the call).
  static Barrier collective(Communicator comm, int lanes, MemoryKind kind, std::function<void(Stream)> run,
                            std::string noHandleWhy);
  /// Runs `check(call)` first in every sync/signal/wait on `barrier` (it throws to refuse the call).
  static void ownedBy(Barrier& barrier, std::function<void(const char*)> check);
};

}  // namespace kvcomm::detail
