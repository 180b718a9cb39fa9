// Communicator, split and Layout under mpirun, against MPI oracles.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kvcomm/error.hpp"
#include "mpi/mpi_util.hpp"

namespace {

// World rank list of an MPI communicator, in its rank order.
std::vector<int> membersOf(MPI_Comm c) {
  int n = 0;
  MPI_Comm_size(c, &n);
  std::vector<int> out(static_cast<size_t>(n));
  int me = kvtest::worldRank();
  MPI_Allgather(&me, 1, MPI_INT, out.data(), 1, MPI_INT, c);
  return out;
}

std::vector<int> membersOf(const kvcomm::Communicator& c) {
  std::vector<int> out;
  for (int r = 0; r < c.size(); ++r) out.push_back(c.worldRank(r));
  return out;
}

TEST(Split, MatchesMpiCommSplitForRandomColorsAndKeys) {
  auto world = kvtest::tcpWorld();
  std::mt19937_64 rng(kvtest::sharedSeed());
  for (int trial = 0; trial < 25; ++trial) {
    // Every rank draws the whole table from the shared seed and takes its own entry.
    std::vector<int> colors, keys;
    for (int r = 0; r < world.size(); ++r) {
      colors.push_back(static_cast<int>(rng() % 4) - 1);  // -1 = no communicator
      keys.push_back(static_cast<int>(rng() % 3) - 1);    // ties broken by rank
    }
    int color = colors[static_cast<size_t>(world.rank())], key = keys[static_cast<size_t>(world.rank())];
    MPI_Comm oracle;
    MPI_Comm_split(MPI_COMM_WORLD, color < 0 ? MPI_UNDEFINED : color, key, &oracle);
    auto sub = world.split(color, key);
    if (color < 0) {
      EXPECT_EQ(oracle, MPI_COMM_NULL);
      EXPECT_FALSE(sub.has_value());
      continue;
    }
    ASSERT_TRUE(sub.has_value());
    int orank = -1;
    MPI_Comm_rank(oracle, &orank);
    EXPECT_EQ(sub->rank(), orank);
    EXPECT_EQ(membersOf(*sub), membersOf(oracle)) << "trial " << trial;
    // The subgroup really talks among itself.
    std::vector<int> v(static_cast<size_t>(sub->size()), -1);
    v[static_cast<size_t>(sub->rank())] = kvtest::worldRank();
    sub->allgather(v.data(), sizeof(int));
    EXPECT_EQ(v, membersOf(oracle));
    MPI_Comm_free(&oracle);
  }
}

TEST(Layout, GroupsMatchMpiSplitOracle) {
  auto world = kvtest::tcpWorld();
  int n = world.size();
  std::vector<kvcomm::LayoutSpec> specs;
  if (n == 4) specs = {{1, 4, 1, 1}, {2, 2, 1, 1}, {4, 1, 1, 1}, {2, 1, 2, 1}};
  if (n == 8) specs = {{2, 2, 1, 2}, {2, 2, 2, 1}, {1, 8, 1, 1}};
  if (specs.empty()) GTEST_SKIP() << "no layout specs for " << n << " ranks";
  for (const auto& s : specs) {
    auto l = kvcomm::Layout::create(world, s);
    const auto& c = l.coord;
    // Oracle: MPI_Comm_split on brute-force colors (same dp/pp/pcp => same TP group, etc.).
    auto check = [&](kvcomm::Communicator& got, int color, int key, kvcomm::Axis axis) {
      MPI_Comm o;
      MPI_Comm_split(MPI_COMM_WORLD, color, key, &o);
      EXPECT_EQ(membersOf(got), membersOf(o));
      EXPECT_EQ(membersOf(got), kvcomm::Layout::groupOf(s, world.rank(), axis));
      MPI_Comm_free(&o);
    };
    check(l.tp, c.dp * 1000000 + c.pp * 10000 + c.pcp * 100, c.tp, kvcomm::Axis::TP);
    check(l.pcp, c.dp * 1000000 + c.pp * 10000 + c.tp, c.pcp, kvcomm::Axis::PCP);
    check(l.pp, c.dp * 1000000 + c.pcp * 100 + c.tp, c.pp, kvcomm::Axis::PP);
    check(l.dp, c.pp * 10000 + c.pcp * 100 + c.tp, c.dp, kvcomm::Axis::DP);
    for (int r = 0; r < l.pcp.size(); ++r) EXPECT_EQ(kvcomm::Layout::coordOf(s, l.pcp.worldRank(r)).tp, c.tp);
  }
  EXPECT_THROW(kvcomm::Layout::create(world, {3, 1, 1, 1}), kvcomm::InvalidArgumentError);
}

// Sizes whose int product wraps to exactly this world's size (3 * 1431655766 = 2^32 + 2) are refused, not taken for
// a world of world.size() ranks; every rank throws alike, before any communication.
TEST(Layout, CreateRefusesSizesWhoseProductWrapsToTheWorldSize) {
  auto world = kvtest::tcpWorld();
  std::vector<kvcomm::LayoutSpec> specs;
  if (world.size() == 2) specs = {{3, 1431655766, 1, 1}, {1, 1431655766, 3, 1}};
  if (world.size() == 4) specs = {{4, 1073741825, 1, 1}, {1, 2, 2, 1073741825}};
  if (world.size() == 8) specs = {{8, 536870913, 1, 1}, {2, 2, 2, 536870913}};
  if (specs.empty()) GTEST_SKIP() << "no wrapping specs for " << world.size() << " ranks";
  for (const auto& s : specs) {
    uint32_t wrapped = static_cast<uint32_t>(s.tp) * static_cast<uint32_t>(s.pcp) * static_cast<uint32_t>(s.pp) *
                       static_cast<uint32_t>(s.dp);
    ASSERT_EQ(wrapped, static_cast<uint32_t>(world.size()));  // the hazard this test is about
    try {
      kvcomm::Layout::create(world, s);
      ADD_FAILURE() << "Layout::create accepted tp " << s.tp << " pcp " << s.pcp << " pp " << s.pp << " dp " << s.dp;
    } catch (const kvcomm::InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find("Layout::create"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("exceeds INT_MAX"), std::string::npos) << e.what();
    }
  }
  // The world still works afterwards: nothing was half-split.
  auto l = kvcomm::Layout::create(world, {world.size(), 1, 1, 1});
  EXPECT_EQ(l.tp.size(), world.size());
}

TEST(Bootstrap, CallbackOverMpiEqualsTcpAndMpi) {
  auto tcp = kvtest::tcpWorld();
  auto cb = kvcomm::Communicator::create(std::make_shared<kvcomm::CallbackBootstrap>(
      kvtest::worldRank(), kvtest::worldSize(), [](const void* send, void* recv, size_t bytes) {
        MPI_Allgather(send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes), MPI_BYTE, MPI_COMM_WORLD);
      }));
  auto mpi = kvcomm::Communicator::create(std::make_shared<kvcomm::MpiBootstrap>(MPI_COMM_WORLD));
  for (auto* c : {&cb, &mpi}) {
    EXPECT_EQ(c->rank(), tcp.rank());
    EXPECT_EQ(c->size(), tcp.size());
    EXPECT_NE(c->id(), 0u);
    const auto& a = c->topology();
    const auto& b = tcp.topology();
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(a.numHosts, b.numHosts);
    EXPECT_EQ(a.p2p, b.p2p);
    for (int r = 0; r < a.size(); ++r) {
      EXPECT_EQ(a.members[r].pid, b.members[r].pid);
      EXPECT_EQ(a.members[r].hostIndex, b.members[r].hostIndex);
      EXPECT_EQ(a.members[r].localRank, b.members[r].localRank);
      EXPECT_EQ(a.members[r].bootId, b.members[r].bootId);
      EXPECT_EQ(a.members[r].gpu.uuid, b.members[r].gpu.uuid);
    }
    auto s1 = c->split(c->rank() % 2, 0);
    auto s2 = tcp.split(tcp.rank() % 2, 0);
    EXPECT_EQ(membersOf(*s1), membersOf(*s2));
    EXPECT_EQ(a.members[static_cast<size_t>(c->rank())].pid, getpid());
  }
}

TEST(Topology, OneHostUnderMpirun) {
  auto world = kvtest::tcpWorld();
  const auto& t = world.topology();
  EXPECT_EQ(t.numHosts, 1);
  for (int r = 0; r < t.size(); ++r) {
    EXPECT_EQ(t.members[r].localRank, r);
    EXPECT_EQ(t.members[r].localSize, t.size());
  }
}

}  // namespace
