// What the members of a Fetcher exchanged and what its server did, for tests and tools that need more than the
// public API (a hostile client needs a server's region id; fault tests count served and refused requests).
#pragma once

#include "fetch/transport/negotiation.hpp"
#include "fetch/transport/tcp/tcp_server.hpp"
#include "kvcomm/fetch.hpp"

namespace kvcomm::detail {

struct FetcherInternals {
  /// Member `rank`'s descriptor as this rank received it.
  static RemoteDescriptor descriptor(const Fetcher& f, int rank);
  /// This rank's TCP server statistics (all zero when it serves none).
  static TcpServer::Stats serverStats(const Fetcher& f);
};

}  // namespace kvcomm::detail
