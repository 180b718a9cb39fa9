// The TCP transport's lifecycle: the listener exists from open() (its address travels in the descriptor), serves
// only where some member reads this rank over TCP, and follows the buffer (generation, backed ranges).
#include "fetch/transport/tcp/tcp_plugin.hpp"

#include <mutex>
#include <shared_mutex>

#include "common/socket.hpp"
#include "fetch/transport/net/net_context.hpp"
#include "fetch/transport/tcp/tcp_transport.hpp"

namespace kvcomm::detail {

namespace {

class TcpPlugin : public FetchTransport {
 public:
  explicit TcpPlugin(const TransportSetup& setup) : setup_(setup) {}
  const char* name() const override { return "tcp"; }
  Route route() const override { return Route::Tcp; }
  size_t FetchPlanInfo::*runCounter() const override { return &FetchPlanInfo::tcpRuns; }

  uint32_t open() override {
    const MemberLayouts& t = *setup_.table;
    const size_t me = static_cast<size_t>(setup_.rank), R = t.numRegions;
    auto served = std::make_shared<ServedMemory>();
    served->base = static_cast<char*>(setup_.buffer->local());
    served->kind = setup_.kind;
    served->device = setup_.device;
    served->regionId = setup_.regionId;
    served->groupId = setup_.comm.id();
    served->regions.assign(t.views.begin() + static_cast<std::ptrdiff_t>(me * R),
                           t.views.begin() + static_cast<std::ptrdiff_t>((me + 1) * R));
    served->minBlocks = t.minBlocks[me];
    served->blockBytesSum = t.blockBytesSum;
    served->generation = setup_.generation;
    served->layoutHash = t.hashes[me];
    served->backed = setup_.buffer->backedRanges();
    served_ = served;
    TcpServerOptions so;
    so.netTimeoutMs = setup_.netTimeoutMs;
    server_ = std::make_unique<TcpServer>(served_, pickLocalAddress(), so);
    return kCapTcp;
  }

  void describe(RemoteDescriptor& mine) override {
    if (mine.head.caps & kCapTcp) mine.tcp = server_->endpoint();
  }

  void serve(bool readByPeers) override {
    if (readByPeers)
      server_->start();
    else
      server_.reset();  // nobody reads this rank over TCP: no thread, no open port
  }

  void connect(const ConnectPass& pass) override {
    for (int r = 0; r < pass.n; ++r)
      if (pass.reads(pass.me, r, Route::Tcp)) {
        requester_ = makeTcpTransport(netContext(setup_, *pass.descs));
        return;
      }
  }

  void refresh(uint64_t generation) override {
    std::unique_lock<std::shared_mutex> lock(served_->mu);  // what this rank serves follows the buffer
    served_->generation = generation;
    served_->backed = setup_.buffer->backedRanges();
  }

  void unback(const std::vector<Range>& ranges) override { served_->unback(ranges); }

  void stopServing() override {
    if (served_) served_->close();
    server_.reset();
  }

  void close() override { requester_.reset(); }

  std::string unreachable(int rank) const override {
    return requester_ ? requester_->unreachable(rank) : cat("this rank reads no member over TCP (rank ", rank, ")");
  }
  void submit(const PlanOutput& plan, const std::vector<size_t>& runs, Stream stream) override {
    requester_->submit(plan, runs, stream);
  }
  std::unique_ptr<TransportOp> start(std::shared_ptr<const PlanOutput> plan, std::vector<size_t> runs,
                                     const FetchOptions& options, Stream stream) override {
    return requester_->start(std::move(plan), std::move(runs), options, stream);
  }

  TcpServer::Stats stats() const { return server_ ? server_->stats() : TcpServer::Stats{}; }

 private:
  TransportSetup setup_;
  std::shared_ptr<ServedMemory> served_;
  std::unique_ptr<TcpServer> server_;
  std::unique_ptr<FetchTransport> requester_;
};

}  // namespace

std::unique_ptr<FetchTransport> makeTcpPlugin(const TransportSetup& setup) {
  return std::make_unique<TcpPlugin>(setup);
}

TcpServer::Stats tcpServerStats(const FetchTransport& t) {
  const auto* tcp = dynamic_cast<const TcpPlugin*>(&t);
  return tcp ? tcp->stats() : TcpServer::Stats{};
}

}  // namespace kvcomm::detail
