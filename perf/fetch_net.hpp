// perf_fetch's cross-host mode: two processes in two network namespaces (perf/fetch_netns.sh) or on two hosts, joined
// by a TCP bootstrap (no MPI): rank 0 pulls blocks from rank 1 with kvcomm's TCP transport, against the same bytes
// through one plain TCP connection between the same two processes (send/recv; plus cudaMemcpy into GPU memory on the
// cuda kind), measured in the same run; RDMA READ where both have an RDMA device, else "not run (no RDMA device)".
#pragma once

#include <string>

namespace kvbench {

struct NetOptions {
  int rank = -1;
  int size = 2;
  std::string idFile;  ///< rank 0 writes the bootstrap's unique id here, rank 1 reads it
  std::string ifname;  ///< interface whose address the bootstrap, the fetch server and the baseline use
  std::string kind = "host";
  int reps = 10;
  bool quick = false;
  /// The endpoint sweep instead of the fixed cases: block sizes 4 KiB to 2 MiB x batches of 1 to 16k blocks (up to
  /// 64 MiB a transfer; 8 MiB with quick), the Fetcher, the endpoint's pull and push and a raw socket on each.
  bool sweep = false;
  std::string json;
};

/// Runs the cross-host fetch table; returns the process exit code.
int runNetwork(const NetOptions& o);

}  // namespace kvbench
