// Publisher: raw launches (the package validates arrays and picks the stream), without the GIL.
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <tuple>
#include <vector>

#include "bindings.hpp"
#include "kvcomm/barrier.hpp"
#include "kvcomm/publish.hpp"

namespace kvcomm::py {

namespace {

// (src, srcStride, rowBytes, offset, blockSize, blockStride, rowStride)
using RawTensor = std::tuple<uintptr_t, size_t, size_t, size_t, size_t, size_t, size_t>;

std::vector<CacheTensor> toTensors(const std::vector<RawTensor>& raw) {
  std::vector<CacheTensor> out;
  for (const RawTensor& t : raw) {
    CacheTensor c;
    c.src = reinterpret_cast<const void*>(std::get<0>(t));
    c.srcStride = std::get<1>(t);
    c.rowBytes = std::get<2>(t);
    c.offset = std::get<3>(t);
    c.blockSize = std::get<4>(t);
    c.blockStride = std::get<5>(t);
    c.rowStride = std::get<6>(t);
    out.push_back(c);
  }
  return out;
}

}  // namespace

void bindPublish(nb::module_& m) {
  nb::enum_<PublishMode>(m, "PublishMode", "How a Publisher moves rows.")
      .value("Direct", PublishMode::Direct)
      .value("Fallback", PublishMode::Fallback);
  nb::enum_<PublishThen>(m, "PublishThen", "What a publish runs on its lane after the rows.")
      .value("Nothing", PublishThen::Nothing)
      .value("Barrier", PublishThen::Barrier)
      .value("Signal", PublishThen::Signal);

  nb::class_<Publisher> publisher(m, "Publisher",
                                  "Publication into a buffer's replicas and its barrier (kvcomm::Publisher).");
  publisher
      .def_static(
          "create",
          [](SymmetricBuffer& buffer, int lanes, int64_t barrierTimeoutMs, size_t stagingTokens,
             size_t stagingBytesPerToken) {
            PublisherOptions o;
            o.lanes = lanes;
            o.barrierTimeoutMs = barrierTimeoutMs;
            o.stagingTokens = stagingTokens;
            o.stagingBytesPerToken = stagingBytesPerToken;
            return Publisher::create(buffer, o);
          },
          nb::arg("buffer"), nb::arg("lanes") = 2, nb::arg("barrier_timeout_ms") = -1, nb::arg("staging_tokens") = 4096,
          nb::arg("staging_bytes_per_token") = 1024, nb::call_guard<nb::gil_scoped_release>(),
          "Collective over the buffer's group.")
      .def(
          "_publish",
          [](Publisher& p, const std::vector<RawTensor>& tensors, uintptr_t slots, bool slot64, size_t slotCount,
             size_t numTokens, uintptr_t stream, PublishThen then, int lane) {
            SlotMapping m;
            m.data = reinterpret_cast<const void*>(slots);
            m.type = slot64 ? SlotType::Int64 : SlotType::Int32;
            m.count = slotCount;
            p.publish(toTensors(tensors), m, numTokens, toStream(stream), then, lane);
          },
          nb::arg("tensors"), nb::arg("slots"), nb::arg("slot64"), nb::arg("slot_count"), nb::arg("num_tokens"),
          nb::arg("stream"), nb::arg("then"), nb::arg("lane"), nb::call_guard<nb::gil_scoped_release>(),
          "Internal: publish, then what `then` says, on raw pointers the package validated.")
      .def_prop_ro(
          "barrier", [](Publisher& p) -> Barrier& { return p.barrier(); }, nb::rv_policy::reference_internal,
          "The publisher's barrier (borrowed: it keeps the publisher alive).")
      .def_prop_ro("mode", &Publisher::mode)
      .def_prop_ro("mode_reason", &Publisher::modeReason);
  defDeviceErrors(publisher, "Reads (and clears) the first device error since the last call, as a dict, or None.");
}

}  // namespace kvcomm::py
