#include "fetch/transport/peer/peer_memory.hpp"

#include "symm/buffer_use.hpp"

namespace kvcomm::detail {

namespace {

class BufferMemoryUse : public PeerMemory::Use {
 public:
  BufferMemoryUse(const SymmetricBuffer& b, const char* call) : use_(b, call) {}
  uint64_t generation() const override { return use_.generation(); }

 private:
  BufferUse use_;
};

class BufferPeerMemory : public PeerMemory {
 public:
  explicit BufferPeerMemory(const SymmetricBuffer& b) : b_(b) {}
  MemoryKind kind() const override { return b_.kind(); }
  int rank() const override { return b_.rank(); }
  char* local() const override { return static_cast<char*>(b_.local()); }
  char* peer(int rank) const override { return static_cast<char*>(b_.peer(rank)); }
  bool isMapped(int rank) const override { return b_.isMapped(rank); }
  std::unique_ptr<Use> use(const char* call) const override { return std::make_unique<BufferMemoryUse>(b_, call); }

 private:
  const SymmetricBuffer& b_;
};

}  // namespace

std::shared_ptr<const PeerMemory> bufferPeerMemory(const SymmetricBuffer& buffer) {
  return std::make_shared<BufferPeerMemory>(buffer);
}

}  // namespace kvcomm::detail
