#include "fetch/transport/peer/peer_transport.hpp"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "common/bulk_copy.hpp"
#include "common/check.hpp"
#include "common/log.hpp"
#include "common/workers.hpp"

namespace kvcomm::detail {

bool processAlive(int pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) == -1 && errno == ESRCH) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // cannot tell (no /proc): assume alive
  size_t close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return true;
  char state = line[close + 2];
  return state != 'Z' && state != 'X';
}

std::string sourceName(const PeerContext& c, int source) {
  if (source >= 0 && static_cast<size_t>(source) < c.names.size() && !c.names[static_cast<size_t>(source)].empty())
    return c.names[static_cast<size_t>(source)];
  return cat("source rank ", source);
}

std::string healthFailure(const PeerContext& c, int source) {
  if (!c.health || c.health->healthy()) return "";
  if (c.health->state() == kAborted) return cat("the communicator was aborted (", c.health->reason(), ")");
  std::string why = c.health->deathOf(source);
  return why.empty() ? "" : cat("source rank ", source, " is gone: ", why);
}

std::vector<CopyDesc> runCopies(const PeerContext& c, const BlockRun& run) {
  std::vector<CopyDesc> out;
  runCopies(c, run, out);
  return out;
}

void runCopies(const PeerContext& c, const BlockRun& run, std::vector<CopyDesc>& out) {
  const MemberLayouts& t = *c.table;
  const int me = c.memory->rank();
  char* srcBase = c.memory->peer(run.rank);
  char* dstBase = c.memory->local();
  out.clear();
  for (size_t j = 0; j < t.numRegions; ++j) {
    const FetchRegionView& s = t.views[static_cast<size_t>(run.rank) * t.numRegions + j];
    const FetchRegionView& d = t.views[static_cast<size_t>(me) * t.numRegions + j];
    CopyDesc x{};
    x.src = srcBase + s.offset + static_cast<uint64_t>(run.src) * s.blockStride;
    x.dst = dstBase + d.offset + static_cast<uint64_t>(run.dst) * d.blockStride;
    if (run.blocks == 1 || (s.blockStride == s.blockBytes && d.blockStride == d.blockBytes)) {
      x.width = static_cast<size_t>(run.blocks) * d.blockBytes;
      x.height = 1;
    } else {
      x.width = d.blockBytes;
      x.height = static_cast<size_t>(run.blocks);
      x.spitch = s.blockStride;
      x.dpitch = d.blockStride;
    }
    out.push_back(x);
  }
}

FetchLaunch makeFetchLaunch(const PeerContext& c, size_t pairs) {
  FetchLaunch f{};
  f.h = c.handle;
  f.vec = c.table->vec;
  f.error = c.error;
  f.claims = c.claims;
  f.numClaims = c.numClaims;
  f.numPairs = static_cast<int64_t>(pairs);
  uint64_t largest = 0;
  for (size_t j = 0; j < c.table->numRegions; ++j) largest = std::max(largest, c.table->views[j].blockBytes);
  // Enough warp-sized items to fill the GPU (about 16k), in chunks of 4 to 64 KiB (multiples of every vector).
  uint64_t chunk = 64u << 10;
  while (chunk > 4096 &&
         static_cast<uint64_t>(pairs) * c.table->numRegions * ((largest + chunk - 1) / chunk) < (16u << 10))
    chunk /= 2;
  f.chunkBytes = chunk;
  f.chunksPerBlock = static_cast<int64_t>((largest + chunk - 1) / chunk);
  return f;
}

namespace {

void hostCopy(const CopyDesc& c) {
  for (size_t row = 0; row < c.height; ++row) bulkCopy(c.dst + row * c.dpitch, c.src + row * c.spitch, c.width);
}

// Polled CPU copies, run by run in slices of blocks (every region of a slice, then the next), pacing and watching
// the sources between slices, so progress and failure are known block by block. Whoever claims the operation first
// runs it: one of the transport's kept workers, or a waiter with nothing else to do (runHere): a small transfer then
// costs what its copies do, not a thread's creation and two hand-offs.
class HostOp : public TransportOp {
 public:
  static constexpr size_t kInlineBytes = 256 << 10;

