// Fetcher: collective registration of every member's layout, then one-sided fetches planned on the host (plan,
// submit, fetch, start, fetchAll) or validated on the device (fetchDevice), through the transport that reaches
// each source.
#include <chrono>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>

#include "barrier/device_errors_of.hpp"
#include "comm/agreement.hpp"
#include "comm/health.hpp"
#include "common/check.hpp"
#include "common/env.hpp"
#include "common/log.hpp"
#include "common/socket.hpp"
#include "device/device_errors.hpp"
#include "device/device_memory.hpp"
#include "fetch/checked_launch.hpp"
#include "fetch/fetcher_internals.hpp"
#include "fetch/member_layouts.hpp"
#include "fetch/planner.hpp"
#include "fetch/transport/negotiation.hpp"
#include "fetch/transport/peer/peer_transport.hpp"
#include "fetch/transport/tcp/tcp_plugin.hpp"
#include "fetch/transport/transport.hpp"
#include "kernels/launch.hpp"
#include "kvcomm/barrier.hpp"
#include "kvcomm/fetch.hpp"
#include "kvcomm/limits.hpp"
#include "symm/buffer_internals.hpp"
#include "symm/buffer_use.hpp"

namespace kvcomm {

using detail::cat;

const char* fetchPathName(FetchPath path) {
  switch (path) {
    case FetchPath::Auto:
      return "auto";
    case FetchPath::Kernel:
      return "kernel";
    case FetchPath::CopyEngine:
      return "copy";
    case FetchPath::Host:
      return "host";
    case FetchPath::Network:
      return "network";
  }
  return "?";
}

const char* fetchTransportName(FetchTransportKind kind) {
  switch (kind) {
    case FetchTransportKind::None:
      return "none";
    case FetchTransportKind::Peer:
      return "peer";
    case FetchTransportKind::Tcp:
      return "tcp";
    case FetchTransportKind::Rdma:
      return "rdma";
  }
  return "?";
}

const char* fetchValidationName(FetchValidation validation) {
  switch (validation) {
    case FetchValidation::Host:
      return "host";
    case FetchValidation::Device:
      return "device";
  }
  return "?";
}

std::string FetchPlanInfo::toString() const {
  std::ostringstream os;
  os << "pairs " << pairsIn << " (" << pairsSkipped << " skipped) -> runs " << runsOut << " (kernel " << kernelRuns
     << ", copy engine " << copyEngineRuns << ", host " << hostRuns;
  if (tcpRuns) os << ", tcp " << tcpRuns;
  if (rdmaRuns) os << ", rdma " << rdmaRuns;
  os << "), " << bytes << " bytes, path " << fetchPathName(path) << ", planned in " << planMicros << " us";
  return os.str();
}

namespace {

// Region tables the kernels read: device memory for CUDA buffers, host memory otherwise; fixed addresses.
class RegionTables {
 public:
  RegionTables(MemoryKind kind, size_t entries) : kind_(kind) {
    if (kind_ == MemoryKind::Cuda)
      mem_ = static_cast<FetchRegionView*>(detail::deviceAlloc(entries * sizeof(FetchRegionView)));
    else
      host_.resize(entries);
  }
  ~RegionTables() {
    if (kind_ == MemoryKind::Cuda) detail::deviceFree(mem_);
  }
  RegionTables(const RegionTables&) = delete;
  RegionTables& operator=(const RegionTables&) = delete;
  FetchRegionView* get() { return kind_ == MemoryKind::Cuda ? mem_ : host_.data(); }
  void write(const std::vector<FetchRegionView>& v) {
    if (kind_ == MemoryKind::Cuda)
      detail::hostToDevice(mem_, v.data(), v.size() * sizeof(FetchRegionView));
    else
      std::copy(v.begin(), v.end(), host_.begin());
  }

 private:
  MemoryKind kind_;
  FetchRegionView* mem_ = nullptr;
  std::vector<FetchRegionView> host_;
};

// KVCOMM_FETCH_PATH's choices are FetchPath's first four values, in order.
static_assert(static_cast<int>(FetchPath::Auto) == 0 && static_cast<int>(FetchPath::Kernel) == 1 &&
              static_cast<int>(FetchPath::CopyEngine) == 2 && static_cast<int>(FetchPath::Host) == 3);
FetchPath parsePathKnob() {
  return static_cast<FetchPath>(env::choice(env::kFetchPath));
}

// A polled fetch over several transports: done when every part is; failed when any part failed (after every part
// ended: nothing may still write when the failure is reported).
class CompositeOp : public detail::TransportOp {
 public:
  explicit CompositeOp(std::vector<std::unique_ptr<detail::TransportOp>> parts) : parts_(std::move(parts)) {}
  void poll(std::vector<int64_t>& blocksDone, bool* finished, std::string* error) override {
    bool all = true;
    std::string errors;
    for (auto& p : parts_) {
      bool f = false;
      std::string e;
      p->poll(blocksDone, &f, &e);
      all = all && f;
      if (!e.empty()) errors += (errors.empty() ? "" : "; ") + e;
    }
    *finished = all;
    *error = all ? errors : "";
  }

