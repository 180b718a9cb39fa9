// ParallelGroups against a brute-force oracle that enumerates coordinates in nested loops (TP innermost).
#include <gtest/gtest.h>

#include <initializer_list>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kvcomm/comm.hpp"
#include "kvcomm/error.hpp"
#include "support/expect_error.hpp"

namespace {

using Coord = std::tuple<int, int, int, int>;  // dp, pp, pcp, tp

std::map<int, Coord> enumerate(const kvcomm::ParallelSpec& s) {
  std::map<int, Coord> out;
  int r = 0;
  for (int dp = 0; dp < s.dp; ++dp)
    for (int pp = 0; pp < s.pp; ++pp)
      for (int pcp = 0; pcp < s.pcp; ++pcp)
        for (int tp = 0; tp < s.tp; ++tp) out[r++] = {dp, pp, pcp, tp};
  return out;
}

// Ranks that share every coordinate except the one at index `axis` of Coord, sorted by that coordinate.
std::vector<int> oracleGroup(const std::map<int, Coord>& all, int rank, int axis) {
  std::map<int, int> byCoord;
  const Coord& me = all.at(rank);
  auto get = [](const Coord& c, int i) {
    switch (i) {
      case 0:
        return std::get<0>(c);
      case 1:
        return std::get<1>(c);
      case 2:
        return std::get<2>(c);
      default:
        return std::get<3>(c);
    }
  };
  for (const auto& [r, c] : all) {
    bool same = true;
    for (int i = 0; i < 4; ++i)
      if (i != axis && get(c, i) != get(me, i)) same = false;
    if (same) byCoord[get(c, axis)] = r;
  }
  std::vector<int> out;
  for (auto& [k, r] : byCoord) out.push_back(r);
  return out;
}

class LayoutOracle : public ::testing::TestWithParam<kvcomm::ParallelSpec> {};

TEST_P(LayoutOracle, GroupsMatchBruteForce) {
  kvcomm::ParallelSpec s = GetParam();
  auto all = enumerate(s);
  for (const auto& [rank, c] : all) {
    kvcomm::ParallelCoord lc = kvcomm::ParallelGroups::coordOf(s, rank);
    EXPECT_EQ(lc.dp, std::get<0>(c));
    EXPECT_EQ(lc.pp, std::get<1>(c));
    EXPECT_EQ(lc.pcp, std::get<2>(c));
    EXPECT_EQ(lc.tp, std::get<3>(c));
    EXPECT_EQ(kvcomm::ParallelGroups::rankOf(s, lc), rank);
    EXPECT_EQ(kvcomm::ParallelGroups::groupOf(s, rank, kvcomm::Axis::DP), oracleGroup(all, rank, 0));
    EXPECT_EQ(kvcomm::ParallelGroups::groupOf(s, rank, kvcomm::Axis::PP), oracleGroup(all, rank, 1));
    EXPECT_EQ(kvcomm::ParallelGroups::groupOf(s, rank, kvcomm::Axis::PCP), oracleGroup(all, rank, 2));
    EXPECT_EQ(kvcomm::ParallelGroups::groupOf(s, rank, kvcomm::Axis::TP), oracleGroup(all, rank, 3));
    // A PCP group never crosses TP coordinates.
    for (int member : kvcomm::ParallelGroups::groupOf(s, rank, kvcomm::Axis::PCP))
      EXPECT_EQ(kvcomm::ParallelGroups::coordOf(s, member).tp, lc.tp);
  }
}

INSTANTIATE_TEST_SUITE_P(Specs, LayoutOracle,
                         ::testing::Values(kvcomm::ParallelSpec{1, 4, 1, 1}, kvcomm::ParallelSpec{2, 2, 1, 1},
                                           kvcomm::ParallelSpec{4, 1, 1, 1}, kvcomm::ParallelSpec{2, 2, 1, 2},
                                           kvcomm::ParallelSpec{2, 3, 2, 2}),
                         [](const ::testing::TestParamInfo<kvcomm::ParallelSpec>& i) {  // e.g. "tp2_pcp3_pp2_dp2"
                           const kvcomm::ParallelSpec& s = i.param;
                           return "tp" + std::to_string(s.tp) + "_pcp" + std::to_string(s.pcp) + "_pp" +
                                  std::to_string(s.pp) + "_dp" + std::to_string(s.dp);
                         });

TEST(ParallelGroups, Tp2Pcp2IsTheEngineNumbering) {
  kvcomm::ParallelSpec s{2, 2, 1, 1};
  EXPECT_EQ(kvcomm::ParallelGroups::groupOf(s, 0, kvcomm::Axis::TP), (std::vector<int>{0, 1}));
  EXPECT_EQ(kvcomm::ParallelGroups::groupOf(s, 3, kvcomm::Axis::TP), (std::vector<int>{2, 3}));
  EXPECT_EQ(kvcomm::ParallelGroups::groupOf(s, 0, kvcomm::Axis::PCP), (std::vector<int>{0, 2}));
  EXPECT_EQ(kvcomm::ParallelGroups::groupOf(s, 1, kvcomm::Axis::PCP), (std::vector<int>{1, 3}));
}

TEST(ParallelGroups, RejectsBadSpecs) {
  EXPECT_THROW(kvcomm::ParallelGroups::coordOf({0, 1, 1, 1}, 0), kvcomm::InvalidArgumentError);
  EXPECT_THROW(kvcomm::ParallelGroups::coordOf({2, 2, 1, 1}, 4), kvcomm::InvalidArgumentError);
}

// rankOf checks each coordinate against its axis (docs/api/parallel-groups.md), not only the sizes.
TEST(ParallelGroups, RankOfRejectsCoordinatesOutsideTheirAxis) {
  const kvcomm::ParallelSpec s{2, 3, 2, 2};
  EXPECT_EQ(kvcomm::ParallelGroups::rankOf(s, {1, 2, 1, 1}), 23);
  const kvcomm::ParallelCoord bad[] = {{2, 0, 0, 0},  {0, 3, 0, 0},  {0, 0, 2, 0},  {0, 0, 0, 2},
                                       {-1, 0, 0, 0}, {0, -1, 0, 0}, {0, 0, -1, 0}, {0, 0, 0, -1}};
  for (const kvcomm::ParallelCoord& c : bad) {
    try {
      kvcomm::ParallelGroups::rankOf(s, c);
      ADD_FAILURE() << "rankOf accepted tp " << c.tp << " pcp " << c.pcp << " pp " << c.pp << " dp " << c.dp;
    } catch (const kvcomm::InvalidArgumentError& e) {
      EXPECT_NE(std::string(e.what()).find("ParallelGroups::rankOf"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(kvcomm::ParallelGroups::rankOf({2, 0, 1, 1}, {0, 0, 0, 0}), kvcomm::InvalidArgumentError);
}

// Throws InvalidArgumentError whose message holds every string of `parts`.
template <typename F>
void expectInvalid(F&& f, std::initializer_list<const char*> parts) {
  kvtest::expectError(f, kvcomm::ErrorCode::InvalidArgument, std::vector<std::string>(parts.begin(), parts.end()));
}

// Sizes whose product wraps an int (3 * 1431655766 = 2^32 + 2 reads as 2) are refused, on every axis, by every
// function: the wrapped world would otherwise map ranks onto coordinates that do not exist.
TEST(ParallelGroups, RefusesSizesWhoseProductOverflowsInt) {
  const std::vector<kvcomm::ParallelSpec> wrapping = {
      {3, 1431655766, 1, 1}, {1, 1, 3, 1431655766}, {1431655766, 1, 1, 3}, {2, 2, 2, 536870913}, {65536, 65536, 1, 1}};
  for (const auto& s : wrapping) {
    expectInvalid([&] { kvcomm::ParallelGroups::coordOf(s, 1); }, {"ParallelGroups::coordOf", "exceeds INT_MAX"});
    expectInvalid(
        [&] {
          kvcomm::ParallelGroups::rankOf(s, {0, 0, 0, 0});
        },
        {"ParallelGroups::rankOf", "exceeds INT_MAX"});
    expectInvalid([&] { kvcomm::ParallelGroups::groupOf(s, 0, kvcomm::Axis::TP); },
                  {"ParallelGroups::groupOf", "exceeds INT_MAX"});
  }
  expectInvalid([] { kvcomm::ParallelGroups::coordOf({3, 1431655766, 1, 1}, 1); }, {"3*1431655766*1*1"});
  // The largest worlds that fit an int stay accepted.
  const kvcomm::ParallelSpec widest{2147483647, 1, 1, 1};
  EXPECT_EQ(kvcomm::ParallelGroups::coordOf(widest, 2147483646).tp, 2147483646);
  const kvcomm::ParallelSpec square{46340, 46341, 1, 1};  // 2,147,441,940 ranks
  kvcomm::ParallelCoord last = kvcomm::ParallelGroups::coordOf(square, 2147441939);
  EXPECT_EQ(last.tp, 46339);
  EXPECT_EQ(last.pcp, 46340);
  EXPECT_EQ(kvcomm::ParallelGroups::rankOf(square, last), 2147441939);
}

TEST(ParallelGroups, GroupOfRefusesAnAxisOutsideTheEnum) {
  expectInvalid(
      [] {
        kvcomm::ParallelGroups::groupOf({2, 2, 1, 1}, 0, static_cast<kvcomm::Axis>(9));
      },
      {"ParallelGroups::groupOf", "axis 9"});
}

}  // namespace

namespace {

TEST(Topology, SharedGpuFindsMembersOfOneHostOnOneGpu) {
  kvcomm::Topology t;
  auto add = [&](int host, const char* uuid) {
    kvcomm::MemberInfo m;
    m.rank = t.size();
    m.hostIndex = host;
    m.gpu.uuid = uuid;
    t.members.push_back(m);
  };
  add(0, "GPU-a");
  add(0, "GPU-b");
  add(1, "GPU-a");  // another host: the same UUID string is not the same GPU
  add(1, "");
  add(1, "");  // no GPU at all is not sharing one
  EXPECT_EQ(t.sharedGpu(), (std::pair<int, int>{-1, -1}));
  add(0, "GPU-b");
  EXPECT_EQ(t.sharedGpu(), (std::pair<int, int>{1, 5}));
}

// sameHost/canAccessPeer check their members (and the matrix) instead of indexing past the vectors.
TEST(Topology, AccessorsCheckMembersAndTheMatrix) {
  kvcomm::Topology t;
  for (int host : {0, 0, 1}) {
    kvcomm::MemberInfo m;
    m.rank = t.size();
    m.hostIndex = host;
    t.members.push_back(m);
  }
  t.p2p = {1, 1, 0, 0, 1, 0, 0, 0, 1};  // row a: a can access column b
  EXPECT_TRUE(t.sameHost(0, 1));
  EXPECT_FALSE(t.sameHost(1, 2));
  EXPECT_TRUE(t.canAccessPeer(0, 1));
  EXPECT_FALSE(t.canAccessPeer(1, 0));
  EXPECT_TRUE(t.canAccessPeer(2, 2));
  for (auto [a, b] : {std::pair<int, int>{3, 0}, {0, 3}, {-1, 0}, {0, -1}, {1 << 30, 0}}) {
    for (bool same : {true, false}) {
      const char* call = same ? "Topology::sameHost" : "Topology::canAccessPeer";
      try {
        (void)(same ? t.sameHost(a, b) : t.canAccessPeer(a, b));
        ADD_FAILURE() << call << "(" << a << ", " << b << ") accepted a member outside [0, 3)";
      } catch (const kvcomm::InvalidArgumentError& e) {
        EXPECT_NE(std::string(e.what()).find(std::string(call) + ": member "), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(" outside [0, 3)"), std::string::npos) << e.what();
      }
    }
  }
  t.p2p.pop_back();  // a matrix that does not match the members
  EXPECT_THROW((void)t.canAccessPeer(0, 1), kvcomm::InvalidArgumentError);
}

}  // namespace
