// perf_fetch --endpoint: the same-host endpoint (kvcomm::Endpoint, peer mappings) beside the collective Fetcher on the
// same buffers and path, swept over block sizes 4 KiB-2 MiB and batches of 1-16k blocks: polled read and write
// against the Fetcher's polled start, and (CUDA) readDevice against fetchDevice with the host us spent in the call,
// and a cudaMemcpyAsync (host: memcpy) per block.
#pragma once

#include <string>

#include "bench/bench.hpp"
#include "kvcomm/comm.hpp"

namespace kvbench {

struct EndpointPeerOptions {
  std::string kind = "host";  ///< "host" or "cuda"
  int reps = 20;
  bool quick = false;
  std::string json;
};

/// Collective over `world` (2 ranks on one host): rank 0 pulls from and pushes to rank 1.
void runEndpointPeer(kvcomm::Communicator& world, const EndpointPeerOptions& o, const Placement& where);

}  // namespace kvbench
