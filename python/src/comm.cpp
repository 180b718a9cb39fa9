// Communicator, UniqueId, Topology and ParallelGroups. Blocking collectives run without the GIL; the callback bootstrap
// takes it back only to call the Python allgather.
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <string>

#include "bindings.hpp"
#include "kvcomm/comm.hpp"
#include "kvcomm/error.hpp"
#include "kvcomm/limits.hpp"

namespace kvcomm::py {

namespace {

// Refuses a member outside [0, size) naming Python's call and this rank (Topology checks too, but knows no rank).
void checkMember(const Communicator& c, int r, const char* call) {
  if (r < 0 || r >= c.size())
    throw InvalidArgumentError("kvcomm [rank " + std::to_string(c.rank()) + "] " + call + ": member " +
                               std::to_string(r) + " outside [0, " + std::to_string(c.size()) + ")");
}

// The Python allgather of a callback bootstrap. kvcomm calls it only while Communicator::create runs (the mesh
// address exchange); afterwards the callable is dropped (under the GIL) so that no Python object outlives that call
// inside the C++ communicator, which may be destroyed on any thread.
struct PyAllgather {
  nb::object fn;
  int rank = 0;
  int size = 0;

  void operator()(const void* send, void* recv, size_t bytes) {
    nb::gil_scoped_acquire gil;
    if (!fn.is_valid() || fn.is_none())
      throw Error(ErrorCode::InternalError, "kvcomm [rank " + std::to_string(rank) +
                                                "] Communicator.from_allgather: callback used after creation");
    std::string failure;
    try {
      nb::object out = fn(nb::bytes(static_cast<const char*>(send), bytes));
      std::string all;
      if (nb::isinstance<nb::bytes>(out)) {
        nb::bytes b = nb::borrow<nb::bytes>(out);
        all.assign(b.c_str(), b.size());
      } else {  // a sequence of per-rank bytes
        for (nb::handle part : out) {
          nb::bytes b = nb::cast<nb::bytes>(part);
          if (b.size() != bytes)
            throw Error(ErrorCode::InvalidArgument,
                        "kvcomm [rank " + std::to_string(rank) + "] allgather callback: a rank contributed " +
                            std::to_string(b.size()) + " bytes, expected " + std::to_string(bytes));
          all.append(b.c_str(), b.size());
        }
      }
      if (all.size() != bytes * static_cast<size_t>(size))
        throw Error(ErrorCode::InvalidArgument, "kvcomm [rank " + std::to_string(rank) +
                                                    "] allgather callback: returned " + std::to_string(all.size()) +
                                                    " bytes, expected " + std::to_string(size) + " x " +
                                                    std::to_string(bytes));
      std::memcpy(recv, all.data(), all.size());
      return;
    } catch (nb::python_error& e) {
      nb::handle type = e.type();
      failure = std::string(nb::type_name(type).c_str()) + ": " + nb::str(e.value()).c_str();
    } catch (const nb::cast_error&) {
      failure = "the callback must return bytes, or a sequence of bytes (one per rank)";
    }
    throw Error(ErrorCode::RemoteError, "kvcomm [rank " + std::to_string(rank) +
                                            "] Communicator.from_allgather: the allgather callback raised " + failure);
  }
};

Communicator fromAllgather(int rank, int size, nb::object fn) {
  auto state = std::make_shared<PyAllgather>();
  state->fn = std::move(fn);
  state->rank = rank;
  state->size = size;
  auto boot =
      std::make_shared<CallbackBootstrap>(rank, size, [state](const void* s, void* r, size_t n) { (*state)(s, r, n); });
  std::optional<Communicator> comm;
  std::exception_ptr failure;
  {
    nb::gil_scoped_release nogil;
    try {
      comm = Communicator::create(boot);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  state->fn = nb::none();  // under the GIL
  if (failure) std::rethrow_exception(failure);
  return *comm;
}

// The four group sizes of a ParallelGroups call: each at least 1, their product (the world's size) at most
// limits::kMaxRanks, checked before anything is sized (group_of returns a list as long as one of them).
ParallelSpec specArg(nb::handle tp, nb::handle pcp, nb::handle pp, nb::handle dp, const char* call, int rank) {
  constexpr int64_t kMax = limits::kMaxRanks;
  ParallelSpec s;
  s.tp = static_cast<int>(intArg(tp, call, "tp", rank, 1, kMax));
  s.pcp = static_cast<int>(intArg(pcp, call, "pcp", rank, 1, kMax));
  s.pp = static_cast<int>(intArg(pp, call, "pp", rank, 1, kMax));
  s.dp = static_cast<int>(intArg(dp, call, "dp", rank, 1, kMax));
  int64_t world = int64_t{s.tp} * s.pcp * s.pp * s.dp;  // each factor <= 2^16: no overflow
  if (world > kMax)
    argError(call, "tp*pcp*pp*dp", rank,
             std::to_string(world) + " exceeds kvcomm.limits.MAX_RANKS (" + std::to_string(kMax) + ")");
  return s;
}

// The size a bootstrap is given: 1 to limits::kMaxRanks.
int sizeArg(nb::handle v, const char* call, int rank) {
  return static_cast<int>(intArg(v, call, "size", rank, 1, limits::kMaxRanks));
}

nb::dict memberDict(const MemberInfo& m) {
  nb::dict d;
  d["rank"] = m.rank;
  d["world_rank"] = m.worldRank;
  d["pid"] = m.pid;
  d["uid"] = m.uid;
  d["hostname"] = m.hostname;
  d["boot_id"] = m.bootId;
  d["netns"] = m.netns;
  d["host_index"] = m.hostIndex;
  d["local_rank"] = m.localRank;
  d["local_size"] = m.localSize;
  d["gpu_device"] = m.gpu.device;
  d["gpu_uuid"] = m.gpu.uuid;
  d["gpu_pci_bus_id"] = m.gpu.pciBusId;
  d["rdma_devices"] = m.rdmaDevices;
  return d;
}

}  // namespace

void bindComm(nb::module_& m) {
  nb::class_<UniqueId> uniqueId(m, "UniqueId", "Identity of a TCP bootstrap group (root address + nonce).");
  refuseConstruction(uniqueId, "UniqueId", "use kvcomm.create_unique_id() or UniqueId.from_string()");
  uniqueId
      .def_static(
          "create",
          [](nb::handle ifname) {
            return TcpBootstrap::createUniqueId(strArg(ifname, "create_unique_id", "ifname", -1));
          },
          nb::arg("ifname").none() = "",
          "A new id whose root listens on `ifname` (default: KVCOMM_SOCKET_IFNAME, else the first interface that is "
          "up). Call it in the process that will be rank 0.")
      .def_static(
          "from_string",
          [](nb::handle text) { return UniqueId::fromString(strArg(text, "UniqueId.from_string", "text", -1)); },
          nb::arg("text").none(), "Parses to_string()'s hex text.")
      .def("to_string", &UniqueId::toString, "Hex text, for environment variables and command lines.")
      .def("__str__", &UniqueId::toString)
      .def("__repr__", [](const UniqueId& id) { return "kvcomm.UniqueId('" + id.toString() + "')"; });

  // dynamic_attr: the Python bootstraps (python/kvcomm/_bootstrap.py) note on the world they build how it was
  // bootstrapped (`_bootstrap`), which the repr names.
  nb::class_<Communicator> communicator(m, "Communicator", nb::dynamic_attr(),
                                        "A group of processes (kvcomm::Communicator).");
  refuseConstruction(communicator, "Communicator", "use kvcomm.init_tcp() or another kvcomm.init_*() bootstrap");
  communicator
      .def_static(
          "from_unique_id",
          [](nb::handle uid, nb::handle rankArg, nb::handle sizeObj, nb::handle timeout) {
            const char* call = "init_tcp";
            int rank = cIntArg(rankArg, call, "rank", -1);
            int size = sizeArg(sizeObj, call, rank);
            int64_t timeoutMs = intArg(timeout, call, "timeout_ms", rank, INT64_MIN, INT64_MAX);
            const UniqueId& id = objArg<UniqueId>(uid, call, "unique_id", rank, "kvcomm.UniqueId (or its string)");
            nb::gil_scoped_release nogil;
            return Communicator::create(std::make_shared<TcpBootstrap>(id, rank, size, timeoutMs));
          },
          nb::arg("unique_id").none(), nb::arg("rank").none(), nb::arg("size").none(),
          nb::arg("timeout_ms").none() = -1, "World communicator over TCP (collective).")
      .def_static(
          "from_allgather",
          [](nb::handle rankArg, nb::handle sizeObj, nb::object fn) {
            const char* call = "init_allgather";
            int rank = cIntArg(rankArg, call, "rank", -1);
            int size = sizeArg(sizeObj, call, rank);
            if (!PyCallable_Check(fn.ptr()))
              argError(call, "allgather", rank, "must be callable, got " + typeNameOf(fn));
            return fromAllgather(rank, size, std::move(fn));
          },
          nb::arg("rank").none(), nb::arg("size").none(), nb::arg("allgather").none(),
          "World communicator over the caller's allgather(bytes) -> bytes | sequence of bytes (collective); "
          "the callable is used during this call only.")
      .def("__repr__",
           [](nb::handle self) {
             const Communicator& c = nb::cast<const Communicator&>(self);
             std::string s = "kvcomm.Communicator(rank=" + std::to_string(c.rank()) +
                             ", size=" + std::to_string(c.size()) + ", hosts=" + std::to_string(c.topology().numHosts);
             nb::object how = nb::getattr(self, "_bootstrap", nb::none());
             if (!how.is_none())  // a world built by one of kvcomm's Python bootstraps
               s += std::string(", bootstrap=") + nb::repr(how).c_str();
             else  // a split group (or a world built through the native statics directly)
               s += ", world_rank=" + std::to_string(c.worldRank(c.rank()));
             return s + ")";
           })
      .def_prop_ro("rank", &Communicator::rank)
      .def_prop_ro("size", &Communicator::size)
      .def_prop_ro("id", &Communicator::id, "Identity of the group (equal on every member).")
      .def(
          "world_rank",
          [](const Communicator& c, nb::handle r) {
            int rank = cIntArg(r, "Communicator.world_rank", "rank", c.rank());
            checkMember(c, rank, "Communicator.world_rank");
            return c.worldRank(rank);
          },
          nb::arg("rank").none(), "Rank of member `rank` in the world communicator this one was split from.")
      .def(
          "split",
          [](Communicator& c, nb::handle colorArg, nb::handle keyArg) {
            int color = cIntArg(colorArg, "Communicator.split", "color", c.rank());
            int key = cIntArg(keyArg, "Communicator.split", "key", c.rank());
            nb::gil_scoped_release nogil;
            return c.split(color, key);
          },
          nb::arg("color").none(), nb::arg("key").none(),
          "MPI_Comm_split semantics (collective); None for a negative color.")
      .def(
          "allgather",
          [](Communicator& c, nb::handle arg) {
            nb::bytes data = bytesArg(arg, "Communicator.allgather", "data", c.rank());
            size_t n = data.size();
            std::string all(n * static_cast<size_t>(c.size()), '\0');
            std::memcpy(all.data() + n * static_cast<size_t>(c.rank()), data.c_str(), n);
            {
              nb::gil_scoped_release nogil;
              c.allgather(all.data(), n);
            }
            return nb::bytes(all.data(), all.size());
          },
          nb::arg("data").none(),
          "Gathers equal-sized bytes from every member, in rank order, concatenated (collective).")
      .def("barrier", &Communicator::barrier, nb::call_guard<nb::gil_scoped_release>(),
           "Returns when every member entered (collective).")
      .def(
          "members",
          [](const Communicator& c) {
            nb::list l;
            for (const MemberInfo& mi : c.topology().members) l.append(memberDict(mi));
            return l;
          },
          "What the communicator knows about each member (host, pid, GPU, RDMA devices).")
      .def("num_hosts", [](const Communicator& c) { return c.topology().numHosts; })
      .def(
          "same_host",
          [](const Communicator& c, nb::handle aArg, nb::handle bArg) {
            const char* call = "Communicator.same_host";
            int a = cIntArg(aArg, call, "a", c.rank()), b = cIntArg(bArg, call, "b", c.rank());
            checkMember(c, a, call);
            checkMember(c, b, call);
            return c.topology().sameHost(a, b);
          },
          nb::arg("a").none(), nb::arg("b").none(),
          "Whether members a and b are on one host (InvalidArgumentError unless 0 <= a, b < size).")
      .def(
          "can_access_peer",
          [](const Communicator& c, nb::handle aArg, nb::handle bArg) {
            const char* call = "Communicator.can_access_peer";
            int a = cIntArg(aArg, call, "a", c.rank()), b = cIntArg(bArg, call, "b", c.rank());
            checkMember(c, a, call);
            checkMember(c, b, call);
            return c.topology().canAccessPeer(a, b);
          },
          nb::arg("a").none(), nb::arg("b").none(),
          "Whether member a's GPU can access member b's directly (InvalidArgumentError unless 0 <= a, b < size).")
      .def(
          "topology_string", [](const Communicator& c) { return c.topology().toString(); }, "The topology as a table.");

  nb::class_<ParallelGroups> layout(m, "ParallelGroups", "TP/PCP/PP/DP groups of this rank (kvcomm::ParallelGroups).");
  refuseConstruction(layout, "ParallelGroups", "use ParallelGroups.create()");
  layout
      .def_static(
          "create",
          [](nb::handle worldArg, nb::handle tp, nb::handle pcp, nb::handle pp, nb::handle dp) {
            const char* call = "ParallelGroups.create";
            Communicator& world = objArg<Communicator>(worldArg, call, "world", -1, "kvcomm.Communicator");
            ParallelSpec s = specArg(tp, pcp, pp, dp, call, world.rank());
            nb::gil_scoped_release nogil;
            return ParallelGroups::create(world, s);
          },
          nb::arg("world").none(), nb::arg("tp").none() = 1, nb::arg("pcp").none() = 1, nb::arg("pp").none() = 1,
          nb::arg("dp").none() = 1, "Splits `world` into the four groups (collective).")
      .def_prop_ro("spec",
                   [](const ParallelGroups& l) { return nb::make_tuple(l.spec.tp, l.spec.pcp, l.spec.pp, l.spec.dp); })
      .def_prop_ro(
          "coord",
          [](const ParallelGroups& l) { return nb::make_tuple(l.coord.tp, l.coord.pcp, l.coord.pp, l.coord.dp); })
      .def_prop_ro("tp", [](const ParallelGroups& l) { return l.tp; })
      .def_prop_ro("pcp", [](const ParallelGroups& l) { return l.pcp; })
      .def_prop_ro("pp", [](const ParallelGroups& l) { return l.pp; })
      .def_prop_ro("dp", [](const ParallelGroups& l) { return l.dp; })
      .def_static(
          "group_of",
          [](nb::handle tp, nb::handle pcp, nb::handle pp, nb::handle dp, nb::handle rankArg, nb::handle axisArg) {
            const char* call = "ParallelGroups.group_of";
            ParallelSpec s = specArg(tp, pcp, pp, dp, call, -1);
            int rank = cIntArg(rankArg, call, "rank", -1);
            // kvcomm.Axis members (an IntEnum) or their values; anything else is refused before it becomes an Axis.
            auto axis = static_cast<Axis>(
                enumArg(axisArg, call, "axis", rank, 4, "a kvcomm.Axis (TP = 0, PCP = 1, PP = 2, DP = 3)"));
            // ParallelGroups::groupOf checks the sizes (and their product) and the rank, naming each.
            return ParallelGroups::groupOf(s, rank, axis);
          },
          nb::arg("tp").none(), nb::arg("pcp").none(), nb::arg("pp").none(), nb::arg("dp").none(),
          nb::arg("rank").none(), nb::arg("axis").none(),
          "World ranks of the group along axis (0 TP, 1 PCP, 2 PP, 3 DP) holding `rank`, in group-rank order.");
}

}  // namespace kvcomm::py
