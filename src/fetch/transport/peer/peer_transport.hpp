// Same-host fetch over peer mappings (a SymmetricBuffer's, or an endpoint pair's: PeerMemory): the gather kernel or
// the copy engines on CUDA memory, CPU copies on host memory. Owns nothing but the copies in flight: close() drains
// them.
#pragma once

#include <memory>

#include "comm/health.hpp"
#include "fetch/device_copy.hpp"
#include "fetch/transport/peer/peer_memory.hpp"
#include "fetch/transport/transport.hpp"
#include "kvcomm/symm.hpp"

namespace kvcomm::detail {

/// What the peer transport reads: the memory, the layouts, the kernel's view of both.
struct PeerContext {
  std::shared_ptr<const PeerMemory> memory;
  const MemberLayouts* table = nullptr;
  FetchDeviceHandle handle{};
  DeviceErrorRecord* error = nullptr;
  uint32_t* claims = nullptr;  // CUDA: one zeroed word per destination block (device ids: the last pair wins)
  int64_t numClaims = 0;
  DeviceCopier* copier = nullptr;       // CUDA buffers
  std::vector<int> pids;                // by rank (liveness of sources)
  std::vector<std::string> names;       // by rank: how errors name a source ("" : "source rank R")
  const GroupHealth* health = nullptr;  // the buffer's group (abort, members known dead); outlives every operation
};

std::unique_ptr<FetchTransport> makePeerTransport(PeerContext context);
/// The registry's entry: the peer transport over the fetcher's same-host context (setup.peer).
std::unique_ptr<FetchTransport> makePeerPlugin(const TransportSetup& setup);

/// The copies of run `run` region by region: one contiguous copy where both sides' blocks are back to back, else
/// one 2-D copy (blocks rows of blockBytes at the two strides).
std::vector<CopyDesc> runCopies(const PeerContext& c, const BlockRun& run);
/// The same into `out` (cleared first; its capacity is reused).
void runCopies(const PeerContext& c, const BlockRun& run, std::vector<CopyDesc>& out);

/// The gather kernel's launch for `pairs` pairs (ids filled in by the caller): the fetcher's tables and chunking
/// that gives the GPU enough warp-sized items.
FetchLaunch makeFetchLaunch(const PeerContext& c, size_t pairs);

/// Whether process `pid` (on this host) still runs: not gone and not a zombie.
bool processAlive(int pid);

/// How errors name member `source` (PeerContext::names, else "source rank R").
std::string sourceName(const PeerContext& c, int source);

/// Why an operation reading from `source` must fail by the group's health ("" when it may go on): the communicator
/// was aborted, or `source` is known dead.
std::string healthFailure(const PeerContext& c, int source);

}  // namespace kvcomm::detail
