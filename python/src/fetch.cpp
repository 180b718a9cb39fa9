// Fetcher: layouts, plans, fetches on raw id pointers the package validated, polled operations; every call that can
// block or copy runs without the GIL.
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <tuple>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "kvcomm/fetch.hpp"

namespace kvcomm::py {

KvLayout toLayout(const std::vector<RawRegion>& regions, uint64_t version) {
  KvLayout l;
  l.version = version;
  for (const RawRegion& r : regions)
    l.regions.push_back({std::get<0>(r), std::get<1>(r), std::get<2>(r), std::get<3>(r)});
  return l;
}

std::tuple<std::vector<RawRegion>, uint64_t> fromLayout(const KvLayout& l) {
  std::vector<RawRegion> out;
  for (const KvRegion& r : l.regions) out.emplace_back(r.offset, r.blockBytes, r.blockStride, r.numBlocks);
  return {out, l.version};
}

nb::object statusToPython(FetchStatus&& s) {
  auto* blocks = new std::vector<int64_t>(std::move(s.failedBlocks));
  nb::capsule owner(blocks, [](void* p) noexcept { delete static_cast<std::vector<int64_t>*>(p); });
  size_t shape[1] = {blocks->size()};
  nb::ndarray<nb::numpy, int64_t, nb::ndim<1>> failed(blocks->data(), 1, shape, owner);
  return nb::make_tuple(s.state, s.bytesDone, s.bytesTotal, nb::cast(failed, nb::rv_policy::reference), s.error);
}

namespace {

// (srcRank, srcBlocks address, dstBlocks address, count, srcLayoutHash)
using RawRequest = std::tuple<int, uintptr_t, uintptr_t, size_t, uint64_t>;

std::vector<FetchRequest> toRequests(const std::vector<RawRequest>& raw) {
  std::vector<FetchRequest> out;
  out.reserve(raw.size());
  for (const RawRequest& q : raw) {
    FetchRequest r;
    r.srcRank = std::get<0>(q);
    r.srcBlocks = reinterpret_cast<const int64_t*>(std::get<1>(q));
    r.dstBlocks = reinterpret_cast<const int64_t*>(std::get<2>(q));
    r.count = std::get<3>(q);
    r.srcLayoutHash = std::get<4>(q);
    out.push_back(r);
  }
  return out;
}

FetchOptions toOptions(FetchPath path, size_t copyEngineMinRunBytes, uint64_t maxBytesPerSecond) {
  FetchOptions o;
  o.path = path;
  o.copyEngineMinRunBytes = copyEngineMinRunBytes;
  o.maxBytesPerSecond = maxBytesPerSecond;
  return o;
}

#define KVCOMM_FETCH_OPTION_ARGS \
  nb::arg("path") = FetchPath::Auto, nb::arg("copy_engine_min_run_bytes") = 0, nb::arg("max_bytes_per_second") = 0

}  // namespace

void bindFetch(nb::module_& m) {
  nb::enum_<FetchPath>(m, "FetchPath", "What moves a fetch's bytes.")
      .value("Auto", FetchPath::Auto)
      .value("Kernel", FetchPath::Kernel)
      .value("CopyEngine", FetchPath::CopyEngine)
      .value("Host", FetchPath::Host)
      .value("Network", FetchPath::Network);
  nb::enum_<FetchTransportKind>(m, "FetchTransport", "What carries a fetch's bytes from a source to this rank.")
      .value("None_", FetchTransportKind::None)
      .value("Peer", FetchTransportKind::Peer)
      .value("Tcp", FetchTransportKind::Tcp)
      .value("Rdma", FetchTransportKind::Rdma);
  nb::enum_<FetchState>(m, "FetchState", "State of a polled fetch.")
      .value("InProgress", FetchState::InProgress)
      .value("Done", FetchState::Done)
      .value("Failed", FetchState::Failed);
  m.def(
      "layout_hash",
      [](const std::vector<RawRegion>& regions, uint64_t version) { return layoutHash(toLayout(regions, version)); },
      nb::arg("regions"), nb::arg("version") = 0,
      "FNV-1a hash of a layout: (offset, block_bytes, block_stride, "
      "num_blocks) regions and the engine's version.");

  nb::class_<FetchPlanInfo> planInfo(m, "FetchPlanInfo", "What a plan does (kvcomm::FetchPlanInfo).");
  refuseConstruction(planInfo, "FetchPlanInfo", "Fetcher.fetch() and FetchPlan.info return one");
  planInfo.def_ro("pairs_in", &FetchPlanInfo::pairsIn, "Block pairs named by the requests.")
      .def_ro("pairs_skipped", &FetchPlanInfo::pairsSkipped, "Pairs with -1 (padding).")
      .def_ro("runs_out", &FetchPlanInfo::runsOut, "Copies after coalescing (one per run and region).")
      .def_ro("kernel_runs", &FetchPlanInfo::kernelRuns)
      .def_ro("copy_engine_runs", &FetchPlanInfo::copyEngineRuns)
      .def_ro("host_runs", &FetchPlanInfo::hostRuns)
      .def_ro("tcp_runs", &FetchPlanInfo::tcpRuns, "Runs the TCP transport moves (sources reached over TCP).")
      .def_ro("rdma_runs", &FetchPlanInfo::rdmaRuns, "Runs RDMA READs move (sources reached over RDMA).")
      .def_ro("bytes", &FetchPlanInfo::bytes, "Bytes to copy.")
      .def_ro("path", &FetchPlanInfo::path,
              "The one path the same-host runs use, Auto when they use both kernel and copy engines, Network when "
              "every run goes over TCP or RDMA.")
      .def_ro("plan_micros", &FetchPlanInfo::planMicros, "Host time spent validating and coalescing.")
      .def("__repr__", [](const FetchPlanInfo& i) { return "kvcomm.FetchPlanInfo(" + i.toString() + ")"; });

  nb::class_<FetchPlan>(m, "FetchPlan", "A validated, coalesced batch, reusable while the buffer does not change.")
      .def_prop_ro("info", &FetchPlan::info, nb::rv_policy::copy)
      .def_prop_ro("generation", &FetchPlan::generation, "The buffer generation the plan was validated at.");

  nb::class_<FetchOperation>(m, "FetchOperation", "A polled fetch (kvcomm::FetchOperation).")
      .def(
          "test",
          [](FetchOperation& op) {
            FetchStatus s;
            {
              nb::gil_scoped_release nogil;
              s = op.test();
            }
            return statusToPython(std::move(s));
          },
          "Non-blocking: (state, bytes_done, bytes_total, failed_blocks, error).")
      .def(
          "wait",
          [](FetchOperation& op, int64_t timeoutMs) {
            FetchStatus s;
            {
              nb::gil_scoped_release nogil;
              s = op.wait(timeoutMs);
            }
            return statusToPython(std::move(s));
          },
          nb::arg("timeout_ms") = -1, "Blocks up to timeout_ms (< 0: until it ends); expiry cancels nothing.");

  nb::class_<Fetcher> fetcher(m, "Fetcher",
                              "Fetches of KV blocks between the members of a buffer's group (kvcomm::Fetcher).");
  fetcher
      .def_static(
          "create",
          [](SymmetricBuffer& buffer, const std::vector<RawRegion>& regions, uint64_t version,
             int64_t barrierTimeoutMs) {
            FetcherOptions o;
            o.barrierTimeoutMs = barrierTimeoutMs;
            return Fetcher::create(buffer, toLayout(regions, version), o);
          },
          nb::arg("buffer"), nb::arg("regions"), nb::arg("version") = 0, nb::arg("barrier_timeout_ms") = -1,
          nb::call_guard<nb::gil_scoped_release>(),
          "Collective: registers this rank's layout and learns every member's.")
      .def(
          "plan",
          [](const Fetcher& f, const std::vector<RawRequest>& requests, FetchPath path, size_t ceMin, uint64_t bps) {
            return f.plan(toRequests(requests), toOptions(path, ceMin, bps));
          },
          nb::arg("requests"), KVCOMM_FETCH_OPTION_ARGS, nb::call_guard<nb::gil_scoped_release>(),
          "Internal: validates and coalesces raw requests without moving anything.")
      .def(
          "submit", [](Fetcher& f, const FetchPlan& plan, uintptr_t stream) { f.submit(plan, toStream(stream)); },
          nb::arg("plan"), nb::arg("stream") = 0, nb::call_guard<nb::gil_scoped_release>(),
          "Enqueues a plan made by this fetcher (host buffers: done when it returns).")
      .def(
          "fetch",
          [](Fetcher& f, const std::vector<RawRequest>& requests, uintptr_t stream, FetchPath path, size_t ceMin,
             uint64_t bps, bool onDevice) {
            FetchOptions o = toOptions(path, ceMin, bps);
            o.validation = onDevice ? FetchValidation::Device : FetchValidation::Host;
            return f.fetch(toRequests(requests), toStream(stream), o);
          },
          nb::arg("requests"), nb::arg("stream"), KVCOMM_FETCH_OPTION_ARGS, nb::arg("check_on_device") = false,
          nb::call_guard<nb::gil_scoped_release>(), "Internal: plan + submit on raw requests.")
      .def(
          "fetch_device",
          [](Fetcher& f, uintptr_t src, uintptr_t dst, uintptr_t ranks, int srcRank, size_t count, uintptr_t stream) {
            DeviceFetchBatch b;
            b.srcBlocks = reinterpret_cast<const int64_t*>(src);
            b.dstBlocks = reinterpret_cast<const int64_t*>(dst);
            b.srcRanks = reinterpret_cast<const int32_t*>(ranks);
            b.srcRank = srcRank;
            b.count = count;
            f.fetchDevice(b, toStream(stream));
          },
          nb::arg("src_blocks"), nb::arg("dst_blocks"), nb::arg("src_ranks"), nb::arg("src_rank"), nb::arg("count"),
          nb::arg("stream"), nb::call_guard<nb::gil_scoped_release>(), "Internal: fetchDevice on raw pointers.")
      .def(
          "start",
          [](Fetcher& f, const std::vector<RawRequest>& requests, uintptr_t stream, FetchPath path, size_t ceMin,
             uint64_t bps) { return f.start(toRequests(requests), toOptions(path, ceMin, bps), toStream(stream)); },
          nb::arg("requests"), nb::arg("stream"), KVCOMM_FETCH_OPTION_ARGS, nb::call_guard<nb::gil_scoped_release>(),
          "Internal: starts a polled fetch of raw requests.")
      .def(
          "fetch_all",
          [](Fetcher& f, const std::vector<RawRequest>& requests, uintptr_t stream, FetchPath path, size_t ceMin,
             uint64_t bps) { return f.fetchAll(toRequests(requests), toStream(stream), toOptions(path, ceMin, bps)); },
          nb::arg("requests"), nb::arg("stream"), KVCOMM_FETCH_OPTION_ARGS, nb::call_guard<nb::gil_scoped_release>(),
          "Internal: the collective form on raw requests.")
      .def("refresh", &Fetcher::refresh, nb::call_guard<nb::gil_scoped_release>(),
           "Collective: revalidates every member's layout and adopts the buffer's generation.")
      .def(
          "layout", [](const Fetcher& f, int rank) { return fromLayout(f.layout(rank)); }, nb::arg("rank"),
          "Member `rank`'s registered layout: ([(offset, block_bytes, block_stride, num_blocks)], "
          "version).")
      .def("layout_hash", &Fetcher::layoutHash, nb::arg("rank"))
      .def("transport", &Fetcher::transport, nb::arg("rank"))
      .def_prop_ro("generation", &Fetcher::generation, "The buffer generation the layouts were validated at.")
      .def(
          "device_handle",
          [](const Fetcher& f) {
            FetchDeviceHandle h = f.deviceHandle();
            return nb::bytes(reinterpret_cast<const char*>(&h), sizeof(h));
          },
          "The bytes of a kvcomm::FetchDeviceHandle, for custom kernels (kvcomm/device/fetch.hpp).");
  defDeviceErrors(fetcher,
                  "Reads (and clears) the first device error of fetch_device()/fetch_all(), as a dict, or None.");
}

}  // namespace kvcomm::py
