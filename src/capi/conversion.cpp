// C ABI: KV contents (kvcomm::KvContents as kvcommKvContents arrays), converted reads over endpoints
// (kvcomm::readConverted) and converted fetches among a group's members (kvcomm::ConvertedFetcher). Every array and
// count is checked before anything reads it.
#include <string>
#include <vector>

#include "capi/capi.hpp"
#include "common/check.hpp"
#include "kvcomm/converted_fetch.hpp"
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

kvcomm::KvTokenRange rangeOf(const kvcommKvTokenRange& t, const char* call) {
  return {tableOf(t.srcBlocks, t.numSrcBlocks, call, "srcBlocks"),
          tableOf(t.dstBlocks, t.numDstBlocks, call, "dstBlocks"), t.firstToken, t.numTokens};
}

kvcomm::ConvertedReadOptions readOptionsOf(const kvcommConvertedReadOptions* options, const char* call) {
  kvcomm::ConvertedReadOptions o;
  if (options) {
    o.conversion.preferredSource = options->preferredSource;
    o.via = fromC(options->via, call, "options->via");
    o.timeoutMs = options->timeoutMs;
  }
  return o;
}

// The C result of a converted read or fetch; a failed one is kvcommNetworkError naming the source.
void finish(const kvcomm::ConvertedReadResult& r, kvcommConvertedReadResult* result, const char* call) {
  kvcommConvertedReadResult out{};
  out.state = r.status.state == kvcomm::FetchState::Done ? kvcommFetchDone : kvcommFetchFailed;
  out.bytesConverted = r.bytesConverted;
  out.bytesLanded = r.bytesLanded;
  out.pieces = r.pieces;
  out.sourcesRead = r.sourcesRead.size();
  out.sourcesMapped = r.sourcesMapped.size();
  *result = out;
  if (r.status.state != kvcomm::FetchState::Done)
    KVCOMM_THROW(NetworkError, call, r.status.error, " (nothing was written into the local memory)");
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
    const kvcomm::KvLayout layout = kvcomm::capi::fetchLayoutOf(regions, numRegions, 0, call);
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
    const kvcomm::ConvertedReadResult r =
        kvcomm::readConverted(ep, reg, mine, src, rangeOf(*tokens, call), readOptionsOf(options, call));
    finish(r, result, call);
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

kvcommResult_t kvcommConvertedFetcherCreate(kvcommBuffer_t buffer, const kvcommKvRegion* regions, size_t numRegions,
                                            const kvcommKvContents* contents, size_t numContents,
                                            const char* tcpAddress, kvcommConvertedFetcher_t* fetcher) {
  const char* call = "kvcommConvertedFetcherCreate";
  return guard(call, [&] {
    auto& b = use(buffer, call, "buffer");
    // Every member takes part in create() even with malformed arguments of its own: the arguments are agreed on
    // first, so a NULL list or a count past the limit on one member fails every member, naming it.
    kvcomm::KvLayout l;
    kvcomm::KvDescription d;
    kvcomm::ConvertedFetcherOptions o;
    kvcomm::capi::agreeOnArguments(b.buffer.communicator(), call, [&] {
      requireNonNull(fetcher, call, "fetcher");
      KVCOMM_CHECK_ARG(regions != nullptr, call, "regions is NULL (numRegions ", numRegions, ")");
      l = kvcomm::capi::fetchLayoutOf(regions, numRegions, 0, call);
      d = descriptionOf(contents, numContents, call, "contents");
      if (tcpAddress) o.tcpAddress = tcpAddress;
    });
    *fetcher = kvcomm::capi::adopt<kvcommConvertedFetcher>(kvcomm::ConvertedFetcher::create(b.buffer, l, d, o), b.rank);
  });
}

kvcommResult_t kvcommConvertedFetch(kvcommConvertedFetcher_t fetcher, const int* sources, size_t numSources,
                                    const kvcommKvTokenRange* tokens, const kvcommConvertedReadOptions* options,
                                    kvcommConvertedReadResult* result) {
  const char* call = "kvcommConvertedFetch";
  return guard(call, [&] {
    auto& f = use(fetcher, call, "fetcher");
    requireNonNull(tokens, call, "tokens");
    requireNonNull(result, call, "result");
    KVCOMM_CHECK_ARG(sources != nullptr || numSources == 0, call, "sources is NULL but numSources is ", numSources);
    kvcomm::capi::checkCount(numSources, static_cast<size_t>(lim::kMaxRanks), call, "numSources", "KVCOMM_MAX_RANKS");
    const std::vector<int> src(sources, sources + numSources);
    finish(f.fetcher.fetch(src, rangeOf(*tokens, call), readOptionsOf(options, call)), result, call);
  });
}

kvcommResult_t kvcommConvertedFetcherDestroy(kvcommConvertedFetcher_t fetcher) {
  return guard("kvcommConvertedFetcherDestroy",
               [&] { kvcomm::capi::retire(fetcher, "kvcommConvertedFetcherDestroy", "fetcher"); });
}
