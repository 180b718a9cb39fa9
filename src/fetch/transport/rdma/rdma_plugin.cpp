// The RDMA transport's lifecycle: the device opens at open() (its name and link layer travel in the descriptor);
// queue pairs and chunk keys are exchanged collectively where any pair of members reads over RDMA, and again at
// refresh; registrations go before their memory is unmapped.
#include "fetch/transport/rdma/rdma_plugin.hpp"

#include <cstdio>

#include "fetch/transport/net/net_context.hpp"
#include "fetch/transport/rdma/verbs_transport.hpp"
#include "symm/buffer_internals.hpp"

namespace kvcomm::detail {

namespace {

class RdmaPlugin : public FetchTransport {
 public:
  explicit RdmaPlugin(const TransportSetup& setup) : setup_(setup) {}
  const char* name() const override { return "rdma"; }
  Route route() const override { return Route::Rdma; }
  size_t FetchPlanInfo::*runCounter() const override { return &FetchPlanInfo::rdmaRuns; }

  uint32_t open() override {
    const GpuInfo& gpu = setup_.comm.topology().members[static_cast<size_t>(setup_.rank)].gpu;
    fabric_ = VerbsFabric::open(nullptr, setup_.kind, setup_.device, gpu.pciBusId, setup_.buffer->handleType(),
                                setup_.netTimeoutMs, &why_);
    if (setup_.demand == TransportDemand::Rdma && !fabric_)
      KVCOMM_THROW(Unsupported, "Fetcher::create",
                   "KVCOMM_FETCH_TRANSPORT=rdma, but this rank has no usable RDMA device: ", why_);
    return fabric_ ? static_cast<uint32_t>(kCapRdma) : 0u;
  }

  void describe(RemoteDescriptor& mine) override {
    if (fabric_) {
      std::snprintf(mine.rdmaDevice, sizeof(mine.rdmaDevice), "%s", fabric_->deviceName().c_str());
      std::snprintf(mine.rdmaLinkLayer, sizeof(mine.rdmaLinkLayer), "%s", fabric_->linkLayer().c_str());
    } else {
      std::snprintf(mine.note, sizeof(mine.note), "no RDMA: %s", why_.c_str());
    }
  }

  // Collective where any pair reads over RDMA (every rank sees the same matrix): chunk keys, fabric addresses and
  // queue pairs of every such pair; otherwise the device closes.
  void connect(const ConnectPass& pass) override {
    for (Route x : *pass.routes) inGroup_ = inGroup_ || x == Route::Rdma;
    if (!inGroup_) {
      fabric_.reset();
      return;
    }
    VerbsFabric::connectAll(setup_.comm, fabric_.get(), base(), localPieces(*setup_.symm), *pass.routes);
    for (int r = 0; r < pass.n; ++r)
      if (pass.reads(pass.me, r, Route::Rdma)) {
        requester_ = makeVerbsTransport(netContext(setup_, *pass.descs), fabric_.get());
        return;
      }
  }

  void refresh(uint64_t) override {
    if (inGroup_) VerbsFabric::refreshAll(setup_.comm, fabric_.get(), base(), localPieces(*setup_.symm));
  }

  void unback(const std::vector<Range>& ranges) override {
    if (fabric_) fabric_->unback(ranges);
  }

  void close() override {
    requester_.reset();
    fabric_.reset();
  }

  std::string unreachable(int rank) const override {
    return requester_ ? requester_->unreachable(rank) : cat("this rank reads no member over RDMA (rank ", rank, ")");
  }
  void submit(const PlanOutput& plan, const std::vector<size_t>& runs, Stream stream) override {
    requester_->submit(plan, runs, stream);
  }
  std::unique_ptr<TransportOp> start(std::shared_ptr<const PlanOutput> plan, std::vector<size_t> runs,
                                     const FetchOptions& options, Stream stream) override {
    return requester_->start(std::move(plan), std::move(runs), options, stream);
  }

 private:
  char* base() const { return static_cast<char*>(setup_.buffer->local()); }

  TransportSetup setup_;
  std::string why_;  // no RDMA device: why
  std::unique_ptr<VerbsFabric> fabric_;
  bool inGroup_ = false;  // some pair reads over RDMA: refresh re-exchanges chunk keys
  std::unique_ptr<FetchTransport> requester_;
};

}  // namespace

std::unique_ptr<FetchTransport> makeRdmaPlugin(const TransportSetup& setup) {
  return std::make_unique<RdmaPlugin>(setup);
}

}  // namespace kvcomm::detail
