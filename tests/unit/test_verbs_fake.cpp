// The verbs transport against the fake provider (tests/support/fake_verbs.hpp): work requests (one READ per remote run,
// scattered over at most max_sge local SGEs, cut at message size and at memory-region boundaries), byte-exact reads
// with at most the negotiated READ depth in flight per queue pair, and every injected failure (remote access error,
// retry exceeded, a flush error out of nowhere, READs that never complete, a cancel, a completion-queue overrun)
// reported naming the source and the blocks not known to have landed, after a full drain: every completion reaped
// (or, after an overrun, the queue pairs destroyed), none lost, memory regions and queue pairs back to zero.
#include <gtest/gtest.h>

#if KVCOMM_HAVE_VERBS

#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "fetch/member_layouts.hpp"
#include "fetch/planner.hpp"
#include "fetch/transport/rdma/verbs_transport.hpp"
#include "kvcomm/error.hpp"
#include "support/fake_verbs.hpp"

namespace {

using namespace kvcomm::detail;
using kvcomm::FetchRegionView;
namespace fake = kvtest::fakeverbs;
using Clock = std::chrono::steady_clock;

constexpr size_t kMem = 1 << 20;
constexpr uint64_t kBlocks = 100;

// Source (rank 1): region 0 packed, region 1 padded and crossing the boundary between its two registered pieces.
// Destination (rank 0): region 0 padded (local SGEs per block), region 1 packed.
const std::vector<FetchRegionView> kSrc = {{0, 4096, 4096, kBlocks}, {480 << 10, 1024, 1536, kBlocks}};
const std::vector<FetchRegionView> kDst = {{0, 4096, 4096 + 256, kBlocks}, {600 << 10, 1024, 1024, kBlocks}};

MemberLayouts table() {
  MemberLayouts t;
  t.numRegions = 2;
  t.views = kDst;
  t.views.insert(t.views.end(), kSrc.begin(), kSrc.end());
  t.minBlocks = {kBlocks, kBlocks};
  t.hashes = {1, 2};
  t.contiguous = {0, 0};
  t.minBlockBytes = 1024;
  t.blockBytesSum = 5120;
  t.layouts.resize(2);
  return t;
}

// Runs of 1 to 7 consecutive blocks from source block ids in [0, 50) into destination ids in [50, 100).
PlanOutput plan(uint64_t seed) {
  std::mt19937_64 rng(seed);
  PlanOutput p;
  int64_t s = 0, d = 50;
  while (s < 48) {
    int64_t n = std::min<int64_t>(1 + static_cast<int64_t>(rng() % 7), 50 - s);
    p.runs.push_back({1, s, d, n, 0, kvcomm::FetchPath::Host});
    s += n + static_cast<int64_t>(rng() % 2);
    d += n;
  }
  return p;
}

std::vector<size_t> allRuns(const PlanOutput& p) {
  std::vector<size_t> r(p.runs.size());
  for (size_t i = 0; i < r.size(); ++i) r[i] = i;
  return r;
}

class VerbsFake : public ::testing::Test {
 protected:
  void open(const fake::Config& c = {}, int64_t timeoutMs = 2000) {
    fake::reset(c);
    src_.assign(kMem, 0);
    dst_.assign(kMem, 0x5a);  // poison
    std::mt19937_64 rng(99);
    for (auto& b : src_) b = static_cast<uint8_t>(rng());
    std::string why;
    a_ = VerbsFabric::open(fake::api(), kvcomm::MemoryKind::Host, -1, "", "memfd", timeoutMs, &why);
    b_ = VerbsFabric::open(fake::api(), kvcomm::MemoryKind::Host, -1, "", "memfd", timeoutMs, &why);
    ASSERT_TRUE(a_ && b_) << why;
    EXPECT_EQ(a_->deviceName(), "fake_mlx5_0");
    a_->registerPieces(reinterpret_cast<char*>(dst_.data()), {{0, kMem, reinterpret_cast<char*>(dst_.data())}}, false);
    keysB_ = b_->registerPieces(reinterpret_cast<char*>(src_.data()),
                                {{0, kMem / 2, reinterpret_cast<char*>(src_.data())},
                                 {kMem / 2, kMem / 2, reinterpret_cast<char*>(src_.data()) + kMem / 2}},
                                false);
    ASSERT_EQ(keysB_.size(), 2u);
    auto qa = a_->createQps(1), qb = b_->createQps(0);
    a_->connectQps(1, b_->address(), qb);
    b_->connectQps(0, a_->address(), qa);
    a_->setRemoteChunks(1, keysB_);
    table_ = table();
    NetContext ctx;
    ctx.local = reinterpret_cast<char*>(dst_.data());
    ctx.rank = 0;
    ctx.table = &table_;
    ctx.descs.resize(2);
    ctx.netTimeoutMs = timeoutMs;
    transport_ = makeVerbsTransport(ctx, a_.get());
    EXPECT_EQ(transport_->unreachable(1), "");
  }

