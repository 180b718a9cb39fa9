// The fetch planner alone: validation names what is wrong (request, pair, id), and coalescing is correct and
// maximal (property test against a brute-force run finder over random id lists).
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "fetch/member_layouts.hpp"
#include "fetch/planner.hpp"
#include "kvcomm/error.hpp"

namespace {

using kvcomm::FetchPath;
using kvcomm::FetchPlanInfo;
using kvcomm::FetchRequest;
using kvcomm::detail::MemberLayouts;
using kvcomm::detail::planFetch;
using kvcomm::detail::PlanInput;

// A table of `ranks` members with `regions` regions of `blocks` blocks each (strides equal blockBytes when
// `contiguous`).
MemberLayouts table(int ranks, size_t regions, uint64_t blocks, uint64_t blockBytes = 4096, bool contiguous = true) {
  MemberLayouts t;
  t.numRegions = regions;
  t.minBlockBytes = blockBytes;
  t.blockBytesSum = blockBytes * regions;
  for (int r = 0; r < ranks; ++r) {
    kvcomm::KvLayout l;
    uint64_t stride = contiguous ? blockBytes : blockBytes + 64;
    for (size_t j = 0; j < regions; ++j) {
      uint64_t off = j * stride * blocks;
      l.regions.push_back({off, blockBytes, stride, blocks});
      t.views.push_back({off, blockBytes, stride, blocks});
    }
    t.hashes.push_back(kvcomm::layoutHash(l));
    t.layouts.push_back(l);
    t.minBlocks.push_back(blocks);
    t.contiguous.push_back(contiguous ? 1 : 0);
  }
  return t;
}

PlanInput input(const MemberLayouts& t, FetchPath path = FetchPath::Kernel) {
  PlanInput in;
  in.table = &t;
  in.myRank = 0;
  in.reachable.assign(t.layouts.size(), 1);
  in.unreachableWhy.assign(t.layouts.size(), "");
  in.path = path;
  return in;
}

struct Ids {
  std::vector<int64_t> src, dst;
  FetchRequest req(int rank) const {
    FetchRequest q;
    q.srcRank = rank;
    q.srcBlocks = src.data();
    q.dstBlocks = dst.data();
    q.count = src.size();
    return q;
  }
};

// Expects an InvalidArgumentError (or `code`) whose message contains every fragment.
template <typename Fn>
void expectError(Fn&& fn, std::vector<std::string> fragments,
                 kvcomm::ErrorCode code = kvcomm::ErrorCode::InvalidArgument) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one naming " << fragments[0];
  } catch (const kvcomm::Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const std::string& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
}

// Brute force: maximal segments of consecutive non-skipped pairs whose ids both go up by one.
struct SimpleRun {
  int64_t src, dst, blocks;
  bool operator==(const SimpleRun& o) const { return src == o.src && dst == o.dst && blocks == o.blocks; }
};
std::vector<SimpleRun> bruteRuns(const Ids& ids) {
  std::vector<SimpleRun> out;
  for (size_t i = 0; i < ids.src.size();) {
    if (ids.src[i] == -1 || ids.dst[i] == -1) {
      ++i;
      continue;
    }
    size_t j = i + 1;
    while (j < ids.src.size() && ids.src[j] != -1 && ids.dst[j] != -1 && ids.src[j] == ids.src[j - 1] + 1 &&
           ids.dst[j] == ids.dst[j - 1] + 1)
      ++j;
    out.push_back({ids.src[i], ids.dst[i], static_cast<int64_t>(j - i)});
    i = j;
  }
  return out;
}

