// C ABI: Fetcher (layouts, plans, host-id and device-id fetches, polled operations, the collective form, device
// errors). Lists go out through caller arrays: min(count, capacity) written, *count = the full count.
#include <algorithm>
#include <vector>

#include "capi/capi.hpp"
#include "comm/agreement.hpp"
#include "common/check.hpp"

using kvcomm::capi::guard;
using kvcomm::capi::query;
using kvcomm::capi::requireNonNull;
using kvcomm::capi::use;
namespace lim = kvcomm::limits;

namespace {

kvcomm::Fetcher& get(kvcommFetcher_t fetcher, const char* call) {
  return use(fetcher, call, "fetcher").fetcher;
}

kvcommFetchOperation& getOp(kvcommFetchOperation_t op, const char* call) {
  return use(op, call, "op");
}

kvcomm::FetchOptions optionsOf(const kvcommFetchOptions* o, const char* call) {
  kvcomm::FetchOptions out;
  if (o) {
    out.path = kvcomm::capi::fromC(o->path, call, "options->path");
    KVCOMM_CHECK_ARG(out.path != kvcomm::FetchPath::Network, call, "options->path ", static_cast<unsigned>(o->path),
                     " (kvcommFetchPathNetwork) is reported by plans, not a path to demand");
    out.copyEngineMinRunBytes = o->copyEngineMinRunBytes;
    out.maxBytesPerSecond = o->maxBytesPerSecond;
    out.validation = kvcomm::capi::fromC(o->validation, call, "options->validation");
  }
  return out;
}

// Requests and their pairs are counted against the limit table before anything is sized by them (the pair total with
// checked addition: counts that wrap would size the plan by their small sum and read past the id arrays).
std::vector<kvcomm::FetchRequest> requestsOf(const kvcommFetchRequest* r, size_t n, const char* call) {
  KVCOMM_CHECK_ARG(r != nullptr || n == 0, call, "requests is NULL but numRequests is ", n);
  kvcomm::capi::checkCount(n, lim::kMaxFetchRequests, call, "numRequests", "KVCOMM_MAX_FETCH_REQUESTS");
  size_t pairs = 0;
  for (size_t i = 0; i < n; ++i) {
    KVCOMM_CHECK_ARG(r[i].count <= lim::kMaxFetchPairs - pairs, call, "request ", i, ": ", r[i].count,
                     " pairs bring the call's pairs past KVCOMM_MAX_FETCH_PAIRS (", lim::kMaxFetchPairs, ")");
    pairs += r[i].count;
    KVCOMM_CHECK_ARG(r[i].count == 0 || (r[i].srcBlocks != nullptr && r[i].dstBlocks != nullptr), call, "request ", i,
                     ": ", r[i].count, " pairs but srcBlocks or dstBlocks is NULL");
  }
  std::vector<kvcomm::FetchRequest> out(n);
  for (size_t i = 0; i < n; ++i) {
    out[i].srcRank = r[i].srcRank;
    out[i].srcBlocks = r[i].srcBlocks;
    out[i].dstBlocks = r[i].dstBlocks;
    out[i].count = r[i].count;
    out[i].srcLayoutHash = r[i].srcLayoutHash;
  }
  return out;
}

}  // namespace

