#include <climits>
#include <cstdint>

#include "comm/parallel_spec.hpp"
#include "common/check.hpp"
#include "kvcomm/comm.hpp"

namespace kvcomm {

namespace detail {

int checkedWorldSize(const ParallelSpec& s, const char* call) {
  KVCOMM_CHECK_ARG(s.tp > 0 && s.pcp > 0 && s.pp > 0 && s.dp > 0, call, "every layout size must be positive (tp ", s.tp,
                   ", pcp ", s.pcp, ", pp ", s.pp, ", dp ", s.dp, ")");
  // Each factor is at most INT_MAX, so every partial product stays below INT_MAX * INT_MAX < INT64_MAX once the
  // running product is checked before the next multiplication.
  int64_t world = 1;
  for (int size : {s.tp, s.pcp, s.pp, s.dp}) {
    world *= size;
    KVCOMM_CHECK_ARG(world <= INT_MAX, call, "tp*pcp*pp*dp = ", s.tp, "*", s.pcp, "*", s.pp, "*", s.dp,
                     " exceeds INT_MAX (", INT_MAX, ") ranks");
  }
  return static_cast<int>(world);
}

}  // namespace detail

namespace {

int& coordRef(ParallelCoord& c, Axis a) {
  switch (a) {
    case Axis::TP:
      return c.tp;
    case Axis::PCP:
      return c.pcp;
    case Axis::PP:
      return c.pp;
    case Axis::DP:
      return c.dp;
  }
  return c.tp;
}

int axisSize(const ParallelSpec& s, Axis a) {
  switch (a) {
    case Axis::TP:
      return s.tp;
    case Axis::PCP:
      return s.pcp;
    case Axis::PP:
      return s.pp;
    case Axis::DP:
      return s.dp;
  }
  return 1;
}

}  // namespace

ParallelCoord ParallelGroups::coordOf(const ParallelSpec& s, int rank) {
  const int size = detail::checkedWorldSize(s, "ParallelGroups::coordOf");
  KVCOMM_CHECK_ARG(rank >= 0 && rank < size, "ParallelGroups::coordOf", "rank ", rank, " outside the layout's ", size,
                   " ranks");
  ParallelCoord c;
  c.tp = rank % s.tp;
  rank /= s.tp;
  c.pcp = rank % s.pcp;
  rank /= s.pcp;
  c.pp = rank % s.pp;
  c.dp = rank / s.pp;
  return c;
}

int ParallelGroups::rankOf(const ParallelSpec& s, const ParallelCoord& c) {
  detail::checkedWorldSize(s, "ParallelGroups::rankOf");
  KVCOMM_CHECK_ARG(
      c.tp >= 0 && c.tp < s.tp && c.pcp >= 0 && c.pcp < s.pcp && c.pp >= 0 && c.pp < s.pp && c.dp >= 0 && c.dp < s.dp,
      "ParallelGroups::rankOf", "coordinates (tp ", c.tp, ", pcp ", c.pcp, ", pp ", c.pp, ", dp ", c.dp,
      ") outside the layout");
  return ((c.dp * s.pp + c.pp) * s.pcp + c.pcp) * s.tp + c.tp;
}

std::vector<int> ParallelGroups::groupOf(const ParallelSpec& s, int rank, Axis axis) {
  KVCOMM_CHECK_ARG(axis == Axis::TP || axis == Axis::PCP || axis == Axis::PP || axis == Axis::DP,
                   "ParallelGroups::groupOf", "axis ", static_cast<int>(axis),
                   " is not an Axis (TP 0, PCP 1, PP 2, DP 3)");
  detail::checkedWorldSize(s, "ParallelGroups::groupOf");
  ParallelCoord c = coordOf(s, rank);
  std::vector<int> out;
  for (int i = 0; i < axisSize(s, axis); ++i) {
    coordRef(c, axis) = i;
    out.push_back(rankOf(s, c));
  }
  return out;
}

ParallelGroups ParallelGroups::create(Communicator& world, const ParallelSpec& spec) {
  KVCOMM_CHECK_ARG(world.valid(), "ParallelGroups::create", "the communicator is empty");
  detail::RankScope scope(world.rank());
  const int size = detail::checkedWorldSize(spec, "ParallelGroups::create");
  KVCOMM_CHECK_ARG(world.size() == size, "ParallelGroups::create", "the communicator has ", world.size(),
                   " ranks but tp*pcp*pp*dp = ", spec.tp, "*", spec.pcp, "*", spec.pp, "*", spec.dp, " = ", size);
  ParallelGroups l;
  l.spec = spec;
  l.coord = coordOf(spec, world.rank());
  const ParallelCoord& c = l.coord;
  // Color = the coordinates that stay fixed along the axis; key = the coordinate that varies (the group rank).
  l.tp = *world.split((c.dp * spec.pp + c.pp) * spec.pcp + c.pcp, c.tp);
  l.pcp = *world.split((c.dp * spec.pp + c.pp) * spec.tp + c.tp, c.pcp);
  l.pp = *world.split((c.dp * spec.pcp + c.pcp) * spec.tp + c.tp, c.pp);
  l.dp = *world.split((c.pp * spec.pcp + c.pcp) * spec.tp + c.tp, c.dp);
  return l;
}

}  // namespace kvcomm
