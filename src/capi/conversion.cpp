// C ABI: KV contents (kvcomm::KvContents as kvcommKvContents arrays) and converted reads over endpoints
// (kvcomm::readConverted). Every array and count is checked before anything reads it.
#include <string>
#include <vector>

#include "capi/capi.hpp"
#include "common/check.hpp"
#include "kvcomm/converted_read.hpp"
#include "kvcomm/kv_contents.hpp"

using kvcomm::capi::fromC;
using kvcomm::capi::guard;
using kvcomm::capi::requireNonNull;
using kvcomm::capi::use;
namespace lim = kvcomm::limits;

namespace kvcomm::capi {

kvcomm::KvDescription descriptionOf(const kvcommKvContents* c, size_t n, const char* call, const std::string& what) {
  KVCOMM_CHECK_ARG(c != nullptr || n == 0, call, what, " is NULL but its count is ", n);
  kvcomm::capi::checkCount(n, lim::kMaxFetchRegions, call, what.c_str(), "KVCOMM_MAX_FETCH_REGIONS");
  kvcomm::KvDescription d;
  d.regions.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const kvcommKvContents& x = c[i];
    KVCOMM_CHECK_ARG(x.replicated == 0 || x.replicated == 1, call, what, "[", i, "].replicated is ", x.replicated,
                     " (0 or 1)");
    const std::string order = kvcomm::detail::cat(what, "[", i, "].order");
    d.regions[i] = {x.elementBytes,
                    x.headDim,
                    x.tokensPerBlock,
                    x.numHeads,
                    x.headBegin,
                    x.headEnd,
                    fromC(x.order, call, order.c_str()),
                    x.replicated == 1};
  }
  return d;
}

}  // namespace kvcomm::capi

namespace {

using kvcomm::capi::descriptionOf;

std::vector<int64_t> tableOf(const int64_t* ids, size_t n, const char* call, const char* what) {
  KVCOMM_CHECK_ARG(ids != nullptr || n == 0, call, "tokens->", what, " is NULL but its count is ", n);
  kvcomm::capi::checkCount(n, lim::kMaxFetchPairs, call, what, "KVCOMM_MAX_FETCH_PAIRS");
  return std::vector<int64_t>(ids, ids + n);
}

}  // namespace

kvcommResult_t kvcommConvertedReadOptionsInit(kvcommConvertedReadOptions* options) {
  return guard("kvcommConvertedReadOptionsInit", [&] {
    requireNonNull(options, "kvcommConvertedReadOptionsInit", "options");
    *options = kvcommConvertedReadOptions{};
    options->via = kvcommTransferViaAuto;
    options->timeoutMs = -1;
  });
}

kvcommResult_t kvcommKvCheckContents(const kvcommKvRegion* regions, size_t numRegions, const kvcommKvContents* contents,
                                     size_t numContents) {
  const char* call = "kvcommKvCheckContents";
  return guard(call, [&] {
    const kvcomm::KvLayout layout =
        kvcomm::capi::layoutOf(regions, numRegions, 0, lim::kMaxFetchRegions, "KVCOMM_MAX_FETCH_REGIONS", call);
    kvcomm::checkDescription(layout, descriptionOf(contents, numContents, call, "contents"), call);
  });
}

kvcommResult_t kvcommKvWhyNotConvertible(const kvcommKvContents* src, size_t numSrc, const kvcommKvContents* dst,
                                         size_t numDst, char* text, size_t textBytes, size_t* needed) {
  const char* call = "kvcommKvWhyNotConvertible";
  return guard(call, [&] {
    const kvcomm::KvDescription s = descriptionOf(src, numSrc, call, "src");
    const kvcomm::KvDescription d = descriptionOf(dst, numDst, call, "dst");
    kvcomm::capi::copyString(kvcomm::whyNotConvertible(s, d), text, textBytes, needed, call);
  });
}

