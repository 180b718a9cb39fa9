// The fetch planner: validates a batch of requests against the registered layouts before anything moves, then
// coalesces consecutive block pairs into runs and picks the path per run. Pure (no communication, no memory
// access), so it is unit-tested on its own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fetch/member_layouts.hpp"
#include "kvcomm/fetch.hpp"

namespace kvcomm::detail {

/// Validated block pairs (skips removed), structure of arrays in request order: the first size() entries are valid
/// (the arrays may be longer: a reused output keeps its capacity).
struct FetchPairs {
  std::vector<int64_t> src;
  std::vector<int64_t> dst;
  std::vector<int32_t> rank;
  size_t count = 0;
  size_t size() const { return count; }
};

/// Consecutive pairs of one request whose source and destination ids both go up by one: `blocks` blocks from
/// source block `src` of member `rank` into destination block `dst`, in every region (one copy per region).
struct BlockRun {
  int32_t rank;
  int64_t src;
  int64_t dst;
  int64_t blocks;
  size_t firstPair;  ///< index into FetchPairs of the run's first pair
  FetchPath path;    ///< Kernel, CopyEngine or Host
};

struct PlanInput {
  const MemberLayouts* table = nullptr;
  int myRank = 0;
  /// By rank: whether the same-host path reaches the member, and why not.
  std::vector<uint8_t> reachable;
  std::vector<std::string> unreachableWhy;
  /// Resolved path: Kernel, CopyEngine, Host, or Auto (CUDA: per run by copyEngineMinRunBytes).
  FetchPath path = FetchPath::Host;
  uint64_t copyEngineMinRunBytes = 4ull << 20;
  /// Auto: a batch of at most this many copies (runs x regions) goes to the copy engines (lower latency).
  size_t copyEngineMaxDescriptors = 4;
  /// By rank (null, or a null entry: counted by path): the FetchPlanInfo field that counts runs from that source,
  /// as the transport that moves them reports it (FetchTransport::runCounter: tcpRuns, rdmaRuns).
  const std::vector<size_t FetchPlanInfo::*>* counters = nullptr;
  /// By rank (null: "rank N" and "this rank"): how errors name the members (an endpoint's two registrations).
  const std::vector<std::string>* names = nullptr;
  const char* call = "fetch (plan)";
};

struct PlanOutput {
  FetchPairs pairs;
  std::vector<BlockRun> runs;
  FetchPlanInfo info;
  uint64_t generation =
      0;  ///< the buffer generation it was validated at (set by the Fetcher; network requests name it)
  /// An endpoint's write: each run moves this side's blocks `dst` into the source's blocks `src` (the other way
  /// round from a fetch); only the network transports carry it.
  bool push = false;
};

/// Validates every request and pair, then coalesces (maximal runs in request order). Throws InvalidArgumentError
/// naming the request and pair index (bad rank, hash mismatch, id out of range or negative other than -1, duplicate
/// destination), Unsupported naming the request when its source is not reachable.
PlanOutput planFetch(const std::vector<FetchRequest>& requests, const PlanInput& in);
/// The same into `out`, reusing its arrays' capacity (fetches planned and submitted at once keep one scratch
/// output: no allocation, no page faults on the per-pair path).
void planFetch(const std::vector<FetchRequest>& requests, const PlanInput& in, PlanOutput& out);

}  // namespace kvcomm::detail
