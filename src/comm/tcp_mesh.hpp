// Point-to-point TCP mesh among the processes of a bootstrap: tagged messages, lazy connections, bounded waits.
//
// Why this shape: sub-communicators (TP, PCP groups) must run collectives among their members only, whatever the
// engine's bootstrap was, so every Communicator talks over this mesh. Each direction of a pair has its own
// connection (the sender dials), so there is no connect race; every wait also drains inbound connections into a
// stash, so two ranks sending large messages to each other never deadlock on full socket buffers.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/fd.hpp"
#include "common/socket.hpp"
#include "kvcomm/bootstrap.hpp"

namespace kvcomm::detail {

/// Wire constants shared by the mesh and the TCP bootstrap's root handshake.
inline constexpr uint32_t kWireMagic = 0x4b56434d;  // "KVCM"
inline constexpr uint32_t kProtocolVersionWire = kvcomm::kProtocolVersion;

/// Message tag: a group identity and that group's collective sequence number.
inline uint64_t makeTag(uint32_t group, uint32_t seq) {
  return (static_cast<uint64_t>(group) << 32) | seq;
}
enum class HelloKind : uint32_t { Root = 1, Mesh = 2 };

/// First message on every connection.
struct Hello {
  uint32_t magic;
  uint32_t version;
  uint32_t kind;
  int32_t rank;
  int32_t size;
  uint32_t reserved;
  std::array<uint8_t, 16> nonce;
  SockAddr listenAddr;  // Root hellos: where this rank's mesh listens
};

/// Root's answer to a Root hello: status 0 and then size() addresses, or an error text.
struct HelloReply {
  int32_t status;
  char message[252];
};

class TcpMesh {
 public:
  TcpMesh(int rank, int size, const std::array<uint8_t, 16>& nonce, Fd listener, int64_t timeoutMs);
  ~TcpMesh();

  int rank() const { return rank_; }
  int size() const { return size_; }
  int64_t timeoutMs() const { return timeoutMs_; }
  /// Sets every rank's listening address (after the bootstrap exchanged them).
  void setAddresses(std::vector<SockAddr> addrs);

  /// Sends `len` bytes to `peer` under `tag`.
  void send(int peer, uint64_t tag, const void* data, size_t len);
  /// Receives the next message from `peer` under `tag`; its length must be `len`.
  void recv(int peer, uint64_t tag, void* data, size_t len);
  /// Sends to one peer while receiving from another (ring steps).
  void sendRecv(int sendPeer, const void* sdata, size_t slen, int recvPeer, void* rdata, size_t rlen, uint64_t tag);
  /// Ring allgather among `members` (mesh ranks, sorted by group rank); `me` is this rank's index in it.
  void allgather(const std::vector<int>& members, int me, void* data, size_t bytesPerRank, uint64_t tag);

  /// A new identity for a group created collectively by every mesh rank.
  uint32_t nextWorldGroupId() { return ++worldGroups_; }

 private:
  struct Inbound {
    Fd fd;
    int rank = -1;  // -1 until its hello arrived
    std::vector<char> buf;
  };
  void progressLocked(int timeoutMs);
  void acceptLocked();
  bool readInboundLocked(Inbound& in);
  void parseFramesLocked(Inbound& in);
  int outboundLocked(int peer);
  void sendLocked(int peer, uint64_t tag, const void* data, size_t len);
  void recvLocked(int peer, uint64_t tag, void* data, size_t len, Clock::time_point deadline);
  [[noreturn]] void throwPeerGone(int peer, const char* call);

  int rank_;
  int size_;
  std::array<uint8_t, 16> nonce_;
  Fd listener_;
  int64_t timeoutMs_;
  uint32_t worldGroups_ = 0;
  std::vector<SockAddr> addrs_;
  std::vector<Fd> outbound_;
  std::vector<std::unique_ptr<Inbound>> inbound_;
  std::vector<std::string> gone_;  // per peer: why its inbound connection ended ("" while alive)
  std::map<std::pair<int, uint64_t>, std::deque<std::vector<char>>> stash_;
  std::mutex mu_;
};

}  // namespace kvcomm::detail
