// A peer's registration mapped into this process: the client side of the share protocol (share_protocol.hpp). It
// holds the mapping and the lease; copies hold a use while they touch the mapping, and unmap() (the owner ended the
// lease, the peer died, the endpoint closes) waits for them, unmaps, then closes the lease, which tells the owner
// nothing here can touch its memory any more.
#pragma once

#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>

#include "arena/arena_memory.hpp"
#include "endpoint/metadata.hpp"
#include "endpoint/share_protocol.hpp"
#include "fetch/transport/peer/peer_memory.hpp"

namespace kvcomm::detail {

class PeerMapping {
 public:
  struct Opened {
    std::shared_ptr<PeerMapping> mapping;  // null when refused
    ShareStatus status = ShareStatus::Granted;
    std::string why;  // refused: the owner's reason (or why it could not be reached)
  };
  /// Asks the owner named by `m` for its registration and maps it; CUDA memory is mapped for `device` (the local
  /// registration's). A refusal (stale, forged, unregistered, not shareable, owner gone) is returned, not thrown;
  /// a failure to map what was granted throws.
  static Opened open(const EndpointMetadata& m, int device, int64_t timeoutMs);
  ~PeerMapping();

  /// The registration's first byte in this process (valid while mapped()).
  char* base() const { return base_; }
  MemoryKind kind() const { return kind_; }
  ShareKind shareKind() const { return shareKind_; }
  int leaseFd() const { return lease_.get(); }

  /// Held while a copy touches the mapping; throws InvalidArgumentError naming `call` and why once unmapped.
  std::unique_ptr<PeerMemory::Use> use(const char* call);
  bool mapped();
  std::string endedWhy();
  /// Reads why the owner ended the lease (its notice, or end of stream: the owner is gone).
  std::string readEnd(const std::string& owner);
  /// Waits for every use, unmaps and closes the lease. Idempotent.
  void unmap(const std::string& why) noexcept;

 private:
  PeerMapping() = default;
  std::shared_mutex mu_;
  bool mapped_ = false;
  std::string endedWhy_;
  char* base_ = nullptr;
  MemoryKind kind_ = MemoryKind::Host;
  ShareKind shareKind_ = ShareKind::None;
  int device_ = -1;
  std::unique_ptr<arena::ImportedMemory> memory_;
  Fd lease_;
};

/// Runs `f` with CUDA device `device` current on a thread of its own (device < 0: on the calling thread), so that the
/// caller's current device never changes; rethrows what it throws.
void onDevice(int device, const std::function<void()>& f);

}  // namespace kvcomm::detail
