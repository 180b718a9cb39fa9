// Converted fetches among the members of one world split into a prefill and a decode group (ConvertedFetcher):
// the prefill members' caches laid out as TP ranks of their group, the decode members' with another TP size, block
// size and order. Every byte of each decode member's buffer (untouched blocks, skipped tokens, guard bytes) against
// the model oracle of support/kv_model.hpp, on the host backend and (where a GPU is present) the CUDA backend; bad
// descriptions fail create on every member; bad sources are refused before anything moves; a member that left fails
// the fetches naming it, the decode memory untouched.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvcomm/converted_fetch.hpp"
#include "kvcomm/error.hpp"
#include "mpi/mpi_util.hpp"
#include "support/expect_error.hpp"
#include "support/kv_model.hpp"
#include "verify/memory.hpp"

namespace {

using namespace kvcomm;
using kvtest::expectError;
using kvtest::kPoison;
using kvtest::Model;
using kvtest::Side;

constexpr uint64_t kTokens = 3 * 64 + 21;

struct Shape {
  Model model;
  uint32_t bsSrc, bsDst;
  KvOrder oSrc, oDst;
};

class ConvertedFetch : public kvtest::BackendTest {
 protected:
  // This world as a prefill group (the first half) and a decode group (the rest): member `r`'s side, its block
  // table shared by its group (every prefill member the same ids, as one engine's block manager gives them).
  struct World {
    int prefill = 0, decode = 0;
    std::vector<Side> sides;
    size_t most = 0;
  };
  World world(int size, const Shape& s) const {
    World w;
    w.prefill = size / 2;
    w.decode = size - w.prefill;
    for (int r = 0; r < size; ++r) {
      std::mt19937_64 rng(seed_ + static_cast<uint64_t>(r < w.prefill ? 0 : r));
      const bool pre = r < w.prefill;
      const uint32_t tp = static_cast<uint32_t>(pre ? w.prefill : w.decode);
      const uint32_t rank = static_cast<uint32_t>(pre ? r : r - w.prefill);
      const uint32_t tpb = pre ? s.bsSrc : s.bsDst;
      w.sides.push_back(
          kvtest::makeSide(s.model, tp, rank, tpb, pre ? s.oSrc : s.oDst, (kTokens + tpb - 1) / tpb, rng));
      w.most = std::max(w.most, w.sides.back().mem.size());
    }
    return w;
  }

  std::vector<int> prefillRanks(const World& w) const {
    std::vector<int> v(static_cast<size_t>(w.prefill));
    for (int r = 0; r < w.prefill; ++r) v[static_cast<size_t>(r)] = r;
    return v;
  }