  void TearDown() override {
    transport_.reset();
    a_.reset();
    b_.reset();
    fake::Counts c = fake::counts();
    EXPECT_TRUE(c.zero()) << "contexts " << c.contexts << ", pds " << c.pds << ", mrs " << c.mrs << ", cqs " << c.cqs
                          << ", qps " << c.qps;
    fake::Violations v = fake::violations();
    EXPECT_EQ(v.overDepth + v.unreapedAtDestroy + v.cqNotEmpty + v.badPost, 0) << v.first;
  }

  // Whether the first `done[i]` blocks of every run hold the source's bytes, region by region.
  ::testing::AssertionResult landedExactly(const PlanOutput& p, const std::vector<int64_t>& done) {
    for (size_t i = 0; i < p.runs.size(); ++i)
      for (int64_t b = 0; b < done[i]; ++b)
        for (size_t j = 0; j < 2; ++j) {
          const uint8_t* s = src_.data() + kSrc[j].offset + (p.runs[i].src + b) * kSrc[j].blockStride;
          const uint8_t* d = dst_.data() + kDst[j].offset + (p.runs[i].dst + b) * kDst[j].blockStride;
          if (std::memcmp(s, d, kSrc[j].blockBytes) != 0)
            return ::testing::AssertionFailure() << "run " << i << " block " << b << " region " << j << " differs";
        }
    // Guard bytes between the destination's padded blocks are untouched.
    for (int64_t b = 0; b < static_cast<int64_t>(kBlocks); ++b)
      for (size_t k = 4096; k < 4096 + 256; ++k)
        if (dst_[static_cast<size_t>(b) * (4096 + 256) + k] != 0x5a)
          return ::testing::AssertionFailure() << "guard bytes after block " << b << " were written";
    return ::testing::AssertionSuccess();
  }

