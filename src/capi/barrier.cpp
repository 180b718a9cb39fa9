// C ABI: Barrier (barrier, split signal/wait, lanes, device handle, device errors).
#include "capi/capi.hpp"
#include "common/check.hpp"

using kvcomm::capi::guard;
using kvcomm::capi::query;
using kvcomm::capi::requireNonNull;
using kvcomm::capi::use;

namespace {

kvcomm::Barrier& get(kvcommBarrier_t barrier, const char* call) {
  return use(barrier, call, "barrier").barrier;
}

}  // namespace

extern "C" {

kvcommResult_t kvcommBarrierOptionsInit(kvcommBarrierOptions* options) {
  return guard("kvcommBarrierOptionsInit", [&] {
    requireNonNull(options, "kvcommBarrierOptionsInit", "options");
    kvcomm::BarrierOptions d;
    options->lanes = d.lanes;
    options->timeoutMs = d.timeoutMs;
    options->kind = kvcomm::capi::toC<kvcommMemoryKind_t>(d.kind);
  });
}

kvcommResult_t kvcommBarrierCreate(kvcommComm_t comm, const kvcommBarrierOptions* options, kvcommBarrier_t* barrier) {
  return guard("kvcommBarrierCreate", [&] {
    const char* call = "kvcommBarrierCreate";
    auto& c = use(comm, call, "comm").comm;
    kvcomm::BarrierOptions o;
    kvcomm::capi::agreeOnArguments(c, call, [&] {
      requireNonNull(barrier, call, "barrier");
      if (options) {
        o.lanes = options->lanes;
        o.timeoutMs = options->timeoutMs;
        o.kind = kvcomm::capi::fromC(options->kind, call, "options->kind");
      }
    });
    *barrier = kvcomm::capi::adopt<kvcommBarrier>(kvcomm::Barrier::create(c, o));
  });
}

kvcommResult_t kvcommBarrierDestroy(kvcommBarrier_t barrier) {
  return guard("kvcommBarrierDestroy", [&] { kvcomm::capi::retire(barrier, "kvcommBarrierDestroy", "barrier"); });
}

kvcommResult_t kvcommBarrierSync(kvcommBarrier_t barrier, kvcommStream_t stream, int lane) {
  return guard("kvcommBarrierSync", [&] { get(barrier, "kvcommBarrierSync").sync(stream, lane); });
}

kvcommResult_t kvcommBarrierSignal(kvcommBarrier_t barrier, kvcommStream_t stream, int lane) {
  return guard("kvcommBarrierSignal", [&] { get(barrier, "kvcommBarrierSignal").signal(stream, lane); });
}

kvcommResult_t kvcommBarrierWait(kvcommBarrier_t barrier, kvcommStream_t stream, int lane) {
  return guard("kvcommBarrierWait", [&] { get(barrier, "kvcommBarrierWait").wait(stream, lane); });
}

kvcommResult_t kvcommBarrierLanes(kvcommBarrier_t barrier, int* lanes) {
  return query("kvcommBarrierLanes", lanes, "lanes", [&](const char* call) { return get(barrier, call).lanes(); });
}

kvcommResult_t kvcommBarrierKind(kvcommBarrier_t barrier, kvcommMemoryKind_t* kind) {
  return query("kvcommBarrierKind", kind, "kind",
               [&](const char* call) { return kvcomm::capi::toC<kvcommMemoryKind_t>(get(barrier, call).kind()); });
}

kvcommResult_t kvcommBarrierComm(kvcommBarrier_t barrier, kvcommComm_t* comm) {
  return query("kvcommBarrierComm", comm, "comm",
               [&](const char* call) { return kvcomm::capi::adopt<kvcommComm>(get(barrier, call).communicator()); });
}

kvcommResult_t kvcommBarrierDeviceHandle(kvcommBarrier_t barrier, void* handle, size_t handleBytes, size_t* needed) {
  return guard("kvcommBarrierDeviceHandle", [&] {
    kvcomm::BarrierDeviceHandle h = get(barrier, "kvcommBarrierDeviceHandle").deviceHandle();
    kvcomm::capi::copyHandle(&h, sizeof(h), handle, handleBytes, needed, "kvcommBarrierDeviceHandle");
  });
}

kvcommResult_t kvcommBarrierPollError(kvcommBarrier_t barrier, kvcommDeviceError* error) {
  return kvcomm::capi::pollDeviceError(
      "kvcommBarrierPollError", error, [&](const char* call) -> auto& { return get(barrier, call); });
}

kvcommResult_t kvcommBarrierCheckErrors(kvcommBarrier_t barrier) {
  return kvcomm::capi::checkDeviceErrors(
      "kvcommBarrierCheckErrors", [&](const char* call) -> auto& { return get(barrier, call); });
}

}  // extern "C"
