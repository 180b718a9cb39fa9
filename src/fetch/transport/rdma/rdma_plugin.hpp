// The RDMA transport as the registry makes it: this rank's fabric (device, registrations, queue pairs) and the
// requester side (fetch/transport/rdma/verbs_transport.hpp) behind one FetchTransport.
#pragma once

#include <memory>

#include "fetch/transport/transport.hpp"

namespace kvcomm::detail {

std::unique_ptr<FetchTransport> makeRdmaPlugin(const TransportSetup& setup);

}  // namespace kvcomm::detail
