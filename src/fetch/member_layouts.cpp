#include "fetch/member_layouts.hpp"

#include <algorithm>
#include <cstring>

#include "comm/agreement.hpp"
#include "common/check.hpp"
#include "kvcomm/device/vector.hpp"

namespace kvcomm {

namespace detail {

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
  for (size_t j = 0; j < mine.regions.size(); ++j) {
    const KvRegion& r = mine.regions[j];
    all[static_cast<size_t>(comm.rank()) * most + j] = {r.offset, r.blockBytes,
                                                        r.blockStride ? r.blockStride : r.blockBytes, r.numBlocks};
  }
  comm.allgather(all.data() + 0, sizeof(FetchRegionView) * most);
  // Every rank runs the same checks on the same data: the same error everywhere, no vote needed.
  MemberLayouts t;
  t.numRegions = heads[0].regions;
  requireSame(
      heads, [](const Head& h) { return h.regions; }, call, "the number of regions", asPrinted, worldRanksOf(comm),
      "every member's layout needs the same regions");
  t.views.resize(static_cast<size_t>(n) * t.numRegions);
  t.layouts.resize(static_cast<size_t>(n));
  t.hashes.resize(static_cast<size_t>(n));
  t.minBlocks.assign(static_cast<size_t>(n), ~0ull);
  t.contiguous.assign(static_cast<size_t>(n), 1);
  t.minBlockBytes = ~0ull;
  for (size_t j = 0; j < t.numRegions; ++j) {
    t.minBlockBytes = std::min<uint64_t>(t.minBlockBytes, all[j].blockBytes);
    t.blockBytesSum += all[j].blockBytes;
  }
  uint64_t align = 0;
  for (int r = 0; r < n; ++r) {
    KvLayout& l = t.layouts[static_cast<size_t>(r)];
    l.version = heads[static_cast<size_t>(r)].version;
    for (size_t j = 0; j < t.numRegions; ++j) {
      const FetchRegionView& v = all[static_cast<size_t>(r) * most + j];
      const FetchRegionView& ref = all[j];
      KVCOMM_CHECK_ARG(v.blockBytes == ref.blockBytes, call, "region ", j, " of rank ", r, " has blocks of ",
                       v.blockBytes, " bytes but rank 0's has ", ref.blockBytes,
                       " (a fetch copies whole blocks: region sizes must match)");
      t.views[static_cast<size_t>(r) * t.numRegions + j] = v;
      l.regions.push_back({v.offset, v.blockBytes, v.blockStride, v.numBlocks});
      t.minBlocks[static_cast<size_t>(r)] = std::min<uint64_t>(t.minBlocks[static_cast<size_t>(r)], v.numBlocks);
      if (v.blockStride != v.blockBytes) t.contiguous[static_cast<size_t>(r)] = 0;
      align |= v.offset | v.blockBytes | v.blockStride;
    }
    t.hashes[static_cast<size_t>(r)] = layoutHash(l);
  }
  t.vec = commonAlignment(align);
  return t;
}

}  // namespace detail
}  // namespace kvcomm