  HostOp(const PeerContext& c, std::shared_ptr<const PlanOutput> plan, std::vector<size_t> runs,
         const FetchOptions& options, Workers& workers)
      : ctx_(c), plan_(std::move(plan)), runs_(std::move(runs)), rate_(options.maxBytesPerSecond) {
    // A small unpaced operation runs here and now (its copies cost less than handing it to a thread); the caller
    // gets a transfer that has ended, as NIXL's small transfers do.
    if (rate_ == 0 && plan_->info.bytes <= kInlineBytes) {
      claim_->store(true);
      work();
      return;
    }
    // The worker names the rank of the thread that started the fetch ("kvcomm [rank R] fetch (polled): ..."). The
    // loser of the claim touches only the claim, which it co-owns: the op may be gone by then.
    workers.run([this, claim = claim_, rank = detail::currentRank()] {
      if (claim->exchange(true)) return;
      detail::RankScope scope(rank);
      work();
    });
  }
  ~HostOp() override {
    stop_ = true;
    if (!claim_->exchange(true)) return;  // never started: nothing landed, nothing will
    std::unique_lock<std::mutex> lock(mu_);
    ended_.wait(lock, [&] { return finished_; });  // the runner is the only writer: once it ended nothing lands
  }

  bool runHere() override {
    if (claim_->exchange(true)) return false;
    work();
    return true;
  }
  void poll(std::vector<int64_t>& blocksDone, bool* finished, std::string* error) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [ri, n] : progress_) blocksDone[ri] = n;
    *finished = finished_;
    *error = error_;
  }
  // Woken by the worker when it ends (the default's millisecond sleeps were the floor of a small transfer's wait).
  bool waitEnded(int64_t timeoutMs) override {
    std::unique_lock<std::mutex> lock(mu_);
    return ended_.wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(timeoutMs, 0)), [&] { return finished_; });
  }

 private:
  void work() {
    const auto start = std::chrono::steady_clock::now();
    auto lastCheck = start;
    uint64_t copied = 0;
    const MemberLayouts& t = *ctx_.table;
    const int64_t perSlice = std::max<int64_t>(1, static_cast<int64_t>((1u << 20) / t.blockBytesSum));
    std::string failure;
    for (size_t ri : runs_) {
      const BlockRun& run = plan_->runs[ri];
      failure = healthFailure(ctx_, run.rank);  // before the run's first slice: nothing read from a lost source
      if (!failure.empty()) break;
      for (int64_t b0 = 0; b0 < run.blocks && failure.empty(); b0 += perSlice) {
        BlockRun slice = run;
        slice.src += b0;
        slice.dst += b0;
        slice.blocks = std::min(perSlice, run.blocks - b0);
        try {
          // The buffer stays mapped while a slice lands (close() and release() on other threads wait for it); a
          // buffer closed meanwhile fails the rest of the operation, and so does one whose backing changed since
          // the plan (a release() unmaps ranges the next slices would read or write: it crashed the process).
          std::unique_ptr<PeerMemory::Use> use = ctx_.memory->use("fetch (polled)");
          if (use->generation() != plan_->generation)
            KVCOMM_THROW(InvalidArgument, "fetch (polled)", "the buffer changed (grow, commit or release: generation ",
                         use->generation(), ", the plan's ", plan_->generation,
                         ") while the fetch ran; the rest was not copied (refresh() the fetcher and fetch again)");
          for (const CopyDesc& c : runCopies(ctx_, slice)) hostCopy(c);
        } catch (const Error& e) {
          failure = e.what();
          break;
        }
        copied += static_cast<uint64_t>(slice.blocks) * t.blockBytesSum;
        {
          std::lock_guard<std::mutex> lock(mu_);
          progress_[ri] = b0 + slice.blocks;
        }
        if (rate_) {  // pace: never ahead of maxBytesPerSecond
          auto due = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                 std::chrono::duration<double>(static_cast<double>(copied) / rate_));
          while (!stop_ && failure.empty() && std::chrono::steady_clock::now() < due) {
            checkSource(run.rank, &lastCheck, &failure);
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
        }
        checkSource(run.rank, &lastCheck, &failure);
        if (stop_ && failure.empty()) failure = "the operation was destroyed before it finished";
      }
      if (!failure.empty()) break;
    }
    // The group's health at the end (blocks of a lost source not reported landed) is settled by the operation that
    // polls this one, for every transport alike.
    std::lock_guard<std::mutex> lock(mu_);
    error_ = failure;
    finished_ = true;
    ended_.notify_all();
  }

  void checkSource(int rank, std::chrono::steady_clock::time_point* last, std::string* failure) {
    std::string lost = healthFailure(ctx_, rank);  // one atomic load while the group is healthy: every slice
    if (!lost.empty()) {
      *failure = lost;
      return;
    }
    auto now = std::chrono::steady_clock::now();
    if (now - *last < std::chrono::milliseconds(2)) return;
    *last = now;
    int pid = ctx_.pids[static_cast<size_t>(rank)];
    if (!processAlive(pid)) *failure = cat(sourceName(ctx_, rank), " (pid ", pid, ") died during the transfer");
  }

  PeerContext ctx_;
  std::shared_ptr<const PlanOutput> plan_;
  std::vector<size_t> runs_;
  uint64_t rate_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable ended_;
  std::map<size_t, int64_t> progress_;  // run -> blocks landed
  bool finished_ = false;
  std::string error_;
  std::shared_ptr<std::atomic<bool>> claim_ = std::make_shared<std::atomic<bool>>(false);
};

