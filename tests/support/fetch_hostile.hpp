// A hostile client of a fetch server (tests of its robustness, in one process and across network namespaces): it
// speaks, abuses or breaks the wire protocol of src/fetch/transport/net/wire.hpp and checks that the server answers as
// it must.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/fd.hpp"
#include "common/socket.hpp"
#include "fetch/transport/net/wire.hpp"

namespace kvtest {

/// Where a fetch server listens and what it serves.
struct FetchTarget {
  kvcomm::detail::SockAddr addr;
  uint64_t regionId = 0;
  uint64_t groupId = 0;
  uint64_t generation = 0;
  uint64_t layoutHash = 0;
  uint64_t minBlocks = 0;
  uint64_t blockBytesSum = 0;
};

/// A raw connection speaking the wire protocol.
class RawFetchClient {
 public:
  explicit RawFetchClient(const kvcomm::detail::SockAddr& a);
  int fd() const { return fd_.get(); }
  void send(const void* p, size_t n);
  template <typename T>
  void sendStruct(const T& v) {
    send(&v, sizeof(v));
  }
  /// Reads exactly n bytes; false on EOF or after `ms`.
  bool recv(void* p, size_t n, int ms = 2000);
  /// True once the server closed the connection within `ms`.
  bool closedByPeer(int ms = 2000);
  kvcomm::detail::WireHelloReply hello(uint64_t regionId, uint64_t groupId,
                                       uint16_t version = kvcomm::detail::kFetchProtocolVersion,
                                       uint16_t minVersion = kvcomm::detail::kFetchMinProtocolVersion);
  /// Sends a request; returns the reply header (zeroed when none came), the error text or the payload.
  kvcomm::detail::WireReply request(const kvcomm::detail::WireRequest& q,
                                    const std::vector<kvcomm::detail::WireRun>& runs,
                                    std::vector<char>* payload = nullptr, std::string* error = nullptr);

 private:
  kvcomm::detail::Fd fd_;
};

/// A request header for `target` with a fresh id.
kvcomm::detail::WireRequest fetchRequest(const FetchTarget& target, uint32_t runs);

/// Kinds of malformed requests: 0 bad hello magic, 1 wrong region, 2 version mismatch, 3 bad request magic, 4 zero
/// runs, 5 a run count above the cap, 6 a block out of range, 7 a negative id, 8 a count near 2^63, 9 a stale
/// generation, 10 another layout, 11 a reply above the cap, 12 a truncated header, 13 truncated runs, 14 a request
/// that stalls half-way (the server must drop it after its deadline; waits up to `stallMs` for that).
inline constexpr int kMalformedKinds = 15;
const char* malformedKindName(int kind);
/// Sends one malformed request of `kind` on a fresh connection and checks the server's answer (the right error
/// reply, a close where the stream cannot be trusted, and for well-formed bad requests a connection that still
/// serves a valid read). Returns "" when it answered as it must, else what was wrong.
std::string sendMalformed(const FetchTarget& target, int kind, int64_t stallMs = 2000);

}  // namespace kvtest
