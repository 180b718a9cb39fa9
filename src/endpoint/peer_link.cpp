#include "endpoint/peer_link.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "arena/cuda_support.hpp"
#include "common/check.hpp"
#include "common/log.hpp"
#include "device/device_memory.hpp"

namespace kvcomm::detail {

namespace {

// One pair's memory as the peer transport sees it: member 0 the destination, member 1 the source; the mapped side's
// uses hold the mapping (its unmap waits for them).
class PairMemory : public PeerMemory {
 public:
  PairMemory(MemoryKind kind, char* dst, char* src, std::shared_ptr<PeerMapping> mapping)
      : kind_(kind), dst_(dst), src_(src), mapping_(std::move(mapping)) {}
  MemoryKind kind() const override { return kind_; }
  int rank() const override { return 0; }
  char* local() const override { return dst_; }
  char* peer(int rank) const override { return rank == 1 ? src_ : dst_; }
  bool isMapped(int rank) const override { return rank == 0 || (rank == 1 && mapping_->mapped()); }
  std::unique_ptr<Use> use(const char* call) const override { return mapping_->use(call); }

 private:
  MemoryKind kind_;
  char* dst_;
  char* src_;
  std::shared_ptr<PeerMapping> mapping_;
};

// The words of one direction's tables, back to back: source regions [2 * n], destination regions [n], peers [2],
// the backed word [1] (granShift 63: one bit says whether the pair may be touched at all).
struct TableLayout {
  size_t n;
  size_t srcAt() const { return 0; }
  size_t dstAt() const { return 2 * n * 4; }
  size_t peersAt() const { return dstAt() + n * 4; }
  size_t backedAt() const { return peersAt() + 2; }
  size_t words() const { return backedAt() + 1; }
};
static_assert(sizeof(FetchRegionView) == 4 * sizeof(uint64_t));

}  // namespace

PeerLink::PeerLink(const PeerLinkSpec& spec) : spec_(spec) {
  onDevice(spec_.kind == MemoryKind::Cuda ? spec_.device : -1, [&] {
    if (spec_.kind == MemoryKind::Cuda) cudaCtx_ = arena::currentCudaContext();
    build(read_, false);
    build(write_, true);
  });
}

PeerLink::~PeerLink() {
  disable();
  if (spec_.kind != MemoryKind::Cuda) return;
  arena::CudaContextScope scope(cudaCtx_);
  for (Direction* d : {&read_, &write_}) {
    if (d->words) deviceFree(d->words);
    d->claims.reset();  // device memory of this context: freed inside its scope
    d->error.reset();
  }
}

void PeerLink::build(Direction& d, bool write) {
  const MemberLayouts& t = write ? *spec_.writeTable : *spec_.table;
  char* remote = spec_.mapping->base();
  char* dst = write ? remote : spec_.localBase;
  char* src = write ? spec_.localBase : remote;
  d.memory = std::make_shared<PairMemory>(spec_.kind, dst, src, spec_.mapping);
  TableLayout L{t.numRegions};
  std::vector<uint64_t> w(L.words());
  std::memcpy(w.data() + L.srcAt(), t.views.data(), 2 * t.numRegions * sizeof(FetchRegionView));
  std::memcpy(w.data() + L.dstAt(), t.views.data(), t.numRegions * sizeof(FetchRegionView));
  w[L.peersAt()] = reinterpret_cast<uint64_t>(dst);
  w[L.peersAt() + 1] = reinterpret_cast<uint64_t>(src);
  w[L.backedAt()] = 1;
  if (spec_.kind == MemoryKind::Cuda) {
    d.words = static_cast<uint64_t*>(deviceAlloc(w.size() * sizeof(uint64_t)));
    hostToDevice(d.words, w.data(), w.size() * sizeof(uint64_t));
  } else {
    d.hostWords = std::move(w);
    d.words = d.hostWords.data();
  }
  d.error = std::make_unique<ErrorRecordMemory>(spec_.kind);
  PeerContext& c = d.ctx;
  c.memory = d.memory;
  c.table = &t;
  FetchDeviceHandle& h = c.handle;
  h.srcRegions = reinterpret_cast<const FetchRegionView*>(d.words + L.srcAt());
  h.dstRegions = reinterpret_cast<const FetchRegionView*>(d.words + L.dstAt());
  h.peers = d.words + L.peersAt();
  h.local = dst;
  h.backed = d.words + L.backedAt();
  // Block ids are checked against each side's own regions; this bound only has to hold every valid range.
  uint64_t extent = spec_.localBytes;
  for (size_t m = 0; m < 2; ++m)
    for (size_t j = 0; j < t.numRegions; ++j) {
      const FetchRegionView& v = t.views[m * t.numRegions + j];
      extent = std::max<uint64_t>(extent, v.offset + (v.numBlocks - 1) * v.blockStride + v.blockBytes);
    }
  h.capacity = extent;
  h.numRegions = static_cast<int32_t>(t.numRegions);
  h.size = 2;
  h.rank = 0;
  h.granShift = 63;
  c.error = d.error->get();
  if (spec_.kind == MemoryKind::Cuda) {
    uint64_t blocks = 1;  // the destination's (member 0's) blocks
    for (size_t j = 0; j < t.numRegions; ++j) blocks = std::max<uint64_t>(blocks, t.views[j].numBlocks);
    d.claims = std::make_unique<DeviceWords>(blocks);
    c.claims = d.claims->get();
    c.numClaims = static_cast<int64_t>(blocks);
  }
  c.copier = spec_.copier;
  c.pids = {static_cast<int>(::getpid()), spec_.remotePid};
  c.names = {"", spec_.remoteName};
  d.transport = makePeerTransport(c);
}

void PeerLink::disable() noexcept {
  if (disabled_.exchange(true)) return;
  try {
    for (Direction* d : {&read_, &write_}) {
      if (!d->words) continue;
      TableLayout L{d->ctx.table->numRegions};
      if (spec_.kind == MemoryKind::Cuda) {
        arena::CudaContextScope scope(cudaCtx_);
        deviceMemset(d->words + L.backedAt(), 0, sizeof(uint64_t));  // and synchronises the context
      } else {
        __atomic_store_n(d->words + L.backedAt(), 0, __ATOMIC_RELEASE);
      }
    }
    std::unique_lock<std::shared_mutex> wait(runs_);  // CPU runs that started have ended
  } catch (const std::exception& e) {
    KVCOMM_DEBUG("endpoint: disabling a peer link: ", e.what());
  }
}

DeviceError PeerLink::pollError() {
  arena::CudaContextScope scope(cudaCtx_);
  DeviceError e = readDeviceError(spec_.kind, read_.ctx.error);
  if (e.kind != DeviceErrorKind::None) return e;
  return readDeviceError(spec_.kind, write_.ctx.error);
}

}  // namespace kvcomm::detail
