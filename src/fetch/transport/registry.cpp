// The registered fetch transports and the one loop that picks a transport per source.
#include "fetch/transport/peer/peer_transport.hpp"
#include "fetch/transport/rdma/rdma_plugin.hpp"
#include "fetch/transport/tcp/tcp_plugin.hpp"
#include "fetch/transport/transport.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

namespace kvcomm::detail {

bool TransportOp::waitEnded(int64_t timeoutMs) {
  std::this_thread::sleep_for(std::chrono::microseconds(std::clamp<int64_t>(timeoutMs * 1000, 0, 50)));
  return false;
}

const std::vector<TransportEntry>& transportRegistry() {
  static const std::vector<TransportEntry> entries = {
      {"peer", makePeerPlugin},
      {"tcp", makeTcpPlugin},
      {"rdma", makeRdmaPlugin},
  };
  return entries;
}

Selection selectTransports(const RouteInput& in, const std::vector<std::shared_ptr<FetchTransport>>& transports) {
  Selection s;
  s.routes = chooseRoutes(in, &s.why);
  s.chosen.assign(s.routes.size(), nullptr);
  for (size_t r = 0; r < s.routes.size(); ++r) {
    if (s.routes[r] == Route::None) continue;
    for (const auto& t : transports)
      if (t->route() == s.routes[r]) s.chosen[r] = t.get();
    if (!s.chosen[r]) {  // a route no registered transport runs: as unreachable as no route at all
      s.why[r] = cat("no registered transport runs route ", routeName(s.routes[r]), " to member ", r);
      s.routes[r] = Route::None;
    }
  }
  return s;
}

}  // namespace kvcomm::detail
