// Arenas: Arena, ArenaPin, ArenaImport, ArenaSession, ArenaServer. Layouts come in as (offset, blockBytes,
// blockStride, numBlocks) tuples the package checked, copies as raw addresses of arrays the package validated
// (_arrays.require), capabilities and IPC handles as bytes (48 and 64). Every call that can block (on a peer, a
// drain, a copy, the driver) runs without the GIL. Views of an arena's bytes hold a reference to the Python object
// that made them; after free() / close() they must no longer be used.
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "kvcomm/arena.hpp"
#include "kvcomm/error.hpp"

namespace kvcomm::py {

namespace {

[[noreturn]] void invalid(const std::string& call, const std::string& cause) {
  throw InvalidArgumentError("kvcomm [rank ?] " + call + ": " + cause);
}

nb::bytes capabilityBytes(const ArenaCapability& c) {
  return nb::bytes(reinterpret_cast<const char*>(&c), sizeof(c));
}

ArenaCapability capabilityOf(const nb::bytes& b, const char* call) {
  if (b.size() != sizeof(ArenaCapability))
    invalid(call, "capability: " + std::to_string(b.size()) + " bytes, a capability is " +
                      std::to_string(sizeof(ArenaCapability)));
  ArenaCapability c;
  std::memcpy(static_cast<void*>(&c), b.c_str(), sizeof(c));
  return c;
}

ArenaIpcHandle ipcOf(const nb::bytes& b, const char* call) {
  ArenaIpcHandle h;
  if (b.size() != sizeof(h.bytes))
    invalid(call,
            "handle: " + std::to_string(b.size()) + " bytes, an IPC handle is " + std::to_string(sizeof(h.bytes)));
  std::memcpy(h.bytes, b.c_str(), sizeof(h.bytes));
  return h;
}

// A 1-D uint8 view of [data, data + nbytes), owned by `owner`, in the requested framework.
nb::object makeView(void* data, size_t nbytes, bool cuda, int device, nb::handle owner, const std::string& framework) {
  size_t shape[1] = {nbytes};
  int devType = cuda ? nb::device::cuda::value : nb::device::cpu::value;
  nb::dlpack::dtype dt = nb::dtype<uint8_t>();
  if (framework == "numpy") {
    if (cuda) throw nb::value_error("kvcomm: numpy cannot view CUDA memory; use framework='torch' or 'dlpack'");
    return nb::cast(nb::ndarray<nb::numpy>(data, 1, shape, owner, nullptr, dt, devType, device),
                    nb::rv_policy::reference);
  }
  if (framework == "torch")
    return nb::cast(nb::ndarray<nb::pytorch>(data, 1, shape, owner, nullptr, dt, devType, device),
                    nb::rv_policy::reference);
  if (framework == "dlpack")
    return nb::cast(nb::ndarray<>(data, 1, shape, owner, nullptr, dt, devType, device), nb::rv_policy::reference);
  throw nb::value_error(("kvcomm: unknown framework '" + framework + "' (numpy, torch or dlpack)").c_str());
}

// [offset, offset + nbytes) of memory whose `size` bytes start at `base`, as a view (nbytes 0: to the end).
nb::object rangeView(void* base, size_t size, size_t offset, size_t nbytes, bool cuda, int device, nb::handle owner,
                     const std::string& framework, const char* call) {
  if (base == nullptr) invalid(call, "the memory is released (freed or closed)");
  if (nbytes == 0 && offset < size) nbytes = size - offset;
  size_t end = 0;
  if (nbytes == 0 || __builtin_add_overflow(offset, nbytes, &end) || end > size)
    invalid(call, "[" + std::to_string(offset) + ", +" + std::to_string(nbytes) + ") is not inside the " +
                      std::to_string(size) + " bytes");
  return makeView(static_cast<char*>(base) + offset, nbytes, cuda, device, owner, framework);
}

// The CUDA ordinal of a mapping (from the driver's pointer attributes would need libcuda here: the package passes
// the ordinal it knows, the current device at import time; host memory is 0).
int arenaDevice(const Arena& a) {
  int d = a.device();
  return d < 0 ? 0 : d;
}

std::tuple<uint64_t, size_t, std::vector<std::string>> growthToPython(ArenaGrowth&& g) {
  return {g.generation, g.importersUpdated, std::move(g.failures)};
}

}  // namespace

void bindArena(nb::module_& m) {
  nb::enum_<OwnerLoss>(m, "OwnerLoss", "What an import does when its owner goes away.")
      .value("Keep", OwnerLoss::Keep)
      .value("Release", OwnerLoss::Release);

  m.def("_arena_constants", [] {
    nb::dict d;
    d["max_regions"] = Arena::kMaxRegions;
    d["default_ttl_ms"] = Arena::kDefaultTtlMs;
    d["max_message_bytes"] = ArenaSession::kMaxMessageBytes;
    d["capability_bytes"] = sizeof(ArenaCapability);
    d["ipc_handle_bytes"] = sizeof(ArenaIpcHandle::bytes);
    return d;
  });

  nb::class_<ArenaPin>(m, "ArenaPin", "An operation in flight on an arena range (kvcomm::ArenaPin).")
      .def_prop_ro("valid", &ArenaPin::valid)
      .def_prop_ro("data_ptr", [](const ArenaPin& p) { return reinterpret_cast<uintptr_t>(p.data()); })
      .def_prop_ro("offset", &ArenaPin::offset)
      .def_prop_ro("bytes", &ArenaPin::bytes)
      .def("release", &ArenaPin::release, nb::call_guard<nb::gil_scoped_release>());

  nb::class_<Arena>(m, "Arena", "Memory this process owns, shareable with local processes (kvcomm::Arena).")
      .def_static(
          "create",
          [](const std::vector<RawRegion>& regions, uint64_t version, MemoryKind kind, size_t capacity,
             bool legacyIpc) {
            ArenaOptions o;
            o.kind = kind;
            o.capacity = capacity;
            o.legacyIpc = legacyIpc;
            KvLayout l = toLayout(regions, version);
            nb::gil_scoped_release unlocked;
            return Arena::create(l, o);
          },
          nb::arg("regions"), nb::arg("version"), nb::arg("kind"), nb::arg("capacity"), nb::arg("legacy_ipc"))
      .def(
          "_release", [](Arena& a) { a = Arena(); }, nb::call_guard<nb::gil_scoped_release>(),
          "Internal: destroys the C++ arena now (withdraws it unless freed).")
      .def_prop_ro("valid", &Arena::valid)
      .def_prop_ro("data_ptr", [](const Arena& a) { return reinterpret_cast<uintptr_t>(a.data()); })
      .def_prop_ro("bytes", &Arena::bytes)
      .def_prop_ro("capacity", &Arena::capacity)
      .def_prop_ro("granularity", &Arena::granularity)
      .def_prop_ro("kind", &Arena::kind)
      .def_prop_ro("handle_type", &Arena::handleType)
      .def_prop_ro("device", &Arena::device)
      .def_prop_ro("id", &Arena::id)
      .def_prop_ro("generation", &Arena::generation)
      .def_prop_ro("layout", [](const Arena& a) { return fromLayout(a.layout()); })
      .def_prop_ro("leases", &Arena::leases)
      .def_prop_ro("operations", &Arena::operations)
      .def_prop_ro("importers", &Arena::importers)
      .def_prop_ro("live_capabilities", &Arena::liveCapabilities)
      .def_prop_ro("freed", &Arena::freed)
      .def(
          "offer", [](Arena& a, int pid, uint32_t uid, int64_t ttl) { return capabilityBytes(a.offer(pid, uid, ttl)); },
          nb::arg("pid"), nb::arg("uid"), nb::arg("ttl_ms"))
      .def("revoke_capabilities", &Arena::revokeCapabilities)
      .def(
          "grow",
          [](Arena& a, size_t newBytes, int64_t timeoutMs) {
            nb::gil_scoped_release unlocked;
            return growthToPython(a.grow(newBytes, timeoutMs));
          },
          nb::arg("new_bytes"), nb::arg("timeout_ms"))
      .def(
          "grow_layout",
          [](Arena& a, const std::vector<RawRegion>& regions, uint64_t version, int64_t timeoutMs) {
            KvLayout l = toLayout(regions, version);
            nb::gil_scoped_release unlocked;
            return growthToPython(a.grow(l, timeoutMs));
          },
          nb::arg("regions"), nb::arg("version"), nb::arg("timeout_ms"))
      .def(
          "shrink", [](Arena& a, size_t newBytes, int64_t waitMs) { a.shrink(newBytes, waitMs); }, nb::arg("new_bytes"),
          nb::arg("wait_ms"), nb::call_guard<nb::gil_scoped_release>())
      .def(
          "shrink_layout",
          [](Arena& a, const std::vector<RawRegion>& regions, uint64_t version, int64_t waitMs) {
            KvLayout l = toLayout(regions, version);
            nb::gil_scoped_release unlocked;
            a.shrink(l, waitMs);
          },
          nb::arg("regions"), nb::arg("version"), nb::arg("wait_ms"))
      .def("free", &Arena::free, nb::arg("wait_ms"), nb::call_guard<nb::gil_scoped_release>())
      .def("pin", &Arena::pin, nb::arg("offset"), nb::arg("bytes"))
      .def(
          "write",
          [](Arena& a, size_t offset, uintptr_t src, size_t bytes) {
            a.write(offset, reinterpret_cast<const void*>(src), bytes);
          },
          nb::arg("offset"), nb::arg("src"), nb::arg("bytes"), nb::call_guard<nb::gil_scoped_release>())
      .def(
          "read",
          [](const Arena& a, size_t offset, uintptr_t dst, size_t bytes) {
            a.read(offset, reinterpret_cast<void*>(dst), bytes);
          },
          nb::arg("offset"), nb::arg("dst"), nb::arg("bytes"), nb::call_guard<nb::gil_scoped_release>())
      .def("ipc_handle",
           [](const Arena& a) {
             ArenaIpcHandle h = a.ipcHandle();
             return nb::bytes(reinterpret_cast<const char*>(h.bytes), sizeof(h.bytes));
           })
      .def(
          "_view",
          [](nb::handle self, size_t offset, size_t nbytes, const std::string& framework) {
            Arena& a = nb::cast<Arena&>(self);
            return rangeView(a.data(), a.bytes(), offset, nbytes, a.kind() == MemoryKind::Cuda, arenaDevice(a), self,
                             framework, "Arena.view");
          },
          nb::arg("offset"), nb::arg("nbytes"), nb::arg("framework"));

  nb::class_<ArenaImport>(m, "ArenaImport", "Another process's arena mapped here (kvcomm::ArenaImport).")
      .def_static(
          "open_ipc",
          [](const nb::bytes& handle, const std::vector<RawRegion>& regions, uint64_t version) {
            ArenaIpcHandle h = ipcOf(handle, "ArenaImport.open_ipc");
            KvLayout l = toLayout(regions, version);
            nb::gil_scoped_release unlocked;
            return ArenaImport::openIpc(h, l);
          },
          nb::arg("handle"), nb::arg("regions"), nb::arg("version"))
      .def_prop_ro("valid", &ArenaImport::valid)
      .def_prop_ro("data_ptr", [](const ArenaImport& i) { return reinterpret_cast<uintptr_t>(i.data()); })
      .def_prop_ro("bytes", &ArenaImport::bytes)
      .def_prop_ro("capacity", &ArenaImport::capacity)
      .def_prop_ro("kind", &ArenaImport::kind)
      .def_prop_ro("handle_type", &ArenaImport::handleType)
      .def_prop_ro("arena_id", &ArenaImport::arenaId)
      .def_prop_ro("generation", &ArenaImport::generation)
      .def_prop_ro("layout", [](const ArenaImport& i) { return fromLayout(i.layout()); })
      .def_prop_ro("owner_pid", &ArenaImport::ownerPid)
      .def_prop_ro("owner_alive", &ArenaImport::ownerAlive)
      .def_prop_ro("owner_lost_reason", &ArenaImport::ownerLostReason)
      .def_prop_ro("operations", &ArenaImport::operations)
      .def_prop_ro("closed", &ArenaImport::closed)
      .def("check", &ArenaImport::check)
      .def("pin", &ArenaImport::pin, nb::arg("offset"), nb::arg("bytes"))
      .def(
          "write",
          [](ArenaImport& i, size_t offset, uintptr_t src, size_t bytes) {
            i.write(offset, reinterpret_cast<const void*>(src), bytes);
          },
          nb::arg("offset"), nb::arg("src"), nb::arg("bytes"), nb::call_guard<nb::gil_scoped_release>())
      .def(
          "read",
          [](const ArenaImport& i, size_t offset, uintptr_t dst, size_t bytes) {
            i.read(offset, reinterpret_cast<void*>(dst), bytes);
          },
          nb::arg("offset"), nb::arg("dst"), nb::arg("bytes"), nb::call_guard<nb::gil_scoped_release>())
      .def("close", &ArenaImport::close, nb::arg("timeout_ms"), nb::call_guard<nb::gil_scoped_release>())
      .def(
          "_view",
          [](nb::handle self, size_t offset, size_t nbytes, const std::string& framework, int device) {
            ArenaImport& i = nb::cast<ArenaImport&>(self);
            return rangeView(i.data(), i.bytes(), offset, nbytes, i.kind() == MemoryKind::Cuda, device, self, framework,
                             "ArenaImport.view");
          },
          nb::arg("offset"), nb::arg("nbytes"), nb::arg("framework"), nb::arg("device"));

  nb::class_<ArenaSession>(m, "ArenaSession", "A connection between two local processes (kvcomm::ArenaSession).")
      .def_static(
          "connect",
          [](const std::string& address, int64_t timeoutMs) {
            ArenaSessionOptions o;
            o.timeoutMs = timeoutMs;
            return ArenaSession::connect(address, o);
          },
          nb::arg("address"), nb::arg("timeout_ms"), nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("valid", &ArenaSession::valid)
      .def_prop_ro("peer_pid", &ArenaSession::peerPid)
      .def_prop_ro("peer_uid", &ArenaSession::peerUid)
      .def_prop_ro("alive", &ArenaSession::alive)
      .def_prop_ro("lost_reason", &ArenaSession::lostReason)
      .def(
          "offer", [](ArenaSession& s, Arena& a, int64_t ttl) { return capabilityBytes(s.offer(a, ttl)); },
          nb::arg("arena"), nb::arg("ttl_ms"))
      .def(
          "import_",
          [](ArenaSession& s, const nb::bytes& capability, OwnerLoss onOwnerLoss, int64_t timeoutMs) {
            ArenaCapability c = capabilityOf(capability, "ArenaSession.import_");
            ImportOptions o;
            o.onOwnerLoss = onOwnerLoss;
            o.timeoutMs = timeoutMs;
            nb::gil_scoped_release unlocked;
            return s.import(c, o);
          },
          nb::arg("capability"), nb::arg("on_owner_loss"), nb::arg("timeout_ms"))
      .def(
          "send",
          [](ArenaSession& s, const nb::bytes& data) {
            std::string copy(data.c_str(), data.size());
            nb::gil_scoped_release unlocked;
            s.send(copy.data(), copy.size());
          },
          nb::arg("data"))
      .def(
          "receive",
          [](ArenaSession& s, int64_t timeoutMs) {
            std::vector<uint8_t> m;
            {
              nb::gil_scoped_release unlocked;
              m = s.receive(timeoutMs);
            }
            return nb::bytes(reinterpret_cast<const char*>(m.data()), m.size());
          },
          nb::arg("timeout_ms"))
      .def("close", &ArenaSession::close, nb::call_guard<nb::gil_scoped_release>());

  nb::class_<ArenaServer>(m, "ArenaServer", "Where arena sessions meet a server (kvcomm::ArenaServer).")
      .def_static(
          "listen",
          [](const std::string& address, size_t maxSessions, size_t maxPendingHandshakes, int64_t handshakeTimeoutMs,
             int64_t requestTimeoutMs) {
            ArenaServerOptions o;
            o.maxSessions = maxSessions;
            o.maxPendingHandshakes = maxPendingHandshakes;
            o.handshakeTimeoutMs = handshakeTimeoutMs;
            o.requestTimeoutMs = requestTimeoutMs;
            return ArenaServer::listen(address, o);
          },
          nb::arg("address"), nb::arg("max_sessions"), nb::arg("max_pending_handshakes"),
          nb::arg("handshake_timeout_ms"), nb::arg("request_timeout_ms"), nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("valid", &ArenaServer::valid)
      .def_prop_ro("address", &ArenaServer::address)
      .def_prop_ro("sessions", &ArenaServer::sessions)
      .def_prop_ro("refused_connections", &ArenaServer::refusedConnections)
      .def("accept", &ArenaServer::accept, nb::arg("timeout_ms"), nb::call_guard<nb::gil_scoped_release>())
      .def("close", &ArenaServer::close, nb::call_guard<nb::gil_scoped_release>());
}

}  // namespace kvcomm::py