kvcommResult_t kvcommEndpointReadConverted(kvcommEndpoint_t endpoint, kvcommRegistration_t local,
                                           const kvcommKvContents* localContents, size_t numLocalContents,
                                           const kvcommConvertedSource* sources, size_t numSources,
                                           const kvcommKvTokenRange* tokens, const kvcommConvertedReadOptions* options,
                                           kvcommConvertedReadResult* result) {
  const char* call = "kvcommEndpointReadConverted";
  return guard(call, [&] {
    kvcomm::Endpoint& ep = use(endpoint, call, "endpoint").endpoint;
    const kvcomm::Registration& reg = use(local, call, "local").registration;
    requireNonNull(tokens, call, "tokens");
    requireNonNull(result, call, "result");
    KVCOMM_CHECK_ARG(sources != nullptr || numSources == 0, call, "sources is NULL but numSources is ", numSources);
    kvcomm::capi::checkCount(numSources, static_cast<size_t>(lim::kMaxRanks), call, "numSources", "KVCOMM_MAX_RANKS");
    const kvcomm::KvDescription mine = descriptionOf(localContents, numLocalContents, call, "localContents");
    std::vector<kvcomm::ConvertedSource> src;
    src.reserve(numSources);
    for (size_t i = 0; i < numSources; ++i) {
      const std::string what = kvcomm::detail::cat("sources[", i, "]");
      const std::string remote = what + ".remote";
      src.push_back({use(sources[i].remote, call, remote.c_str()).remote,
                     descriptionOf(sources[i].contents, sources[i].numContents, call, what + ".contents")});
    }
    kvcomm::KvTokenRange range{tableOf(tokens->srcBlocks, tokens->numSrcBlocks, call, "srcBlocks"),
                               tableOf(tokens->dstBlocks, tokens->numDstBlocks, call, "dstBlocks"), tokens->firstToken,
                               tokens->numTokens};
    kvcomm::ConvertedReadOptions o;
    if (options) {
      o.conversion.preferredSource = options->preferredSource;
      o.via = fromC(options->via, call, "options->via");
      o.timeoutMs = options->timeoutMs;
    }
    const kvcomm::ConvertedReadResult r = kvcomm::readConverted(ep, reg, mine, src, range, o);
    kvcommConvertedReadResult out{};
    out.state = r.status.state == kvcomm::FetchState::Done ? kvcommFetchDone : kvcommFetchFailed;
    out.bytesConverted = r.bytesConverted;
    out.bytesLanded = r.bytesLanded;
    out.pieces = r.pieces;
    out.sourcesRead = r.sourcesRead.size();
    out.sourcesMapped = r.sourcesMapped.size();
    *result = out;
    if (r.status.state != kvcomm::FetchState::Done)
      KVCOMM_THROW(NetworkError, call, r.status.error, " (nothing was written into the local registration)");
  });
}

kvcommResult_t kvcommRemoteMemoryContents(kvcommRemoteMemory_t remote, kvcommKvContents* contents, size_t capacity,
                                          size_t* count) {
  const char* call = "kvcommRemoteMemoryContents";
  return guard(call, [&] {
    const kvcomm::KvDescription& d = use(remote, call, "remote").remote.contents();
    requireNonNull(count, call, "count");
    KVCOMM_CHECK_ARG(contents != nullptr || capacity == 0, call, "contents is NULL but capacity is ", capacity);
    for (size_t i = 0; i < d.regions.size() && i < capacity; ++i) {
      const kvcomm::KvContents& k = d.regions[i];
      contents[i] = {
          k.elementBytes,
          k.headDim,
          k.tokensPerBlock,
          k.numHeads,
          k.headBegin,
          k.headEnd,
          k.order == kvcomm::KvOrder::TokensHeadsDim ? kvcommKvOrderTokensHeadsDim : kvcommKvOrderHeadsTokensDim,
          k.replicated ? 1 : 0};
    }
    *count = d.regions.size();
  });
}
