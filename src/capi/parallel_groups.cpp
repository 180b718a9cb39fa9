// C ABI: ParallelGroups (TP/PCP/PP/DP groups) and its pure coordinate functions.
#include "capi/capi.hpp"
#include "comm/parallel_spec.hpp"
#include "common/check.hpp"

using kvcomm::capi::fromC;
using kvcomm::capi::guard;
using kvcomm::capi::requireNonNull;
using kvcomm::capi::use;

namespace {

kvcomm::ParallelSpec specOf(const kvcommParallelSpec* s, const char* call) {
  requireNonNull(s, call, "spec");
  kvcomm::ParallelSpec spec;
  spec.tp = s->tp;
  spec.pcp = s->pcp;
  spec.pp = s->pp;
  spec.dp = s->dp;
  kvcomm::detail::checkedWorldSize(spec, call);  // positive sizes, and a product that fits an int
  return spec;
}

void checkRank(const kvcomm::ParallelSpec& s, int rank, const char* call) {
  const int world = kvcomm::detail::checkedWorldSize(s, call);
  KVCOMM_CHECK_ARG(rank >= 0 && rank < world, call, "rank ", rank, " outside [0, ", world, ")");
}

void toC(const kvcomm::ParallelCoord& c, kvcommParallelCoord* out) {
  out->tp = c.tp;
  out->pcp = c.pcp;
  out->pp = c.pp;
  out->dp = c.dp;
}

kvcomm::ParallelGroups& get(kvcommParallelGroups_t layout, const char* call) {
  return use(layout, call, "layout").layout;
}

}  // namespace

extern "C" {

kvcommResult_t kvcommParallelGroupsCreate(kvcommComm_t world, const kvcommParallelSpec* spec,
                                          kvcommParallelGroups_t* layout) {
  return guard("kvcommParallelGroupsCreate", [&] {
    auto& w = use(world, "kvcommParallelGroupsCreate", "world");
    requireNonNull(layout, "kvcommParallelGroupsCreate", "layout");
    kvcomm::ParallelSpec s = specOf(spec, "kvcommParallelGroupsCreate");
    *layout = kvcomm::capi::adopt<kvcommParallelGroups>(kvcomm::ParallelGroups::create(w.comm, s));
  });
}

kvcommResult_t kvcommParallelGroupsDestroy(kvcommParallelGroups_t layout) {
  return guard("kvcommParallelGroupsDestroy",
               [&] { kvcomm::capi::retire(layout, "kvcommParallelGroupsDestroy", "layout"); });
}

kvcommResult_t kvcommParallelGroupsComm(kvcommParallelGroups_t layout, kvcommAxis_t axis, kvcommComm_t* comm) {
  return guard("kvcommParallelGroupsComm", [&] {
    auto& l = get(layout, "kvcommParallelGroupsComm");
    requireNonNull(comm, "kvcommParallelGroupsComm", "comm");
    kvcomm::Axis a = fromC(axis, "kvcommParallelGroupsComm", "axis");
    const kvcomm::Communicator& c = a == kvcomm::Axis::TP    ? l.tp
                                    : a == kvcomm::Axis::PCP ? l.pcp
                                    : a == kvcomm::Axis::PP  ? l.pp
                                                             : l.dp;
    *comm = kvcomm::capi::adopt<kvcommComm>(c);
  });
}

kvcommResult_t kvcommParallelGroupsGetSpec(kvcommParallelGroups_t layout, kvcommParallelSpec* spec) {
  return guard("kvcommParallelGroupsGetSpec", [&] {
    auto& l = get(layout, "kvcommParallelGroupsGetSpec");
    requireNonNull(spec, "kvcommParallelGroupsGetSpec", "spec");
    spec->tp = l.spec.tp;
    spec->pcp = l.spec.pcp;
    spec->pp = l.spec.pp;
    spec->dp = l.spec.dp;
  });
}

kvcommResult_t kvcommParallelGroupsGetCoord(kvcommParallelGroups_t layout, kvcommParallelCoord* coord) {
  return guard("kvcommParallelGroupsGetCoord", [&] {
    auto& l = get(layout, "kvcommParallelGroupsGetCoord");
    requireNonNull(coord, "kvcommParallelGroupsGetCoord", "coord");
    toC(l.coord, coord);
  });
}

kvcommResult_t kvcommParallelCoordOf(const kvcommParallelSpec* spec, int rank, kvcommParallelCoord* coord) {
  return guard("kvcommParallelCoordOf", [&] {
    kvcomm::ParallelSpec s = specOf(spec, "kvcommParallelCoordOf");
    requireNonNull(coord, "kvcommParallelCoordOf", "coord");
    checkRank(s, rank, "kvcommParallelCoordOf");
    toC(kvcomm::ParallelGroups::coordOf(s, rank), coord);
  });
}

kvcommResult_t kvcommParallelRankOf(const kvcommParallelSpec* spec, const kvcommParallelCoord* coord, int* rank) {
  return guard("kvcommParallelRankOf", [&] {
    kvcomm::ParallelSpec s = specOf(spec, "kvcommParallelRankOf");
    requireNonNull(coord, "kvcommParallelRankOf", "coord");
    requireNonNull(rank, "kvcommParallelRankOf", "rank");
    KVCOMM_CHECK_ARG(coord->tp >= 0 && coord->tp < s.tp && coord->pcp >= 0 && coord->pcp < s.pcp && coord->pp >= 0 &&
                         coord->pp < s.pp && coord->dp >= 0 && coord->dp < s.dp,
                     "kvcommParallelRankOf", "coordinates (tp ", coord->tp, ", pcp ", coord->pcp, ", pp ", coord->pp,
                     ", dp ", coord->dp, ") outside the spec");
    kvcomm::ParallelCoord c;
    c.tp = coord->tp;
    c.pcp = coord->pcp;
    c.pp = coord->pp;
    c.dp = coord->dp;
    *rank = kvcomm::ParallelGroups::rankOf(s, c);
  });
}

kvcommResult_t kvcommParallelGroupOf(const kvcommParallelSpec* spec, int rank, kvcommAxis_t axis, int* ranks,
                                     int capacity, int* count) {
  return guard("kvcommParallelGroupOf", [&] {
    kvcomm::ParallelSpec s = specOf(spec, "kvcommParallelGroupOf");
    requireNonNull(count, "kvcommParallelGroupOf", "count");
    KVCOMM_CHECK_ARG(capacity >= 0 && (ranks != nullptr || capacity == 0), "kvcommParallelGroupOf",
                     "ranks is NULL or capacity ", capacity, " is negative");
    checkRank(s, rank, "kvcommParallelGroupOf");
    const kvcomm::Axis a = fromC(axis, "kvcommParallelGroupOf", "axis");
    // Member i of the group is `rank` with its coordinate along the axis set to i: written straight into the
    // caller's array (a group of up to INT_MAX members is never materialised).
    const kvcomm::ParallelCoord mine = kvcomm::ParallelGroups::coordOf(s, rank);
    const int n = a == kvcomm::Axis::TP ? s.tp : a == kvcomm::Axis::PCP ? s.pcp : a == kvcomm::Axis::PP ? s.pp : s.dp;
    for (int i = 0; i < n && i < capacity; ++i) {
      kvcomm::ParallelCoord m = mine;
      (a == kvcomm::Axis::TP ? m.tp : a == kvcomm::Axis::PCP ? m.pcp : a == kvcomm::Axis::PP ? m.pp : m.dp) = i;
      ranks[i] = kvcomm::ParallelGroups::rankOf(s, m);
    }
    *count = n;
  });
}

}  // extern "C"
