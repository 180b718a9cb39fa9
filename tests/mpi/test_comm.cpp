// Communicator, split and ParallelGroups under mpirun, against MPI oracles.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>
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

TEST(ParallelGroups, GroupsMatchMpiSplitOracle) {
  auto world = kvtest::tcpWorld();
  int n = world.size();
  std::vector<kvcomm::ParallelSpec> specs;
  if (n == 4) specs = {{1, 4, 1, 1}, {2, 2, 1, 1}, {4, 1, 1, 1}, {2, 1, 2, 1}};
  if (n == 8) specs = {{2, 2, 1, 2}, {2, 2, 2, 1}, {1, 8, 1, 1}};
  if (specs.empty()) GTEST_SKIP() << "no layout specs for " << n << " ranks";
  for (const auto& s : specs) {
    auto l = kvcomm::ParallelGroups::create(world, s);
    const auto& c = l.coord;
    // Oracle: MPI_Comm_split on brute-force colors (same dp/pp/pcp => same TP group, etc.).
    auto check = [&](kvcomm::Communicator& got, int color, int key, kvcomm::Axis axis) {
      MPI_Comm o;
      MPI_Comm_split(MPI_COMM_WORLD, color, key, &o);
      EXPECT_EQ(membersOf(got), membersOf(o));
      EXPECT_EQ(membersOf(got), kvcomm::ParallelGroups::groupOf(s, world.rank(), axis));
      MPI_Comm_free(&o);
    };
    check(l.tp, c.dp * 1000000 + c.pp * 10000 + c.pcp * 100, c.tp, kvcomm::Axis::TP);
    check(l.pcp, c.dp * 1000000 + c.pp * 10000 + c.tp, c.pcp, kvcomm::Axis::PCP);
    check(l.pp, c.dp * 1000000 + c.pcp * 100 + c.tp, c.pp, kvcomm::Axis::PP);
    check(l.dp, c.pp * 10000 + c.pcp * 100 + c.tp, c.dp, kvcomm::Axis::DP);
    for (int r = 0; r < l.pcp.size(); ++r) EXPECT_EQ(kvcomm::ParallelGroups::coordOf(s, l.pcp.worldRank(r)).tp, c.tp);
  }
  // The size check names this rank in `world` (docs/api/errors.md), on every rank alike.
  try {
    kvcomm::ParallelGroups::create(world, {3, 1, 1, 1});
    ADD_FAILURE() << "a layout of 3 ranks was accepted by " << n << " ranks";
  } catch (const kvcomm::InvalidArgumentError& e) {
    std::string want = "kvcomm [rank " + std::to_string(world.rank()) +
                       "] ParallelGroups::create: the communicator has " + std::to_string(n) +
                       " ranks but tp*pcp*pp*dp = 3*1*1*1 = 3 (parallel_groups.cpp:";
    EXPECT_EQ(std::string(e.what()).rfind(want, 0), 0u) << e.what();
  }
}

// An empty handle: every method but valid() throws InvalidArgumentError naming itself (id() used to dereference null).
TEST(Communicator, EmptyHandleThrowsFromEveryMethod) {
  kvcomm::Communicator empty;
  EXPECT_FALSE(empty.valid());
  int buf = 0;
  auto refused = [&](const char* call, const std::function<void()>& fn) {
    try {
      fn();
      ADD_FAILURE() << call << " worked on an empty communicator";
    } catch (const kvcomm::InvalidArgumentError& e) {
      std::string m = e.what();
      EXPECT_NE(m.find(std::string(call) + ": the communicator is empty"), std::string::npos) << m;
    }
  };
  refused("Communicator::rank", [&] { (void)empty.rank(); });
  refused("Communicator::size", [&] { (void)empty.size(); });
  refused("Communicator::worldRank", [&] { (void)empty.worldRank(0); });
  refused("Communicator::id", [&] { (void)empty.id(); });
  refused("Communicator::topology", [&] { (void)empty.topology(); });
  refused("Communicator::split", [&] { (void)empty.split(0, 0); });
  refused("Communicator::allgather", [&] { empty.allgather(&buf, sizeof(buf)); });
  refused("Communicator::barrier", [&] { empty.barrier(); });
  refused("Communicator::send", [&] { empty.send(&buf, sizeof(buf), 0, 1); });
  refused("Communicator::recv", [&] { empty.recv(&buf, sizeof(buf), 0, 1); });
  refused("Communicator::abort", [&] { empty.abort(); });
  refused("Communicator::healthy", [&] { (void)empty.healthy(); });
  refused("Communicator::failedRank", [&] { (void)empty.failedRank(); });
}