 private:
  std::vector<std::unique_ptr<detail::TransportOp>> parts_;
};

}  // namespace

struct FetchPlan::Impl {
  std::shared_ptr<const detail::PlanOutput> out;
  uint64_t generation = 0;
  // Not an address: a fetcher created after the planning one died may get the same one, and would take a plan of
  // another layout for its own (it wrote outside its layout).
  std::weak_ptr<Fetcher::Impl> owner;
  // Made at the first submit (under the fetcher's lock): the runs by transport, each made ready for repeated submits,
  // so that a reused plan costs no host work per pair or run.
  std::vector<std::unique_ptr<detail::PreparedRuns>> prepared;
  bool isPrepared = false;
};

FetchPlan::FetchPlan() = default;
FetchPlan::FetchPlan(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FetchPlan::~FetchPlan() = default;
FetchPlan::FetchPlan(FetchPlan&&) noexcept = default;
FetchPlan& FetchPlan::operator=(FetchPlan&&) noexcept = default;
const FetchPlanInfo& FetchPlan::info() const {
  KVCOMM_CHECK_ARG(impl_, "FetchPlan::info", "empty plan");
  return impl_->out->info;
}
uint64_t FetchPlan::generation() const {
  KVCOMM_CHECK_ARG(impl_, "FetchPlan::generation", "empty plan");
  return impl_->generation;
}

struct Fetcher::Impl {
  SymmetricBuffer buf;  // the fetcher's own handle: the buffer lives as long as either holds it
  Communicator comm;
  MemoryKind kind = MemoryKind::Host;
  KvLayout mine;
  detail::MemberLayouts table;
  uint64_t generation = 0;
  std::unique_ptr<RegionTables> srcTables, dstTables;
  std::unique_ptr<detail::ErrorRecordMemory> errors;
  std::unique_ptr<detail::DeviceWords> claims;       // CUDA: one per destination block, for fetchDevice's duplicates
  std::unique_ptr<detail::DeviceCopier> copier;      // CUDA buffers
  std::unique_ptr<detail::CheckedLauncher> checked;  // CUDA: fetch() with FetchValidation::Device
  detail::PeerContext ctx;
  // The registered transports (fetch/transport/registry.cpp), in registry order, and what members exchanged.
  std::vector<std::shared_ptr<detail::FetchTransport>> transports;
  std::vector<detail::RemoteDescriptor> descs;    // by rank
  std::vector<detail::Route> routes;              // by rank
  std::vector<detail::FetchTransport*> route;     // by rank: the transport that reaches it (nullptr: none)
  std::vector<size_t FetchPlanInfo::*> counters;  // by rank: the transport's run counter (nullptr: by path)
  std::vector<uint8_t> reachable;
  std::vector<std::string> why;
  std::shared_ptr<SymmetricBuffer::Impl> symm;
  uint64_t unbackListener = 0;
  Barrier barrier;             // fetchAll, when every member is reachable here
  std::mutex mu;               // one submission at a time (staging, copier, scratch)
  detail::PlanOutput scratch;  // plans of fetch()/fetchAll(), made and submitted at once: reused, never reallocated

  ~Impl() {
    // Every transport stops serving first (no request reads the memory afterwards), then each drains in reverse
    // registry order (the network requester sides, then the same-host copies); the buffer itself goes last (the
    // members above).
    if (symm && unbackListener) detail::removeUnbackListener(*symm, unbackListener);
    for (auto& t : transports) t->stopServing();
    for (auto it = transports.rbegin(); it != transports.rend(); ++it) (*it)->close();
    if (copier) copier->drain();  // a fetcher whose create failed before the transports existed
    if (checked) checked->drain();
  }

  detail::FetchTransport* transportOf(detail::Route r) const {
    for (const auto& t : transports)
      if (t->route() == r) return t.get();
    return nullptr;
  }

  int rank() const { return comm.rank(); }

  FetchPath resolvePath(const FetchOptions& o) const {
    FetchPath p = o.path == FetchPath::Auto ? parsePathKnob() : o.path;
    if (kind == MemoryKind::Host) {
      if (p == FetchPath::Auto) return FetchPath::Host;
      if (p != FetchPath::Host)
        KVCOMM_THROW(Unsupported, "fetch", "the ", fetchPathName(p),
                     " path needs CUDA memory, but this buffer is host memory (its path is host)");
      return p;
    }
    if (p == FetchPath::Host)
      KVCOMM_THROW(Unsupported, "fetch",
                   "the host path copies host memory, but this buffer is CUDA memory (use "
                   "auto, kernel or copy)");
    return p;
  }

  // The group's health at every submission: nothing starts once the communicator was aborted (Aborted), and nothing
  // is read from a source known dead (NetworkError): its memory may still be mapped here, but its bytes are not to be
  // trusted. A fetch from a live member (or this rank's own blocks) goes on after another member died.
  void checkHealth(const char* call) const {
    const detail::GroupHealth& h = detail::healthOf(comm);
    if (h.state() == detail::kAborted) h.check(call);
  }
  void checkSourceAlive(int source, const char* call) const {
    std::string why = detail::healthOf(comm).deathOf(source);
    if (!why.empty())
      KVCOMM_THROW(NetworkError, call, "source rank ", source, " is gone: ", why, "; nothing was fetched from it");
  }
  void checkHealth(const std::vector<FetchRequest>& requests, const char* call) const {
    checkHealth(call);
    if (detail::healthOf(comm).healthy()) return;
    for (const FetchRequest& r : requests)
      if (r.count > 0 && r.srcRank >= 0 && r.srcRank < comm.size()) checkSourceAlive(r.srcRank, call);
  }
  void checkHealth(const detail::PlanOutput& plan, const char* call) const {
    checkHealth(call);
    if (detail::healthOf(comm).healthy()) return;
    for (const detail::BlockRun& r : plan.runs) checkSourceAlive(r.rank, call);
  }

  // fetchDevice: one srcRank, or per-pair ranks read here from host memory; per-pair ranks in device memory cannot be
  // read on the host, so any member known dead refuses the batch.
  void checkHealth(const DeviceFetchBatch& batch, const char* call) const {
    checkHealth(call);
    const detail::GroupHealth& h = detail::healthOf(comm);
    if (batch.count == 0 || h.healthy()) return;
    if (!batch.srcRanks) return checkSourceAlive(batch.srcRank, call);
    if (kind == MemoryKind::Cuda)
      KVCOMM_THROW(NetworkError, call, "rank ", h.deadRank(), " of the group is gone: ", h.deathOf(h.deadRank()),
                   "; srcRanks (in device memory) may name it: pass one srcRank of a live member");
    for (size_t i = 0; i < batch.count; ++i)
      if (batch.srcBlocks[i] != -1 && batch.dstBlocks[i] != -1 && batch.srcRanks[i] >= 0 &&
          batch.srcRanks[i] < comm.size())
        checkSourceAlive(batch.srcRanks[i], call);
  }

  // Calls that do not otherwise touch the buffer (plan, deviceHandle) still refuse a closed one.
  void checkOpen(const char* call) const { detail::BufferUse use(buf, call); }

  void checkCurrent(uint64_t gen, const char* call) const {
    KVCOMM_CHECK_ARG(buf.generation() == gen && generation == gen, call, "stale: the buffer changed (generation ", gen,
                     " -> ", buf.generation(),
                     ") since the layouts were validated; call Fetcher::refresh() on every member (and plan again)");
  }

  detail::PlanOutput makePlan(const std::vector<FetchRequest>& requests, const FetchOptions& o,
                              const char* call) const {
    detail::PlanOutput out;
    makePlan(requests, o, out, call);
    return out;
  }

  void makePlan(const std::vector<FetchRequest>& requests, const FetchOptions& o, detail::PlanOutput& out,
                const char* call) const {
    KVCOMM_CHECK_ENUM(o.path, FetchPath::Host, call, "options.path");
    KVCOMM_CHECK_ENUM(o.validation, FetchValidation::Device, call, "options.validation");
    checkCurrent(generation, call);
    detail::PlanInput in;
    in.table = &table;
    in.myRank = rank();
    in.reachable = reachable;
    in.unreachableWhy = why;
    in.path = resolvePath(o);
    in.counters = &counters;
    in.copyEngineMinRunBytes =
        o.copyEngineMinRunBytes ? o.copyEngineMinRunBytes : static_cast<uint64_t>(env::fetchCopyEngineMinBytes());
    detail::planFetch(requests, in, out);
    out.generation = generation;
  }

  // The plan's runs split by the transport that reaches their source.
  std::vector<std::pair<detail::FetchTransport*, std::vector<size_t>>> split(const detail::PlanOutput& plan) const {
    std::vector<std::pair<detail::FetchTransport*, std::vector<size_t>>> parts;
    for (size_t i = 0; i < plan.runs.size(); ++i) {
      detail::FetchTransport* t = route[static_cast<size_t>(plan.runs[i].rank)];
      auto it = std::find_if(parts.begin(), parts.end(), [&](const auto& p) { return p.first == t; });
      if (it == parts.end()) {
        parts.push_back({t, {}});
        it = parts.end() - 1;
      }
      it->second.push_back(i);
    }
    return parts;
  }

  void refuseCapture(Stream stream) {
    if (kind == MemoryKind::Cuda)
      KVCOMM_CHECK_ARG(!copier->capturing(stream), "Fetcher::submit",
                       "a fetch with host-side block ids cannot be captured in a CUDA graph (the ids would be frozen "
                       "into it); use fetchDevice() with ids in device memory");
  }

  // The plan's runs by transport: same-host copies first (asynchronous on CUDA), then the network transports (they
  // return once received).
  std::vector<std::pair<detail::FetchTransport*, std::vector<size_t>>> ordered(const detail::PlanOutput& plan) const {
    auto parts = split(plan);
    const detail::FetchTransport* local = transportOf(detail::Route::Peer);
    std::stable_sort(parts.begin(), parts.end(),
                     [&](const auto& a, const auto& b) { return (a.first == local) > (b.first == local); });
    return parts;
  }

  void submitLocked(const detail::PlanOutput& plan, Stream stream) {
    refuseCapture(stream);
    for (auto& [t, runs] : ordered(plan)) t->submit(plan, runs, stream);
  }

  // fetch() checked on the device (CUDA): what is per request is checked here, as the planner would; the pairs are
  // the check pass's (all or nothing: checkErrors() names the first bad pair).
  FetchPlanInfo fetchChecked(const std::vector<FetchRequest>& requests, const FetchOptions& o, Stream stream) {
    const char* call = "Fetcher::fetch";
    const auto t0 = std::chrono::steady_clock::now();
    KVCOMM_CHECK_ENUM(o.path, FetchPath::Host, call, "options.path");
    const FetchPath path = resolvePath(o);
    if (path != FetchPath::Auto && path != FetchPath::Kernel)
      KVCOMM_THROW(Unsupported, call, "pairs checked on the device are copied by the gather kernel, not the ",
                   fetchPathName(path), " path", o.path == FetchPath::Auto ? " (KVCOMM_FETCH_PATH)" : "",
                   ": use path auto or kernel, or validation host");
    KVCOMM_CHECK_ARG(requests.size() <= limits::kMaxDeviceCheckedRequests, call, requests.size(),
                     " requests exceed kvcomm::limits::kMaxDeviceCheckedRequests (", limits::kMaxDeviceCheckedRequests,
                     ") of a fetch checked on the device (merge the requests of a source, or check on the host)");
    checkCurrent(generation, call);
    const detail::FetchTransport* peer = transportOf(detail::Route::Peer);
    std::vector<detail::CheckedIds> ids;
    size_t total = 0;
    for (size_t k = 0; k < requests.size(); ++k) {
      const FetchRequest& q = requests[k];
      KVCOMM_CHECK_ARG(q.srcRank >= 0 && q.srcRank < comm.size(), call, "request ", k, ": source rank ", q.srcRank,
                       " is outside the group of ", comm.size());
      const size_t r = static_cast<size_t>(q.srcRank);
      if (!route[r] || route[r] != peer)
        KVCOMM_THROW(Unsupported, call, "request ", k, ": source rank ", q.srcRank,
                     route[r] ? cat(" is reached over ", route[r]->name()) : cat(" cannot be reached (", why[r], ")"),
                     "; pairs checked on the device need the same-host peer path (use validation host)");
      KVCOMM_CHECK_ARG(q.srcLayoutHash == 0 || q.srcLayoutHash == table.hashes[r], call, "request ", k,
                       ": expects source layout hash 0x", std::hex, q.srcLayoutHash, " but rank ", std::dec, q.srcRank,
                       " registered 0x", std::hex, table.hashes[r], std::dec, " (its layout changed)");
      KVCOMM_CHECK_ARG(q.count == 0 || (q.srcBlocks && q.dstBlocks), call, "request ", k, ": ", q.count,
                       " pairs but a null id array");
      KVCOMM_CHECK_ARG(q.count <= limits::kMaxFetchPairs - total, call, "request ", k, ": ", q.count,
                       " pairs bring the call past kvcomm::limits::kMaxFetchPairs (", limits::kMaxFetchPairs, ")");
      total += q.count;
      ids.push_back({q.srcBlocks, q.dstBlocks, q.count, q.srcRank, table.minBlocks[r]});
    }
    KVCOMM_CHECK_ARG(!copier->capturing(stream), call,
                     "a fetch with host-side block ids cannot be captured in a CUDA graph (the ids would be frozen "
                     "into it); use fetchDevice() with ids in device memory");
    FetchPlanInfo info;
    info.pairsIn = total;
    info.path = FetchPath::Kernel;
    if (total > 0) {
      std::lock_guard<std::mutex> lock(mu);
      detail::BufferUse use(buf, call);
      checked->launch(detail::makeFetchLaunch(ctx, total), ids, rank(), table.minBlocks[static_cast<size_t>(rank())],
                      stream);
    }
    info.planMicros = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    return info;
  }

  void writeTables() {
    const size_t R = table.numRegions;
    srcTables->write(table.views);
    std::vector<FetchRegionView> mineViews(table.views.begin() + static_cast<std::ptrdiff_t>(rank() * R),
                                           table.views.begin() + static_cast<std::ptrdiff_t>((rank() + 1) * R));
    dstTables->write(mineViews);
  }
};

namespace {

// The transports' lifecycle up to connect (phases of fetch/transport/negotiation.hpp), collective: every member
// takes part in every step, and every transport is called on every member, whatever it needs itself.
void setupTransports(Fetcher::Impl& impl, SymmetricBuffer& buffer) {
  Communicator& comm = impl.comm;
  const int n = comm.size(), me = comm.rank();
  const char* call = "Fetcher::create";
  detail::TransportSetup setup;
  detail::RemoteDescriptor mine{};
  detail::allSucceed(comm, "Fetcher::create (transports)", [&] {
    setup.demand = static_cast<detail::TransportDemand>(env::choice(env::kFetchTransport));
    setup.netTimeoutMs = env::fetchNetTimeoutMs();
    // read here: a bad value fails every member, not this one alone
    setup.connectionsPerSource = env::fetchTcpConnections();
    setup.comm = comm;
    setup.buffer = &impl.buf;
    setup.symm = impl.symm;
    setup.kind = impl.kind;
    setup.device = detail::bufferDevice(*impl.symm);
    setup.rank = me;
    setup.table = &impl.table;
    setup.generation = impl.generation;
    detail::randomBytes(&setup.regionId, sizeof(uint64_t));
    setup.peer = &impl.ctx;
    for (const detail::TransportEntry& e : detail::transportRegistry()) impl.transports.push_back(e.make(setup));
    uint32_t caps = detail::kCapDirect;  // a fetcher serves one-sided reads of its registered memory
    for (auto& t : impl.transports) caps |= t->open();
    mine.head = detail::makeHead(caps);
    mine.demand = static_cast<uint32_t>(setup.demand);
    mine.memoryKind = static_cast<uint32_t>(impl.kind);
    mine.regionId = setup.regionId;
    mine.generation = impl.generation;
    mine.capacity = buffer.capacity();
    mine.layoutHash = impl.table.hashes[static_cast<size_t>(me)];
    for (auto& t : impl.transports) t->describe(mine);
  });
  // Phase 1: heads (every version keeps their form); the same checks, so the same error, on every rank.
  std::vector<detail::DescriptorHead> heads(static_cast<size_t>(n));
  heads[static_cast<size_t>(me)] = mine.head;
  comm.allgather(heads.data(), sizeof(detail::DescriptorHead));
  detail::checkHeads(heads, call);
  // Phase 2: descriptors.
  impl.descs.assign(static_cast<size_t>(n), detail::RemoteDescriptor{});
  impl.descs[static_cast<size_t>(me)] = mine;
  comm.allgather(impl.descs.data(), sizeof(detail::RemoteDescriptor));
  for (int r = 0; r < n; ++r) {
    std::string bad = detail::checkDescriptor(impl.descs[static_cast<size_t>(r)], heads[static_cast<size_t>(r)], r);
    KVCOMM_CHECK_ARG(bad.empty(), call, bad);
  }
  // Phase 3: a transport per source, and who reads whom over what.
  detail::RouteInput in;
  in.me = me;
  in.demand = setup.demand;
  in.descs = impl.descs;
  for (int r = 0; r < n; ++r) in.mapped.push_back(buffer.isMapped(r) ? 1 : 0);
  detail::Selection sel = detail::selectTransports(in, impl.transports);
  impl.routes = sel.routes;
  impl.why = sel.why;
  std::vector<detail::Route> matrix(static_cast<size_t>(n * n));
  std::copy(impl.routes.begin(), impl.routes.end(), matrix.begin() + static_cast<std::ptrdiff_t>(me * n));
  comm.allgather(matrix.data(), static_cast<size_t>(n) * sizeof(detail::Route));
  detail::ConnectPass pass;
  pass.me = me;
  pass.n = n;
  pass.descs = &impl.descs;
  pass.routes = &matrix;
  detail::allSucceed(comm, "Fetcher::create (fetch server)", [&] {
    for (auto& t : impl.transports) {
      bool read = false;
      for (int r = 0; r < n; ++r) read = read || (r != me && pass.reads(r, me, t->route()));
      t->serve(read);
    }
  });
  for (auto& t : impl.transports) t->connect(pass);
  // This rank's memory stops being served before any of it is unmapped (release, close).
  std::vector<std::weak_ptr<detail::FetchTransport>> ts(impl.transports.begin(), impl.transports.end());
  impl.unbackListener = detail::addUnbackListener(*impl.symm, [ts](const std::vector<Range>& ranges) {
    for (const auto& w : ts)
      if (auto t = w.lock()) t->unback(ranges);
  });
  impl.route = sel.chosen;
  impl.reachable.assign(static_cast<size_t>(n), 0);
  impl.counters.assign(static_cast<size_t>(n), nullptr);
  for (int r = 0; r < n; ++r) {
    detail::FetchTransport* t = impl.route[static_cast<size_t>(r)];
    impl.reachable[static_cast<size_t>(r)] = t != nullptr;
    if (t) impl.counters[static_cast<size_t>(r)] = t->runCounter();
  }
}

}  // namespace

Fetcher::Fetcher() = default;
Fetcher::Fetcher(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
Fetcher::~Fetcher() = default;
Fetcher::Fetcher(Fetcher&&) noexcept = default;
Fetcher& Fetcher::operator=(Fetcher&&) noexcept = default;

Fetcher Fetcher::create(SymmetricBuffer& buffer, const KvLayout& layout, const FetcherOptions& options) {
  const char* call = "Fetcher::create";
  KVCOMM_CHECK_ARG(buffer.valid(), call, "the buffer is empty");
  Communicator comm = buffer.communicator();
  detail::RankScope scope(comm.rank());
  auto impl = std::make_shared<Impl>();
  impl->buf = detail::BufferAccess::share(buffer);
  impl->comm = comm;
  impl->kind = buffer.kind();
  impl->mine = layout;
  detail::allSucceed(comm, "Fetcher::create (validate this rank's layout)", [&] {
    detail::validateLayout(
        layout, buffer.capacity(), [&](uint64_t off, uint64_t bytes) { return buffer.isBacked(off, bytes); }, call);
  });
  impl->table = detail::exchangeLayouts(comm, layout);
  impl->generation = buffer.generation();
  const int n = comm.size();
  detail::allSucceed(comm, "Fetcher::create (tables)", [&] {
    impl->errors = std::make_unique<detail::ErrorRecordMemory>(impl->kind);
    impl->srcTables = std::make_unique<RegionTables>(impl->kind, impl->table.views.size());
    impl->dstTables = std::make_unique<RegionTables>(impl->kind, impl->table.numRegions);
    impl->writeTables();
    if (impl->kind == MemoryKind::Cuda) {
      impl->copier = detail::makeDeviceCopier();
      uint64_t blocks = 1;
      for (size_t j = 0; j < impl->table.numRegions; ++j)
        blocks = std::max<uint64_t>(
            blocks, impl->table.views[static_cast<size_t>(comm.rank()) * impl->table.numRegions + j].numBlocks);
      impl->claims = std::make_unique<detail::DeviceWords>(blocks);
      impl->checked = detail::makeCheckedLauncher(blocks);
    }
  });
  FetchDeviceHandle& h = impl->ctx.handle;
  h.srcRegions = impl->srcTables->get();
  h.dstRegions = impl->dstTables->get();
  h.peers = buffer.peerTable();
  h.local = static_cast<char*>(buffer.local());
  h.backed = buffer.backedBitmap();
  h.capacity = buffer.capacity();
  h.numRegions = static_cast<int32_t>(impl->table.numRegions);
  h.size = n;
  h.rank = comm.rank();
  h.granShift = static_cast<int32_t>(__builtin_ctzll(buffer.granularity()));
  impl->ctx.memory = detail::bufferPeerMemory(impl->buf);
  impl->ctx.table = &impl->table;
  impl->ctx.error = impl->errors->get();
  if (impl->claims) {
    impl->ctx.claims = impl->claims->get();
    impl->ctx.numClaims = static_cast<int64_t>(impl->claims->count());
  }
  impl->ctx.copier = impl->copier.get();
  impl->ctx.health = &detail::healthOf(impl->comm);
  for (const MemberInfo& m : comm.topology().members) impl->ctx.pids.push_back(m.pid);
  impl->symm = detail::BufferAccess::impl(buffer);
  setupTransports(*impl, buffer);
  int everyone = 1;
  const detail::FetchTransport* local = impl->transportOf(detail::Route::Peer);
  for (int r = 0; r < n; ++r) everyone = everyone && local && local->unreachable(r).empty();
  // The collective form needs a barrier every member can run: agree on whether every member reaches every other.
  std::vector<int32_t> all(static_cast<size_t>(n));
  all[static_cast<size_t>(comm.rank())] = everyone && n <= kMaxHandlePeers;
  comm.allgather(all.data(), sizeof(int32_t));
  bool barrierOk = true;
  for (int32_t a : all) barrierOk = barrierOk && a;
  if (barrierOk) {
    BarrierOptions bo;
    bo.lanes = 1;  // fetchAll's two barriers, one after the other: one lane
    bo.timeoutMs = options.barrierTimeoutMs;
    bo.kind = impl->kind;
    impl->barrier = Barrier::create(comm, bo);
  }
  comm.barrier();
  return Fetcher(std::move(impl));
}

FetchPlan Fetcher::plan(const std::vector<FetchRequest>& requests, const FetchOptions& options) const {
  KVCOMM_CHECK_ARG(impl_, "Fetcher::plan", "empty fetcher");
  detail::RankScope scope(impl_->rank());
  impl_->checkOpen("Fetcher::plan");
  impl_->checkHealth(requests, "Fetcher::plan");
  auto p = std::make_unique<FetchPlan::Impl>();
  p->out = std::make_shared<detail::PlanOutput>(impl_->makePlan(requests, options, "Fetcher::plan"));
  p->generation = impl_->generation;
  p->owner = impl_;
  return FetchPlan(std::move(p));
}

void Fetcher::submit(const FetchPlan& plan, Stream stream) {
  KVCOMM_CHECK_ARG(impl_, "Fetcher::submit", "empty fetcher");
  detail::RankScope scope(impl_->rank());
  KVCOMM_CHECK_ARG(plan.impl_ && plan.impl_->owner.lock() == impl_, "Fetcher::submit",
                   "the plan is empty or was made by another fetcher");
  impl_->checkCurrent(plan.impl_->generation, "Fetcher::submit");
  impl_->checkHealth(*plan.impl_->out, "Fetcher::submit");
  std::lock_guard<std::mutex> lock(impl_->mu);
  detail::BufferUse use(impl_->buf, "Fetcher::submit");  // open, and steady while the copies are made
  impl_->refuseCapture(stream);
  FetchPlan::Impl& p = *plan.impl_;
  if (!p.isPrepared) {
    std::vector<std::unique_ptr<detail::PreparedRuns>> prepared;
    for (auto& [t, runs] : impl_->ordered(*p.out)) prepared.push_back(t->prepare(p.out, std::move(runs)));
    p.prepared = std::move(prepared);
    p.isPrepared = true;
  }
  for (const auto& r : p.prepared) r->submit(stream);
}

FetchPlanInfo Fetcher::fetch(const std::vector<FetchRequest>& requests, Stream stream, const FetchOptions& options) {
  KVCOMM_CHECK_ARG(impl_, "Fetcher::fetch", "empty fetcher");
  detail::RankScope scope(impl_->rank());
  KVCOMM_CHECK_ENUM(options.validation, FetchValidation::Device, "Fetcher::fetch", "options.validation");
  impl_->checkHealth(requests, "Fetcher::fetch");
  // A closed buffer is refused by fetchChecked's BufferUse, as by the planned path's.
  if (options.validation == FetchValidation::Device && impl_->kind == MemoryKind::Cuda)
    return impl_->fetchChecked(requests, options, stream);
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->makePlan(requests, options, impl_->scratch, "Fetcher::fetch");
  detail::BufferUse use(impl_->buf, "Fetcher::fetch");  // after planning: it read the buffer's generation itself
  impl_->submitLocked(impl_->scratch, stream);
  return impl_->scratch.info;
}

void Fetcher::fetchDevice(const DeviceFetchBatch& batch, Stream stream) {
  const char* call = "Fetcher::fetchDevice";
  KVCOMM_CHECK_ARG(impl_, call, "empty fetcher");
  detail::RankScope scope(impl_->rank());
  KVCOMM_CHECK_ARG(batch.count <= limits::kMaxFetchPairs, call, "count ", batch.count,
                   " exceeds kvcomm::limits::kMaxFetchPairs (", limits::kMaxFetchPairs, ")");
  KVCOMM_CHECK_ARG(batch.count == 0 || (batch.srcBlocks && batch.dstBlocks), call, batch.count,
                   " pairs but a null id array");
  if (!batch.srcRanks)
    KVCOMM_CHECK_ARG(batch.count == 0 || (batch.srcRank >= 0 && batch.srcRank < impl_->comm.size()), call, "srcRank ",
                     batch.srcRank, " is outside the group of ", impl_->comm.size(), " (or pass srcRanks)");
  impl_->checkOpen(call);
  impl_->checkHealth(batch, call);
  if (!batch.srcRanks && batch.count > 0 && !impl_->buf.isMapped(batch.srcRank))
    KVCOMM_THROW(Unsupported, call, "source rank ", batch.srcRank,
                 " is not mapped here (another host, or no P2P access): device-side ids need the same-host peer "
                 "mappings; use fetch() or start() with host ids for sources on other hosts");
  if (batch.count == 0) return;
  detail::FetchLaunch f = detail::makeFetchLaunch(impl_->ctx, batch.count);
  f.srcBlocks = batch.srcBlocks;
  f.dstBlocks = batch.dstBlocks;
  f.srcRanks = batch.srcRanks;
  f.srcRank = batch.srcRank;
  std::lock_guard<std::mutex> lock(impl_->mu);
  detail::BufferUse use(impl_->buf, call);
  if (impl_->kind == MemoryKind::Cuda)
    detail::launchFetch(f, stream);
  else
    detail::hostFetch(f);
}

FetchPlanInfo Fetcher::fetchAll(const std::vector<FetchRequest>& requests, Stream stream, const FetchOptions& options) {
  const char* call = "Fetcher::fetchAll";
  KVCOMM_CHECK_ARG(impl_, call, "empty fetcher");
  detail::RankScope scope(impl_->rank());
  detail::checkHealthy(impl_->comm, call);  // its barriers would refuse too, naming themselves
  if (!impl_->barrier.valid())
    KVCOMM_THROW(Unsupported, call,
                 "the collective form needs every member mapped by every other (one host, P2P "
                 "between the GPUs, at most ",
                 kMaxHandlePeers, " members)");
  if (impl_->kind == MemoryKind::Cuda)
    KVCOMM_CHECK_ARG(!impl_->copier->capturing(stream), call,
                     "a fetch with host-side block ids cannot be captured in a CUDA graph (the ids would be frozen "
                     "into it); use fetchDevice() with ids in device memory");
  // A bad request on this rank must not leave the others waiting at the barriers: run both, then throw.
  std::lock_guard<std::mutex> lock(impl_->mu);
  detail::PlanOutput& plan = impl_->scratch;
  detail::joinThenThrow(
      [&] {
        impl_->checkOpen(call);  // a closed buffer is this rank's refusal: the barriers still run
        impl_->makePlan(requests, options, plan, call);
      },
      [&](bool planned) {
        impl_->barrier.sync(stream, 0);  // every source's earlier writes are visible
        if (planned) {
          detail::BufferUse use(impl_->buf, call);
          impl_->submitLocked(plan, stream);
        }
        impl_->barrier.sync(stream, 0);  // nobody overwrites a source block a peer still reads
      });
  return plan.info;
}

struct FetchOperation::Impl {
  std::shared_ptr<Fetcher::Impl> owner;  // keeps the buffer, tables and copier alive
  std::shared_ptr<const detail::PlanOutput> plan;
  std::unique_ptr<detail::TransportOp> op;
  std::vector<int64_t> blocksDone;  // by run
  std::mutex mu;
  FetchStatus last;
  bool finished = false;

  // Every transport, when an operation is first seen finished: an abort of the communicator, or a source the group
  // knows is dead, fails it (keeping a transport's own error when it has one), and the blocks read from that source
  // (every block, after an abort) are not reported landed, however the failure was first seen. The group's health
  // never recovers, so this one pass is the rule.
  void settleWithHealth(std::string* error) {
    for (size_t i = 0; i < plan->runs.size(); ++i) {
      std::string lost = detail::healthFailure(owner->ctx, plan->runs[i].rank);
      if (lost.empty()) continue;
      if (error->empty()) *error = lost;
      blocksDone[i] = 0;
    }
  }

  FetchStatus poll() {
    std::lock_guard<std::mutex> lock(mu);
    if (finished) return last;
    bool done = false;
    std::string error;
    op->poll(blocksDone, &done, &error);
    if (done) settleWithHealth(&error);
    FetchStatus s;
    s.bytesTotal = plan->info.bytes;
    for (size_t i = 0; i < plan->runs.size(); ++i)
      s.bytesDone += static_cast<uint64_t>(blocksDone[i]) * owner->table.blockBytesSum;
    if (!done) {
      s.state = FetchState::InProgress;
      return s;
    }
    if (error.empty()) {
      s.state = FetchState::Done;
    } else {
      s.state = FetchState::Failed;
      s.error = error;
      for (size_t i = 0; i < plan->runs.size(); ++i) {
        const detail::BlockRun& r = plan->runs[i];
        for (int64_t b = blocksDone[i]; b < r.blocks; ++b) s.failedBlocks.push_back(r.dst + b);
      }
    }
    finished = true;
    last = s;
    return s;
  }
};

FetchOperation::FetchOperation() = default;
FetchOperation::FetchOperation(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
FetchOperation::~FetchOperation() = default;
FetchOperation::FetchOperation(FetchOperation&&) noexcept = default;
FetchOperation& FetchOperation::operator=(FetchOperation&&) noexcept = default;

FetchStatus FetchOperation::test() {
  KVCOMM_CHECK_ARG(impl_, "FetchOperation::test", "empty operation");
  detail::RankScope scope(impl_->owner->rank());
  return impl_->poll();
}

FetchStatus FetchOperation::wait(int64_t timeoutMs) {
  KVCOMM_CHECK_ARG(impl_, "FetchOperation::wait", "empty operation");
  detail::RankScope scope(impl_->owner->rank());
  // < 0 and anything above 10^12 ms: no bound (a huge timeout must not wrap the deadline into the past).
  const detail::Clock::time_point deadline = detail::deadlineIn(timeoutMs);
  for (;;) {
    FetchStatus s = impl_->poll();
    if (s.state != FetchState::InProgress) return s;
    if (deadline != detail::Clock::time_point::max() && detail::Clock::now() >= deadline) return s;
    // Woken when it ends where the transport can (peer, TCP), else after a short sleep; at most 1 ms between polls,
    // which settle the group's health (a source known dead, an abort).
    impl_->op->waitEnded(1);
  }
}

FetchOperation Fetcher::start(const std::vector<FetchRequest>& requests, const FetchOptions& options, Stream stream) {
  KVCOMM_CHECK_ARG(impl_, "Fetcher::start", "empty fetcher");
  detail::RankScope scope(impl_->rank());
  impl_->checkHealth(requests, "Fetcher::start");
  auto plan = std::make_shared<const detail::PlanOutput>(impl_->makePlan(requests, options, "Fetcher::start"));
  auto op = std::make_shared<FetchOperation::Impl>();
  op->owner = impl_;
  op->plan = plan;
  op->blocksDone.assign(plan->runs.size(), 0);
  std::lock_guard<std::mutex> lock(impl_->mu);
  detail::BufferUse use(impl_->buf, "Fetcher::start");
  if (impl_->kind == MemoryKind::Cuda && stream)
    KVCOMM_CHECK_ARG(!impl_->copier->capturing(stream), "Fetcher::start", "a polled fetch cannot be captured");
  auto parts = impl_->split(*plan);
  if (parts.size() == 1) {
    op->op = parts[0].first->start(plan, std::move(parts[0].second), options, stream);
  } else {
    std::vector<std::unique_ptr<detail::TransportOp>> ops;
    for (auto& [t, runs] : parts) ops.push_back(t->start(plan, std::move(runs), options, stream));
    op->op = std::make_unique<CompositeOp>(std::move(ops));
  }
  return FetchOperation(std::move(op));
}

void Fetcher::refresh() {
  KVCOMM_CHECK_ARG(impl_, "Fetcher::refresh", "empty fetcher");
  detail::RankScope scope(impl_->rank());
  // A closed buffer is refused before the vote (every member's buffer is closed alike, or the vote names the rank):
  // its backed state is gone, so validating the layout against it would only say "not wholly backed".
  SymmetricBuffer& b = impl_->buf;
  detail::checkHealthy(impl_->comm, "Fetcher::refresh");  // its collectives would refuse too, naming themselves
  detail::allSucceed(impl_->comm, "Fetcher::refresh", [&] {
    impl_->checkOpen("Fetcher::refresh");
    detail::validateLayout(
        impl_->mine, b.capacity(), [&](uint64_t off, uint64_t bytes) { return b.isBacked(off, bytes); },
        "Fetcher::refresh");
  });
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->generation = b.generation();
    for (auto& t : impl_->transports) t->refresh(impl_->generation);  // collective where a transport needs it
  }
  // Nobody returns (and fetches at the new generation) before every member serves it: a member still between the
  // vote and its update would refuse the request as stale.
  impl_->comm.barrier();
}

FetchTransportKind Fetcher::transport(int rank) const {
  KVCOMM_CHECK_ARG(impl_, "Fetcher::transport", "empty fetcher");
  KVCOMM_CHECK_ARG(rank >= 0 && rank < impl_->comm.size(), "Fetcher::transport", "rank ", rank,
                   " is outside the group of ", impl_->comm.size());
  switch (impl_->routes[static_cast<size_t>(rank)]) {
    case detail::Route::Peer:
      return FetchTransportKind::Peer;
    case detail::Route::Tcp:
      return FetchTransportKind::Tcp;
    case detail::Route::Rdma:
      return FetchTransportKind::Rdma;
    case detail::Route::None:
      break;
  }
  return FetchTransportKind::None;
}

const KvLayout& Fetcher::layout(int rank) const {
  KVCOMM_CHECK_ARG(impl_, "Fetcher::layout", "empty fetcher");
  KVCOMM_CHECK_ARG(rank >= 0 && rank < impl_->comm.size(), "Fetcher::layout", "rank ", rank,
                   " is outside the group of ", impl_->comm.size());
  return impl_->table.layouts[static_cast<size_t>(rank)];
}
uint64_t Fetcher::layoutHash(int rank) const {
  KVCOMM_CHECK_ARG(impl_, "Fetcher::layoutHash", "empty fetcher");
  KVCOMM_CHECK_ARG(rank >= 0 && rank < impl_->comm.size(), "Fetcher::layoutHash", "rank ", rank,
                   " is outside the group of ", impl_->comm.size());
  return impl_->table.hashes[static_cast<size_t>(rank)];
}
uint64_t Fetcher::generation() const {
  KVCOMM_CHECK_ARG(impl_, "Fetcher::generation", "empty fetcher");
  return impl_->generation;
}
SymmetricBuffer& Fetcher::buffer() const {
  KVCOMM_CHECK_ARG(impl_, "Fetcher::buffer", "empty fetcher");
  return impl_->buf;
}
FetchDeviceHandle Fetcher::deviceHandle() const {
  KVCOMM_CHECK_ARG(impl_, "Fetcher::deviceHandle", "empty fetcher");
  detail::RankScope scope(impl_->rank());
  impl_->checkOpen("Fetcher::deviceHandle");  // its pointers name the buffer's mappings, gone once it is closed
  return impl_->ctx.handle;
}

namespace detail {

RemoteDescriptor FetcherInternals::descriptor(const Fetcher& f, int rank) {
  KVCOMM_CHECK_ARG(f.impl_ && rank >= 0 && rank < f.impl_->comm.size(), "FetcherInternals::descriptor", "rank ", rank);
  return f.impl_->descs[static_cast<size_t>(rank)];
}

TcpServer::Stats FetcherInternals::serverStats(const Fetcher& f) {
  KVCOMM_CHECK_ARG(f.impl_, "FetcherInternals::serverStats", "empty fetcher");
  const FetchTransport* tcp = f.impl_->transportOf(Route::Tcp);
  return tcp ? tcpServerStats(*tcp) : TcpServer::Stats{};
}

}  // namespace detail

DeviceError Fetcher::pollError() {
  KVCOMM_CHECK_ARG(impl_, "Fetcher::pollError", "empty fetcher");
  detail::RankScope scope(impl_->rank());
  return detail::pollDeviceErrors(impl_->kind, impl_->errors->get(), &impl_->barrier);
}

void Fetcher::checkErrors() {
  KVCOMM_CHECK_ARG(impl_, "Fetcher::checkErrors", "empty fetcher");
  DeviceError e = pollError();
  detail::RankScope scope(impl_->rank());
  uint64_t ms = impl_->barrier.valid() ? impl_->barrier.deviceHandle().timeoutNs / 1000000 : 0;
  detail::throwDeviceErrors(e, impl_->comm, ms);
}

}  // namespace kvcomm
