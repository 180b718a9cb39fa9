#include "fetch/transport/tcp/tcp_transport.hpp"

#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "common/check.hpp"
#include "common/log.hpp"
#include "common/socket.hpp"
#include "common/workers.hpp"
#include "fetch/transport/net/net_io.hpp"
#include "fetch/transport/net/run_slices.hpp"
#include "fetch/transport/net/segments.hpp"
#include "fetch/transport/net/staged_io.hpp"
#include "fetch/transport/tcp/tcp_client.hpp"

namespace kvcomm::detail {

namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kBatchBytes = 8u << 20;  // bytes per request: progress granularity and parallelism
constexpr size_t kSlotBytes = 4u << 20;     // pinned slots of CUDA destinations

struct Channel {
  Fd fd;
  uint32_t serverCaps = 0;
  bool pooled = false;                   // taken from the pool: the server may have closed it while it was idle
  std::unique_ptr<HostStaging> staging;  // CUDA destinations
};

struct Batch {
  int rank;
  size_t first, count;  // into the job's pieces
  uint64_t bytes;
};

std::string ioFailureText(const std::string& who, IoResult r, const char* during, int64_t timeoutMs, int err) {
  if (r == IoResult::Stopped) return std::string("stopped");
  if (r == IoResult::Closed) return cat(who, " closed the connection ", during, " (did it exit or die?)");
  if (r == IoResult::Timeout)
    return cat("no progress from ", who, " for ", timeoutMs, " ms ", during,
               " (link down, host unreachable, or the source hung)");
  return cat(who, ": socket error ", during, ": ", std::strerror(err));
}

class TcpTransport;

// One network fetch: the runs of a plan this transport serves, split into requests carried by lanes (one connection
// each) that take requests of their source in turn. Lanes stop at the first failure anywhere.
class TcpJob {
 public:
  TcpJob(TcpTransport& t, std::shared_ptr<const PlanOutput> plan, std::vector<size_t> runs, uint64_t rate,
         Stream stream, bool polled);
  /// Moves everything (or fails); returns when no lane runs any more.
  void run();
  void cancel() { stop_ = true; }
  /// blocksDone per run (prefix of landed blocks).
  void progress(std::vector<int64_t>& blocksDone);
  std::string error() {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }
  const std::vector<size_t>& runs() const { return runs_; }
  const PlanOutput& plan() const { return *plan_; }

 private:
  void lane(int rank, std::atomic<size_t>* next, const std::vector<size_t>* batches);
  // "" on success; else the failure (pieces that landed are recorded either way).
  std::string doBatch(Channel& ch, const Batch& b, bool* retryable);
  // A write (plan_->push): header, runs (the source's ids) and payload (this side's blocks), then the reply.
  std::string pushBatch(Channel& ch, const Batch& b, const WireRequest& q, const std::vector<WireRun>& remote,
                        const std::vector<WireRun>& local, bool stale, bool* retryable);
  void landed(size_t first, size_t count);
  void fail(const std::string& why);
  void pace(uint64_t bytes);

  TcpTransport& t_;
  std::shared_ptr<const PlanOutput> plan_;
  std::vector<size_t> runs_;
  uint64_t rate_;
  Stream stream_;
  bool polled_;
  std::vector<RunSlice> pieces_;
  std::vector<Batch> batches_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::string error_;
  LandedBlocks landed_;
  Clock::time_point start_;
  std::atomic<uint64_t> issued_{0};
};

class TcpTransport : public FetchTransport {
 public:
  explicit TcpTransport(NetContext c) : ctx_(std::move(c)) {
    for (size_t r = 0; r < ctx_.descs.size(); ++r) pools_.push_back(std::make_unique<Pool>());
  }
  const char* name() const override { return "tcp"; }
  Route route() const override { return Route::Tcp; }
  size_t FetchPlanInfo::*runCounter() const override { return &FetchPlanInfo::tcpRuns; }