TEST(FetchPlanner, CoalescingIsCorrectAndMaximalForRandomIdLists) {
  std::mt19937_64 rng(std::random_device{}());
  for (int trial = 0; trial < 300; ++trial) {
    const uint64_t blocks = 64 + rng() % 4000;
    MemberLayouts t = table(3, 1 + rng() % 8, blocks);
    // Destinations: a random permutation prefix, made partly consecutive; sources likewise; some -1 skips.
    std::vector<int64_t> perm(blocks);
    for (uint64_t b = 0; b < blocks; ++b) perm[b] = static_cast<int64_t>(b);
    std::shuffle(perm.begin(), perm.end(), rng);
    const size_t n = 1 + rng() % (blocks / 2);
    Ids ids;
    int64_t s = static_cast<int64_t>(rng() % blocks);
    for (size_t i = 0; i < n; ++i) {
      int64_t d = perm[i];
      if (i > 0 && rng() % 3 && ids.dst.back() >= 0 && ids.dst.back() + 1 < static_cast<int64_t>(blocks)) {
        // Extend the previous destination where it is still free.
        int64_t next = ids.dst.back() + 1;
        if (std::find(ids.dst.begin(), ids.dst.end(), next) == ids.dst.end()) d = next;
      }
      if (std::find(ids.dst.begin(), ids.dst.end(), d) != ids.dst.end()) d = -1;
      s = rng() % 4 ? (s + 1) % static_cast<int64_t>(blocks) : static_cast<int64_t>(rng() % blocks);
      ids.src.push_back(rng() % 17 == 0 ? -1 : s);
      ids.dst.push_back(d);
    }
    auto out = planFetch({ids.req(1)}, input(t));
    std::vector<SimpleRun> got;
    for (const auto& r : out.runs) got.push_back({r.src, r.dst, r.blocks});
    ASSERT_EQ(got, bruteRuns(ids)) << "trial " << trial;
    // Pairs are the non-skipped pairs, in order, and each run points at its own.
    size_t kept = 0, skipped = 0;
    for (size_t i = 0; i < n; ++i) (ids.src[i] == -1 || ids.dst[i] == -1) ? ++skipped : ++kept;
    ASSERT_EQ(out.pairs.size(), kept);
    EXPECT_EQ(out.info.pairsIn, n);
    EXPECT_EQ(out.info.pairsSkipped, skipped);
    EXPECT_EQ(out.info.runsOut, got.size() * t.numRegions);
    EXPECT_EQ(out.info.bytes, kept * t.blockBytesSum);
    for (const auto& r : out.runs)
      for (int64_t b = 0; b < r.blocks; ++b) {
        ASSERT_EQ(out.pairs.src[r.firstPair + b], r.src + b);
        ASSERT_EQ(out.pairs.dst[r.firstPair + b], r.dst + b);
        ASSERT_EQ(out.pairs.rank[r.firstPair + b], 1);
      }
  }
}

TEST(FetchPlanner, RunsNeverCrossRequestsOrSources) {
  MemberLayouts t = table(3, 2, 100);
  Ids a{{0, 1, 2}, {10, 11, 12}}, b{{3, 4}, {13, 14}};
  auto out = planFetch({a.req(1), b.req(2)}, input(t));
  ASSERT_EQ(out.runs.size(), 2u);
  EXPECT_EQ(out.runs[0].rank, 1);
  EXPECT_EQ(out.runs[0].blocks, 3);
  EXPECT_EQ(out.runs[1].rank, 2);
  EXPECT_EQ(out.runs[1].blocks, 2);
}

// Runs from a source a network transport reaches count as that transport's (its runCounter), not as a path's; a
// plan whose every run goes over the network reports path Network.
TEST(FetchPlanner, NetworkRunsCountAsTheTransportsAndSetPathNetwork) {
  MemberLayouts t = table(3, 2, 100);
  Ids a{{0, 1, 2}, {10, 11, 12}}, b{{3, 4}, {13, 14}}, local{{5}, {20}};
  PlanInput in = input(t);
  std::vector<size_t FetchPlanInfo::*> counters = {nullptr, &FetchPlanInfo::tcpRuns, &FetchPlanInfo::rdmaRuns};
  in.counters = &counters;
  auto out = planFetch({a.req(1), b.req(2)}, in);
  EXPECT_EQ(out.info.tcpRuns, 2u);  // one run x two regions
  EXPECT_EQ(out.info.rdmaRuns, 2u);
  EXPECT_EQ(out.info.kernelRuns + out.info.copyEngineRuns + out.info.hostRuns, 0u);
  EXPECT_EQ(out.info.path, FetchPath::Network);
  out = planFetch({a.req(1), local.req(0)}, in);  // the same-host runs say the path
  EXPECT_EQ(out.info.tcpRuns, 2u);
  EXPECT_EQ(out.info.kernelRuns, 2u);
  EXPECT_EQ(out.info.path, FetchPath::Kernel);
  EXPECT_EQ(out.info.runsOut, out.info.kernelRuns + out.info.tcpRuns);
}

