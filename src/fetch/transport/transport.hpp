// The seam between the fetch planner and what moves bytes. The planner never knows which transport runs a run:
// the Fetcher asks each transport which members it reaches, hands it the runs whose source it serves, and tracks
// completion run by run. Same-host peer mappings today (fetch/transport/peer/peer_transport.hpp); TCP and RDMA verbs plug in here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "fetch/planner.hpp"
#include "kvcomm/fetch.hpp"

namespace kvcomm::detail {

/// One transport's share of a polled fetch. Destruction drains: it returns only when nothing the operation started
/// can still write the destination.
class TransportOp {
 public:
  virtual ~TransportOp() = default;
  /// Sets blocksDone[i], for every run i (index into the plan's runs) it serves, to how many of the run's first
  /// blocks have landed in every region (visible in this rank's memory); sets *finished when the operation ended
  /// (everything landed, or it failed with *error set: the blocks not counted are not known to have landed).
  virtual void poll(std::vector<int64_t>& blocksDone, bool* finished, std::string* error) = 0;
};

class FetchTransport {
 public:
  virtual ~FetchTransport() = default;
  virtual const char* name() const = 0;
  /// "" when this transport can read member `rank`'s registered memory, else why not.
  virtual std::string unreachable(int rank) const = 0;
  /// Stream-ordered: enqueues the runs `runs` (indices into plan.runs) of `plan`.
  virtual void submit(const PlanOutput& plan, const std::vector<size_t>& runs, Stream stream) = 0;
  /// Polled: starts the runs `runs` of `plan`; the operation holds the plan until it is destroyed.
  virtual std::unique_ptr<TransportOp> start(std::shared_ptr<const PlanOutput> plan, std::vector<size_t> runs,
                                             const FetchOptions& options, Stream stream) = 0;
};

}  // namespace kvcomm::detail
