// Endpoints: Endpoint, Registration, RemoteMemory, Transfer. Memory comes in as the address, size, kind and device of
// an array the package validated (_arrays.require) and keeps alive while it is registered; layouts as the regions
// the package checked; block ids as raw addresses of int64 arrays it validated (read before read()/write() return);
// metadata and notification messages as bytes. Every call that can block (listening, registering, unregistering,
// starting, polling and waiting for a transfer, revoking, closing) runs without the GIL.
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "kvcomm/endpoint.hpp"

namespace kvcomm::py {

namespace {

RegisterOptions registerOptions(Access access, const std::vector<RawContents>& contents) {
  RegisterOptions o;
  o.access = access;
  o.contents = toDescription(contents);
  return o;
}

// `notify` is None (no notification) or bytes the package checked (at most kMaxNotificationBytes).
TransferOptions transferOptions(TransferVia via, const nb::object& notify) {
  TransferOptions o;
  o.via = via;
  if (!notify.is_none()) {
    nb::bytes b = nb::cast<nb::bytes>(notify);
    o.notify = std::string(b.c_str(), b.size());
  }
  return o;
}

// Ids the package handed over as arrays (1-D, C-contiguous, native int64 on the CPU: checked there, and again here).
using HostIds = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

const int64_t* ids(uintptr_t address) {
  return reinterpret_cast<const int64_t*>(address);
}

}  // namespace

void bindEndpoint(nb::module_& m) {
  nb::enum_<Access>(m, "Access", "What a registration lets the holders of its metadata do.")
      .value("ReadWrite", Access::ReadWrite)
      .value("ReadOnly", Access::ReadOnly);
  nb::enum_<TransferVia>(m, "TransferVia", "Which transport a transfer must take.")
      .value("Auto", TransferVia::Auto)
      .value("Peer", TransferVia::Peer)
      .value("Tcp", TransferVia::Tcp)
      .value("Rdma", TransferVia::Rdma);

  nb::class_<Registration>(m, "Registration", "Memory registered with an endpoint (kvcomm::Registration).")
      .def_prop_ro("valid", &Registration::valid)
      .def_prop_ro("id", &Registration::id)
      .def_prop_ro("generation", &Registration::generation)
      .def_prop_ro("data_ptr", [](const Registration& r) { return reinterpret_cast<uintptr_t>(r.data()); })
      .def_prop_ro("bytes", &Registration::bytes)
      .def_prop_ro("kind", &Registration::kind)
      .def_prop_ro("device", &Registration::device)
      .def_prop_ro("layout", [](const Registration& r) { return fromLayout(r.layout()); })
      .def_prop_ro("contents", [](const Registration& r) { return fromDescription(r.contents()); })
      .def_prop_ro("access", &Registration::access)
      .def_prop_ro("registered", &Registration::registered)
      .def("metadata",
           [](const Registration& r) {
             std::vector<uint8_t> md = r.metadata();
             return nb::bytes(reinterpret_cast<const char*>(md.data()), md.size());
           })
      .def("revoke", &Registration::revoke, nb::call_guard<nb::gil_scoped_release>());

  nb::class_<RemoteMemory>(m, "RemoteMemory", "A peer's registration, known from its metadata (kvcomm::RemoteMemory).")
      .def_prop_ro("valid", &RemoteMemory::valid)
      .def_prop_ro("peer_name", &RemoteMemory::peerName)
      .def_prop_ro("id", &RemoteMemory::id)
      .def_prop_ro("generation", &RemoteMemory::generation)
      .def_prop_ro("layout", [](const RemoteMemory& r) { return fromLayout(r.layout()); })
      .def_prop_ro("contents", [](const RemoteMemory& r) { return fromDescription(r.contents()); })
      .def_prop_ro("kind", &RemoteMemory::kind)
      .def_prop_ro("access", &RemoteMemory::access)
      .def_prop_ro("address", &RemoteMemory::address);

  nb::class_<Transfer>(m, "Transfer", "A polled transfer (kvcomm::Transfer).")
      .def_prop_ro("valid", &Transfer::valid)
      .def(
          "test",
          [](Transfer& t) {
            FetchStatus s;
            {
              nb::gil_scoped_release nogil;
              s = t.test();
            }
            return statusToPython(std::move(s));
          },
          "Non-blocking: (state, bytes_done, bytes_total, failed_blocks, error).")
      .def(
          "wait",
          [](Transfer& t, int64_t timeoutMs) {
            FetchStatus s;
            {
              nb::gil_scoped_release nogil;
              s = t.wait(timeoutMs);
            }
            return statusToPython(std::move(s));
          },
          nb::arg("timeout_ms") = -1, "Blocks up to timeout_ms (< 0: until it ends); expiry cancels nothing.")
      .def_prop_ro("info", &Transfer::info, nb::rv_policy::copy)
      .def_prop_ro("transport", &Transfer::transport);

  nb::class_<Endpoint>(m, "Endpoint", "Transfers of KV blocks between processes that meet at run time.")
      .def_static(
          "create",
          [](const std::string& name, const std::string& tcpAddress, int64_t timeoutMs, int connectionsPerPeer,
             size_t maxQueuedNotifications) {
            EndpointOptions o;
            o.name = name;
            o.tcpAddress = tcpAddress;
            o.timeoutMs = timeoutMs;
            o.connectionsPerPeer = connectionsPerPeer;
            o.maxQueuedNotifications = maxQueuedNotifications;
            nb::gil_scoped_release nogil;
            return Endpoint::create(o);
          },
          nb::arg("name"), nb::arg("tcp_address"), nb::arg("timeout_ms"), nb::arg("connections_per_peer"),
          nb::arg("max_queued_notifications"))
      .def_prop_ro("valid", &Endpoint::valid)
      .def_prop_ro("id", &Endpoint::id)
      .def_prop_ro("name", &Endpoint::name)
      .def_prop_ro("address", &Endpoint::address)
      .def(
          "register_memory",
          [](Endpoint& e, uintptr_t base, size_t bytes, MemoryKind kind, int device,
             const std::vector<RawRegion>& regions, uint64_t version, Access access,
             const std::vector<RawContents>& contents) {
            KvLayout l = toLayout(regions, version);
            RegisterOptions o = registerOptions(access, contents);
            nb::gil_scoped_release nogil;
            return e.registerMemory(reinterpret_cast<void*>(base), bytes, kind, l, device, o);
          },
          nb::arg("base"), nb::arg("bytes"), nb::arg("kind"), nb::arg("device"), nb::arg("regions"), nb::arg("version"),
          nb::arg("access"), nb::arg("contents"), "Internal: registers memory the package validated and keeps alive.")
      .def(
          "register_buffer",
          [](Endpoint& e, const SymmetricBuffer& buffer, const std::vector<RawRegion>& regions, uint64_t version,
             Access access, const std::vector<RawContents>& contents) {
            KvLayout l = toLayout(regions, version);
            RegisterOptions o = registerOptions(access, contents);
            nb::gil_scoped_release nogil;
            return e.registerBuffer(buffer, l, o);
          },
          nb::arg("buffer"), nb::arg("regions"), nb::arg("version"), nb::arg("access"), nb::arg("contents"))
      .def(
          "register_arena",
          [](Endpoint& e, Arena& arena, Access access, const std::vector<RawContents>& contents) {
            RegisterOptions o = registerOptions(access, contents);
            nb::gil_scoped_release nogil;
            return e.registerArena(arena, o);
          },
          nb::arg("arena"), nb::arg("access"), nb::arg("contents"))
      .def("unregister", &Endpoint::unregister, nb::arg("registration"), nb::arg("timeout_ms"),
           nb::call_guard<nb::gil_scoped_release>())
      .def(
          "connect",
          [](Endpoint& e, const nb::bytes& metadata) {
            std::string copy(metadata.c_str(), metadata.size());
            nb::gil_scoped_release nogil;
            return e.connect(copy.data(), copy.size());
          },
          nb::arg("metadata"))
      .def("disconnect", &Endpoint::disconnect, nb::arg("remote"), nb::call_guard<nb::gil_scoped_release>())
      .def(
          "read_device",
          [](Endpoint& e, const Registration& local, const RemoteMemory& remote, uintptr_t remoteBlocks,
             uintptr_t localBlocks, size_t count, uintptr_t stream, bool push) {
            DeviceTransferBatch b{ids(remoteBlocks), ids(localBlocks), count};
            if (push)
              e.writeDevice(local, remote, b, toStream(stream));
            else
              e.readDevice(local, remote, b, toStream(stream));
          },
          nb::arg("local"), nb::arg("remote"), nb::arg("remote_blocks"), nb::arg("local_blocks"), nb::arg("count"),
          nb::arg("stream"), nb::arg("push"), nb::call_guard<nb::gil_scoped_release>(),
          "Internal: readDevice / writeDevice on raw pointers.")
      .def(
          "poll_error",
          [](Endpoint& e, const Registration& local, const RemoteMemory& remote) {
            DeviceError err;
            {
              nb::gil_scoped_release nogil;
              err = e.pollError(local, remote);
            }
            return deviceErrorToPython(err);
          },
          nb::arg("local"), nb::arg("remote"))
      .def(
          "read",
          [](Endpoint& e, const Registration& local, const RemoteMemory& remote, uintptr_t remoteBlocks,
             uintptr_t localBlocks, size_t count, TransferVia via, const nb::object& notify) {
            TransferOptions o = transferOptions(via, notify);
            nb::gil_scoped_release nogil;
            return e.read(local, remote, ids(remoteBlocks), ids(localBlocks), count, o);
          },
          nb::arg("local"), nb::arg("remote"), nb::arg("remote_blocks"), nb::arg("local_blocks"), nb::arg("count"),
          nb::arg("via"), nb::arg("notify").none(), "Internal: read on raw id addresses.")
      .def(
          "write",
          [](Endpoint& e, const Registration& local, const RemoteMemory& remote, uintptr_t remoteBlocks,
             uintptr_t localBlocks, size_t count, TransferVia via, const nb::object& notify) {
            TransferOptions o = transferOptions(via, notify);
            nb::gil_scoped_release nogil;
            return e.write(local, remote, ids(remoteBlocks), ids(localBlocks), count, o);
          },
          nb::arg("local"), nb::arg("remote"), nb::arg("remote_blocks"), nb::arg("local_blocks"), nb::arg("count"),
          nb::arg("via"), nb::arg("notify").none(), "Internal: write on raw id addresses.")
      .def(
          "start_arrays",
          [](Endpoint& e, const Registration& local, const RemoteMemory& remote, HostIds remoteBlocks,
             HostIds localBlocks, TransferVia via, const nb::object& notify, bool push) {
            TransferOptions o = transferOptions(via, notify);
            const size_t n = remoteBlocks.shape(0);
            nb::gil_scoped_release nogil;
            return push ? e.write(local, remote, remoteBlocks.data(), localBlocks.data(), n, o)
                        : e.read(local, remote, remoteBlocks.data(), localBlocks.data(), n, o);
          },
          nb::arg("local"), nb::arg("remote"), nb::arg("remote_blocks").noconvert(),
          nb::arg("local_blocks").noconvert(), nb::arg("via"), nb::arg("notify").none(), nb::arg("push"),
          "Internal: read / write on two int64 arrays of equal length the package checked (the small-transfer path: "
          "no pointer extraction in Python).")
      .def(
          "notify",
          [](Endpoint& e, const RemoteMemory& remote, const nb::bytes& message) {
            std::string m(message.c_str(), message.size());
            nb::gil_scoped_release nogil;
            e.notify(remote, m);
          },
          nb::arg("remote"), nb::arg("message"), "Internal: notify with bytes the package checked.")
      .def(
          "notifications",
          [](Endpoint& e, int64_t timeoutMs) {
            std::vector<Notification> got;
            {
              nb::gil_scoped_release nogil;
              got = e.notifications(timeoutMs);
            }
            nb::list out;
            for (const Notification& n : got)
              out.append(
                  nb::make_tuple(n.from, n.fromName, n.registration, nb::bytes(n.message.data(), n.message.size())));
            return out;
          },
          nb::arg("timeout_ms"), "Internal: [(from, from_name, registration, message)], oldest first.")
      .def("close", &Endpoint::close, nb::call_guard<nb::gil_scoped_release>());
}

}  // namespace kvcomm::py