TEST(FetchPlanner, ValidationNamesTheRequestPairAndId) {
  MemberLayouts t = table(3, 2, 100);
  PlanInput in = input(t);
  Ids ok{{0, 1}, {2, 3}};
  expectError(
      [&] {
        planFetch({ok.req(1), Ids{{0, 100}, {5, 6}}.req(2)}, in);
      },
      {"request 1, pair 1", "source block 100", "[0, 100)"});
  expectError([&] { planFetch({Ids{{5}, {100}}.req(1)}, in); }, {"request 0, pair 0", "destination block 100"});
  const int64_t huge = std::numeric_limits<int64_t>::max() - 3;  // near 2^63: must not wrap into range
  expectError([&] { planFetch({Ids{{1, 2, huge}, {1, 2, 3}}.req(1)}, in); }, {"pair 2", "source block"});
  expectError([&] { planFetch({Ids{{1}, {huge}}.req(1)}, in); }, {"pair 0", "destination block"});
  // Only -1 is padding: another negative id is refused, also when the other side of its pair is -1.
  expectError([&] { planFetch({Ids{{0, -7}, {0, -1}}.req(1)}, in); }, {"pair 1", "source block -7 is outside"});
  expectError([&] { planFetch({Ids{{-1}, {-9}}.req(1)}, in); }, {"pair 0", "destination block -9 is outside"});
  EXPECT_EQ(planFetch({Ids{{-1, 2}, {-1, 3}}.req(1)}, in).info.pairsSkipped, 1u);
  expectError([&] { planFetch({Ids{{-2}, {1}}.req(1)}, in); }, {"pair 0", "source block -2"});
  expectError(
      [&] {
        planFetch({ok.req(1), Ids{{7, 8, 9}, {9, 3, 4}}.req(2)}, in);
      },
      {"request 1, pair 1", "destination block 3", "already written by request 0, pair 1", "duplicate"});
  expectError([&] { planFetch({Ids{{1}, {1}}.req(3)}, in); }, {"request 0", "source rank 3"});
  // Rank 0 is this rank: a local copy may not read a block the batch writes.
  expectError(
      [&] {
        planFetch({ok.req(1), Ids{{3, 50}, {60, 61}}.req(0)}, in);
      },
      {"request 1, pair 0", "source block 3 of this rank", "written by request 0, pair 1"});
  EXPECT_EQ(planFetch({ok.req(1), Ids{{50}, {60}}.req(0)}, in).pairs.size(), 3u);
  FetchRequest wrongHash = ok.req(1);
  wrongHash.srcLayoutHash = t.hashes[1] ^ 1;
  expectError([&] { planFetch({wrongHash}, in); }, {"request 0", "layout hash"});
  FetchRequest rightHash = ok.req(1);
  rightHash.srcLayoutHash = t.hashes[1];
  EXPECT_EQ(planFetch({rightHash}, in).pairs.size(), 2u);
  in.reachable[2] = 0;
  in.unreachableWhy[2] = "member 2 is not mapped here (another host)";
  expectError([&] { planFetch({ok.req(2)}, in); }, {"request 0", "source rank 2", "another host"},
              kvcomm::ErrorCode::Unsupported);
}

TEST(FetchPlanner, AutoSendsLongContiguousRunsToTheCopyEngines) {
  MemberLayouts t = table(2, 2, 1000, 64 << 10);
  PlanInput in = input(t, FetchPath::Auto);
  in.copyEngineMinRunBytes = 1 << 20;  // 16 blocks of 64 KiB
  std::vector<int64_t> src, dst;
  for (int64_t b = 0; b < 20; ++b) src.push_back(b), dst.push_back(100 + b);               // one 20-block run
  for (int64_t b = 0; b < 5; ++b) src.push_back(300 + 2 * b), dst.push_back(500 + 2 * b);  // 5 single blocks
  Ids ids{src, dst};
  auto out = planFetch({ids.req(1)}, in);
  ASSERT_EQ(out.runs.size(), 6u);
  EXPECT_EQ(out.runs[0].path, FetchPath::CopyEngine);
  for (size_t i = 1; i < 6; ++i) EXPECT_EQ(out.runs[i].path, FetchPath::Kernel);
  EXPECT_EQ(out.info.copyEngineRuns, 2u);
  EXPECT_EQ(out.info.kernelRuns, 10u);
  EXPECT_EQ(out.info.path, FetchPath::Auto);
  // Strided blocks never go to the copy engines under auto (2-D copies are slow there).
  MemberLayouts strided = table(2, 2, 1000, 64 << 10, false);
  PlanInput in2 = input(strided, FetchPath::Auto);
  in2.copyEngineMinRunBytes = 1 << 20;
  EXPECT_EQ(planFetch({ids.req(1)}, in2).info.path, FetchPath::Kernel);
}

