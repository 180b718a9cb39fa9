#include "endpoint/rdma_side.hpp"

#include "common/check.hpp"
#include "fetch/transport/rdma/rdma_connect.hpp"

namespace kvcomm::detail {

std::shared_ptr<RdmaSide> RdmaSide::open(const VerbsApi* api, const Memory& memory, int64_t timeoutMs,
                                         std::string* why) {
  // VMM and cudaMalloc memory both export dma-bufs (only legacy-IPC imports cannot, and endpoints register their
  // own memory).
  auto fabric = VerbsFabric::open(api, memory.kind, memory.device, "",
                                  memory.kind == MemoryKind::Cuda ? "posix_fd" : "memfd", timeoutMs, why);
  if (!fabric) return nullptr;
  std::shared_ptr<RdmaSide> side(new RdmaSide());
  try {
    side->keys_ = fabric->registerPieces(memory.base, memory.pieces, memory.remoteWrite);
  } catch (const std::exception& e) {
    *why = cat("the memory cannot be registered with ", fabric->deviceName(), ": ", e.what());
    return nullptr;
  }
  side->fabric_ = std::move(fabric);
  side->bytes_ = memory.bytes;
  return side;
}

RdmaSide::~RdmaSide() {
  close();
}

WireStatus RdmaSide::accept(const uint8_t* body, size_t bytes, std::vector<uint8_t>* reply, std::shared_ptr<void>* hold,
                            std::string* why) {
  RdmaConnectRequest req;
  *why = decodeConnectRequest(body, bytes, &req);
  if (!why->empty()) return WireStatus::Malformed;
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) {
    *why = "the registration's RDMA side is closed";
    return WireStatus::Closing;
  }
  const int peer = nextPeer_++;
  RdmaConnectReply r;
  try {
    r.qps = fabric_->createQps(peer);
    peers_.insert(peer);
    fabric_->connectQps(peer, req.fabric, req.qps);
  } catch (const std::exception& e) {
    fabric_->dropPeer(peer);
    peers_.erase(peer);
    *why = e.what();
    return WireStatus::Unsupported;
  }
  r.fabric = fabric_->address();
  r.chunks = keys_;
  for (ChunkKey& k : r.chunks) k.lkey = 0;
  *reply = encodeConnectReply(r);
  // The lease: the peer's queue pairs go when the connection that asked ends (a client that exits or dies).
  struct Lease {
    Lease(std::weak_ptr<RdmaSide> s, int p) : side(std::move(s)), peer(p) {}
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() {
      if (auto s = side.lock()) s->drop(peer);
    }
    std::weak_ptr<RdmaSide> side;
    int peer;
  };
  *hold = std::make_shared<Lease>(weak_from_this(), peer);
  return WireStatus::Ok;
}

int RdmaSide::newPeer(std::vector<uint8_t>* request) {
  std::lock_guard<std::mutex> lock(mu_);
  KVCOMM_CHECK_ARG(!closed_, "Endpoint (rdma)", "the registration's RDMA side is closed (unregistered)");
  const int peer = nextPeer_++;
  RdmaConnectRequest req;
  req.fabric = fabric_->address();
  req.qps = fabric_->createQps(peer);
  peers_.insert(peer);
  *request = encodeConnectRequest(req);
  return peer;
}

std::string RdmaSide::finish(int peer, const std::vector<uint8_t>& reply, uint64_t remoteBytes,
                             const std::string& name) {
  RdmaConnectReply r;
  std::string why = decodeConnectReply(reply.data(), reply.size(), remoteBytes, &r);
  if (!why.empty()) return why;
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return "the registration's RDMA side is closed (unregistered)";
  fabric_->namePeer(peer, name);
  fabric_->connectQps(peer, r.fabric, r.qps);
  fabric_->setRemoteChunks(peer, std::move(r.chunks));
  return "";
}

void RdmaSide::drop(int peer) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_ || !peers_.erase(peer)) return;
  fabric_->dropPeer(peer);
}

void RdmaSide::close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_ || !fabric_) return;
  closed_ = true;
  for (int peer : peers_) fabric_->dropPeer(peer);
  peers_.clear();
  fabric_->unback({{0, bytes_}});
}

}  // namespace kvcomm::detail
