// Converted reads over endpoints, in three phases:
//   1. plan against the sources' own layouts (every check runs here, before anything moves) and find the source
//      blocks the tokens need;
//   2. a source on this host with memory of the local kind is mapped (the peer path's mapping): its pieces are
//      copied straight out of it. Any other source's blocks land, whole, in a landing area of the local kind laid out
//      as the source's regions with the blocks packed (an ordinary Endpoint::read: any transport, every check the
//      owner runs);
//   3. plan again against the landing areas, then copy every piece into the local registration -- the CPU for host
//      memory, one conversion kernel launch for CUDA memory -- only once every source landed or is mapped, so a
//      failure leaves the local memory as it was.
#include "kvcomm/converted_read.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "arena/cuda_support.hpp"
#include "common/bulk_copy.hpp"
#include "common/check.hpp"
#include "common/log.hpp"
#include "device/device_memory.hpp"
#include "endpoint/convert_program.hpp"
#include "endpoint/endpoint_access.hpp"
#include "endpoint/peer_mapping.hpp"
#include "fetch/device_copy.hpp"
#include "kernels/launch.hpp"
#include "kvlayout/conversion_runs.hpp"
#include "kvlayout/kv_layout.hpp"

namespace kvcomm {

namespace {

constexpr const char* kCall = "readConverted";

bool sameLayout(const KvLayout& a, const KvLayout& b) {
  if (a.regions.size() != b.regions.size()) return false;
  for (size_t i = 0; i < a.regions.size(); ++i)
    if (a.regions[i].offset != b.regions[i].offset || a.regions[i].blockBytes != b.regions[i].blockBytes ||
        a.regions[i].numBlocks != b.regions[i].numBlocks)
      return false;
  return true;
}

// Landing memory: host (aligned_alloc) or device memory of one CUDA device (allocated and freed on it).
class LandingMemory {
 public:
  LandingMemory() = default;
  LandingMemory(MemoryKind kind, int device, uint64_t bytes) : kind_(kind), device_(device) {
    if (kind == MemoryKind::Cuda) {
      detail::onDevice(device, [&] { p_ = static_cast<uint8_t*>(detail::deviceAlloc(bytes)); });
    } else {
      p_ = static_cast<uint8_t*>(std::aligned_alloc(4096, bytes));
      if (!p_) KVCOMM_THROW(SystemError, kCall, "cannot allocate a landing area of ", bytes, " bytes");
    }
  }
  ~LandingMemory() { release(); }
  LandingMemory(LandingMemory&& o) noexcept { *this = std::move(o); }
  LandingMemory& operator=(LandingMemory&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      kind_ = o.kind_;
      device_ = o.device_;
    }
    return *this;
  }
  uint8_t* get() const { return p_; }
  MemoryKind kind() const { return kind_; }
  int device() const { return device_; }

 private:
  void release() noexcept {
    if (!p_) return;
    if (kind_ == MemoryKind::Cuda) {
      try {
        detail::onDevice(device_, [p = p_] { detail::deviceFree(p); });
      } catch (const std::exception& e) {
        KVCOMM_WARN(kCall, ": freeing a device landing area: ", e.what());
      }
    } else {
      std::free(p_);
    }
    p_ = nullptr;
  }
  uint8_t* p_ = nullptr;
  MemoryKind kind_ = MemoryKind::Host;
  int device_ = -1;
};

// A source position's landing area: memory of the local registration's kind registered with the endpoint, kept
// between reads of a reader.
struct Landing {
  Endpoint* endpoint = nullptr;
  LandingMemory memory;
  uint64_t capacity = 0;
  uint64_t bytes = 0;
  KvLayout layout;
  Registration registration;

  Landing() = default;
  Landing(Landing&&) = default;
  Landing& operator=(Landing&&) = delete;
  ~Landing() { unregister(); }

  void unregister() noexcept {
    if (!registration.valid()) return;
    if (!registration.registered()) {  // the endpoint closed (it unregistered everything)
      registration = Registration();
      return;
    }
    try {
      endpoint->unregister(registration);
    } catch (const std::exception& e) {
      KVCOMM_WARN(kCall, ": unregistering a landing area: ", e.what());
    }
    registration = Registration();
  }