TEST(FetchLayout, ValidationRefusesOverflowOutOfBoundsAndUnbacked) {
  auto backed = [](uint64_t off, uint64_t bytes) { return off + bytes <= (1u << 20); };
  const uint64_t cap = 1 << 20;
  auto check = [&](kvcomm::KvRegion r) {
    kvcomm::KvLayout l;
    l.regions.push_back({0, 4096, 4096, 4});
    l.regions.push_back(r);
    kvcomm::detail::validateLayout(l, cap, backed, "test");
  };
  check({4096 * 4, 4096, 0, 4});  // fine
  expectError([&] { check({0, 4096, ~0ull / 2, 4}); }, {"region 1", "overflow"});
  expectError([&] { check({~0ull - 100, 4096, 4096, 1}); }, {"region 1", "ends beyond"});
  expectError([&] { check({cap - 4096, 4096, 4096, 2}); }, {"region 1", "ends beyond"});
  expectError([&] { check({0, 0, 0, 4}); }, {"region 1", "blockBytes (0)"});
  expectError([&] { check({0, 4096, 100, 4}); }, {"region 1", "blockStride 100"});
  kvcomm::KvLayout empty;
  expectError([&] { kvcomm::detail::validateLayout(empty, cap, backed, "test"); }, {"1 to"});
  auto holes = [](uint64_t off, uint64_t) { return off < 4096; };
  kvcomm::KvLayout l;
  l.regions.push_back({8192, 4096, 4096, 2});
  expectError([&] { kvcomm::detail::validateLayout(l, cap, holes, "test"); }, {"region 0", "not wholly backed"});
}

// Regions whose blocks share bytes are refused (a local fetch would read bytes the same batch already overwrote,
// behind the hazard checks, which compare block ids): named cases, including the layouts engines use that must stay
// accepted (K and V interleaved per block, every layer in one block-major record, K and V of different sizes).
TEST(FetchLayout, RefusesRegionsWhoseBlocksShareBytes) {
  auto backed = [](uint64_t, uint64_t) { return true; };
  const uint64_t cap = 1 << 24, B = 4096;
  auto validate = [&](std::vector<kvcomm::KvRegion> regions) {
    kvcomm::KvLayout l;
    l.regions = std::move(regions);
    kvcomm::detail::validateLayout(l, cap, backed, "Fetcher::create");
  };
  // The probe's layout: region 1's block k is region 0's block k + 1.
  expectError(
      [&] {
        validate({{0, B, 0, 8}, {B, B, 0, 8}});
      },
      {"Fetcher::create", "regions 0 and 1 overlap", "offset 4096", "share bytes"});
  expectError([&] { validate({{0, B, 0, 8}, {64 * B, B, 0, 8}, {0, B, 0, 8}}); }, {"regions 0 and 2 overlap"});
  expectError([&] { validate({{0, B, 2 * B, 8}, {B - 1, B, 2 * B, 8}}); }, {"regions 0 and 1 overlap"});  // by 1 byte
  expectError([&] { validate({{0, B, 2 * B, 8}, {B + 1, B, 2 * B, 8}}); }, {"regions 0 and 1 overlap"});  // into k+1
  expectError([&] { validate({{0, B, 2 * B, 8}, {14 * B, B, 0, 1}}); }, {"regions 0 and 1 overlap"});     // last block
  expectError([&] { validate({{0, B, 2 * B, 8}, {B, B, 3 * B, 4}}); }, {"different strides"});
  // Accepted: K/V interleaved per block; a block-major record of 4 layers x K/V; K and V of different sizes; a
  // region of one block in a gap; different strides in disjoint ranges; the same residue in disjoint ranges.
  validate({{0, B, 2 * B, 8}, {B, B, 2 * B, 8}});
  std::vector<kvcomm::KvRegion> record;
  for (uint64_t j = 0; j < 8; ++j) record.push_back({j * B, B, 8 * B, 16});
  validate(record);
  validate({{0, 576, 576 + 64, 32}, {576, 64, 576 + 64, 32}});
  validate({{0, B, 2 * B, 8}, {3 * B, B, 0, 1}, {15 * B, B, 0, 1}});
  validate({{0, B, 2 * B, 8}, {16 * B, B, 3 * B, 4}});
  validate({{0, B, 2 * B, 8}, {16 * B, B, 2 * B, 8}});
}