  std::string unreachable(int rank) const override {
    const RemoteDescriptor& d = ctx_.descs[static_cast<size_t>(rank)];
    if (!(d.head.caps & kCapDirect) || !(d.head.caps & kCapTcp) || d.tcp.len == 0)
      return cat("rank ", rank, " serves no direct reads over TCP");
    return "";
  }

  void submit(const PlanOutput& plan, const std::vector<size_t>& runs, Stream stream) override {
    // The plan outlives the call: an aliasing pointer that owns nothing.
    std::shared_ptr<const PlanOutput> p(std::shared_ptr<const PlanOutput>(), &plan);
    TcpJob job(*this, p, runs, 0, stream, false);
    job.run();
    std::string e = job.error();
    if (e.empty()) return;
    std::vector<int64_t> done(plan.runs.size(), 0);
    job.progress(done);
    KVCOMM_THROW(NetworkError, "fetch (tcp)", e, "; ", describeFailedBlocks(plan, runs, done));
  }

  std::unique_ptr<TransportOp> start(std::shared_ptr<const PlanOutput> plan, std::vector<size_t> runs,
                                     const FetchOptions& options, Stream stream) override;

  const NetContext& ctx() const { return ctx_; }

  // A pooled connection to `rank`, or a new one (connect + hello). Throws NetworkError/Timeout naming the source.
  std::unique_ptr<Channel> acquire(int rank) {
    Pool& p = *pools_[static_cast<size_t>(rank)];
    {
      std::lock_guard<std::mutex> lock(p.mu);
      if (!p.idle.empty()) {
        auto ch = std::move(p.idle.back());
        p.idle.pop_back();
        ch->pooled = true;
        return ch;
      }
    }
    return connect(rank);
  }
  void giveBack(int rank, std::unique_ptr<Channel> ch) {
    Pool& p = *pools_[static_cast<size_t>(rank)];
    std::lock_guard<std::mutex> lock(p.mu);
    if (p.idle.size() < static_cast<size_t>(ctx_.connectionsPerSource)) p.idle.push_back(std::move(ch));
  }
  std::unique_ptr<Channel> connect(int rank) {
    auto ch = std::make_unique<Channel>();
    HelloedConnection c = connectHello(ctx_, rank);
    ch->fd = std::move(c.fd);
    ch->serverCaps = c.serverCaps;
    return ch;
  }

  uint64_t nextRequestId() { return ++requestIds_; }
  Workers& workers() { return workers_; }