  // Laid out as `want` (`need` bytes) in memory of `kind` (on `device`): the memory grows (or moves to that kind or
  // device) when it must, the registration follows the layout.
  void prepare(Endpoint& ep, const KvLayout& want, uint64_t need, MemoryKind kind, int device) {
    endpoint = &ep;
    const bool sameMemory = memory.get() && memory.kind() == kind && memory.device() == device;
    if (registration.valid() && sameMemory && bytes == need && sameLayout(layout, want)) return;
    unregister();
    if (!sameMemory || need > capacity) {
      const uint64_t rounded = (need + 4095) / 4096 * 4096;
      memory = LandingMemory();
      memory = LandingMemory(kind, device, rounded);
      capacity = rounded;
    }
    layout = want;
    bytes = need;
    registration = ep.registerMemory(memory.get(), bytes, kind, layout, kind == MemoryKind::Cuda ? device : -1);
  }
};

bool sameContents(const KvDescription& a, const KvDescription& b) {
  if (a.regions.size() != b.regions.size()) return false;
  for (size_t i = 0; i < a.regions.size(); ++i) {
    const KvContents &x = a.regions[i], &y = b.regions[i];
    if (x.elementBytes != y.elementBytes || x.headDim != y.headDim || x.tokensPerBlock != y.tokensPerBlock ||
        x.numHeads != y.numHeads || x.headBegin != y.headBegin || headEndOf(x) != headEndOf(y) || x.order != y.order ||
        x.replicated != y.replicated)
      return false;
  }
  return true;
}

// What a side holds: `given` by the caller, else `registered` (with its registration or in its metadata); both
// given must agree.
KvDescription describedAs(const KvDescription& given, const KvDescription& registered, const std::string& who) {
  if (given.regions.empty()) {
    KVCOMM_CHECK_ARG(!registered.regions.empty(), kCall, who,
                     ": no contents given, and none registered (RegisterOptions::contents carries them)");
    return registered;
  }
  KVCOMM_CHECK_ARG(registered.regions.empty() || sameContents(given, registered), kCall, who,
                   ": the contents given differ from those it was registered with");
  return given;
}

uint64_t extentOf(const KvLayout& l) {
  uint64_t end = 0;
  for (size_t i = 0; i < l.regions.size(); ++i)
    end = std::max(end, l.regions[i].offset + detail::regionExtent(l.regions[i], kCall, i));
  return end;
}

// Pieces of one source made absolute, each checked against both memories (the plans keep them inside the layouts;
// this is the last line before a kernel or memcpy touches memory).
void appendPieces(std::vector<detail::PieceCopy>& out, const std::vector<KvPiece>& pieces, const char* src,
                  uint64_t srcBytes, char* dst, uint64_t dstBytes, size_t source) {
  for (size_t i = 0; i < pieces.size(); ++i) {
    const KvPiece& p = pieces[i];
    if (p.bytes > srcBytes || p.srcOffset > srcBytes - p.bytes || p.bytes > dstBytes ||
        p.dstOffset > dstBytes - p.bytes)
      KVCOMM_THROW(InvalidArgument, kCall, "source ", source, " piece ", i, " (", p.bytes, " bytes from ", p.srcOffset,
                   " to ", p.dstOffset, ") lies outside a memory (source ", srcBytes, ", destination ", dstBytes,
                   " bytes)");
    out.push_back({src + p.srcOffset, dst + p.dstOffset, p.bytes});
  }
}

}  // namespace

struct ConvertedReader::Impl {
  Endpoint* endpoint = nullptr;
  std::mutex mu;
  std::vector<Landing> landings;  // by source position
  // CUDA, per device: the conversion kernel's launcher (its own: an endpoint's copier serves its transfers' threads)
  // and the device's context, which the launches make current on the calling thread.
  struct OnDevice {
    std::unique_ptr<detail::DeviceCopier> copier;
    void* context = nullptr;
  };
  std::map<int, OnDevice> devices;

  ~Impl() {
    for (auto& [device, d] : devices) {
      try {
        detail::onDevice(device, [&c = d.copier] { c.reset(); });
      } catch (const std::exception& e) {
        KVCOMM_WARN(kCall, ": releasing the conversion kernel's staging: ", e.what());
      }
    }
  }

