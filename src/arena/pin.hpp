// What an ArenaPin refers to: the owner's arena or an import, which count pins and are told when one ends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "kvcomm/arena.hpp"

namespace kvcomm::detail::arena {

class PinHost {
 public:
  virtual ~PinHost() = default;
  /// Pin `id` ended (ArenaPin released or destroyed). Never throws.
  virtual void unpin(uint64_t id) noexcept = 0;
};

}  // namespace kvcomm::detail::arena

namespace kvcomm {

struct ArenaPin::Impl {
  std::shared_ptr<detail::arena::PinHost> host;  // keeps the memory mapped while the pin lives
  uint64_t id = 0;
  char* data = nullptr;
  size_t offset = 0;
  size_t bytes = 0;
};

namespace detail::arena {

/// Ends a pin taken for the duration of a call (the copies).
struct PinGuard {
  std::unique_ptr<ArenaPin::Impl> pin;
  ~PinGuard() {
    if (pin && pin->host) pin->host->unpin(pin->id);
  }
};

}  // namespace detail::arena

}  // namespace kvcomm
