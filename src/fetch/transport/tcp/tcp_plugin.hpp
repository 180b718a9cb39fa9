// The TCP transport as the registry makes it: this rank's fetch server (serving side, fetch/transport/tcp/
// tcp_server.hpp) and the requester side (fetch/transport/tcp/tcp_transport.hpp) behind one FetchTransport.
#pragma once

#include <memory>

#include "fetch/transport/tcp/tcp_server.hpp"
#include "fetch/transport/transport.hpp"

namespace kvcomm::detail {

std::unique_ptr<FetchTransport> makeTcpPlugin(const TransportSetup& setup);

/// The server statistics of `t` when the registry made it as the TCP transport (all zero otherwise, or when it
/// serves nothing).
TcpServer::Stats tcpServerStats(const FetchTransport& t);

}  // namespace kvcomm::detail