  // Runs `enqueue(copier, stream)` on `device` with the reader's copier of it (made on first use, on a thread of its
  // own) and waits for what it enqueued: the conversion kernel over a program, or the pieces kernel. Every later
  // launch runs on the calling thread with the device's context made current for it and the caller's restored after
  // (arena::CudaContextScope): a thread per read (onDevice) cost more than copying 512 MiB (0.6-1.3 ms a read on an
  // H200, against 0.28 ms of kernel).
  template <typename Enqueue>
  void onDeviceAndWait(int device, Enqueue&& enqueue) {
    OnDevice& d = devices[device];
    if (!d.copier)
      detail::onDevice(device, [&] {
        d.copier = detail::makeDeviceCopier();
        d.context = detail::arena::currentCudaContext();
      });
    detail::arena::CudaContextScope scope(d.context);
    const Stream stream = d.copier->ownStream();
    enqueue(*d.copier, stream);
    d.copier->record(stream)->wait();
  }
};

ConvertedReader::ConvertedReader(Endpoint& endpoint) : impl_(std::make_unique<Impl>()) {
  KVCOMM_CHECK_ARG(endpoint.valid(), "ConvertedReader", "empty endpoint");
  impl_->endpoint = &endpoint;
}
ConvertedReader::~ConvertedReader() = default;
ConvertedReader::ConvertedReader(ConvertedReader&&) noexcept = default;
ConvertedReader& ConvertedReader::operator=(ConvertedReader&&) noexcept = default;

uint64_t ConvertedReader::landingBytes() const {
  KVCOMM_CHECK_ARG(impl_, "ConvertedReader::landingBytes", "empty reader (moved from)");
  std::lock_guard<std::mutex> lock(impl_->mu);
  uint64_t n = 0;
  for (const Landing& l : impl_->landings) n += l.capacity;
  return n;
}

ConvertedReadResult readConverted(Endpoint& endpoint, const Registration& local, const KvDescription& localContents,
                                  const std::vector<ConvertedSource>& sources, const KvTokenRange& tokens,
                                  const ConvertedReadOptions& options) {
  KVCOMM_CHECK_ARG(endpoint.valid(), kCall, "empty endpoint");
  ConvertedReader reader(endpoint);
  return reader.read(local, localContents, sources, tokens, options);
}

