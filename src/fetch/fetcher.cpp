// Fetcher: collective registration of every member's layout, then one-sided fetches planned on the host (plan,
// submit, fetch, start, fetchAll) or validated on the device (fetchDevice), through the transport that reaches
// each source.
#include <chrono>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>

#include "comm/agreement.hpp"
#include "common/check.hpp"
#include "common/env.hpp"
#include "fetch/layout_registry.hpp"
#include "fetch/peer_transport.hpp"
#include "fetch/planner.hpp"
#include "kernels/launch.hpp"
#include "kvcomm/fetch.hpp"
#include "ops/device_errors.hpp"
#include "ops/device_memory.hpp"
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
  }
  return "?";
}

std::string FetchPlanInfo::toString() const {
  std::ostringstream os;
  os << "pairs " << pairsIn << " (" << pairsSkipped << " skipped) -> runs " << runsOut << " (kernel " << kernelRuns
     << ", copy engine " << copyEngineRuns << ", host " << hostRuns << "), " << bytes << " bytes, path "
     << fetchPathName(path) << ", planned in " << planMicros << " us";
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

FetchPath parsePathKnob() {
  switch (env::fetchPath()) {
    case env::FetchPathKnob::Kernel:
      return FetchPath::Kernel;
    case env::FetchPathKnob::Copy:
      return FetchPath::CopyEngine;
    case env::FetchPathKnob::Host:
      return FetchPath::Host;
    case env::FetchPathKnob::Auto:
      break;
  }
  return FetchPath::Auto;
}

}  // namespace

struct FetchPlan::Impl {
  std::shared_ptr<const detail::PlanOutput> out;
  uint64_t generation = 0;
  const void* owner = nullptr;
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
  detail::LayoutTable table;
  uint64_t generation = 0;
  std::unique_ptr<RegionTables> srcTables, dstTables;
  std::unique_ptr<detail::ErrorRecordMemory> errors;
  std::unique_ptr<detail::DeviceCopier> copier;  // CUDA buffers
  detail::PeerContext ctx;
  std::unique_ptr<detail::FetchTransport> peer;
  std::vector<detail::FetchTransport*> route;  // by rank: the transport that reaches it (nullptr: none)
  std::vector<uint8_t> reachable;
  std::vector<std::string> why;
  Barrier barrier;             // fetchAll, when every member is reachable here
  std::mutex mu;               // one submission at a time (staging, copier, scratch)
  detail::PlanOutput scratch;  // plans of fetch()/fetchAll(), made and submitted at once: reused, never reallocated