// Polled CUDA copies: enqueued at once, one event at the end; a source found dead before the event fires fails
// the operation (its bytes are not known to have landed), and destruction waits for the event.
class DeviceOp : public TransportOp {
 public:
  DeviceOp(const PeerContext& c, std::shared_ptr<const PlanOutput> plan, std::vector<size_t> runs,
           std::unique_ptr<DeviceEvent> event)
      : ctx_(c), plan_(std::move(plan)), runs_(std::move(runs)), event_(std::move(event)) {}
  ~DeviceOp() override {
    try {
      event_->wait();
    } catch (const std::exception& e) {
      KVCOMM_WARN("fetch: waiting for a polled fetch at teardown: ", e.what());
    }
  }
  void setSources(std::vector<int> ranks) { sources_ = std::move(ranks); }
  // Polls the event briefly instead of the default's millisecond sleeps (a small copy ends in microseconds).
  bool waitEnded(int64_t timeoutMs) override {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max<int64_t>(timeoutMs, 0));
    for (;;) {
      if (finished_ || event_->done()) return true;
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(5));
    }
  }
  void poll(std::vector<int64_t>& blocksDone, bool* finished, std::string* error) override {
    if (!finished_) {
      bool done = event_->done();
      // The group's health first, also before reporting Done: an abort or a source known dead fails the operation
      // (its blocks are not reported landed).
      for (int r : sources_) {
        error_ = healthFailure(ctx_, r);
        if (!error_.empty()) break;
      }
      if (!error_.empty()) {
        finished_ = true;
      } else if (done) {
        finished_ = landed_ = true;
      } else {
        for (int r : sources_)
          if (!processAlive(ctx_.pids[static_cast<size_t>(r)])) {
            finished_ = true;
            error_ =
                cat(sourceName(ctx_, r), " (pid ", ctx_.pids[static_cast<size_t>(r)], ") died during the transfer");
            break;
          }
      }
    }
    if (landed_)
      for (size_t i : runs_) blocksDone[i] = plan_->runs[i].blocks;
    *finished = finished_;
    *error = error_;
  }

 private:
  PeerContext ctx_;
  std::shared_ptr<const PlanOutput> plan_;
  std::vector<size_t> runs_;
  std::unique_ptr<DeviceEvent> event_;
  std::vector<int> sources_;
  bool finished_ = false;
  bool landed_ = false;
  std::string error_;
};

// Whether `runs` are the whole of `plan` and every one goes to the gather kernel: the plan's pair arrays are then
// the kernel's list as they are (submit launches them; prepare keeps them on the GPU).
bool wholePlanToKernel(const PlanOutput& plan, const std::vector<size_t>& runs) {
  if (runs.size() != plan.runs.size()) return false;
  for (size_t ri : runs)
    if (plan.runs[ri].path != FetchPath::Kernel) return false;
  return true;
}

// A launch over pairs of a plan: validated on the host against the current generation (submit checked the plan is
// current), so the kernel skips its checks.
FetchLaunch trustedLaunch(const PeerContext& ctx, size_t pairs) {
  FetchLaunch f = makeFetchLaunch(ctx, pairs);
  f.trusted = 1;
  return f;
}

// PeerTransport::prepare's: the plan's pairs uploaded at its first submit, launched from device memory at each.
class ResidentKernelRuns final : public PreparedRuns {
 public:
  ResidentKernelRuns(const PeerContext& ctx, std::shared_ptr<const PlanOutput> plan)
      : ctx_(ctx), plan_(std::move(plan)) {}
  void submit(Stream stream) override {
    const FetchPairs& p = plan_->pairs;
    if (!pairs_) pairs_ = ctx_.copier->upload(p.src.data(), p.dst.data(), p.rank.data(), p.size(), stream);
    ctx_.copier->launchResident(trustedLaunch(ctx_, pairs_->count), *pairs_, stream);
  }

 private:
  const PeerContext& ctx_;
  std::shared_ptr<const PlanOutput> plan_;  // its arrays stay while the upload runs
  std::unique_ptr<ResidentPairs> pairs_;
};

