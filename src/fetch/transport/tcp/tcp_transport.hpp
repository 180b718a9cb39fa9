// Fetch over TCP from members on other hosts (or any member, when KVCOMM_FETCH_TRANSPORT=tcp): the requester side
// of the protocol in fetch/transport/net/wire.hpp; the serving side is fetch/transport/tcp/tcp_server.hpp.
//
// A fetch's runs from one source are split into requests (at most kMaxRunsPerRequest runs and about 8 MiB each,
// smaller when paced) that up to KVCOMM_FETCH_TCP_CONNECTIONS connections to that source carry in parallel. Replies
// are received straight into the destination blocks (readv over the layout's segments) on host memory, and through
// two pinned slots per connection on CUDA memory (socket -> slot while the other slot's host-to-device copy runs,
// in the caller's stream order). Connections are pooled per source, opened on first use, and dropped after any
// failure. Every wait is bounded by KVCOMM_FETCH_NET_TIMEOUT_MS of no progress, so a dead or unreachable source is
// an error naming it (and the blocks not known to have landed), never a hang.
#pragma once

#include <memory>
#include <vector>

#include "fetch/device_copy.hpp"
#include "fetch/transport/net/net_context.hpp"
#include "fetch/transport/transport.hpp"
#include "kvcomm/symm.hpp"

namespace kvcomm::detail {

std::unique_ptr<FetchTransport> makeTcpTransport(NetContext context);

}  // namespace kvcomm::detail
