// KV contents and conversion plans: descriptions as tuples the package (kvcomm/conversion.py) checked for type, plans
// back as numpy arrays of pieces, host-memory application on raw addresses the package validated.
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <tuple>
#include <utility>
#include <vector>

#include "bindings.hpp"
#include "kvcomm/converted_fetch.hpp"
#include "kvcomm/converted_read.hpp"
#include "kvcomm/kv_conversion.hpp"

namespace kvcomm::py {

namespace {

// A block table as the package hands it over: a C-contiguous int64 numpy array (read in place, copied once here).
using BlockTable = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
std::vector<int64_t> tableOf(const BlockTable& t) {
  return std::vector<int64_t>(t.data(), t.data() + t.shape(0));
}

ConvertedReadOptions readOptions(int32_t preferred, TransferVia via, int64_t timeoutMs) {
  ConvertedReadOptions o;
  o.conversion.preferredSource = preferred;
  o.via = via;
  o.timeoutMs = timeoutMs;
  return o;
}

// (status, bytes converted, bytes landed, pieces, sources read, sources mapped), as kvcomm/conversion.py unpacks it.
nb::tuple resultToPython(ConvertedReadResult&& r) {
  nb::object status = statusToPython(std::move(r.status));
  return nb::make_tuple(status, r.bytesConverted, r.bytesLanded, r.pieces, r.sourcesRead, r.sourcesMapped);
}

KvContents toContents(const RawContents& c) {
  KvContents k;
  std::tie(k.elementBytes, k.headDim, k.tokensPerBlock, k.numHeads, k.headBegin, k.headEnd, std::ignore, k.replicated) =
      c;
  k.order = static_cast<KvOrder>(std::get<6>(c));
  return k;
}

RawContents fromContents(const KvContents& k) {
  return {k.elementBytes, k.headDim, k.tokensPerBlock,          k.numHeads,
          k.headBegin,    k.headEnd, static_cast<int>(k.order), k.replicated};
}

}  // namespace

KvDescription toDescription(const std::vector<RawContents>& raw) {
  KvDescription d;
  for (const RawContents& c : raw) d.regions.push_back(toContents(c));
  return d;
}

std::vector<RawContents> fromDescription(const KvDescription& d) {
  std::vector<RawContents> out;
  for (const KvContents& k : d.regions) out.push_back(fromContents(k));
  return out;
}

void bindConversion(nb::module_& m) {
  m.def(
      "check_description",
      [](const std::vector<RawRegion>& regions, const std::vector<RawContents>& contents, const std::string& call) {
        checkDescription(toLayout(regions, 0), toDescription(contents), call.c_str());
      },
      nb::arg("regions"), nb::arg("contents"), nb::arg("call"));
  m.def(
      "split_for_tp",
      [](const RawContents& model, uint32_t tp, uint32_t rank) {
        return fromContents(splitForTp(toContents(model), tp, rank));
      },
      nb::arg("model"), nb::arg("tp_size"), nb::arg("tp_rank"));
  m.def(
      "why_not_convertible",
      [](const std::vector<RawContents>& src, const std::vector<RawContents>& dst) {
        return whyNotConvertible(toDescription(src), toDescription(dst));
      },
      nb::arg("src"), nb::arg("dst"));
  m.def(
      "plan_conversion",
      [](const std::vector<std::pair<std::vector<RawRegion>, std::vector<RawContents>>>& sources,
         const std::vector<RawRegion>& dstRegions, const std::vector<RawContents>& dst, const BlockTable& srcBlocks,
         const BlockTable& dstBlocks, uint64_t first, uint64_t num, int32_t preferred) {
        std::vector<KvConversionSource> src;
        for (const auto& [regions, contents] : sources) src.push_back({toLayout(regions, 0), toDescription(contents)});
        KvConversionOptions o;
        o.preferredSource = preferred;
        KvConversionPlan plan;
        {
          nb::gil_scoped_release nogil;
          plan = planConversion(src, toLayout(dstRegions, 0), toDescription(dst),
                                {tableOf(srcBlocks), tableOf(dstBlocks), first, num}, o);
        }
        nb::list pieces;
        for (std::vector<KvPiece>& p : plan.pieces) {
          static_assert(sizeof(KvPiece) == 3 * sizeof(uint64_t));
          auto* held = new std::vector<KvPiece>(std::move(p));
          nb::capsule owner(held, [](void* q) noexcept { delete static_cast<std::vector<KvPiece>*>(q); });
          size_t shape[2] = {held->size(), 3};
          pieces.append(nb::ndarray<nb::numpy, uint64_t, nb::ndim<2>>(reinterpret_cast<uint64_t*>(held->data()), 2,
                                                                      shape, owner));
        }
        return nb::make_tuple(pieces, plan.headSource, plan.bytes);
      },
      nb::arg("sources"), nb::arg("dst_regions"), nb::arg("dst"), nb::arg("src_blocks"), nb::arg("dst_blocks"),
      nb::arg("first_token"), nb::arg("num_tokens"), nb::arg("preferred_source"));
  m.def(
      "apply_conversion",
      [](uintptr_t pieces, size_t count, uintptr_t src, uint64_t srcBytes, uintptr_t dst, uint64_t dstBytes) {
        const auto* p = reinterpret_cast<const KvPiece*>(pieces);
        std::vector<KvPiece> list(p, p + count);
        nb::gil_scoped_release nogil;
        applyConversion(list, reinterpret_cast<const void*>(src), srcBytes, reinterpret_cast<void*>(dst), dstBytes);
      },
      nb::arg("pieces"), nb::arg("count"), nb::arg("src"), nb::arg("src_bytes"), nb::arg("dst"), nb::arg("dst_bytes"),
      "Internal: applyConversion on addresses the package checked.");
  nb::class_<ConvertedReader>(m, "ConvertedReader", "readConverted with landing areas kept (kvcomm::ConvertedReader).")
      .def(nb::init<Endpoint&>(), nb::arg("endpoint"), nb::keep_alive<1, 2>())
      .def_prop_ro("landing_bytes", &ConvertedReader::landingBytes)
      .def(
          "read",
          [](ConvertedReader& reader, const Registration& local, const std::vector<RawContents>& localContents,
             const std::vector<std::pair<RemoteMemory, std::vector<RawContents>>>& sources, const BlockTable& srcBlocks,
             const BlockTable& dstBlocks, uint64_t first, uint64_t num, int32_t preferred, TransferVia via,
             int64_t timeoutMs) {
            std::vector<ConvertedSource> src;
            for (const auto& [remote, contents] : sources) src.push_back({remote, toDescription(contents)});
            ConvertedReadResult r;
            {
              nb::gil_scoped_release nogil;
              r = reader.read(local, toDescription(localContents), src,
                              {tableOf(srcBlocks), tableOf(dstBlocks), first, num},
                              readOptions(preferred, via, timeoutMs));
            }
            return resultToPython(std::move(r));
          },
          nb::arg("local"), nb::arg("local_contents"), nb::arg("sources"), nb::arg("src_blocks"), nb::arg("dst_blocks"),
          nb::arg("first_token"), nb::arg("num_tokens"), nb::arg("preferred_source"), nb::arg("via"),
          nb::arg("timeout_ms"));
  nb::class_<ConvertedFetcher>(m, "ConvertedFetcher",
                               "Converted fetches among a group's members (kvcomm::ConvertedFetcher).")
      .def_static(
          "create",
          [](SymmetricBuffer& buffer, const std::vector<RawRegion>& regions, const std::vector<RawContents>& contents,
             const std::string& tcpAddress, int64_t netTimeoutMs) {
            ConvertedFetcherOptions o;
            o.tcpAddress = tcpAddress;
            o.netTimeoutMs = netTimeoutMs;
            return ConvertedFetcher::create(buffer, toLayout(regions, 0), toDescription(contents), o);
          },
          nb::arg("buffer"), nb::arg("regions"), nb::arg("contents"), nb::arg("tcp_address"), nb::arg("net_timeout_ms"),
          nb::call_guard<nb::gil_scoped_release>(), nb::keep_alive<0, 1>())
      .def_prop_ro("rank", &ConvertedFetcher::rank)
      .def_prop_ro("size", &ConvertedFetcher::size)
      .def(
          "contents", [](const ConvertedFetcher& f, int r) { return fromDescription(f.contents(r)); }, nb::arg("rank"))
      .def(
          "layout",
          [](const ConvertedFetcher& f, int r) {
            std::vector<RawRegion> out;
            for (const KvRegion& g : f.layout(r).regions)
              out.emplace_back(g.offset, g.blockBytes, g.blockStride, g.numBlocks);
            return out;
          },
          nb::arg("rank"))
      .def(
          "fetch",
          [](ConvertedFetcher& f, const std::vector<int>& sources, const BlockTable& srcBlocks,
             const BlockTable& dstBlocks, uint64_t first, uint64_t num, int32_t preferred, TransferVia via,
             int64_t timeoutMs) {
            ConvertedReadResult r;
            {
              nb::gil_scoped_release nogil;
              r = f.fetch(sources, {tableOf(srcBlocks), tableOf(dstBlocks), first, num},
                          readOptions(preferred, via, timeoutMs));
            }
            return resultToPython(std::move(r));
          },
          nb::arg("sources"), nb::arg("src_blocks"), nb::arg("dst_blocks"), nb::arg("first_token"),
          nb::arg("num_tokens"), nb::arg("preferred_source"), nb::arg("via"), nb::arg("timeout_ms"))
      .def(
          "close", [](ConvertedFetcher& f) { f = ConvertedFetcher(); }, nb::call_guard<nb::gil_scoped_release>(),
          "Unregisters and closes this member's endpoint (the others' fetches from it fail from then on).");
}

}  // namespace kvcomm::py