  std::vector<uint8_t> src_, dst_;
  std::vector<ChunkKey> keysB_;
  MemberLayouts table_;
  std::unique_ptr<VerbsFabric> a_, b_;
  std::unique_ptr<FetchTransport> transport_;
};

TEST_F(VerbsFake, WorkRequestsAreOneReadPerRemoteRunCutAtSgeMessageAndRegionBoundaries) {
  open();
  PlanOutput p = plan(1);
  std::vector<WireRun> src, dst;
  for (const BlockRun& r : p.runs) src.push_back({r.src, r.blocks}), dst.push_back({r.dst, r.blocks});
  std::vector<LocalKey> local = a_->localKeys();
  for (uint32_t maxSge : {1u, 2u, 4u})
    for (uint64_t maxBytes : {uint64_t(1) << 30, uint64_t(6000)}) {
      ReadPlanInput in;
      in.srcRegions = kSrc.data();
      in.dstRegions = kDst.data();
      in.numRegions = 2;
      in.src = src.data();
      in.dst = dst.data();
      in.numSlices = src.size();
      in.remote = keysB_.data();
      in.numRemote = keysB_.size();
      in.local = local.data();
      in.numLocal = local.size();
      in.localBase = reinterpret_cast<uint64_t>(dst_.data());
      in.maxSge = maxSge;
      in.maxBytes = maxBytes;
      std::vector<ReadWr> wrs;
      ASSERT_EQ(buildReads(in, &wrs), "");
      uint64_t total = 0;
      size_t region0Reads = 0;
      for (const ReadWr& w : wrs) {
        ASSERT_GE(w.numSge, 1u);
        ASSERT_LE(w.numSge, maxSge);
        ASSERT_LE(w.bytes, maxBytes);
        // Within one registered piece of the source (one rkey).
        const ChunkKey& k = w.rkey == keysB_[0].rkey ? keysB_[0] : keysB_[1];
        ASSERT_GE(w.remoteAddr, k.addr);
        ASSERT_LE(w.remoteAddr + w.bytes, k.addr + k.bytes);
        uint64_t sum = 0;
        for (uint32_t g = 0; g < w.numSge; ++g) sum += w.sge[g].length;
        ASSERT_EQ(sum, w.bytes);
        total += w.bytes;
        if (w.remoteAddr < reinterpret_cast<uint64_t>(src_.data()) + (400 << 10)) ++region0Reads;
        // Apply it, as the NIC would.
        uint64_t at = w.remoteAddr;
        for (uint32_t g = 0; g < w.numSge; ++g) {
          std::memcpy(reinterpret_cast<void*>(w.sge[g].addr), reinterpret_cast<const void*>(at), w.sge[g].length);
          at += w.sge[g].length;
        }
      }
      uint64_t blocks = 0;
      for (const BlockRun& r : p.runs) blocks += static_cast<uint64_t>(r.blocks);
      EXPECT_EQ(total, blocks * 5120);
      // Region 0 is packed at the source: one READ per run, unless the SGE count (one per padded local block) or
      // the message size cuts it.
      if (maxSge == 4 && maxBytes > (1u << 20)) {
        size_t want = 0;
        for (const BlockRun& r : p.runs) want += static_cast<size_t>((r.blocks + 3) / 4);
        EXPECT_EQ(region0Reads, want);
      }
      std::vector<int64_t> done;
      for (const BlockRun& r : p.runs) done.push_back(r.blocks);
      EXPECT_TRUE(landedExactly(p, done)) << "maxSge " << maxSge << " maxBytes " << maxBytes;
      std::fill(dst_.begin(), dst_.end(), 0x5a);
    }
  // A byte outside every registered piece is refused before anything is posted.
  ReadPlanInput in;
  std::vector<WireRun> far = {{0, 1}};
  std::vector<FetchRegionView> beyond = {{kMem, 4096, 4096, 10}, kSrc[1]};
  in.srcRegions = beyond.data();
  in.dstRegions = kDst.data();
  in.numRegions = 2;
  in.src = far.data();
  in.dst = far.data();
  in.numSlices = 1;
  in.remote = keysB_.data();
  in.numRemote = keysB_.size();
  in.local = local.data();
  in.numLocal = local.size();
  in.localBase = reinterpret_cast<uint64_t>(dst_.data());
  in.maxSge = 4;
  std::vector<ReadWr> wrs;
  EXPECT_NE(buildReads(in, &wrs).find("lies in no registered piece of the source"), std::string::npos);
}

TEST_F(VerbsFake, ReadsAreByteExactWithinTheNegotiatedReadDepth) {
  fake::Config c;
  c.maxRdAtom = 3;
  c.progressPerPoll = 1;  // completions trickle in: the window fills up
  c.maxMsg = 8192;        // long remote runs are cut into several READs
  open(c);
  PlanOutput p = plan(2);
  transport_->submit(p, allRuns(p), nullptr);
  std::vector<int64_t> all;
  for (const BlockRun& r : p.runs) all.push_back(r.blocks);
  EXPECT_TRUE(landedExactly(p, all));
  FabricStats s = a_->stats();
  EXPECT_GT(s.posted, p.runs.size() * 2);
  EXPECT_EQ(s.completed, s.posted);  // every completion reaped
  EXPECT_EQ(s.readDepth, 3u);
  EXPECT_EQ(s.maxOutstanding, 3u);  // the window was used, never exceeded (the fake counts violations too)
  EXPECT_EQ(fake::inFlight(), 0);
  // Polled: the same bytes, progress reported per slice.
  std::fill(dst_.begin(), dst_.end(), 0x5a);
  auto sp = std::make_shared<const PlanOutput>(p);
  auto op = transport_->start(sp, allRuns(p), {}, nullptr);
  std::vector<int64_t> done(p.runs.size(), 0);
  bool finished = false;
  std::string error;
  for (auto t0 = Clock::now(); !finished && Clock::now() - t0 < std::chrono::seconds(5);) {
    op->poll(done, &finished, &error);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  ASSERT_TRUE(finished);
  EXPECT_EQ(error, "");
  EXPECT_EQ(done, all);
  EXPECT_TRUE(landedExactly(p, done));
}

struct Fault {
  const char* name;
  fake::Config config;
  bool cancel;
  std::vector<std::string> want;
};

class VerbsFaults : public VerbsFake, public ::testing::WithParamInterface<Fault> {};

TEST_P(VerbsFaults, AreReportedAfterAFullDrainNamingTheBlocksNotLanded) {
  const Fault& f = GetParam();
  open(f.config, f.cancel ? 60000 : 400);  // cancelled: the timeout must not end it first on a loaded machine
  PlanOutput p = plan(3);
  auto sp = std::make_shared<const PlanOutput>(p);
  auto t0 = Clock::now();
  auto op = transport_->start(sp, allRuns(p), {}, nullptr);
  std::vector<int64_t> done(p.runs.size(), 0);
  bool finished = false;
  std::string error;
  if (f.cancel) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    op->poll(done, &finished, &error);
    EXPECT_FALSE(finished);
    op.reset();  // destroyed mid-flight: returns only after the drain
  } else {
    while (!finished && Clock::now() - t0 < std::chrono::seconds(5)) {
      op->poll(done, &finished, &error);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    ASSERT_TRUE(finished) << f.name;
    op->poll(done, &finished, &error);
    op.reset();
  }
  double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  std::fprintf(stderr, "%s: after %.3f s: %s\n", f.name, sec, error.c_str());
  EXPECT_LT(sec, 5.0);
  if (!f.cancel) {
    for (const std::string& w : f.want) EXPECT_NE(error.find(w), std::string::npos) << f.name << ": " << error;
    std::vector<int64_t> all;
    for (const BlockRun& r : p.runs) all.push_back(r.blocks);
    EXPECT_NE(done, all) << "a failed operation reported every block landed";
  }
  EXPECT_TRUE(landedExactly(p, done)) << f.name;  // what it reported landed did land
  EXPECT_EQ(fake::inFlight(), 0) << "completions left unreaped after the drain";
  FabricStats s = a_->stats();
  if (!f.config.cqCapacity) {
    EXPECT_EQ(s.completed, s.posted) << "a completion was lost";
  }
  // The failed connection is not used again silently.
  EXPECT_NE(a_->unreachable(1).find("failed earlier"), std::string::npos) << a_->unreachable(1);
  try {
    transport_->submit(p, allRuns(p), nullptr);
    ADD_FAILURE() << "a fetch over a failed connection succeeded";
  } catch (const kvcomm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("recreate the fetcher"), std::string::npos) << e.what();
  }
}

fake::Config failing(uint64_t nth, ibv_wc_status status) {
  fake::Config c;
  c.failNth = nth;
  c.failStatus = status;
  return c;
}
fake::Config stalled() {
  fake::Config c;
  c.stall = true;
  return c;
}
fake::Config overrunning() {
  fake::Config c;
  c.cqCapacity = 3;
  c.progressPerPoll = 8;
  return c;
}

INSTANTIATE_TEST_SUITE_P(
    Injected, VerbsFaults,
    ::testing::Values(
        Fault{
            "remote_access_error", failing(10, IBV_WC_REM_ACCESS_ERR), false, {"source rank 1", "remote access error"}},
        Fault{"retry_exceeded", failing(7, IBV_WC_RETRY_EXC_ERR), false, {"source rank 1", "retry counter exceeded"}},
        Fault{"flush_error", failing(12, IBV_WC_WR_FLUSH_ERR), false, {"source rank 1", "Flushed"}},
        Fault{"never_completes", stalled(), false, {"no RDMA completion", "1", "400 ms"}},
        Fault{"cancel", stalled(), true, {}},
        Fault{"cq_overrun", overrunning(), false, {"completion queue failed", "lost"}}),
    [](const ::testing::TestParamInfo<Fault>& i) { return std::string(i.param.name); });

TEST_F(VerbsFake, ReleasedPiecesAreDeregisteredAndAStaleReadFaults) {
  open();
  const int mrs = fake::counts().mrs;
  b_->unback({{0, kMem / 2}});  // the source released its first piece (its MR goes; the peer still has the old key)
  EXPECT_EQ(fake::counts().mrs, mrs - 1);
  PlanOutput p;
  p.runs.push_back({1, 0, 60, 4, 0, kvcomm::FetchPath::Host});  // region 0 of the source lies in the first piece
  try {
    transport_->submit(p, {0}, nullptr);
    ADD_FAILURE() << "a read of a released piece succeeded";
  } catch (const kvcomm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("remote access error"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("4 destination blocks not known to have landed: 60, 61, 62, 63"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(fake::inFlight(), 0);
  // Re-registration after the buffer changed keeps the live piece's region and adds none for the released one.
  auto keys = b_->registerPieces(reinterpret_cast<char*>(src_.data()),
                                 {{kMem / 2, kMem / 2, reinterpret_cast<char*>(src_.data()) + kMem / 2}}, false);
  ASSERT_EQ(keys.size(), 1u);
  EXPECT_EQ(keys[0].rkey, keysB_[1].rkey);
  EXPECT_EQ(fake::counts().mrs, mrs - 1);
}

}  // namespace

#else

TEST(VerbsFake, NotBuilt) {
  GTEST_SKIP() << "built without rdma-core headers (libibverbs-dev): the verbs transport is not part of this build";
}

#endif