extern "C" {

kvcommResult_t kvcommFetcherOptionsInit(kvcommFetcherOptions* options) {
  return guard("kvcommFetcherOptionsInit", [&] {
    requireNonNull(options, "kvcommFetcherOptionsInit", "options");
    kvcomm::FetcherOptions d;
    options->lanes = 1;
    options->barrierTimeoutMs = d.barrierTimeoutMs;
  });
}

kvcommResult_t kvcommFetchOptionsInit(kvcommFetchOptions* options) {
  return guard("kvcommFetchOptionsInit", [&] {
    requireNonNull(options, "kvcommFetchOptionsInit", "options");
    kvcomm::FetchOptions d;
    options->path = kvcomm::capi::toC<kvcommFetchPath_t>(d.path);
    options->copyEngineMinRunBytes = d.copyEngineMinRunBytes;
    options->maxBytesPerSecond = d.maxBytesPerSecond;
    options->validation = kvcomm::capi::toC<kvcommFetchValidation_t>(d.validation);
  });
}

const char* kvcommFetchPathName(kvcommFetchPath_t path) {
  const auto* e = kvcomm::capi::entryOf(path);
  return e ? kvcomm::fetchPathName(e->cpp) : "unknown";
}

kvcommResult_t kvcommKvLayoutHash(const kvcommKvRegion* regions, size_t numRegions, uint64_t version, uint64_t* hash) {
  return guard("kvcommKvLayoutHash", [&] {
    requireNonNull(hash, "kvcommKvLayoutHash", "hash");
    *hash = kvcomm::layoutHash(kvcomm::capi::fetchLayoutOf(regions, numRegions, version, "kvcommKvLayoutHash"));
  });
}

kvcommResult_t kvcommFetcherCreate(kvcommBuffer_t buffer, const kvcommKvRegion* regions, size_t numRegions,
                                   uint64_t version, const kvcommFetcherOptions* options, kvcommFetcher_t* fetcher) {
  const char* call = "kvcommFetcherCreate";
  return guard(call, [&] {
    auto& b = use(buffer, call, "buffer");
    // Every member takes part in create() even with malformed arguments of its own (create() votes on the layouts):
    // the arguments are agreed on first, so a NULL list or a count past the limit on one member fails every member,
    // naming it, before anything is sized.
    kvcomm::FetcherOptions o;
    kvcomm::KvLayout l;
    kvcomm::capi::agreeOnArguments(b.buffer.communicator(), call, [&] {
      requireNonNull(fetcher, call, "fetcher");
      KVCOMM_CHECK_ARG(regions != nullptr, call, "regions is NULL (numRegions ", numRegions, ")");
      l = kvcomm::capi::fetchLayoutOf(regions, numRegions, version, call);
      if (options) {
        // lanes: unused since the collective form's barriers run on one lane; still refused outside its range.
        KVCOMM_CHECK_ARG(options->lanes >= 1 && options->lanes <= lim::kMaxBarrierLanes, call, "options->lanes ",
                         options->lanes, " is outside 1..KVCOMM_MAX_BARRIER_LANES (", lim::kMaxBarrierLanes, ")");
        o.barrierTimeoutMs = options->barrierTimeoutMs;
      }
    });
    *fetcher = kvcomm::capi::adopt<kvcommFetcher>(kvcomm::Fetcher::create(b.buffer, l, o), b.rank);
  });
}

kvcommResult_t kvcommFetcherDestroy(kvcommFetcher_t fetcher) {
  return guard("kvcommFetcherDestroy", [&] { kvcomm::capi::retire(fetcher, "kvcommFetcherDestroy", "fetcher"); });
}

kvcommResult_t kvcommFetchPlanCreate(kvcommFetcher_t fetcher, const kvcommFetchRequest* requests, size_t numRequests,
                                     const kvcommFetchOptions* options, kvcommFetchPlan_t* plan) {
  const char* call = "kvcommFetchPlanCreate";
  return guard(call, [&] {
    auto& h = use(fetcher, call, "fetcher");
    requireNonNull(plan, call, "plan");
    *plan = kvcomm::capi::adopt<kvcommFetchPlan>(
        h.fetcher.plan(requestsOf(requests, numRequests, call), optionsOf(options, call)), h.rank);
  });
}

kvcommResult_t kvcommFetchPlanDestroy(kvcommFetchPlan_t plan) {
  return guard("kvcommFetchPlanDestroy", [&] { kvcomm::capi::retire(plan, "kvcommFetchPlanDestroy", "plan"); });
}

kvcommResult_t kvcommFetchPlanGetInfo(kvcommFetchPlan_t plan, kvcommFetchPlanInfo* info) {
  return guard("kvcommFetchPlanGetInfo", [&] {
    auto& p = use(plan, "kvcommFetchPlanGetInfo", "plan");
    requireNonNull(info, "kvcommFetchPlanGetInfo", "info");
    kvcomm::capi::toC(p.plan.info(), info);
  });
}

kvcommResult_t kvcommFetchPlanGeneration(kvcommFetchPlan_t plan, uint64_t* generation) {
  return guard("kvcommFetchPlanGeneration", [&] {
    auto& p = use(plan, "kvcommFetchPlanGeneration", "plan");
    requireNonNull(generation, "kvcommFetchPlanGeneration", "generation");
    *generation = p.plan.generation();
  });
}

kvcommResult_t kvcommFetchSubmit(kvcommFetcher_t fetcher, kvcommFetchPlan_t plan, kvcommStream_t stream) {
  return guard("kvcommFetchSubmit", [&] {
    auto& p = use(plan, "kvcommFetchSubmit", "plan");
    auto& f = get(fetcher, "kvcommFetchSubmit");
    f.submit(p.plan, stream);
  });
}

kvcommResult_t kvcommFetch(kvcommFetcher_t fetcher, const kvcommFetchRequest* requests, size_t numRequests,
                           kvcommStream_t stream, const kvcommFetchOptions* options, kvcommFetchPlanInfo* info) {
  const char* call = "kvcommFetch";
  return guard(call, [&] {
    auto& f = get(fetcher, call);
    kvcomm::FetchPlanInfo i = f.fetch(requestsOf(requests, numRequests, call), stream, optionsOf(options, call));
    if (info) kvcomm::capi::toC(i, info);
  });
}

kvcommResult_t kvcommFetchDevice(kvcommFetcher_t fetcher, const kvcommDeviceFetchBatch* batch, kvcommStream_t stream) {
  const char* call = "kvcommFetchDevice";
  return guard(call, [&] {
    auto& f = get(fetcher, call);
    requireNonNull(batch, call, "batch");
    kvcomm::DeviceFetchBatch b;
    b.srcBlocks = batch->srcBlocks;
    b.dstBlocks = batch->dstBlocks;
    b.srcRanks = batch->srcRanks;
    b.srcRank = batch->srcRank;
    b.count = batch->count;
    kvcomm::capi::checkCount(b.count, lim::kMaxFetchPairs, call, "batch->count", "KVCOMM_MAX_FETCH_PAIRS");
    f.fetchDevice(b, stream);
  });
}

kvcommResult_t kvcommFetchStart(kvcommFetcher_t fetcher, const kvcommFetchRequest* requests, size_t numRequests,
                                const kvcommFetchOptions* options, kvcommStream_t stream, kvcommFetchOperation_t* op) {
  const char* call = "kvcommFetchStart";
  return guard(call, [&] {
    auto& h = use(fetcher, call, "fetcher");
    requireNonNull(op, call, "op");
    kvcomm::FetchOperation o =
        h.fetcher.start(requestsOf(requests, numRequests, call), optionsOf(options, call), stream);
    *op = kvcomm::capi::adopt<kvcommFetchOperation>(std::move(o), h.rank);
  });
}

kvcommResult_t kvcommFetchOperationTest(kvcommFetchOperation_t op, kvcommFetchStatus* status) {
  return guard("kvcommFetchOperationTest", [&] {
    auto& o = getOp(op, "kvcommFetchOperationTest");
    requireNonNull(status, "kvcommFetchOperationTest", "status");
    o.status.record(o.op.test(), status);
  });
}

kvcommResult_t kvcommFetchOperationWait(kvcommFetchOperation_t op, int64_t timeoutMs, kvcommFetchStatus* status) {
  return guard("kvcommFetchOperationWait", [&] {
    auto& o = getOp(op, "kvcommFetchOperationWait");
    requireNonNull(status, "kvcommFetchOperationWait", "status");
    o.status.record(o.op.wait(timeoutMs), status);
  });
}

kvcommResult_t kvcommFetchOperationFailedBlocks(kvcommFetchOperation_t op, int64_t* blocks, size_t capacity,
                                                size_t* count) {
  const char* call = "kvcommFetchOperationFailedBlocks";
  return guard(call, [&] { getOp(op, call).status.failedBlocks(blocks, capacity, count, call); });
}

kvcommResult_t kvcommFetchOperationError(kvcommFetchOperation_t op, char* text, size_t textBytes, size_t* needed) {
  const char* call = "kvcommFetchOperationError";
  return guard(call, [&] { getOp(op, call).status.error(text, textBytes, needed, call); });
}

kvcommResult_t kvcommFetchOperationDestroy(kvcommFetchOperation_t op) {
  return guard("kvcommFetchOperationDestroy", [&] { kvcomm::capi::retire(op, "kvcommFetchOperationDestroy", "op"); });
}

kvcommResult_t kvcommFetchAll(kvcommFetcher_t fetcher, const kvcommFetchRequest* requests, size_t numRequests,
                              kvcommStream_t stream, const kvcommFetchOptions* options, kvcommFetchPlanInfo* info) {
  const char* call = "kvcommFetchAll";
  return guard(call, [&] {
    auto& f = get(fetcher, call);
    // Malformed arguments still take part in the collective (fetchAll's own join-then-throw): an empty request list
    // stands in, and the argument error is raised after the barriers.
    std::vector<kvcomm::FetchRequest> r;
    kvcomm::FetchOptions o;
    kvcomm::FetchPlanInfo i;
    kvcomm::detail::joinThenThrow(
        [&] {
          r = requestsOf(requests, numRequests, call);
          o = optionsOf(options, call);
        },
        [&](bool ok) {
          if (!ok) {
            r.clear();
            o = kvcomm::FetchOptions{};
          }
          i = f.fetchAll(r, stream, o);
        });
    if (info) kvcomm::capi::toC(i, info);
  });
}

kvcommResult_t kvcommFetcherTransport(kvcommFetcher_t fetcher, int rank, kvcommFetchTransport_t* transport) {
  const char* call = "kvcommFetcherTransport";
  return guard(call, [&] {
    auto& f = get(fetcher, call);
    requireNonNull(transport, call, "transport");
    *transport = kvcomm::capi::toC<kvcommFetchTransport_t>(f.transport(rank));
  });
}

kvcommResult_t kvcommFetcherRefresh(kvcommFetcher_t fetcher) {
  return guard("kvcommFetcherRefresh", [&] { get(fetcher, "kvcommFetcherRefresh").refresh(); });
}

kvcommResult_t kvcommFetcherLayout(kvcommFetcher_t fetcher, int rank, kvcommKvRegion* regions, size_t capacity,
                                   size_t* count, uint64_t* version) {
  const char* call = "kvcommFetcherLayout";
  return guard(call, [&] {
    kvcomm::capi::copyLayout(get(fetcher, call).layout(rank), regions, capacity, count, version, call);
  });
}

kvcommResult_t kvcommFetcherLayoutHash(kvcommFetcher_t fetcher, int rank, uint64_t* hash) {
  return query("kvcommFetcherLayoutHash", hash, "hash",
               [&](const char* call) { return get(fetcher, call).layoutHash(rank); });
}

kvcommResult_t kvcommFetcherGeneration(kvcommFetcher_t fetcher, uint64_t* generation) {
  return query("kvcommFetcherGeneration", generation, "generation",
               [&](const char* call) { return get(fetcher, call).generation(); });
}

kvcommResult_t kvcommFetcherDeviceHandle(kvcommFetcher_t fetcher, void* handle, size_t handleBytes, size_t* needed) {
  return guard("kvcommFetcherDeviceHandle", [&] {
    kvcomm::FetchDeviceHandle h = get(fetcher, "kvcommFetcherDeviceHandle").deviceHandle();
    kvcomm::capi::copyHandle(&h, sizeof(h), handle, handleBytes, needed, "kvcommFetcherDeviceHandle");
  });
}

kvcommResult_t kvcommFetcherPollError(kvcommFetcher_t fetcher, kvcommDeviceError* error) {
  return kvcomm::capi::pollDeviceError(
      "kvcommFetcherPollError", error, [&](const char* call) -> auto& { return get(fetcher, call); });
}

kvcommResult_t kvcommFetcherCheckErrors(kvcommFetcher_t fetcher) {
  return kvcomm::capi::checkDeviceErrors(
      "kvcommFetcherCheckErrors", [&](const char* call) -> auto& { return get(fetcher, call); });
}

}  // extern "C"
