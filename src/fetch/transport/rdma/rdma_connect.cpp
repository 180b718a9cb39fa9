#include "fetch/transport/rdma/rdma_connect.hpp"

#include <cstring>
#include <type_traits>

#include "common/check.hpp"

namespace kvcomm::detail {

namespace {

struct Counts {
  uint32_t numQps;
  uint32_t numChunks;  // 0 in a request
};

struct WireChunk {
  uint64_t offset;
  uint64_t bytes;
  uint64_t addr;
  uint32_t rkey;
  uint32_t reserved;
};

static_assert(sizeof(FabricAddress) == 32 && sizeof(QpAddress) == 8 && sizeof(WireChunk) == 32);
static_assert(std::is_trivially_copyable_v<FabricAddress> && std::is_trivially_copyable_v<QpAddress>);

constexpr size_t kHead = sizeof(Counts) + sizeof(FabricAddress);

std::vector<uint8_t> encode(const FabricAddress& fabric, const std::vector<QpAddress>& qps,
                            const std::vector<ChunkKey>* chunks) {
  Counts c{static_cast<uint32_t>(qps.size()), chunks ? static_cast<uint32_t>(chunks->size()) : 0u};
  std::vector<uint8_t> out(kHead + qps.size() * sizeof(QpAddress) + c.numChunks * sizeof(WireChunk));
  uint8_t* p = out.data();
  std::memcpy(p, &c, sizeof(c));
  std::memcpy(p + sizeof(c), &fabric, sizeof(fabric));
  p += kHead;
  if (!qps.empty()) std::memcpy(p, qps.data(), qps.size() * sizeof(QpAddress));
  p += qps.size() * sizeof(QpAddress);
  for (uint32_t i = 0; i < c.numChunks; ++i) {
    const ChunkKey& k = (*chunks)[i];
    WireChunk w{k.offset, k.bytes, k.addr, k.rkey, 0};
    std::memcpy(p + i * sizeof(WireChunk), &w, sizeof(w));
  }
  return out;
}

// The head and queue pairs; "" or why not. *chunksAt: where the pieces start.
std::string decodeHead(const void* data, size_t bytes, Counts* c, FabricAddress* fabric, std::vector<QpAddress>* qps,
                       const uint8_t** chunksAt) {
  if (bytes < kHead) return cat("an RDMA connect message of ", bytes, " bytes (at least ", kHead, ")");
  const auto* p = static_cast<const uint8_t*>(data);
  std::memcpy(c, p, sizeof(*c));
  std::memcpy(fabric, p + sizeof(*c), sizeof(*fabric));
  if (c->numQps != static_cast<uint32_t>(kQpsPerPeer))
    return cat("an RDMA connect message with ", c->numQps, " queue pairs (", kQpsPerPeer, " expected)");
  if (c->numChunks > kMaxConnectChunks)
    return cat("an RDMA connect message with ", c->numChunks, " pieces (at most ", kMaxConnectChunks, ")");
  if (fabric->valid != 1) return "an RDMA connect message without a fabric address";
  if (fabric->readDepth == 0 || fabric->maxMsg == 0)
    return "an RDMA connect message with a zero READ depth or message size";
  const uint64_t need = kHead + uint64_t{c->numQps} * sizeof(QpAddress) + uint64_t{c->numChunks} * sizeof(WireChunk);
  if (bytes != need) return cat("an RDMA connect message of ", bytes, " bytes (its counts say ", need, ")");
  qps->resize(c->numQps);
  std::memcpy(qps->data(), p + kHead, c->numQps * sizeof(QpAddress));
  *chunksAt = p + kHead + c->numQps * sizeof(QpAddress);
  return "";
}

}  // namespace

std::vector<uint8_t> encodeConnectRequest(const RdmaConnectRequest& r) {
  return encode(r.fabric, r.qps, nullptr);
}

std::string decodeConnectRequest(const void* data, size_t bytes, RdmaConnectRequest* out) {
  Counts c{};
  RdmaConnectRequest r;
  const uint8_t* chunks = nullptr;
  std::string why = decodeHead(data, bytes, &c, &r.fabric, &r.qps, &chunks);
  if (!why.empty()) return why;
  if (c.numChunks != 0) return "an RDMA connect request carries pieces";
  *out = std::move(r);
  return "";
}

std::vector<uint8_t> encodeConnectReply(const RdmaConnectReply& r) {
  return encode(r.fabric, r.qps, &r.chunks);
}

std::string decodeConnectReply(const void* data, size_t bytes, uint64_t registeredBytes, RdmaConnectReply* out) {
  Counts c{};
  RdmaConnectReply r;
  const uint8_t* at = nullptr;
  std::string why = decodeHead(data, bytes, &c, &r.fabric, &r.qps, &at);
  if (!why.empty()) return why;
  if (c.numChunks == 0) return "an RDMA connect reply without pieces";
  uint64_t end = 0;
  for (uint32_t i = 0; i < c.numChunks; ++i) {
    WireChunk w;
    std::memcpy(&w, at + i * sizeof(WireChunk), sizeof(w));
    if (w.bytes == 0 || w.offset > registeredBytes || w.bytes > registeredBytes - w.offset)
      return cat("piece ", i, " [", w.offset, ", +", w.bytes, ") lies outside the registration's ", registeredBytes,
                 " bytes");
    if (i > 0 && w.offset < end) return cat("piece ", i, " overlaps or precedes the one before it");
    if (w.addr + w.bytes < w.addr) return cat("piece ", i, "'s address range wraps");
    end = w.offset + w.bytes;
    r.chunks.push_back({w.offset, w.bytes, w.addr, w.rkey, 0});
  }
  *out = std::move(r);
  return "";
}

}  // namespace kvcomm::detail
