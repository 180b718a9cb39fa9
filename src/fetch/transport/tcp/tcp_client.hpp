// The requester's side of a connection to a member's TCP server, below the transfers: phase 1 (connect, hello with
// the capability where the member demands one, the server's answer checked) and control requests (an endpoint's
// RDMA connection of a pair). The transport's channels and an endpoint's control connection open the same way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/fd.hpp"
#include "fetch/transport/net/net_context.hpp"
#include "fetch/transport/net/wire.hpp"

namespace kvcomm::detail {

/// How errors name member `rank`: its source name (or "source rank N") and its TCP address.
std::string describePeer(const NetContext& c, int rank);

/// A connection to member `rank`'s server that passed phase 1. Throws NetworkError (unreachable, no answer) or
/// Unsupported (refused: the server's status and reason; another version; no direct reads; another region).
struct HelloedConnection {
  Fd fd;
  uint32_t serverCaps = 0;
};
HelloedConnection connectHello(const NetContext& c, int rank);

/// What a control request got back: status Ok and the handler's bytes, or a refusal and why.
struct ControlAnswer {
  WireStatus status = WireStatus::Ok;
  std::vector<uint8_t> reply;
  std::string why;
};

/// Sends control request `kind` with `body` for `generation` over a connection that passed phase 1 and waits for
/// its answer (bounded by `timeoutMs` of no progress). Throws NetworkError when the connection fails (`who` names
/// the server).
ControlAnswer controlRequest(int fd, uint32_t kind, uint64_t generation, const std::vector<uint8_t>& body,
                             int64_t timeoutMs, const std::string& who);

}  // namespace kvcomm::detail