// A null buffer with a non-zero size is refused before anything is sent (as the C API does); a zero size is fine.
TEST(Communicator, NullDataWithBytesIsRefused) {
  auto world = kvtest::tcpWorld();
  const int me = world.rank(), n = world.size();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  auto refused = [&](const char* call, const std::function<void()>& fn) {
    try {
      fn();
      ADD_FAILURE() << call << " accepted a null buffer of 8 bytes";
    } catch (const kvcomm::InvalidArgumentError& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("kvcomm [rank " + std::to_string(me) + "] " + call + ": data is null but"), std::string::npos)
          << m;
    }
  };
  refused("Communicator::send", [&] { world.send(nullptr, 8, next, 3); });
  refused("Communicator::recv", [&] { world.recv(nullptr, 8, prev, 3); });
  refused("Communicator::allgather", [&] { world.allgather(nullptr, 8); });  // every rank: nobody is left waiting
  // Nothing was sent: the next message on tag 3 is this one, and empty messages with null data still flow.
  world.send(nullptr, 0, next, 3);
  world.recv(nullptr, 0, prev, 3);
  int token = 1000 + me, got = -1;
  world.send(&token, sizeof(token), next, 3);
  world.recv(&got, sizeof(got), prev, 3);
  EXPECT_EQ(got, 1000 + prev);
  world.allgather(nullptr, 0);
  world.barrier();
}

// Topology's member accessors check their arguments (the C API did; C++ and Python indexed out of range).
TEST(Topology, AccessorsRefuseMembersOutOfRange) {
  auto world = kvtest::tcpWorld();
  const auto& t = world.topology();
  const int n = t.size();
  EXPECT_TRUE(t.sameHost(0, n - 1));
  (void)t.canAccessPeer(n - 1, 0);
  for (auto [a, b] : {std::pair<int, int>{n, 0}, {0, n}, {-1, 0}, {0, -1}, {1 << 30, 1 << 30}}) {
    EXPECT_THROW((void)t.sameHost(a, b), kvcomm::InvalidArgumentError) << a << ", " << b;
    EXPECT_THROW((void)t.canAccessPeer(a, b), kvcomm::InvalidArgumentError) << a << ", " << b;
  }
}

// Sizes whose int product wraps to exactly this world's size (3 * 1431655766 = 2^32 + 2) are refused, not taken for
// a world of world.size() ranks; every rank throws alike, before any communication.
TEST(ParallelGroups, CreateRefusesSizesWhoseProductWrapsToTheWorldSize) {
  auto world = kvtest::tcpWorld();
  std::vector<kvcomm::ParallelSpec> specs;
  if (world.size() == 2) specs = {{3, 1431655766, 1, 1}, {1, 1431655766, 3, 1}};
  if (world.size() == 4) specs = {{4, 1073741825, 1, 1}, {1, 2, 2, 1073741825}};
  if (world.size() == 8) specs = {{8, 536870913, 1, 1}, {2, 2, 2, 536870913}};
  if (specs.empty()) GTEST_SKIP() << "no wrapping specs for " << world.size() << " ranks";
  for (const auto& s : specs) {
    uint32_t wrapped = static_cast<uint32_t>(s.tp) * static_cast<uint32_t>(s.pcp) * static_cast<uint32_t>(s.pp) *
                       static_cast<uint32_t>(s.dp);
    ASSERT_EQ(wrapped, static_cast<uint32_t>(world.size()));  // the hazard this test is about
    try {
      kvcomm::ParallelGroups::create(world, s);
      ADD_FAILURE() << "ParallelGroups::create accepted tp " << s.tp << " pcp " << s.pcp << " pp " << s.pp << " dp "
                    << s.dp;
    } catch (const kvcomm::InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find("ParallelGroups::create"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("exceeds INT_MAX"), std::string::npos) << e.what();
    }
  }
  // The world still works afterwards: nothing was half-split.
  auto l = kvcomm::ParallelGroups::create(world, {world.size(), 1, 1, 1});
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
