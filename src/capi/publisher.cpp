// C ABI: Publisher (publish with what runs fused after it, its barrier as a kvcommBarrier_t, device errors) and the
// capability probes.
#include <vector>

#include "capi/capi.hpp"
#include "common/check.hpp"
#include "kvcomm/capabilities.hpp"

using kvcomm::capi::guard;
using kvcomm::capi::query;
using kvcomm::capi::requireNonNull;
using kvcomm::capi::use;

namespace {

kvcomm::Publisher& get(kvcommPublisher_t publisher, const char* call) {
  return use(publisher, call, "publisher").publisher;
}

std::vector<kvcomm::CacheTensor> tensorsOf(const kvcommCacheTensor* tensors, size_t n, const char* call) {
  KVCOMM_CHECK_ARG(n > 0 && tensors != nullptr, call, "numTensors ", n, " (tensors ", tensors ? "given" : "NULL",
                   "): at least one tensor is needed");
  kvcomm::capi::checkCount(n, kvcomm::limits::kMaxPublishTensors, call, "numTensors", "KVCOMM_MAX_PUBLISH_TENSORS");
  std::vector<kvcomm::CacheTensor> out(n);
  for (size_t k = 0; k < n; ++k) {
    const kvcommCacheTensor& t = tensors[k];
    kvcomm::CacheTensor& c = out[static_cast<size_t>(k)];
    c.src = t.src;
    c.srcStride = t.srcStride;
    c.rowBytes = t.rowBytes;
    c.offset = t.offset;
    c.blockSize = t.blockSize;
    c.blockStride = t.blockStride;
    c.rowStride = t.rowStride;
    c.limitBytes = t.limitBytes;
    c.srcBytes = t.srcBytes;
  }
  return out;
}

kvcomm::SlotMapping slotsOf(const kvcommSlotMapping* slots, const char* call) {
  requireNonNull(slots, call, "slots");
  kvcomm::SlotMapping s;
  s.data = slots->data;
  s.type = kvcomm::capi::fromC(slots->type, call, "slots->type");
  s.count = slots->count;
  return s;
}

}  // namespace

extern "C" {

kvcommResult_t kvcommCacheTensorInit(kvcommCacheTensor* tensor) {
  return guard("kvcommCacheTensorInit", [&] {
    requireNonNull(tensor, "kvcommCacheTensorInit", "tensor");
    *tensor = kvcommCacheTensor{};
    tensor->blockSize = 1;
  });
}

kvcommResult_t kvcommPublisherOptionsInit(kvcommPublisherOptions* options) {
  return guard("kvcommPublisherOptionsInit", [&] {
    requireNonNull(options, "kvcommPublisherOptionsInit", "options");
    kvcomm::PublisherOptions d;
    options->lanes = d.lanes;
    options->barrierTimeoutMs = d.barrierTimeoutMs;
    options->stagingTokens = d.stagingTokens;
    options->stagingBytesPerToken = d.stagingBytesPerToken;
  });
}

kvcommResult_t kvcommPublisherCreate(kvcommBuffer_t buffer, const kvcommPublisherOptions* options,
                                     kvcommPublisher_t* publisher) {
  return guard("kvcommPublisherCreate", [&] {
    const char* call = "kvcommPublisherCreate";
    auto& b = use(buffer, call, "buffer");
    kvcomm::PublisherOptions o;
    kvcomm::capi::agreeOnArguments(b.buffer.communicator(), call, [&] {
      requireNonNull(publisher, call, "publisher");
      if (options) {
        o.lanes = options->lanes;
        o.barrierTimeoutMs = options->barrierTimeoutMs;
        o.stagingTokens = options->stagingTokens;
        o.stagingBytesPerToken = options->stagingBytesPerToken;
        // The staging is sized by these counts: their product (and the slots beside it) must fit a size_t.
        size_t rows = 0, slots = 0, bytes = 0;
        KVCOMM_CHECK_ARG(!__builtin_mul_overflow(o.stagingTokens, o.stagingBytesPerToken, &rows) &&
                             !__builtin_mul_overflow(o.stagingTokens, sizeof(int64_t), &slots) &&
                             !__builtin_add_overflow(rows, slots, &bytes) && bytes <= SIZE_MAX / 2,
                         call, "stagingTokens ", o.stagingTokens, " x stagingBytesPerToken ", o.stagingBytesPerToken,
                         " overflows the staging's size");
      }
    });
    *publisher = kvcomm::capi::adopt<kvcommPublisher>(kvcomm::Publisher::create(b.buffer, o), b.rank);
  });
}

kvcommResult_t kvcommPublisherDestroy(kvcommPublisher_t publisher) {
  return guard("kvcommPublisherDestroy",
               [&] { kvcomm::capi::retire(publisher, "kvcommPublisherDestroy", "publisher"); });
}

kvcommResult_t kvcommPublish(kvcommPublisher_t publisher, const kvcommCacheTensor* tensors, size_t numTensors,
                             const kvcommSlotMapping* slots, size_t numTokens, kvcommStream_t stream,
                             kvcommPublishThen_t then, int lane) {
  return guard("kvcommPublish", [&] {
    const char* call = "kvcommPublish";
    auto& p = get(publisher, call);
    p.publish(tensorsOf(tensors, numTensors, call), slotsOf(slots, call), numTokens, stream,
              kvcomm::capi::fromC(then, call, "then"), lane);
  });
}

kvcommResult_t kvcommPublisherBarrier(kvcommPublisher_t publisher, kvcommBarrier_t* barrier) {
  return guard("kvcommPublisherBarrier", [&] {
    auto& p = use(publisher, "kvcommPublisherBarrier", "publisher");
    requireNonNull(barrier, "kvcommPublisherBarrier", "barrier");
    *barrier = kvcomm::capi::adopt<kvcommBarrier>(p.owned);
  });
}

kvcommResult_t kvcommPublisherMode(kvcommPublisher_t publisher, kvcommPublishMode_t* mode) {
  return query("kvcommPublisherMode", mode, "mode",
               [&](const char* call) { return kvcomm::capi::toC<kvcommPublishMode_t>(get(publisher, call).mode()); });
}

kvcommResult_t kvcommPublisherModeReason(kvcommPublisher_t publisher, const char** reason) {
  return query("kvcommPublisherModeReason", reason, "reason",
               [&](const char* call) { return get(publisher, call).modeReason().c_str(); });
}

kvcommResult_t kvcommPublisherPollError(kvcommPublisher_t publisher, kvcommDeviceError* error) {
  return kvcomm::capi::pollDeviceError(
      "kvcommPublisherPollError", error, [&](const char* call) -> auto& { return get(publisher, call); });
}

kvcommResult_t kvcommPublisherCheckErrors(kvcommPublisher_t publisher) {
  return kvcomm::capi::checkDeviceErrors(
      "kvcommPublisherCheckErrors", [&](const char* call) -> auto& { return get(publisher, call); });
}

kvcommResult_t kvcommCapabilitiesString(char* text, size_t textBytes, size_t* needed) {
  return guard("kvcommCapabilitiesString", [&] {
    kvcomm::capi::copyString(kvcomm::capabilities().toString(), text, textBytes, needed, "kvcommCapabilitiesString");
  });
}

kvcommResult_t kvcommUseLocalDevice(int localRank, int* device) {
  return guard("kvcommUseLocalDevice", [&] {
    requireNonNull(device, "kvcommUseLocalDevice", "device");
    KVCOMM_CHECK_ARG(localRank >= 0, "kvcommUseLocalDevice", "localRank ", localRank, " is negative");
    *device = kvcomm::useLocalDevice(localRank);
  });
}

}  // extern "C"
