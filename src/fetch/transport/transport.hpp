// The fetch transports as plug-ins: each folder below fetch/transport/ (peer/, tcp/, rdma/) is one transport, its
// whole lifecycle behind FetchTransport, and one line of the registry (fetch/transport/registry.cpp). The Fetcher is
// a loop over the registered transports; the planner never knows which transport runs a run.
//
// Lifecycle, in the order the Fetcher calls it (every call on every rank for every transport, used or not, so the
// collective steps of one transport line up across ranks):
//   open       this rank's side exists (a listener, an opened device); returns the FetchCap bits it offers
//   describe   its fields of this rank's descriptor: the bytes peers get (RemoteDescriptor, fetch/transport/
//              negotiation.hpp); its cap bits in mine.head.caps are those that survived the test hooks
//   (select)   one loop (selectTransports) picks a transport per source and records why a source has none
//   serve      whether any member reads this rank over it (from the route matrix): serve, or drop the server
//   connect    a pass over every member's descriptor and the route matrix (collective where the transport needs
//              it: queue pairs). Endpoints (src/endpoint/) meet peers without a world: they make a transport's
//              requester for one pair of registrations (a two-member NetContext) and serve through its server.
//   refresh    the buffer changed (backed ranges, chunk keys): collective, after the Fetcher's vote
//   unback     ranges stop being readable before they are unmapped (release, close of the buffer)
//   submit / start   runs of a plan: stream-ordered / polled (one call per batch of runs, never per block)
//   stopServing, close   teardown: every transport stops serving, then every one drains in reverse registry order
//              (network requester sides first, the peer transport's same-host copies last)
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/check.hpp"
#include "common/env.hpp"
#include "fetch/planner.hpp"
#include "fetch/transport/negotiation.hpp"
#include "kvcomm/comm.hpp"
#include "kvcomm/fetch.hpp"
#include "kvcomm/symm.hpp"

namespace kvcomm::detail {

struct PeerContext;  // fetch/transport/peer/peer_transport.hpp

/// One transport's share of a polled fetch. Destruction drains: it returns only when nothing the operation started
/// can still write the destination.
class TransportOp {
 public:
  virtual ~TransportOp() = default;
  /// Sets blocksDone[i], for every run i (index into the plan's runs) it serves, to how many of the run's first
  /// blocks have landed in every region (visible in this rank's memory); sets *finished when the operation ended
  /// (everything landed, or it failed with *error set: the blocks not counted are not known to have landed).
  virtual void poll(std::vector<int64_t>& blocksDone, bool* finished, std::string* error) = 0;
  /// Blocks until the operation ended or `timeoutMs` passed (>= 0); true when it ended. The default sleeps up to
  /// 50 us and says false (the caller polls).
  virtual bool waitEnded(int64_t timeoutMs);
  /// Runs the operation on the calling thread when nothing has started it yet (a waiter with nothing else to do
  /// saves two thread hand-offs); true when it ran it here (it has ended). The default never does.
  virtual bool runHere() { return false; }
  /// Cancels and returns once nothing the operation started can still write (what destruction does, leaving the
  /// object to poll: a waiter on another thread may still hold it). Idempotent.
  virtual void stop() {}
};

/// What a Fetcher hands every transport it creates: this rank's buffer and layouts, the knobs read at create.
struct TransportSetup {
  Communicator comm;
  const SymmetricBuffer* buffer = nullptr;  // the Fetcher's handle: outlives every transport
  std::shared_ptr<SymmetricBuffer::Impl> symm;
  MemoryKind kind = MemoryKind::Host;
  int device = -1;  // CUDA device of the buffer (-1: host memory)
  int rank = 0;
  const MemberLayouts* table = nullptr;
  uint64_t generation = 0;
  uint64_t regionId = 0;              // random per registration (descriptor)
  const PeerContext* peer = nullptr;  // the same-host context (the peer transport copies it)
  TransportDemand demand = TransportDemand::Auto;
  int64_t netTimeoutMs = 3000;
  int connectionsPerSource = 4;
};

/// Every member's descriptor and who reads whom over what: routes[reader * n + source] (allgathered).
struct ConnectPass {
  int me = 0;
  int n = 0;
  const std::vector<RemoteDescriptor>* descs = nullptr;
  const std::vector<Route>* routes = nullptr;
  /// Whether `reader` reads `source` over `r`.
  bool reads(int reader, int source, Route r) const {
    return (*routes)[static_cast<size_t>(reader) * static_cast<size_t>(n) + static_cast<size_t>(source)] == r;
  }
};

/// A plan's runs on one transport made ready for repeated submits (Fetcher::submit of a reused plan): what does not
/// change between submits is done once. Used only while its fetcher lives and the plan is current (submit refuses a
/// plan of another fetcher, or a stale one, before it gets here).
class PreparedRuns {
 public:
  virtual ~PreparedRuns() = default;
  /// Stream-ordered, as FetchTransport::submit.
  virtual void submit(Stream stream) = 0;
};

class FetchTransport {
 public:
  virtual ~FetchTransport() = default;
  virtual const char* name() const = 0;
  /// The route chooseRoutes names this transport by.
  virtual Route route() const = 0;
  /// The FetchPlanInfo field counting its runs (runs x regions), or nullptr: its runs are counted by their path
  /// (kernelRuns, copyEngineRuns, hostRuns: the same-host paths).
  virtual size_t FetchPlanInfo::*runCounter() const { return nullptr; }

