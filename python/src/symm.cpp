// SymmetricBuffer: collectives without the GIL, and zero-copy views of the local region, each peer's region and the
// kernel tables (numpy arrays on host memory; torch tensors or DLPack objects on CUDA memory). A view holds a
// reference to the buffer object, so the memory outlives it unless the buffer is close()d explicitly.
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "kvcomm/error.hpp"
#include "kvcomm/symm.hpp"

namespace kvcomm::py {

namespace {

using RangeList = std::vector<std::pair<size_t, size_t>>;

std::vector<Range> toRanges(const RangeList& l) {
  std::vector<Range> out;
  for (auto& [o, b] : l) out.push_back({o, b});
  return out;
}

[[noreturn]] void invalid(const SymmetricBuffer& b, const std::string& call, const std::string& cause) {
  std::string rank = b.valid() ? std::to_string(b.rank()) : "?";
  throw InvalidArgumentError("kvcomm [rank " + rank + "] " + call + ": " + cause);
}

int deviceOf(const SymmetricBuffer& b) {
  return b.kind() == MemoryKind::Cuda ? b.communicator().topology().members[static_cast<size_t>(b.rank())].gpu.device
                                      : 0;
}

// A 1-D view of `count` elements of `dtype` at `data`, owned by `owner`, in the requested framework.
nb::object makeView(void* data, size_t count, nb::dlpack::dtype dtype, bool cuda, int device, nb::handle owner,
                    const std::string& framework) {
  size_t shape[1] = {count};
  int devType = cuda ? nb::device::cuda::value : nb::device::cpu::value;
  if (framework == "numpy") {
    if (cuda) throw nb::value_error("kvcomm: numpy cannot view CUDA memory; use framework='torch' or 'dlpack'");
    return nb::cast(nb::ndarray<nb::numpy>(data, 1, shape, owner, nullptr, dtype, devType, device),
                    nb::rv_policy::reference);
  }
  if (framework == "torch")
    return nb::cast(nb::ndarray<nb::pytorch>(data, 1, shape, owner, nullptr, dtype, devType, device),
                    nb::rv_policy::reference);
  if (framework == "dlpack")
    return nb::cast(nb::ndarray<>(data, 1, shape, owner, nullptr, dtype, devType, device), nb::rv_policy::reference);
  throw nb::value_error(("kvcomm: unknown framework '" + framework + "' (numpy, torch or dlpack)").c_str());
}

nb::object regionView(nb::handle self, int r, size_t offset, size_t nbytes, const std::string& framework) {
  SymmetricBuffer& b = nb::cast<SymmetricBuffer&>(self);
  const char* call = b.valid() && r == b.rank() ? "SymmetricBuffer.local" : "SymmetricBuffer.peer";
  if (!b.valid() || b.peerTable() == nullptr) invalid(b, call, "the buffer is closed");  // tables freed at close()
  if (r < 0 || r >= b.size())
    invalid(b, call, "rank " + std::to_string(r) + " outside [0, " + std::to_string(b.size()) + ")");
  if (!b.isMapped(r)) invalid(b, call, "member " + std::to_string(r) + " is not mapped here (another host)");
  if (nbytes == 0 || !b.isBacked(offset, nbytes))
    invalid(b, call,
            "[" + std::to_string(offset) + ", +" + std::to_string(nbytes) +
                ") is not backed memory (mapped bytes: " + std::to_string(b.mappedBytes()) + ")");
  char* base = static_cast<char*>(b.peer(r)) + offset;
  return makeView(base, nbytes, nb::dtype<uint8_t>(), b.kind() == MemoryKind::Cuda, deviceOf(b), self, framework);
}

nb::object tableView(nb::handle self, bool bitmap, const std::string& framework) {
  SymmetricBuffer& b = nb::cast<SymmetricBuffer&>(self);
  const uint64_t* p = !b.valid() ? nullptr : bitmap ? b.backedBitmap() : b.peerTable();
  // The tables are freed at close(): nullptr from here on, which must not become a view.
  if (p == nullptr)
    invalid(b, bitmap ? "SymmetricBuffer.backed_bitmap" : "SymmetricBuffer.peer_table", "the buffer is closed");
  size_t words =
      bitmap ? ((b.capacity() + b.granularity() - 1) / b.granularity() + 63) / 64 : static_cast<size_t>(b.size());
  // torch's uint64 support is recent and partial: torch gets the same words as int64.
  nb::dlpack::dtype dt = framework == "torch" ? nb::dtype<int64_t>() : nb::dtype<uint64_t>();
  return makeView(const_cast<uint64_t*>(p), words, dt, b.kind() == MemoryKind::Cuda, deviceOf(b), self, framework);
}

}  // namespace

void bindSymm(nb::module_& m) {
  nb::enum_<MemoryKind>(m, "MemoryKind", "Which memory backs a buffer.")
      .value("Auto", MemoryKind::Auto)
      .value("Cuda", MemoryKind::Cuda)
      .value("Host", MemoryKind::Host);

  nb::class_<SymmetricBuffer>(m, "SymmetricBuffer", "Symmetric memory on a communicator (kvcomm::SymmetricBuffer).")
      .def_static(
          "create",
          [](Communicator& comm, size_t capacity, size_t initialBytes, MemoryKind kind) {
            return SymmetricBuffer::create(comm, capacity, initialBytes, kind);
          },
          nb::arg("comm"), nb::arg("capacity"), nb::arg("initial_bytes"), nb::arg("kind") = MemoryKind::Auto,
          nb::call_guard<nb::gil_scoped_release>(), "Reserves and maps symmetric memory (collective).")
      .def_static(
          "adopt",
          [](Communicator& comm, uintptr_t base, size_t reservedBytes, MemoryKind kind) {
            return SymmetricBuffer::adopt(comm, reinterpret_cast<void*>(base), reservedBytes, kind);
          },
          nb::arg("comm"), nb::arg("base"), nb::arg("reserved_bytes"), nb::arg("kind") = MemoryKind::Auto,
          nb::call_guard<nb::gil_scoped_release>(), "Adopts an address range the engine reserved (collective).")
      .def("grow", &SymmetricBuffer::grow, nb::arg("new_bytes"), nb::call_guard<nb::gil_scoped_release>(),
           "Maps up to new_bytes everywhere (collective; created buffers).")
      .def(
          "commit", [](SymmetricBuffer& b, const RangeList& r) { b.commit(toRanges(r)); }, nb::arg("ranges"),
          nb::call_guard<nb::gil_scoped_release>(), "Peers map these (offset, bytes) ranges (collective; adopted).")
      .def(
          "release", [](SymmetricBuffer& b, const RangeList& r) { b.release(toRanges(r)); }, nb::arg("ranges"),
          nb::call_guard<nb::gil_scoped_release>(), "Peers unmap these ranges (collective; adopted).")
      .def("close", &SymmetricBuffer::close, nb::call_guard<nb::gil_scoped_release>(),
           "Unmaps peer windows and releases this rank's memory (local; views become invalid).")
      .def_prop_ro("valid", &SymmetricBuffer::valid)
      .def_prop_ro("rank", &SymmetricBuffer::rank)
      .def_prop_ro("size", &SymmetricBuffer::size)
      .def_prop_ro("capacity", &SymmetricBuffer::capacity)
      .def_prop_ro("mapped_bytes", &SymmetricBuffer::mappedBytes)
      .def_prop_ro("generation", &SymmetricBuffer::generation)
      .def_prop_ro("granularity", &SymmetricBuffer::granularity)
      .def_prop_ro("kind", &SymmetricBuffer::kind)
      .def_prop_ro("adopted", &SymmetricBuffer::adopted)
      .def_prop_ro("handle_type", &SymmetricBuffer::handleType)
      .def_prop_ro("device", &deviceOf, "CUDA ordinal of CUDA buffers, 0 for host buffers.")
      .def_prop_ro("communicator", [](const SymmetricBuffer& b) { return b.communicator(); })
      .def("is_mapped", &SymmetricBuffer::isMapped, nb::arg("rank"))
      .def("is_backed", &SymmetricBuffer::isBacked, nb::arg("offset"), nb::arg("bytes"))
      .def(
          "backed_ranges",
          [](const SymmetricBuffer& b) {
            RangeList l;
            for (const Range& r : b.backedRanges()) l.emplace_back(r.offset, r.bytes);
            return l;
          },
          "Backed (offset, bytes) ranges, sorted.")
      .def(
          "local_ptr", [](const SymmetricBuffer& b) { return reinterpret_cast<uintptr_t>(b.local()); },
          "Address of this rank's memory.")
      .def(
          "peer_ptr",
          [](const SymmetricBuffer& b, int r) {
            if (r < 0 || r >= b.size())
              invalid(b, "SymmetricBuffer.peer_ptr",
                      "rank " + std::to_string(r) + " outside [0, " + std::to_string(b.size()) + ")");
            return reinterpret_cast<uintptr_t>(b.peer(r));
          },
          nb::arg("rank"), "Address of member `rank`'s memory as mapped here (0: not mapped).")
      .def(
          "peer_table_ptr", [](const SymmetricBuffer& b) { return reinterpret_cast<uintptr_t>(b.peerTable()); },
          "Address of the uint64[size] peer table (device memory for CUDA buffers).")
      .def(
          "backed_bitmap_ptr", [](const SymmetricBuffer& b) { return reinterpret_cast<uintptr_t>(b.backedBitmap()); },
          "Address of the backed-granule bitmap.")
      .def("_region_view", &regionView, nb::arg("rank"), nb::arg("offset"), nb::arg("nbytes"), nb::arg("framework"),
           "Internal: uint8 view of member `rank`'s [offset, offset + nbytes).")
      .def("_table_view", &tableView, nb::arg("bitmap"), nb::arg("framework"),
           "Internal: uint64 view of the peer table (bitmap=False) or the backed-granule bitmap.");
}

}  // namespace kvcomm::py