 private:
  struct Pool {
    std::mutex mu;
    std::vector<std::unique_ptr<Channel>> idle;
  };
  NetContext ctx_;
  std::vector<std::unique_ptr<Pool>> pools_;
  std::atomic<uint64_t> requestIds_{0};
  Workers workers_;  // last: its destructor joins workers that may still be finishing a task of this transport
};

TcpJob::TcpJob(TcpTransport& t, std::shared_ptr<const PlanOutput> plan, std::vector<size_t> runs, uint64_t rate,
               Stream stream, bool polled)
    : t_(t), plan_(std::move(plan)), runs_(std::move(runs)), rate_(rate), stream_(stream), polled_(polled) {
  const uint64_t perBlock = t_.ctx().table->blockBytesSum;
  // Paced fetches send small requests, so that the pace holds at a fine grain.
  uint64_t target = rate_ ? std::clamp<uint64_t>(rate_ / 16, perBlock, kBatchBytes) : kBatchBytes;
  const int64_t maxBlocks = std::max<int64_t>(1, static_cast<int64_t>(target / perBlock));
  // Requests per source in plan order; a run longer than a request is cut into slices.
  std::map<int, std::vector<size_t>> bySource;
  for (size_t ri : runs_) bySource[plan_->runs[ri].rank].push_back(ri);
  for (auto& [source, list] : bySource) {
    const int rank = source;  // (a structured binding cannot be captured before C++20 compilers caught up)
    Batch cur{rank, pieces_.size(), 0, 0};
    auto close = [&] {
      if (cur.count) batches_.push_back(cur);
      cur = Batch{rank, pieces_.size(), 0, 0};
    };
    for (size_t ri : list) {
      const BlockRun& r = plan_->runs[ri];
      for (int64_t off = 0; off < r.blocks;) {
        int64_t room = maxBlocks - static_cast<int64_t>(cur.bytes / perBlock);
        if (room <= 0 || cur.count == kMaxRunsPerRequest) {
          close();
          room = maxBlocks;
        }
        int64_t n = std::min(room, r.blocks - off);
        pieces_.push_back({ri, off, n});
        cur.count++;
        cur.bytes += static_cast<uint64_t>(n) * perBlock;
        off += n;
      }
    }
    close();
  }
}

void TcpJob::pace(uint64_t bytes) {
  if (!rate_) return;
  uint64_t before = issued_.fetch_add(bytes);
  auto due = start_ + std::chrono::duration_cast<Clock::duration>(
                          std::chrono::duration<double>(static_cast<double>(before) / static_cast<double>(rate_)));
  while (!stop_ && Clock::now() < due) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void TcpJob::fail(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_.empty()) error_ = why;
  stop_ = true;
}

void TcpJob::landed(size_t first, size_t count) {
  for (size_t i = first; i < first + count; ++i) landed_.add(pieces_[i]);
}

void TcpJob::progress(std::vector<int64_t>& blocksDone) {
  landed_.fill(blocksDone);
}

void TcpJob::run() {
  start_ = Clock::now();
  // Lanes per source: as many connections as it has requests, up to the configured number.
  std::map<int, std::vector<size_t>> bySource;
  for (size_t i = 0; i < batches_.size(); ++i) bySource[batches_[i].rank].push_back(i);
  std::vector<std::unique_ptr<std::atomic<size_t>>> nexts;
  std::vector<std::pair<int, size_t>> lanes;  // (rank, index into nexts)
  std::vector<const std::vector<size_t>*> lists;
  for (auto& [rank, list] : bySource) {
    nexts.push_back(std::make_unique<std::atomic<size_t>>(0));
    lists.push_back(&list);
    size_t n = std::min<size_t>(list.size(), static_cast<size_t>(t_.ctx().connectionsPerSource));
    for (size_t k = 0; k < n; ++k) lanes.emplace_back(rank, nexts.size() - 1);
  }
  // One lane runs on the calling thread, except on CUDA memory: lanes bind the buffer's device, which must not
  // change the caller's current device.
  const size_t inlineLanes = t_.ctx().kind == MemoryKind::Cuda ? 0 : 1;
  std::vector<std::thread> threads;
  for (size_t k = inlineLanes; k < lanes.size(); ++k)
    threads.emplace_back([this, &lanes, &nexts, &lists, k, rank = detail::currentRank()] {
      detail::RankScope scope(rank);
      lane(lanes[k].first, nexts[lanes[k].second].get(), lists[lanes[k].second]);
    });
  if (inlineLanes && !lanes.empty()) lane(lanes[0].first, nexts[lanes[0].second].get(), lists[lanes[0].second]);
  for (auto& th : threads) th.join();
  if (stop_ && error().empty()) fail("the operation was cancelled before it finished");
}

void TcpJob::lane(int rank, std::atomic<size_t>* next, const std::vector<size_t>* batches) {
  const NetContext& c = t_.ctx();
  try {
    if (c.kind == MemoryKind::Cuda) bindCudaDevice(c.device);
    std::unique_ptr<Channel> ch;
    for (;;) {
      if (stop_) return;
      size_t i = next->fetch_add(1);
      if (i >= batches->size()) break;
      const Batch& b = batches_[(*batches)[i]];
      pace(b.bytes);
      if (stop_) return;
      bool retryable = false;
      if (!ch) ch = t_.acquire(rank);
      std::string why = doBatch(*ch, b, &retryable);
      if (!why.empty() && retryable) {  // a pooled connection the server had closed while idle: once more, fresh
        ch = t_.connect(rank);
        why = doBatch(*ch, b, &retryable);
      }
      if (!why.empty()) {
        fail(why);
        return;  // the channel is dropped: its stream is in an unknown state
      }
    }
    if (ch) t_.giveBack(rank, std::move(ch));
  } catch (const std::exception& e) {
    fail(e.what());
  }
}

std::string TcpJob::doBatch(Channel& ch, const Batch& b, bool* retryable) {
  const NetContext& c = t_.ctx();
  const MemberLayouts& t = *c.table;
  const int fd = ch.fd.get();
  const bool stale = ch.pooled;  // first use after idling in the pool
  ch.pooled = false;
  const std::string who = describePeer(c, b.rank);
  std::vector<WireRun> src(b.count), dst(b.count);
  for (size_t i = 0; i < b.count; ++i) {
    const RunSlice& p = pieces_[b.first + i];
    const BlockRun& r = plan_->runs[p.run];
    src[i] = {r.src + p.offset, p.blocks};
    dst[i] = {r.dst + p.offset, p.blocks};
  }
  WireRequest q{};
  q.magic = plan_->push ? kWireWriteMagic : kWireRequestMagic;
  q.numRuns = static_cast<uint32_t>(b.count);
  q.requestId = t_.nextRequestId();
  q.generation = plan_->generation;
  q.layoutHash = t.hashes[static_cast<size_t>(b.rank)];
  iovec v[2] = {{&q, sizeof(q)}, {src.data(), src.size() * sizeof(WireRun)}};
  int err = 0;
  auto ioFailure = [&](IoResult r, const char* during) { return ioFailureText(who, r, during, c.netTimeoutMs, err); };
  if (plan_->push) return pushBatch(ch, b, q, src, dst, stale, retryable);
  IoResult r = writeAll(fd, v, 2, c.netTimeoutMs, &stop_, &err);
  WireReply head{};
  if (r == IoResult::Ok) r = readExact(fd, &head, sizeof(head), c.netTimeoutMs, c.netTimeoutMs, &stop_, &err);
  if (r != IoResult::Ok) {
    *retryable = stale && (r == IoResult::Closed || r == IoResult::Error);
    return ioFailure(r, "before its reply");
  }
  std::string why = decodeReply(&head, sizeof(head), &head);
  if (!why.empty()) return cat(who, " sent a malformed reply: ", why);
  if (head.requestId != q.requestId) return cat(who, " answered request ", head.requestId, " instead of ", q.requestId);
  if (head.status != 0) {
    char text[kMaxWireErrorText + 1] = {0};
    readExact(fd, text, head.errorBytes, c.netTimeoutMs, c.netTimeoutMs, &stop_, &err);
    return cat(who, " refused the read: ", wireStatusName(static_cast<WireStatus>(head.status)), ": ", text);
  }
  if (head.payloadBytes != b.bytes)
    return cat(who, " announced ", head.payloadBytes, " bytes for a request of ", b.bytes);

  const FetchRegionView* mine = &t.views[static_cast<size_t>(c.rank) * t.numRegions];
  SegmentCursor cursor(mine, t.numRegions, dst.data(), dst.size());
  const uint64_t perBlock = t.blockBytesSum;
  // Pieces wholly inside the first `bytes` of the payload.
  auto piecesWithin = [&](uint64_t bytes) {
    size_t n = 0;
    uint64_t at = 0;
    while (n < b.count && at + static_cast<uint64_t>(pieces_[b.first + n].blocks) * perBlock <= bytes)
      at += static_cast<uint64_t>(pieces_[b.first + n++].blocks) * perBlock;
    return n;
  };
  if (c.kind == MemoryKind::Host) {
    uint64_t got = 0;
    r = recvSegments(fd, cursor, c.local, head.payloadBytes, c.netTimeoutMs, &stop_, &err, &got);
    landed(b.first, r == IoResult::Ok ? b.count : piecesWithin(got));
    return r == IoResult::Ok ? "" : ioFailure(r, "during its reply");
  }
  // CUDA: socket -> slot k while slot k^1 is copied to the device; a slot's pieces land when its copy finished.
  if (!ch.staging) ch.staging = makeHostStaging(c.device, kSlotBytes, 2);
  HostStaging& st = *ch.staging;
  size_t slotPieces[2] = {0, 0};  // pieces covered once the slot's copy finishes
  bool pending[2] = {false, false};
  size_t marked = 0;
  auto settle = [&](int k) {
    st.waitSlot(k);
    if (pending[k] && polled_ && slotPieces[k] > marked) {
      landed(b.first + marked, slotPieces[k] - marked);
      marked = slotPieces[k];
    }
    pending[k] = false;
  };
  uint64_t left = head.payloadBytes, got = 0;
  for (int k = 0; left > 0; k ^= 1) {
    settle(k);
    const size_t n = static_cast<size_t>(std::min<uint64_t>(left, st.slotBytes()));
    r = readExact(fd, st.slot(k), n, c.netTimeoutMs, c.netTimeoutMs, &stop_, &err);
    if (r != IoResult::Ok) {
      settle(k ^ 1);
      return ioFailure(r, "during its reply");
    }
    std::vector<CopyDesc> copies;
    size_t at = 0;
    uint64_t off = 0, len = 0;
    while (at < n && cursor.take(n - at, &off, &len)) {
      copies.push_back({c.local + off, st.slot(k) + at, static_cast<size_t>(len), 1, 0, 0});
      at += len;
    }
    // Stream-ordered fetches follow the caller's stream (nullptr: the legacy default stream); polled ones given no
    // stream use the staging's own.
    st.toDevice(k, copies, polled_ && !stream_ ? st.ownStream() : stream_);
    got += n;
    left -= n;
    slotPieces[k] = piecesWithin(got);
    pending[k] = true;
  }
  if (polled_) {  // a polled fetch is done when its bytes are in device memory
    settle(0);
    settle(1);
  } else {  // stream-ordered: the copies follow the caller's stream; the slots are reused once they finished
    landed(b.first, b.count);
  }
  return "";
}

std::string TcpJob::pushBatch(Channel& ch, const Batch& b, const WireRequest& q, const std::vector<WireRun>& remote,
                              const std::vector<WireRun>& local, bool stale, bool* retryable) {
  const NetContext& c = t_.ctx();
  const MemberLayouts& t = *c.table;
  const int fd = ch.fd.get();
  const std::string who = describePeer(c, b.rank);
  if (!(ch.serverCaps & kCapWrite)) return cat(who, " serves this memory for reads only (registered read-only)");
  int err = 0;
  // Header and runs leave with the first bytes of the payload (one system call for a small write).
  std::vector<char> head(sizeof(q) + remote.size() * sizeof(WireRun));
  std::memcpy(head.data(), &q, sizeof(q));
  std::memcpy(head.data() + sizeof(q), remote.data(), remote.size() * sizeof(WireRun));
  const FetchRegionView* mine = &t.views[static_cast<size_t>(c.rank) * t.numRegions];
  SegmentCursor cursor(mine, t.numRegions, local.data(), local.size());
  IoResult r = IoResult::Ok;
  if (c.kind == MemoryKind::Host) {
    r = sendSegments(fd, cursor, c.local, b.bytes, c.netTimeoutMs, &stop_, &err, head.data(), head.size());
  } else {
    // CUDA: device -> slot k while slot k^1 is on the wire.
    if (!ch.staging) ch.staging = makeHostStaging(c.device, kSlotBytes, 2);
    iovec hv{head.data(), head.size()};
    r = writeAll(fd, &hv, 1, c.netTimeoutMs, &stop_, &err, true);
    if (r == IoResult::Ok) r = sendStaged(fd, cursor, c.local, b.bytes, *ch.staging, c.netTimeoutMs, &stop_, &err);
  }
  WireReply reply{};
  // A refused write is answered before its payload is read and the connection closed: a failed send still looks
  // for that answer (briefly), so that the error is the server's reason, not a broken pipe.
  IoResult rr =
      readExact(fd, &reply, sizeof(reply), r == IoResult::Ok ? c.netTimeoutMs : 200, c.netTimeoutMs, &stop_, &err);
  if (rr != IoResult::Ok) {
    *retryable = stale && r != IoResult::Ok && (rr == IoResult::Closed || rr == IoResult::Error);
    return ioFailureText(who, r != IoResult::Ok ? r : rr, r != IoResult::Ok ? "during the write" : "before its reply",
                         c.netTimeoutMs, err);
  }
  std::string why = decodeReply(&reply, sizeof(reply), &reply);
  if (!why.empty()) return cat(who, " sent a malformed reply: ", why);
  if (reply.requestId != q.requestId)
    return cat(who, " answered request ", reply.requestId, " instead of ", q.requestId);
  if (reply.status != 0) {
    char text[kMaxWireErrorText + 1] = {0};
    readExact(fd, text, reply.errorBytes, c.netTimeoutMs, c.netTimeoutMs, &stop_, &err);
    return cat(who, " refused the write: ", wireStatusName(static_cast<WireStatus>(reply.status)), ": ", text);
  }
  if (r != IoResult::Ok) return ioFailureText(who, r, "during the write", c.netTimeoutMs, err);
  if (reply.payloadBytes != b.bytes) return cat(who, " took ", reply.payloadBytes, " bytes of a write of ", b.bytes);
  landed(b.first, b.count);
  return "";
}

// A polled TCP fetch: a driver thread runs the job; destruction cancels it and joins (no lane writes afterwards).
class TcpOp : public TransportOp {
 public:
  TcpOp(TcpTransport& t, std::shared_ptr<const PlanOutput> plan, std::vector<size_t> runs, uint64_t rate, Stream stream)
      : job_(t, std::move(plan), std::move(runs), rate, stream, true) {
    // Whoever claims it first runs it: a worker, or a waiter with nothing else to do (runHere). The loser touches
    // only the claim, which it co-owns: the op may be gone by then.
    t.workers().run([this, claim = claim_, rank = detail::currentRank()] {
      if (claim->exchange(true)) return;
      detail::RankScope scope(rank);
      runJob();
    });
  }
  bool runHere() override {
    if (claim_->exchange(true)) return false;
    runJob();
    return true;
  }
  bool waitEnded(int64_t timeoutMs) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (timeoutMs < 0) {
      ended_.wait(lock, [&] { return finished_.load(); });
      return true;
    }
    return ended_.wait_for(lock, std::chrono::milliseconds(timeoutMs), [&] { return finished_.load(); });
  }
  ~TcpOp() override { stop(); }
  void stop() override {
    job_.cancel();
    waitEnded(-1);  // the worker is done with this op (and goes back to the transport's idle workers)
  }
  void poll(std::vector<int64_t>& blocksDone, bool* finished, std::string* error) override {
    bool f = finished_.load();
    job_.progress(blocksDone);
    *finished = f;
    *error = f ? job_.error() : "";
  }

 private:
  void runJob() {
    job_.run();
    std::lock_guard<std::mutex> lock(mu_);  // notified under the lock: a waiter may destroy this op right after
    finished_ = true;
    ended_.notify_all();
  }

  TcpJob job_;
  std::shared_ptr<std::atomic<bool>> claim_ = std::make_shared<std::atomic<bool>>(false);
  std::mutex mu_;
  std::condition_variable ended_;
  std::atomic<bool> finished_{false};
};

std::unique_ptr<TransportOp> TcpTransport::start(std::shared_ptr<const PlanOutput> plan, std::vector<size_t> runs,
                                                 const FetchOptions& options, Stream stream) {
  return std::make_unique<TcpOp>(*this, std::move(plan), std::move(runs), options.maxBytesPerSecond, stream);
}

}  // namespace

std::unique_ptr<FetchTransport> makeTcpTransport(NetContext context) {
  return std::make_unique<TcpTransport>(std::move(context));
}

}  // namespace kvcomm::detail
