// C ABI: Layout (TP/PCP/PP/DP groups) and its pure coordinate functions.
#include "capi/capi.hpp"
#include "comm/layout_spec.hpp"
#include "common/check.hpp"

using kvcomm::capi::fromC;
using kvcomm::capi::guard;
using kvcomm::capi::requireNonNull;
using kvcomm::capi::use;

namespace {

kvcomm::LayoutSpec specOf(const kvcommLayoutSpec* s, const char* call) {
  requireNonNull(s, call, "spec");
  kvcomm::LayoutSpec spec;
  spec.tp = s->tp;
  spec.pcp = s->pcp;
  spec.pp = s->pp;
  spec.dp = s->dp;
  kvcomm::detail::checkedWorldSize(spec, call);  // positive sizes, and a product that fits an int
  return spec;
}

void checkRank(const kvcomm::LayoutSpec& s, int rank, const char* call) {
  const int world = kvcomm::detail::checkedWorldSize(s, call);
  KVCOMM_CHECK_ARG(rank >= 0 && rank < world, call, "rank ", rank, " outside [0, ", world, ")");
}

void toC(const kvcomm::LayoutCoord& c, kvcommLayoutCoord* out) {
  out->tp = c.tp;
  out->pcp = c.pcp;
  out->pp = c.pp;
  out->dp = c.dp;
}

kvcomm::Layout& get(kvcommLayout_t layout, const char* call) {
  return use(layout, call, "layout").layout;
}

}  // namespace

extern "C" {

kvcommResult_t kvcommLayoutCreate(kvcommComm_t world, const kvcommLayoutSpec* spec, kvcommLayout_t* layout) {
  return guard("kvcommLayoutCreate", [&] {
    auto& w = use(world, "kvcommLayoutCreate", "world");
    requireNonNull(layout, "kvcommLayoutCreate", "layout");
    kvcomm::LayoutSpec s = specOf(spec, "kvcommLayoutCreate");
    *layout = kvcomm::capi::adopt<kvcommLayout>(kvcomm::Layout::create(w.comm, s));
  });
}

kvcommResult_t kvcommLayoutDestroy(kvcommLayout_t layout) {
  return guard("kvcommLayoutDestroy", [&] { kvcomm::capi::retire(layout, "kvcommLayoutDestroy", "layout"); });
}

kvcommResult_t kvcommLayoutComm(kvcommLayout_t layout, kvcommAxis_t axis, kvcommComm_t* comm) {
  return guard("kvcommLayoutComm", [&] {
    auto& l = get(layout, "kvcommLayoutComm");
    requireNonNull(comm, "kvcommLayoutComm", "comm");
    kvcomm::Axis a = fromC(axis, "kvcommLayoutComm", "axis");
    const kvcomm::Communicator& c = a == kvcomm::Axis::TP    ? l.tp
                                    : a == kvcomm::Axis::PCP ? l.pcp
                                    : a == kvcomm::Axis::PP  ? l.pp
                                                             : l.dp;
    *comm = kvcomm::capi::adopt<kvcommComm>(c);
  });
}

kvcommResult_t kvcommLayoutGetSpec(kvcommLayout_t layout, kvcommLayoutSpec* spec) {
  return guard("kvcommLayoutGetSpec", [&] {
    auto& l = get(layout, "kvcommLayoutGetSpec");
    requireNonNull(spec, "kvcommLayoutGetSpec", "spec");
    spec->tp = l.spec.tp;
    spec->pcp = l.spec.pcp;
    spec->pp = l.spec.pp;
    spec->dp = l.spec.dp;
  });
}

kvcommResult_t kvcommLayoutGetCoord(kvcommLayout_t layout, kvcommLayoutCoord* coord) {
  return guard("kvcommLayoutGetCoord", [&] {
    auto& l = get(layout, "kvcommLayoutGetCoord");
    requireNonNull(coord, "kvcommLayoutGetCoord", "coord");
    toC(l.coord, coord);
  });
}

kvcommResult_t kvcommLayoutCoordOf(const kvcommLayoutSpec* spec, int rank, kvcommLayoutCoord* coord) {
  return guard("kvcommLayoutCoordOf", [&] {
    kvcomm::LayoutSpec s = specOf(spec, "kvcommLayoutCoordOf");
    requireNonNull(coord, "kvcommLayoutCoordOf", "coord");
    checkRank(s, rank, "kvcommLayoutCoordOf");
    toC(kvcomm::Layout::coordOf(s, rank), coord);
  });
}

kvcommResult_t kvcommLayoutRankOf(const kvcommLayoutSpec* spec, const kvcommLayoutCoord* coord, int* rank) {
  return guard("kvcommLayoutRankOf", [&] {
    kvcomm::LayoutSpec s = specOf(spec, "kvcommLayoutRankOf");
    requireNonNull(coord, "kvcommLayoutRankOf", "coord");
    requireNonNull(rank, "kvcommLayoutRankOf", "rank");
    KVCOMM_CHECK_ARG(coord->tp >= 0 && coord->tp < s.tp && coord->pcp >= 0 && coord->pcp < s.pcp && coord->pp >= 0 &&
                         coord->pp < s.pp && coord->dp >= 0 && coord->dp < s.dp,
                     "kvcommLayoutRankOf", "coordinates (tp ", coord->tp, ", pcp ", coord->pcp, ", pp ", coord->pp,
                     ", dp ", coord->dp, ") outside the spec");
    kvcomm::LayoutCoord c;
    c.tp = coord->tp;
    c.pcp = coord->pcp;
    c.pp = coord->pp;
    c.dp = coord->dp;
    *rank = kvcomm::Layout::rankOf(s, c);
  });
}

kvcommResult_t kvcommLayoutGroupOf(const kvcommLayoutSpec* spec, int rank, kvcommAxis_t axis, int* ranks, int capacity,
                                   int* count) {
  return guard("kvcommLayoutGroupOf", [&] {
    kvcomm::LayoutSpec s = specOf(spec, "kvcommLayoutGroupOf");
    requireNonNull(count, "kvcommLayoutGroupOf", "count");
    KVCOMM_CHECK_ARG(capacity >= 0 && (ranks != nullptr || capacity == 0), "kvcommLayoutGroupOf",
                     "ranks is NULL or capacity ", capacity, " is negative");
    checkRank(s, rank, "kvcommLayoutGroupOf");
    const kvcomm::Axis a = fromC(axis, "kvcommLayoutGroupOf", "axis");
    // Member i of the group is `rank` with its coordinate along the axis set to i: written straight into the
    // caller's array (a group of up to INT_MAX members is never materialised).
    const kvcomm::LayoutCoord mine = kvcomm::Layout::coordOf(s, rank);
    const int n = a == kvcomm::Axis::TP ? s.tp : a == kvcomm::Axis::PCP ? s.pcp : a == kvcomm::Axis::PP ? s.pp : s.dp;
    for (int i = 0; i < n && i < capacity; ++i) {
      kvcomm::LayoutCoord m = mine;
      (a == kvcomm::Axis::TP ? m.tp : a == kvcomm::Axis::PCP ? m.pcp : a == kvcomm::Axis::PP ? m.pp : m.dp) = i;
      ranks[i] = kvcomm::Layout::rankOf(s, m);
    }
    *count = n;
  });
}

}  // extern "C"