  // Lifecycle (see the top of this file); the defaults do nothing.
  virtual uint32_t open() { return 0; }
  virtual void describe(RemoteDescriptor& mine) { (void)mine; }
  virtual void serve(bool readByPeers) { (void)readByPeers; }
  virtual void connect(const ConnectPass& pass) { (void)pass; }
  /// Collective: the buffer is at `generation` now (its backed ranges and pieces as they are).
  virtual void refresh(uint64_t generation) { (void)generation; }
  /// `ranges` stop being readable; returns once nothing of this transport reads or serves them.
  virtual void unback(const std::vector<Range>& ranges) { (void)ranges; }
  /// Serves nothing more; returns once no served read is in flight.
  virtual void stopServing() {}
  /// The requester side drains and closes; nothing it started writes afterwards.
  virtual void close() {}

  /// "" when this transport can read member `rank`'s registered memory, else why not.
  virtual std::string unreachable(int rank) const = 0;
  /// Stream-ordered: enqueues the runs `runs` (indices into plan.runs) of `plan`.
  virtual void submit(const PlanOutput& plan, const std::vector<size_t>& runs, Stream stream) = 0;
  /// The runs `runs` of `plan` made ready for repeated submits; by default each submit is submit()'s.
  virtual std::unique_ptr<PreparedRuns> prepare(std::shared_ptr<const PlanOutput> plan, std::vector<size_t> runs);
  /// Polled: starts the runs `runs` of `plan`; the operation holds the plan until it is destroyed.
  virtual std::unique_ptr<TransportOp> start(std::shared_ptr<const PlanOutput> plan, std::vector<size_t> runs,
                                             const FetchOptions& options, Stream stream) = 0;
};

/// FetchTransport::prepare's default: nothing is kept but the plan and its runs.
class SubmittedEachTime final : public PreparedRuns {
 public:
  SubmittedEachTime(FetchTransport& transport, std::shared_ptr<const PlanOutput> plan, std::vector<size_t> runs)
      : transport_(transport), plan_(std::move(plan)), runs_(std::move(runs)) {}
  void submit(Stream stream) override { transport_.submit(*plan_, runs_, stream); }

 private:
  FetchTransport& transport_;
  std::shared_ptr<const PlanOutput> plan_;
  std::vector<size_t> runs_;
};

inline std::unique_ptr<PreparedRuns> FetchTransport::prepare(std::shared_ptr<const PlanOutput> plan,
                                                             std::vector<size_t> runs) {
  return std::make_unique<SubmittedEachTime>(*this, std::move(plan), std::move(runs));
}

/// One registered transport: adding one is a folder below fetch/transport/ and one line in registry.cpp.
struct TransportEntry {
  const char* name;
  std::unique_ptr<FetchTransport> (*make)(const TransportSetup& setup);
};
/// In the order the Fetcher opens, describes, serves, connects and refreshes them (peer, tcp, rdma).
const std::vector<TransportEntry>& transportRegistry();

/// The one selection loop: by source, the transport that reads it (nullptr: none, with why[r] saying why), by the
/// rules of chooseRoutes (KVCOMM_FETCH_TRANSPORT: a demanded transport that cannot run is an error, never a silent
/// fallback).
struct Selection {
  std::vector<Route> routes;            // by rank
  std::vector<FetchTransport*> chosen;  // by rank
  std::vector<std::string> why;         // by rank ("" where chosen)
};
Selection selectTransports(const RouteInput& in, const std::vector<std::shared_ptr<FetchTransport>>& transports);

}  // namespace kvcomm::detail