ConvertedReadResult ConvertedReader::read(const Registration& local, const KvDescription& givenLocal,
                                          const std::vector<ConvertedSource>& sources, const KvTokenRange& tokens,
                                          const ConvertedReadOptions& options) {
  KVCOMM_CHECK_ARG(impl_, kCall, "empty reader (moved from)");
  std::lock_guard<std::mutex> readerLock(impl_->mu);
  Endpoint& endpoint = *impl_->endpoint;
  KVCOMM_CHECK_ARG(endpoint.valid(), kCall, "the reader's endpoint is closed");
  KVCOMM_CHECK_ARG(local.valid() && local.registered(), kCall, "the local registration is empty or unregistered");
  for (size_t s = 0; s < sources.size(); ++s)
    KVCOMM_CHECK_ARG(sources[s].remote.valid(), kCall, "source ", s, ": empty RemoteMemory");
  // Each side's contents: as given, else as registered (the local registration's options; a source's metadata).
  const KvDescription localContents = describedAs(givenLocal, local.contents(), "the local registration");
  std::vector<KvDescription> described;
  for (size_t s = 0; s < sources.size(); ++s)
    described.push_back(describedAs(sources[s].contents, sources[s].remote.contents(),
                                    detail::cat("source ", s, " (", sources[s].remote.peerName(), ")")));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options.timeoutMs);

  // ---- phase 1: the plan against the sources' layouts (all checks), and the source blocks the tokens need ----
  // As runs (addresses computed where the copy runs) when one block size divides the other, else as pieces.
  std::vector<KvConversionSource> real;
  for (size_t s = 0; s < sources.size(); ++s) real.push_back({sources[s].remote.layout(), described[s]});
  const detail::KvRunPlan runs =
      detail::planConversionRuns(real, local.layout(), localContents, tokens, options.conversion);
  KvConversionPlan first;
  if (!runs.segmented && tokens.numTokens > 0)
    first = planConversion(real, local.layout(), localContents, tokens, options.conversion);
  ConvertedReadResult result;
  const uint64_t sT = runs.sT, dT = runs.dT;
  // The source blocks the tokens need (what a landing source lands, sorted, each once: its position is its block in
  // the landing area) and the local blocks they touch (a failure's failedBlocks). Sorted vectors, not a hash map: a
  // node per block was a quarter of the host's time at 2,048 blocks.
  std::vector<int64_t> remoteIds, localTouched;
  detail::forEachSegment(tokens, sT, dT, [&](uint64_t, uint64_t, int64_t sb, int64_t db) {
    if (sb < 0 || db < 0) return;
    if (remoteIds.empty() || remoteIds.back() != sb) remoteIds.push_back(sb);
    if (localTouched.empty() || localTouched.back() != db) localTouched.push_back(db);
  });
  if (!std::is_sorted(remoteIds.begin(), remoteIds.end())) std::sort(remoteIds.begin(), remoteIds.end());
  remoteIds.erase(std::unique(remoteIds.begin(), remoteIds.end()), remoteIds.end());
  std::vector<int64_t> packed(remoteIds.size());
  for (size_t i = 0; i < packed.size(); ++i) packed[i] = static_cast<int64_t>(i);

  // ---- phase 2: map the same-host sources, land the needed blocks of every other source used ----
  const MemoryKind kind = local.kind();
  const int device = local.device();
  std::vector<Landing>& landings = impl_->landings;
  if (landings.size() < sources.size()) landings.resize(sources.size());
  std::vector<std::unique_ptr<detail::DirectMapping>> mapped(sources.size());  // held until the copies ended
  std::vector<Transfer> reads(sources.size());  // waited for (destroyed) before this call returns
  std::vector<int32_t> landed;
  auto fail = [&](size_t s, const std::string& why) {
    result.status.state = FetchState::Failed;
    result.status.error = detail::cat("source ", s, " (", sources[s].remote.peerName(), "): ", why);
    result.status.failedBlocks = localTouched;
    result.bytesLanded = 0;
    result.sourcesMapped.clear();
    return result;  // transfers are cancelled and waited for, mappings released, before the landing areas are reused
  };
  for (size_t s = 0; s < sources.size(); ++s) {
    if (!runs.used[s] || remoteIds.empty()) continue;
    result.sourcesRead.push_back(static_cast<int32_t>(s));
    // Auto and Peer try the mapping; another host or memory kind is answered without asking the owner (not refused).
    if (options.via == TransferVia::Auto || options.via == TransferVia::Peer) {
      std::string why;
      bool refused = false;
      mapped[s] = detail::EndpointAccess::map(endpoint, local, sources[s].remote, kCall, &why, &refused);
      if (mapped[s]) {
        result.sourcesMapped.push_back(static_cast<int32_t>(s));
        continue;
      }
      if (refused) return fail(s, why);
      if (options.via == TransferVia::Peer)
        KVCOMM_THROW(Unsupported, kCall, "the peer path cannot reach source ", s, " (", sources[s].remote.peerName(),
                     "): ", why);
      KVCOMM_DEBUG(kCall, ": source ", s, " lands over the network: ", why);
    }
    KvLayout want;
    uint64_t at = 0;
    for (const KvRegion& r : sources[s].remote.layout().regions) {
      want.regions.push_back({at, r.blockBytes, r.blockBytes, remoteIds.size()});
      at += r.blockBytes * remoteIds.size();
    }
    Landing& l = landings[s];
    l.prepare(endpoint, want, std::max<uint64_t>(at, 1), kind, device);
    TransferOptions o;
    o.via = options.via;
    reads[s] = endpoint.read(l.registration, sources[s].remote, remoteIds.data(), packed.data(), remoteIds.size(), o);
    result.bytesLanded += at;
    landed.push_back(static_cast<int32_t>(s));
  }
  for (int32_t s : landed) {
    int64_t left = -1;
    if (options.timeoutMs >= 0)
      left = std::max<int64_t>(
          0,
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count());
    FetchStatus st = reads[s].wait(left);
    if (st.state == FetchState::Done) continue;
    return fail(
        s, st.state == FetchState::InProgress ? detail::cat("not landed within ", options.timeoutMs, " ms") : st.error);
  }

  // ---- phase 3: every byte copied into place, from the mappings and the landing areas ----
  char* dst = static_cast<char*>(local.data());
  auto isLanded = [&](size_t s) {
    return std::find(landed.begin(), landed.end(), static_cast<int32_t>(s)) != landed.end();
  };
  std::vector<int64_t> remapped;  // the source table as the landing areas number the blocks
  if (!landed.empty()) {
    remapped = tokens.srcBlocks;
    for (int64_t& b : remapped) {
      auto it = std::lower_bound(remoteIds.begin(), remoteIds.end(), b);
      b = it == remoteIds.end() || *it != b ? -1 : static_cast<int64_t>(it - remoteIds.begin());
    }
  }
  uint64_t bytes = 0;
  if (runs.segmented) {
    // The tables one after another: the sources' (as mapped), the landed sources' (remapped), the destination's.
    std::vector<int64_t> tables = tokens.srcBlocks;
    const uint64_t remappedAt = tables.size();
    tables.insert(tables.end(), remapped.begin(), remapped.end());
    const uint64_t dstAt = tables.size();
    tables.insert(tables.end(), tokens.dstBlocks.begin(), tokens.dstBlocks.end());
    std::vector<detail::ConvertSource> from(sources.size());
    for (int32_t s : result.sourcesMapped) from[s] = {mapped[s]->base, &sources[s].remote.layout(), 0};
    for (int32_t s : landed)
      from[s] = {reinterpret_cast<const char*>(landings[s].memory.get()), &landings[s].layout, remappedAt};
    detail::ConvertProgram p = detail::buildConvert(runs, from, local.layout(), dst, std::move(tables), dstAt,
                                                    tokens.firstToken, tokens.numTokens);
    if (p.launch.numSegments > 0) {
      if (kind == MemoryKind::Cuda) {
        impl_->onDeviceAndWait(device, [&](detail::DeviceCopier& c, Stream stream) {
          c.convert(p.launch, p.runs, p.chunkStart, p.tables, stream);
        });
      } else {
        p.bind();
        detail::hostConvert(p.launch);
      }
    }
    bytes = runs.bytes;
    result.pieces = static_cast<size_t>(p.launch.numSegments) * p.launch.itemsPerSegment;
  } else {
    std::vector<detail::PieceCopy> copies;
    copies.reserve(first.count());
    const uint64_t localBytes = local.bytes();
    for (int32_t s : result.sourcesMapped)
      appendPieces(copies, first.pieces[s], mapped[s]->base, extentOf(sources[s].remote.layout()), dst, localBytes,
                   static_cast<size_t>(s));
    for (int32_t s : result.sourcesMapped)
      for (const KvPiece& p : first.pieces[s]) bytes += p.bytes;
    if (!landed.empty()) {
      std::vector<KvConversionSource> planned;
      for (size_t s = 0; s < sources.size(); ++s)
        planned.push_back({isLanded(s) ? landings[s].layout : sources[s].remote.layout(), described[s]});
      KvTokenRange r = tokens;
      r.srcBlocks = remapped;
      const KvConversionPlan plan = planConversion(planned, local.layout(), localContents, r, options.conversion);
      for (int32_t s : landed) {
        appendPieces(copies, plan.pieces[s], reinterpret_cast<const char*>(landings[s].memory.get()), landings[s].bytes,
                     dst, localBytes, static_cast<size_t>(s));
        for (const KvPiece& p : plan.pieces[s]) bytes += p.bytes;
      }
    }
    if (kind == MemoryKind::Cuda)
      impl_->onDeviceAndWait(device, [&](detail::DeviceCopier& c, Stream stream) { c.copyPieces(copies, stream); });
    else
      for (const detail::PieceCopy& c : copies) detail::bulkCopy(c.dst, c.src, c.bytes);
    result.pieces = copies.size();
  }
  result.status.state = FetchState::Done;
  result.status.bytesDone = result.status.bytesTotal = bytes;
  result.bytesConverted = bytes;
  return result;
}

}  // namespace kvcomm
