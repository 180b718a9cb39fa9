#include "fetch/member_layouts.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "comm/agreement.hpp"
#include "common/check.hpp"
#include "kvcomm/device/vector.hpp"

namespace kvcomm {

namespace detail {

namespace {

// The tables of `n` members' regions (views[r * most + j], `regions[r]` of them each) once every member agreed on the
// region count: blockBytes must match rank 0's region by region (`who(r)` names a member in errors).
template <typename Who>
MemberLayouts buildTable(const std::vector<FetchRegionView>& all, size_t most, size_t numRegions,
                         const std::vector<uint64_t>& versions, const char* call, Who who) {
  const size_t n = versions.size();
  MemberLayouts t;
  t.numRegions = numRegions;
  t.views.resize(n * t.numRegions);
  t.layouts.resize(n);
  t.hashes.resize(n);
  t.minBlocks.assign(n, ~0ull);
  t.contiguous.assign(n, 1);
  t.minBlockBytes = ~0ull;
  for (size_t j = 0; j < t.numRegions; ++j) {
    t.minBlockBytes = std::min<uint64_t>(t.minBlockBytes, all[j].blockBytes);
    t.blockBytesSum += all[j].blockBytes;
  }
  uint64_t align = 0;
  for (size_t r = 0; r < n; ++r) {
    KvLayout& l = t.layouts[r];
    l.version = versions[r];
    for (size_t j = 0; j < t.numRegions; ++j) {
      const FetchRegionView& v = all[r * most + j];
      const FetchRegionView& ref = all[j];
      KVCOMM_CHECK_ARG(v.blockBytes == ref.blockBytes, call, "region ", j, " of ", who(r), " has blocks of ",
                       v.blockBytes, " bytes but ", who(0), "'s has ", ref.blockBytes,
                       " (a fetch copies whole blocks: region sizes must match)");
      t.views[r * t.numRegions + j] = v;
      l.regions.push_back({v.offset, v.blockBytes, v.blockStride, v.numBlocks});
      t.minBlocks[r] = std::min<uint64_t>(t.minBlocks[r], v.numBlocks);
      if (v.blockStride != v.blockBytes) t.contiguous[r] = 0;
      align |= v.offset | v.blockBytes | v.blockStride;
    }
    t.hashes[r] = layoutHash(l);
  }
  t.vec = commonAlignment(align);
  return t;
}

FetchRegionView viewOf(const KvRegion& r) {
  return {r.offset, r.blockBytes, r.blockStride ? r.blockStride : r.blockBytes, r.numBlocks};
}

}  // namespace

MemberLayouts exchangeLayouts(Communicator& comm, const KvLayout& mine) {
  const char* call = "Fetcher::create (layouts)";
  const int n = comm.size();
  struct Head {
    uint64_t regions;
    uint64_t version;
  };
  std::vector<Head> heads(static_cast<size_t>(n));
  heads[static_cast<size_t>(comm.rank())] = {mine.regions.size(), mine.version};
  comm.allgather(heads.data(), sizeof(Head));
  size_t most = 0;
  for (const Head& h : heads) most = std::max<size_t>(most, h.regions);
  std::vector<FetchRegionView> all(static_cast<size_t>(n) * most);
  for (size_t j = 0; j < mine.regions.size(); ++j)
    all[static_cast<size_t>(comm.rank()) * most + j] = viewOf(mine.regions[j]);
  comm.allgather(all.data() + 0, sizeof(FetchRegionView) * most);
  // Every rank runs the same checks on the same data: the same error everywhere, no vote needed.
  requireSame(
      heads, [](const Head& h) { return h.regions; }, call, "the number of regions", asPrinted, worldRanksOf(comm),
      "every member's layout needs the same regions");
  std::vector<uint64_t> versions;
  for (const Head& h : heads) versions.push_back(h.version);
  return buildTable(all, most, heads[0].regions, versions, call, [](size_t r) { return cat("rank ", r); });
}

MemberLayouts pairLayouts(const KvLayout& a, const KvLayout& b, const char* call, const std::string& aName,
                          const std::string& bName) {
  KVCOMM_CHECK_ARG(a.regions.size() == b.regions.size(), call, aName, " has ", a.regions.size(), " regions but ", bName,
                   " has ", b.regions.size(), " (a transfer copies every region of a block)");
  const size_t most = a.regions.size();
  std::vector<FetchRegionView> all(2 * most);
  for (size_t j = 0; j < most; ++j) {
    all[j] = viewOf(a.regions[j]);
    all[most + j] = viewOf(b.regions[j]);
  }
  return buildTable(all, most, most, {a.version, b.version}, call, [&](size_t r) { return r == 0 ? aName : bName; });
}

}  // namespace detail
}  // namespace kvcomm
