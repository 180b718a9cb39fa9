// A registration's RDMA side (endpoints): a fabric on the RDMA device nearest its memory, the memory regions of its
// pieces, and queue pairs per peer: as the owner (a peer's connect request over the TCP connection of the pair,
// fetch/transport/rdma/rdma_connect.hpp) and as the requester (this endpoint's transfers between it and a peer's
// registration). Opened lazily (the first peer that connects, the first RDMA transfer), closed at unregister: every
// queue pair destroyed and every region deregistered once the operation in flight ended, so no peer's READ or WRITE
// reaches the memory afterwards (a peer's next work request fails, naming its blocks).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "fetch/transport/net/wire.hpp"
#include "fetch/transport/rdma/verbs_transport.hpp"

namespace kvcomm::detail {

struct VerbsApi;

class RdmaSide : public std::enable_shared_from_this<RdmaSide> {
 public:
  struct Memory {
    char* base = nullptr;
    size_t bytes = 0;
    MemoryKind kind = MemoryKind::Host;
    int device = -1;
    std::vector<LocalPiece> pieces;  ///< what backs it, one memory region each (CUDA: one allocation each)
    bool remoteWrite = false;        ///< peers may WRITE (a read-write registration)
  };

  /// Opens the fabric (`api`: nullptr means the real libibverbs) and registers the pieces; nullptr with *why when
  /// there is no usable device or the memory cannot be registered.
  static std::shared_ptr<RdmaSide> open(const VerbsApi* api, const Memory& memory, int64_t timeoutMs, std::string* why);
  ~RdmaSide();

  /// Owner: a peer's connect request; Ok with the reply bytes, or a status and *why. *hold destroys the peer's
  /// queue pairs when released (the connection that asked ended).
  WireStatus accept(const uint8_t* body, size_t bytes, std::vector<uint8_t>* reply, std::shared_ptr<void>* hold,
                    std::string* why);

  /// Requester: queue pairs for a new peer and the request that carries them. Throws when closed.
  int newPeer(std::vector<uint8_t>* request);
  /// Requester: connects the peer's queue pairs from the owner's reply; "" or why not (a malformed reply).
  std::string finish(int peer, const std::vector<uint8_t>& reply, uint64_t remoteBytes, const std::string& name);
  /// Destroys the peer's queue pairs (after the operation in flight).
  void drop(int peer);

  VerbsFabric* fabric() { return fabric_.get(); }
  /// Every queue pair destroyed and every region deregistered; later calls find nothing to use.
  void close();

 private:
  RdmaSide() = default;

  std::unique_ptr<VerbsFabric> fabric_;
  size_t bytes_ = 0;
  std::mutex mu_;
  bool closed_ = false;
  int nextPeer_ = 1;
  std::set<int> peers_;
  std::vector<ChunkKey> keys_;
};

}  // namespace kvcomm::detail
