// C ABI: KV layouts both ways (kvcommKvRegion arrays in, the list pattern out), shared by fetchers, arenas and
// endpoints. Each caller names its own region limit.
#include "capi/capi.hpp"
#include "common/check.hpp"

namespace kvcomm::capi {

KvLayout layoutOf(const kvcommKvRegion* regions, size_t n, uint64_t version, size_t limit, const char* limitName,
                  const char* call) {
  KVCOMM_CHECK_ARG(regions != nullptr || n == 0, call, "regions is NULL but numRegions is ", n);
  checkCount(n, limit, call, "numRegions", limitName);
  KvLayout l;
  l.version = version;
  l.regions.resize(n);
  for (size_t i = 0; i < n; ++i)
    l.regions[i] = {regions[i].offset, regions[i].blockBytes, regions[i].blockStride, regions[i].numBlocks};
  return l;
}

KvLayout fetchLayoutOf(const kvcommKvRegion* regions, size_t n, uint64_t version, const char* call) {
  return layoutOf(regions, n, version, limits::kMaxFetchRegions, "KVCOMM_MAX_FETCH_REGIONS", call);
}

void copyLayout(const KvLayout& l, kvcommKvRegion* regions, size_t capacity, size_t* count, uint64_t* version,
                const char* call) {
  requireNonNull(count, call, "count");
  KVCOMM_CHECK_ARG(regions != nullptr || capacity == 0, call, "regions is NULL but capacity is ", capacity);
  for (size_t i = 0; i < l.regions.size() && i < capacity; ++i) {
    const KvRegion& r = l.regions[i];
    regions[i] = {r.offset, r.blockBytes, r.blockStride, r.numBlocks};
  }
  *count = l.regions.size();
  if (version) *version = l.version;
}

}  // namespace kvcomm::capi
