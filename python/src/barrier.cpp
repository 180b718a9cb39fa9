// Barrier: collective creation and the stream-ordered calls without the GIL (the package picks the stream).
#include <nanobind/stl/string.h>

#include "bindings.hpp"
#include "kvcomm/barrier.hpp"

namespace kvcomm::py {

void bindBarrier(nb::module_& m) {
  nb::class_<Barrier> barrier(m, "Barrier",
                              "A release/acquire barrier among the members of a communicator (kvcomm::Barrier).");
  barrier
      .def_static(
          "create",
          [](Communicator& comm, int lanes, int64_t timeoutMs, MemoryKind kind) {
            BarrierOptions o;
            o.lanes = lanes;
            o.timeoutMs = timeoutMs;
            o.kind = kind;
            return Barrier::create(comm, o);
          },
          nb::arg("comm"), nb::arg("lanes") = 2, nb::arg("timeout_ms") = -1, nb::arg("kind") = MemoryKind::Auto,
          nb::call_guard<nb::gil_scoped_release>(), "Collective over `comm`: allocates and zeroes the signal area.")
      .def(
          "sync", [](Barrier& b, uintptr_t stream, int lane) { b.sync(toStream(stream), lane); }, nb::arg("stream") = 0,
          nb::arg("lane") = 0, nb::call_guard<nb::gil_scoped_release>(), "signal() and wait() in one launch.")
      .def(
          "signal", [](Barrier& b, uintptr_t stream, int lane) { b.signal(toStream(stream), lane); },
          nb::arg("stream") = 0, nb::arg("lane") = 0, nb::call_guard<nb::gil_scoped_release>(),
          "Announces this rank's next epoch on `lane` (release of the stream's earlier work).")
      .def(
          "wait", [](Barrier& b, uintptr_t stream, int lane) { b.wait(toStream(stream), lane); }, nb::arg("stream") = 0,
          nb::arg("lane") = 0, nb::call_guard<nb::gil_scoped_release>(),
          "Waits until every member announced this rank's current epoch on `lane` (acquire).")
      .def_prop_ro("lanes", &Barrier::lanes)
      .def_prop_ro("kind", &Barrier::kind)
      .def_prop_ro("communicator", [](const Barrier& b) { return b.communicator(); })
      .def_prop_ro(
          "device",
          [](const Barrier& b) {
            Communicator& c = b.communicator();
            return b.kind() == MemoryKind::Cuda ? c.topology().members[static_cast<size_t>(c.rank())].gpu.device : 0;
          },
          "CUDA ordinal of a CUDA barrier (0 for host barriers).")
      .def(
          "device_handle",
          [](const Barrier& b) {
            BarrierDeviceHandle h = b.deviceHandle();
            return nb::bytes(reinterpret_cast<const char*>(&h), sizeof(h));
          },
          "The bytes of a kvcomm::BarrierDeviceHandle, for custom kernels that fuse the barrier.");
  defDeviceErrors(barrier, "Reads (and clears) the first device error since the last call, as a dict, or None.");
}

}  // namespace kvcomm::py