class PeerTransport : public FetchTransport {
 public:
  explicit PeerTransport(PeerContext c) : ctx_(std::move(c)) {}
  const char* name() const override { return "peer"; }
  Route route() const override { return Route::Peer; }
  // Same-host copies in flight drain last: nothing may outlive the fetcher's tables and staging.
  void close() override {
    if (ctx_.copier) ctx_.copier->drain();
  }

  std::string unreachable(int rank) const override {
    if (ctx_.memory->isMapped(rank)) return "";
    return cat("member ", rank,
               " is not mapped here (another host, or no P2P access between the GPUs); cross-host fetch needs a "
               "network transport");
  }

  void submit(const PlanOutput& plan, const std::vector<size_t>& runs, Stream stream) override {
    if (ctx_.memory->kind() == MemoryKind::Host) {
      std::vector<CopyDesc> copies;  // reused: no allocation per run
      for (size_t ri : runs) {
        runCopies(ctx_, plan.runs[ri], copies);
        for (const CopyDesc& c : copies) hostCopy(c);
      }
      return;
    }
    // Copy-engine runs as descriptors; kernel runs as one list of pairs for the gather kernel.
    std::vector<CopyDesc> descs;
    std::vector<int64_t> src, dst;
    std::vector<int32_t> rank;
    if (wholePlanToKernel(plan, runs)) {
      launch(plan.pairs.src.data(), plan.pairs.dst.data(), plan.pairs.rank.data(), plan.pairs.size(), stream);
      return;
    }
    for (size_t ri : runs) {
      const BlockRun& r = plan.runs[ri];
      if (r.path == FetchPath::CopyEngine) {
        for (const CopyDesc& c : runCopies(ctx_, r)) descs.push_back(c);
      } else {
        src.insert(src.end(), plan.pairs.src.begin() + r.firstPair, plan.pairs.src.begin() + r.firstPair + r.blocks);
        dst.insert(dst.end(), plan.pairs.dst.begin() + r.firstPair, plan.pairs.dst.begin() + r.firstPair + r.blocks);
        rank.insert(rank.end(), static_cast<size_t>(r.blocks), r.rank);
      }
    }
    if (!descs.empty()) ctx_.copier->copies(descs, stream);
    if (!src.empty()) launch(src.data(), dst.data(), rank.data(), src.size(), stream);
  }

  // A reused plan whose every pair goes to the gather kernel keeps its pairs in device memory: each submit is one
  // launch (re-staging 100k pairs every submit cost ~1 ms of host time).
  std::unique_ptr<PreparedRuns> prepare(std::shared_ptr<const PlanOutput> plan, std::vector<size_t> runs) override {
    if (ctx_.memory->kind() != MemoryKind::Cuda || plan->pairs.size() <= static_cast<size_t>(kInlineFetchPairs) ||
        !wholePlanToKernel(*plan, runs))
      return FetchTransport::prepare(std::move(plan), std::move(runs));
    return std::make_unique<ResidentKernelRuns>(ctx_, std::move(plan));
  }

  std::unique_ptr<TransportOp> start(std::shared_ptr<const PlanOutput> plan, std::vector<size_t> runs,
                                     const FetchOptions& options, Stream stream) override {
    if (ctx_.memory->kind() == MemoryKind::Host)
      return std::make_unique<HostOp>(ctx_, std::move(plan), std::move(runs), options, workers_);
    Stream s = stream ? stream : ctx_.copier->ownStream();
    submit(*plan, runs, s);
    std::vector<int> sources;
    for (size_t ri : runs) sources.push_back(plan->runs[ri].rank);
    std::sort(sources.begin(), sources.end());
    sources.erase(std::unique(sources.begin(), sources.end()), sources.end());
    auto op = std::make_unique<DeviceOp>(ctx_, plan, std::move(runs), ctx_.copier->record(s));
    op->setSources(std::move(sources));
    return op;
  }

 private:
  void launch(const int64_t* src, const int64_t* dst, const int32_t* rank, size_t n, Stream stream) {
    ctx_.copier->launchPairs(trustedLaunch(ctx_, n), src, dst, rank, n, stream);
  }

  PeerContext ctx_;
  Workers workers_;  // last: its destructor joins workers that may still be finishing an operation of this transport
};

}  // namespace

std::unique_ptr<FetchTransport> makePeerTransport(PeerContext context) {
  return std::make_unique<PeerTransport>(std::move(context));
}

std::unique_ptr<FetchTransport> makePeerPlugin(const TransportSetup& setup) {
  return makePeerTransport(*setup.peer);
}

}  // namespace kvcomm::detail