  std::vector<uint8_t> read(SymmetricBuffer& buf, size_t n) const {
    std::vector<uint8_t> got(n);
    kvtest::synchronize(kind_);
    kvtest::fromMemory(kind_, got.data(), buf.local(), n);
    return got;
  }
};

TEST_P(ConvertedFetch, DecodeMembersFetchFromPrefillMembersConverted) {
  auto comm = kvtest::tcpWorld();
  if (comm.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const Shape shapes[] = {{Model::Gqa8, 16, 32, KvOrder::TokensHeadsDim, KvOrder::HeadsTokensDim},
                          {Model::Mla, 64, 16, KvOrder::TokensHeadsDim, KvOrder::TokensHeadsDim},
                          {Model::Fp8Scales, 32, 64, KvOrder::HeadsTokensDim, KvOrder::TokensHeadsDim},
                          {Model::Gqa4, 16, 16, KvOrder::TokensHeadsDim, KvOrder::HeadsTokensDim}};
  for (const Shape& s : shapes) {
    SCOPED_TRACE(kvtest::modelName(s.model));
    World w = world(comm.size(), s);
    const int me = comm.rank();
    Side& side = w.sides[static_cast<size_t>(me)];
    const std::vector<int64_t> srcTable = w.sides[0].table;
    std::vector<int64_t> shared = srcTable;
    shared[1] = -1;  // a block the prefill side does not have
    if (me < w.prefill) {
      side.table = shared;
      kvtest::lay(side, 0, kTokens);
    } else {
      side.table[side.table.size() - 2] = -1;  // a block this decode member skips
    }
    auto buf = SymmetricBuffer::create(comm, w.most, w.most, kind_);
    kvtest::toMemory(kind_, buf.local(), side.mem.data(), side.mem.size());
    ConvertedFetcher f = ConvertedFetcher::create(buf, side.layout, side.desc);
    ASSERT_EQ(f.size(), comm.size());
    for (int r = 0; r < comm.size(); ++r) {  // every member learnt every other's description
      ASSERT_EQ(f.contents(r).regions.size(), w.sides[static_cast<size_t>(r)].desc.regions.size());
      for (size_t g = 0; g < f.contents(r).regions.size(); ++g) {
        const KvContents &a = f.contents(r).regions[g], &b = w.sides[static_cast<size_t>(r)].desc.regions[g];
        ASSERT_EQ(a.headBegin, b.headBegin);
        ASSERT_EQ(a.tokensPerBlock, b.tokensPerBlock);
        ASSERT_EQ(a.order, b.order);
      }
    }
    comm.barrier();  // every prefill member's bytes are in place
    if (me >= w.prefill) {
      const uint64_t first = 5;
      // Through the mappings (one host, memory of one kind: nothing lands), then over TCP (whole blocks land first).
      for (TransferVia via : {TransferVia::Auto, TransferVia::Tcp}) {
        SCOPED_TRACE(via == TransferVia::Tcp ? "over TCP" : "through the mappings");
        kvtest::toMemory(kind_, buf.local(), side.mem.data(), side.mem.size());  // poisoned again
        ConvertedReadOptions o;
        o.via = via;
        o.conversion.preferredSource = (me - w.prefill) % w.prefill;
        o.timeoutMs = 60000;
        ConvertedReadResult r = f.fetch(prefillRanks(w), {shared, side.table, first, kTokens - first}, o);
        ASSERT_EQ(r.status.state, FetchState::Done) << r.status.error;
        EXPECT_GT(r.bytesConverted, 0u);
        for (int32_t m : r.sourcesRead) EXPECT_TRUE(m >= 0 && m < w.prefill) << "source " << m;
        if (via == TransferVia::Auto) {
          EXPECT_EQ(r.sourcesMapped, r.sourcesRead);
          EXPECT_EQ(r.bytesLanded, 0u);
        } else {
          EXPECT_TRUE(r.sourcesMapped.empty());
          EXPECT_GE(r.bytesLanded, r.bytesConverted);
        }
        if (s.model == Model::Mla) {  // replicated: one member read, the preferred one (a member rank in the result)
          EXPECT_EQ(r.sourcesRead, std::vector<int32_t>{o.conversion.preferredSource});
        }
        Side want = side;
        std::fill(want.mem.begin(), want.mem.end(), kPoison);
        kvtest::lay(want, first, kTokens, &shared, s.bsSrc);
        std::vector<uint8_t> got = read(buf, want.mem.size());
        for (size_t i = 0; i < want.mem.size(); ++i)
          ASSERT_EQ(got[i], want.mem[i]) << "decode member " << me << ", byte " << i << " (sources read "
                                         << ::testing::PrintToString(r.sourcesRead) << ")";
      }
    }
    comm.barrier();  // nobody leaves while a decode member still reads
  }
}

TEST_P(ConvertedFetch, ABadDescriptionOnOneMemberFailsCreateOnEveryMember) {
  auto comm = kvtest::tcpWorld();
  if (comm.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  World w = world(comm.size(), {Model::Gqa8, 16, 32, KvOrder::TokensHeadsDim, KvOrder::TokensHeadsDim});
  Side& side = w.sides[static_cast<size_t>(comm.rank())];
  auto buf = SymmetricBuffer::create(comm, w.most, w.most, kind_);
  KvDescription desc = side.desc;
  if (comm.rank() == 1) desc.regions[1].headDim += 1;  // no longer what the layout's blocks hold
  expectError([&] { ConvertedFetcher::create(buf, side.layout, desc); }, ErrorCode::InvalidArgument,
              {"ConvertedFetcher::create", "rank 1", "region 1"});
  // A layout past the buffer's backed part: refused the same way, naming the member.
  KvLayout big = side.layout;
  if (comm.rank() == 0) big.regions.back().numBlocks *= 1000;
  expectError(
      [&] {
        KvDescription d = side.desc;
        ConvertedFetcher::create(buf, big, d);
      },
      ErrorCode::InvalidArgument, {"ConvertedFetcher::create", "rank 0"});
  // And the group still works afterwards.
  ConvertedFetcher f = ConvertedFetcher::create(buf, side.layout, side.desc);
  EXPECT_EQ(f.rank(), comm.rank());
  comm.barrier();
}

TEST_P(ConvertedFetch, BadSourcesAreRefusedBeforeAnythingMoves) {
  auto comm = kvtest::tcpWorld();
  if (comm.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  World w = world(comm.size(), {Model::Gqa8, 16, 32, KvOrder::TokensHeadsDim, KvOrder::HeadsTokensDim});
  const int me = comm.rank();
  Side& side = w.sides[static_cast<size_t>(me)];
  auto buf = SymmetricBuffer::create(comm, w.most, w.most, kind_);
  kvtest::toMemory(kind_, buf.local(), side.mem.data(), side.mem.size());
  ConvertedFetcher f = ConvertedFetcher::create(buf, side.layout, side.desc);
  const int other = me == 0 ? 1 : 0;
  const KvTokenRange tokens{w.sides[0].table, side.table, 0, kTokens};
  expectError([&] { f.fetch({}, tokens); }, ErrorCode::InvalidArgument, {"ConvertedFetcher::fetch", "no sources"});
  expectError([&] { f.fetch({comm.size()}, tokens); }, ErrorCode::InvalidArgument,
              {"ConvertedFetcher::fetch", "outside the group"});
  expectError([&] { f.fetch({-1}, tokens); }, ErrorCode::InvalidArgument,
              {"ConvertedFetcher::fetch", "outside the group"});
  expectError([&] { f.fetch({me}, tokens); }, ErrorCode::InvalidArgument, {"ConvertedFetcher::fetch", "this member"});
  expectError(
      [&] {
        f.fetch({other, other}, tokens);
      },
      ErrorCode::InvalidArgument, {"ConvertedFetcher::fetch", "repeats member"});
  expectError(
      [&] {  // a destination table too short
        f.fetch({other}, KvTokenRange{tokens.srcBlocks, {0}, 0, kTokens});
      },
      ErrorCode::InvalidArgument, {"dstBlocks has 1 entries"});
  expectError([&] { f.contents(comm.size()); }, ErrorCode::InvalidArgument,
              {"ConvertedFetcher::contents", "outside the group"});
  EXPECT_EQ(read(buf, side.mem.size()), side.mem);  // nothing moved
  ConvertedFetcher empty;
  expectError([&] { empty.fetch({other}, tokens); }, ErrorCode::InvalidArgument,
              {"ConvertedFetcher::fetch", "empty ConvertedFetcher"});
  comm.barrier();
}

TEST_P(ConvertedFetch, AMemberThatLeftFailsTheFetchNamingIt) {
  auto comm = kvtest::tcpWorld();
  if (comm.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  // Replicated (MLA): every decode member reads the preferred source only, member 0, which leaves.
  World w = world(comm.size(), {Model::Mla, 16, 32, KvOrder::TokensHeadsDim, KvOrder::HeadsTokensDim});
  const int me = comm.rank();
  Side& side = w.sides[static_cast<size_t>(me)];
  if (me < w.prefill) {
    side.table = w.sides[0].table;
    kvtest::lay(side, 0, kTokens);
  }
  auto buf = SymmetricBuffer::create(comm, w.most, w.most, kind_);
  kvtest::toMemory(kind_, buf.local(), side.mem.data(), side.mem.size());
  ConvertedFetcher f = ConvertedFetcher::create(buf, side.layout, side.desc);
  if (me == 0) f = ConvertedFetcher();  // member 0 leaves: its endpoint closes
  comm.barrier();
  if (me >= w.prefill) {
    ConvertedReadOptions o;
    o.timeoutMs = 30000;
    o.conversion.preferredSource = 0;
    ConvertedReadResult r = f.fetch(prefillRanks(w), {w.sides[0].table, side.table, 0, kTokens}, o);
    EXPECT_EQ(r.status.state, FetchState::Failed);
    EXPECT_NE(r.status.error.find("member 0"), std::string::npos) << r.status.error;
    EXPECT_EQ(read(buf, side.mem.size()), side.mem);  // all or nothing: untouched
  }
  comm.barrier();
}

INSTANTIATE_TEST_SUITE_P(Backends, ConvertedFetch, ::testing::Values(MemoryKind::Host, MemoryKind::Cuda),
                         kvtest::kindName);

}  // namespace
