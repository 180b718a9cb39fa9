// What the peer transport copies between: this member's memory and the same-host members' memory mapped into this
// process. A Fetcher's is its SymmetricBuffer (every member of the group); an endpoint's is a pair of registrations
// (its own and a peer's it mapped over the same-host share protocol, src/endpoint/).
#pragma once

#include <cstdint>
#include <memory>

#include "kvcomm/symm.hpp"

namespace kvcomm::detail {

class PeerMemory {
 public:
  /// Held while a CPU copy touches the mappings: whatever could unmap them on another thread waits for it.
  class Use {
   public:
    virtual ~Use() = default;
    /// The memory's generation while this use lives (a plan made at another one is stale).
    virtual uint64_t generation() const = 0;
  };

  virtual ~PeerMemory() = default;
  virtual MemoryKind kind() const = 0;
  /// This member (the destination of every run).
  virtual int rank() const = 0;
  virtual char* local() const = 0;
  /// Member `rank`'s memory as mapped here (null when not mapped).
  virtual char* peer(int rank) const = 0;
  virtual bool isMapped(int rank) const = 0;
  /// Throws (naming `call` and why) when the memory can no longer be touched.
  virtual std::unique_ptr<Use> use(const char* call) const = 0;
};

/// The peer memory of a SymmetricBuffer (a handle of the caller's, which must outlive it).
std::shared_ptr<const PeerMemory> bufferPeerMemory(const SymmetricBuffer& buffer);

}  // namespace kvcomm::detail