// Property: over random small layouts, validateLayout refuses exactly the layouts where a byte belongs to two
// regions (a byte map oracle), plus, by rule, regions of different strides (more than one block each) whose extents
// intersect.
TEST(FetchLayout, OverlapRefusalMatchesAByteMapOracle) {
  auto backed = [](uint64_t, uint64_t) { return true; };
  std::mt19937_64 rng(20240611);
  size_t refused = 0, accepted = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    kvcomm::KvLayout l;
    const size_t n = 2 + rng() % 3;
    const uint64_t strides[] = {16, 24, 32};
    for (size_t j = 0; j < n; ++j) {
      uint64_t bytes = 1 + rng() % 16, stride = strides[rng() % 3];
      l.regions.push_back({rng() % 160, bytes, rng() % 4 == 0 ? 0 : std::max(stride, bytes), 1 + rng() % 5});
    }
    std::vector<int> owner(512, -1);
    bool expectRefused = false;
    for (size_t j = 0; j < n; ++j) {
      const kvcomm::KvRegion& r = l.regions[j];
      uint64_t stride = r.blockStride ? r.blockStride : r.blockBytes;
      for (uint64_t b = 0; b < r.numBlocks; ++b)
        for (uint64_t x = r.offset + b * stride; x < r.offset + b * stride + r.blockBytes; ++x) {
          if (owner[x] >= 0 && owner[x] != static_cast<int>(j)) expectRefused = true;
          owner[x] = static_cast<int>(j);
        }
      for (size_t k = 0; k < j; ++k) {
        const kvcomm::KvRegion& o = l.regions[k];
        uint64_t os = o.blockStride ? o.blockStride : o.blockBytes;
        uint64_t end = r.offset + (r.numBlocks - 1) * stride + r.blockBytes;
        uint64_t oend = o.offset + (o.numBlocks - 1) * os + o.blockBytes;
        if (os != stride && o.numBlocks > 1 && r.numBlocks > 1 && r.offset < oend && o.offset < end)
          expectRefused = true;
      }
    }
    bool threw = false;
    try {
      kvcomm::detail::validateLayout(l, 1 << 20, backed, "test");
    } catch (const kvcomm::InvalidArgumentError& e) {
      threw = true;
      EXPECT_NE(std::string(e.what()).find("overlap"), std::string::npos) << e.what();
    }
    std::string regions;
    for (const kvcomm::KvRegion& r : l.regions)
      regions += "{" + std::to_string(r.offset) + ", " + std::to_string(r.blockBytes) + ", " +
                 std::to_string(r.blockStride) + ", " + std::to_string(r.numBlocks) + "} ";
    ASSERT_EQ(threw, expectRefused) << "iteration " << iter << ": " << regions;
    (threw ? refused : accepted)++;
  }
  EXPECT_GT(refused, 1000u);
  EXPECT_GT(accepted, 1000u);
}

TEST(FetchLayout, HashCoversEveryFieldAndNormalisesTheDefaultStride) {
  kvcomm::KvLayout a;
  a.regions.push_back({0, 4096, 0, 8});
  kvcomm::KvLayout b = a;
  b.regions[0].blockStride = 4096;
  EXPECT_EQ(kvcomm::layoutHash(a), kvcomm::layoutHash(b));
  b.version = 1;
  EXPECT_NE(kvcomm::layoutHash(a), kvcomm::layoutHash(b));
  b = a;
  b.regions[0].numBlocks = 9;
  EXPECT_NE(kvcomm::layoutHash(a), kvcomm::layoutHash(b));
  EXPECT_NE(kvcomm::layoutHash(a), 0u);
}

}  // namespace