  ~Impl() {
    if (copier) copier->drain();  // nothing in flight may outlive the tables and staging
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

  void checkCurrent(uint64_t gen, const char* call) const {
    KVCOMM_CHECK_ARG(buf.generation() == gen && generation == gen, call, "stale: the buffer changed (generation ", gen,
                     " -> ", buf.generation(),
                     ") since the layouts were validated; call Fetcher::refresh() on every member (and plan again)");
  }

  detail::PlanOutput makePlan(const std::vector<FetchRequest>& requests, const FetchOptions& o) const {
    detail::PlanOutput out;
    makePlan(requests, o, out);
    return out;
  }

  void makePlan(const std::vector<FetchRequest>& requests, const FetchOptions& o, detail::PlanOutput& out) const {
    checkCurrent(generation, "fetch (plan)");
    detail::PlanInput in;
    in.table = &table;
    in.myRank = rank();
    in.reachable = reachable;
    in.unreachableWhy = why;
    in.path = resolvePath(o);
    in.copyEngineMinRunBytes =
        o.copyEngineMinRunBytes ? o.copyEngineMinRunBytes : static_cast<uint64_t>(env::fetchCopyEngineMinBytes());
    detail::planFetch(requests, in, out);
  }

  void submitLocked(const detail::PlanOutput& plan, Stream stream) {
    if (kind == MemoryKind::Cuda)
      KVCOMM_CHECK_ARG(!copier->capturing(stream), "Fetcher::submit",
                       "a fetch with host-side block ids cannot be captured in a CUDA graph (the ids would be frozen "
                       "into it); use fetchDevice() with ids in device memory");
    std::vector<size_t> runs(plan.runs.size());
    for (size_t i = 0; i < runs.size(); ++i) runs[i] = i;
    peer->submit(plan, runs, stream);  // every reachable source is the peer transport's today
  }

  void writeTables() {
    const size_t R = table.numRegions;
    srcTables->write(table.views);
    std::vector<FetchRegionView> mineViews(table.views.begin() + static_cast<std::ptrdiff_t>(rank() * R),
                                           table.views.begin() + static_cast<std::ptrdiff_t>((rank() + 1) * R));
    dstTables->write(mineViews);
  }
};

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
  impl->buf = buffer.share();
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
    if (impl->kind == MemoryKind::Cuda) impl->copier = detail::makeDeviceCopier();
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
  impl->ctx.buffer = &impl->buf;
  impl->ctx.table = &impl->table;
  impl->ctx.error = impl->errors->get();
  impl->ctx.copier = impl->copier.get();
  for (const MemberInfo& m : comm.topology().members) impl->ctx.pids.push_back(m.pid);
  impl->peer = detail::makePeerTransport(impl->ctx);
  impl->route.assign(static_cast<size_t>(n), nullptr);
  impl->reachable.assign(static_cast<size_t>(n), 0);
  impl->why.assign(static_cast<size_t>(n), "");
  int everyone = 1;
  for (int r = 0; r < n; ++r) {
    std::string no = impl->peer->unreachable(r);
    if (no.empty()) {
      impl->route[static_cast<size_t>(r)] = impl->peer.get();
      impl->reachable[static_cast<size_t>(r)] = 1;
    } else {
      impl->why[static_cast<size_t>(r)] = no;
      everyone = 0;
    }
  }
  // The collective form needs a barrier every member can run: agree on whether every member reaches every other.
  std::vector<int32_t> all(static_cast<size_t>(n));
  all[static_cast<size_t>(comm.rank())] = everyone && n <= kMaxHandlePeers;
  comm.allgather(all.data(), sizeof(int32_t));
  bool barrierOk = true;
  for (int32_t a : all) barrierOk = barrierOk && a;
  if (barrierOk) {
    BarrierOptions bo;
    bo.lanes = options.lanes;
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
  auto p = std::make_unique<FetchPlan::Impl>();
  p->out = std::make_shared<detail::PlanOutput>(impl_->makePlan(requests, options));
  p->generation = impl_->generation;
  p->owner = impl_.get();
  return FetchPlan(std::move(p));
}

void Fetcher::submit(const FetchPlan& plan, Stream stream) {
  KVCOMM_CHECK_ARG(impl_, "Fetcher::submit", "empty fetcher");
  detail::RankScope scope(impl_->rank());
  KVCOMM_CHECK_ARG(plan.impl_ && plan.impl_->owner == impl_.get(), "Fetcher::submit",
                   "the plan is empty or was made by another fetcher");
  impl_->checkCurrent(plan.impl_->generation, "Fetcher::submit");
  std::lock_guard<std::mutex> lock(impl_->mu);
  detail::BufferUse use(impl_->buf, "Fetcher::submit");  // open, and steady while the copies are made
  impl_->submitLocked(*plan.impl_->out, stream);
}

FetchPlanInfo Fetcher::fetch(const std::vector<FetchRequest>& requests, Stream stream, const FetchOptions& options) {
  KVCOMM_CHECK_ARG(impl_, "Fetcher::fetch", "empty fetcher");
  detail::RankScope scope(impl_->rank());
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->makePlan(requests, options, impl_->scratch);
  detail::BufferUse use(impl_->buf, "Fetcher::fetch");  // after planning: it read the buffer's generation itself
  impl_->submitLocked(impl_->scratch, stream);
  return impl_->scratch.info;
}

void Fetcher::fetchDevice(const DeviceFetchBatch& batch, Stream stream) {
  const char* call = "Fetcher::fetchDevice";
  KVCOMM_CHECK_ARG(impl_, call, "empty fetcher");
  detail::RankScope scope(impl_->rank());
  KVCOMM_CHECK_ARG(batch.count == 0 || (batch.srcBlocks && batch.dstBlocks), call, batch.count,
                   " pairs but a null id array");
  if (!batch.srcRanks)
    KVCOMM_CHECK_ARG(batch.count == 0 || (batch.srcRank >= 0 && batch.srcRank < impl_->comm.size()), call, "srcRank ",
                     batch.srcRank, " is outside the group of ", impl_->comm.size(), " (or pass srcRanks)");
  if (!batch.srcRanks && batch.count > 0 && !impl_->reachable[static_cast<size_t>(batch.srcRank)])
    KVCOMM_THROW(Unsupported, call, "source rank ", batch.srcRank,
                 " cannot be reached by the kernel path: ", impl_->why[static_cast<size_t>(batch.srcRank)]);
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
  detail::Outcome planned;
  std::lock_guard<std::mutex> lock(impl_->mu);
  detail::PlanOutput& plan = impl_->scratch;
  try {
    impl_->makePlan(requests, options, plan);
  } catch (...) {
    planned = detail::Outcome::fromCurrentException();
  }
  impl_->barrier.barrier(stream, 0);  // every source's earlier writes are visible
  if (planned.ok()) {
    detail::BufferUse use(impl_->buf, call);
    impl_->submitLocked(plan, stream);
  }
  impl_->barrier.barrier(stream, 0);  // nobody overwrites a source block a peer still reads
  planned.rethrow();
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

  FetchStatus poll() {
    std::lock_guard<std::mutex> lock(mu);
    if (finished) return last;
    bool done = false;
    std::string error;
    op->poll(blocksDone, &done, &error);
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
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs < 0 ? 0 : timeoutMs);
  for (;;) {
    FetchStatus s = impl_->poll();
    if (s.state != FetchState::InProgress) return s;
    if (timeoutMs >= 0 && std::chrono::steady_clock::now() >= deadline) return s;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

FetchOperation Fetcher::start(const std::vector<FetchRequest>& requests, const FetchOptions& options, Stream stream) {
  KVCOMM_CHECK_ARG(impl_, "Fetcher::start", "empty fetcher");
  detail::RankScope scope(impl_->rank());
  auto plan = std::make_shared<const detail::PlanOutput>(impl_->makePlan(requests, options));
  auto op = std::make_shared<FetchOperation::Impl>();
  op->owner = impl_;
  op->plan = plan;
  op->blocksDone.assign(plan->runs.size(), 0);
  std::vector<size_t> runs(plan->runs.size());
  for (size_t i = 0; i < runs.size(); ++i) runs[i] = i;
  std::lock_guard<std::mutex> lock(impl_->mu);
  detail::BufferUse use(impl_->buf, "Fetcher::start");
  if (impl_->kind == MemoryKind::Cuda && stream)
    KVCOMM_CHECK_ARG(!impl_->copier->capturing(stream), "Fetcher::start", "a polled fetch cannot be captured");
  op->op = impl_->peer->start(plan, std::move(runs), options, stream);
  return FetchOperation(std::move(op));
}

void Fetcher::refresh() {
  KVCOMM_CHECK_ARG(impl_, "Fetcher::refresh", "empty fetcher");
  detail::RankScope scope(impl_->rank());
  SymmetricBuffer& b = impl_->buf;
  detail::allSucceed(impl_->comm, "Fetcher::refresh", [&] {
    detail::validateLayout(
        impl_->mine, b.capacity(), [&](uint64_t off, uint64_t bytes) { return b.isBacked(off, bytes); },
        "Fetcher::refresh");
  });
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->generation = b.generation();
}

const KvLayout& Fetcher::layout(int rank) const {
  KVCOMM_CHECK_ARG(impl_ && rank >= 0 && rank < impl_->comm.size(), "Fetcher::layout", "rank ", rank,
                   " out of range (or empty fetcher)");
  return impl_->table.layouts[static_cast<size_t>(rank)];
}
uint64_t Fetcher::layoutHash(int rank) const {
  KVCOMM_CHECK_ARG(impl_ && rank >= 0 && rank < impl_->comm.size(), "Fetcher::layoutHash", "rank ", rank,
                   " out of range (or empty fetcher)");
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
  return impl_->ctx.handle;
}

DeviceError Fetcher::pollError() {
  KVCOMM_CHECK_ARG(impl_, "Fetcher::pollError", "empty fetcher");
  detail::RankScope scope(impl_->rank());
  DeviceError e = detail::readDeviceError(impl_->kind, impl_->errors->get());
  if (!e && impl_->barrier.valid()) e = impl_->barrier.pollError();
  return e;
}

void Fetcher::checkErrors() {
  DeviceError e = pollError();
  detail::RankScope scope(impl_->rank());
  uint64_t ms = impl_->barrier.valid() ? impl_->barrier.deviceHandle().timeoutNs / 1000000 : 0;
  detail::throwDeviceError(e, ms);
}

}  // namespace kvcomm
