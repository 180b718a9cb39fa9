#include "fetch/device_copy.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "common/check.hpp"
#include "common/log.hpp"
#include "kvcomm/device/vector.hpp"

namespace kvcomm::detail {

namespace {

void checkCuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throwError(ErrorCode::CudaError, what, cat(cudaGetErrorName(e), ": ", cudaGetErrorString(e)), __FILE__, __LINE__,
               static_cast<int>(e));
}

// checkCuda naming the call and what it was for ("call (purpose)"), formatted only on failure.
void checkCuda(cudaError_t e, const char* call, const char* purpose) {
  if (e != cudaSuccess) checkCuda(e, cat(call, " (", purpose, ")").c_str());
}

// Copies of one call in as few API calls as possible: 2-D copies one by one, plain ones in one batch (the legacy
// default stream, which the batch API refuses, one by one; a lone plain copy too unless `batchLone`). Errors name
// the call and `purpose`.
void enqueueCopies(const std::vector<CopyDesc>& descs, cudaStream_t s, cudaMemcpyKind kind, unsigned batchFlags,
                   bool batchLone, const char* purpose) {
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  for (const CopyDesc& c : descs) {
    if (c.height > 1) {
      checkCuda(cudaMemcpy2DAsync(c.dst, c.dpitch, c.src, c.spitch, c.width, c.height, kind, s), "cudaMemcpy2DAsync",
                purpose);
    } else if (s == nullptr || (!batchLone && descs.size() == 1)) {
      checkCuda(cudaMemcpyAsync(c.dst, c.src, c.width, kind, s), "cudaMemcpyAsync", purpose);
    } else {
      dsts.push_back(c.dst);
      srcs.push_back(c.src);
      sizes.push_back(c.width);
    }
  }
  if (dsts.empty()) return;
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  attr.flags = batchFlags;
  size_t first = 0;
  checkCuda(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attr, &first, 1, s),
            "cudaMemcpyBatchAsync", purpose);
}

class CudaEvent : public DeviceEvent {
 public:
  explicit CudaEvent(cudaStream_t s) {
    checkCuda(cudaEventCreateWithFlags(&ev_, cudaEventDisableTiming), "cudaEventCreateWithFlags");
    cudaError_t e = cudaEventRecord(ev_, s);
    if (e != cudaSuccess) {
      cudaEventDestroy(ev_);
      checkCuda(e, "cudaEventRecord");
    }
  }
  ~CudaEvent() override { cudaEventDestroy(ev_); }
  bool done() override {
    cudaError_t e = cudaEventQuery(ev_);
    if (e == cudaErrorNotReady) return false;
    checkCuda(e, "cudaEventQuery");
    return true;
  }
  void wait() override { checkCuda(cudaEventSynchronize(ev_), "cudaEventSynchronize"); }
  cudaEvent_t get() const { return ev_; }

 private:
  cudaEvent_t ev_ = nullptr;
};

// Pair lists for the gather kernel (and piece lists for the conversion kernel). Lists of up to kMappedItems warp items
// stay in pinned, device-mapped host memory that the kernel reads over PCIe (no host-to-device copy in the stream
// before it); longer ones are copied into device memory in stream order first, because then every warp item re-reading
// its ids over PCIe costs more than the copy (measured on H200: 100k items of 4 KiB ran at 0.75 of the copy engine
// mapped, 0.83 copied). Two slots in turn: a slot is rewritten only after the kernel that read it finished.
class ListStaging {
 public:
  static constexpr int64_t kMappedItems = 32768;

  ~ListStaging() {
    drain();
    for (Slot& s : slots_) {
      if (s.host) cudaFreeHost(s.host);
      if (s.device) cudaFree(s.device);
    }
  }

  // Fills the next slot with `parts`, one after another, for a kernel enqueued next on `stream`; returns where that
  // kernel reads the first byte: the pinned slot itself (`mapped`) or device memory the slot is copied into first.
  char* stage(std::initializer_list<std::pair<const void*, size_t>> parts, bool mapped, cudaStream_t stream) {
    Slot& slot = slots_[next_];
    if (slot.reader) slot.reader->wait();
    size_t bytes = 0;
    for (const auto& p : parts) bytes += p.second;
    if (bytes > slot.capacity) {
      if (slot.host) cudaFreeHost(slot.host);
      if (slot.device) cudaFree(slot.device);
      slot.host = slot.device = nullptr;
      slot.capacity = 0;
      size_t cap = std::max<size_t>(bytes, 1u << 20);
      checkCuda(cudaHostAlloc(&slot.host, cap, cudaHostAllocMapped | cudaHostAllocPortable),
                "cudaHostAlloc (fetch ids)");
      checkCuda(cudaMalloc(&slot.device, cap), "cudaMalloc (fetch ids)");
      slot.capacity = cap;
    }
    char* h = static_cast<char*>(slot.host);
    for (const auto& p : parts) {
      std::memcpy(h, p.first, p.second);
      h += p.second;
    }
    void* d = nullptr;
    if (mapped) {
      checkCuda(cudaHostGetDevicePointer(&d, slot.host, 0), "cudaHostGetDevicePointer (fetch ids)");
    } else {
      checkCuda(cudaMemcpyAsync(slot.device, slot.host, bytes, cudaMemcpyHostToDevice, stream),
                "cudaMemcpyAsync (fetch ids)");
      d = slot.device;
    }
    return static_cast<char*>(d);
  }
  // The kernel reading the slot just staged was enqueued on `s`.
  void launched(cudaStream_t s) {
    slots_[next_].reader = std::make_unique<CudaEvent>(s);
    next_ = (next_ + 1) % kSlots;
  }
  void drain() noexcept {
    try {
      for (Slot& s : slots_)
        if (s.reader) s.reader->wait();
    } catch (const std::exception& e) {
      KVCOMM_WARN("fetch staging drain: ", e.what());
    }
  }

 private:
  static constexpr int kSlots = 2;
  struct Slot {
    void* host = nullptr;
    void* device = nullptr;
    size_t capacity = 0;
    std::unique_ptr<CudaEvent> reader;  // the last kernel that read this slot
  };
  Slot slots_[kSlots];
  int next_ = 0;
};

// A reused plan's pairs in device memory, with the event that marks their upload (a launch on another stream waits
// for it). cudaFree waits for the kernels still reading them.
class CudaResidentPairs final : public ResidentPairs {
 public:
  CudaResidentPairs(size_t bytes, cudaStream_t s) : stream(s) {
    checkCuda(cudaMalloc(&memory, bytes), "cudaMalloc (plan pairs)");
    cudaError_t e = cudaEventCreateWithFlags(&uploaded, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      cudaFree(memory);
      checkCuda(e, "cudaEventCreateWithFlags (plan pairs)");
    }
  }
  ~CudaResidentPairs() override {
    cudaEventDestroy(uploaded);
    cudaFree(memory);
  }
  CudaResidentPairs(const CudaResidentPairs&) = delete;
  CudaResidentPairs& operator=(const CudaResidentPairs&) = delete;

  void* memory = nullptr;
  cudaEvent_t uploaded = nullptr;
  cudaStream_t stream;
};

class CudaCopier : public DeviceCopier {
 public:
  static constexpr uint64_t kPieceChunk = 64u << 10;

  ~CudaCopier() override {
    drain();
    if (own_) cudaStreamDestroy(own_);
  }

  void launchPairs(FetchLaunch f, const int64_t* src, const int64_t* dst, const int32_t* rank, size_t n,
                   Stream stream) override {
    auto s = reinterpret_cast<cudaStream_t>(stream);
    f.numPairs = static_cast<int64_t>(n);
    if (n <= static_cast<size_t>(kInlineFetchPairs)) {
      f.inlineCount = static_cast<int32_t>(n);
      std::copy(src, src + n, f.inlineSrc);
      std::copy(dst, dst + n, f.inlineDst);
      std::copy(rank, rank + n, f.inlineRank);
      launchFetch(f, s);
      return;
    }
    f.inlineCount = 0;
    const int64_t items = static_cast<int64_t>(n) * f.h.numRegions * f.chunksPerBlock;
    char* d = staging_.stage({{src, n * sizeof(int64_t)}, {dst, n * sizeof(int64_t)}, {rank, n * sizeof(int32_t)}},
                             items <= ListStaging::kMappedItems, s);
    f.srcBlocks = reinterpret_cast<int64_t*>(d);
    f.dstBlocks = reinterpret_cast<int64_t*>(d + n * sizeof(int64_t));
    f.srcRanks = reinterpret_cast<int32_t*>(d + 2 * n * sizeof(int64_t));
    launchFetch(f, s);
    staging_.launched(s);
  }

  std::unique_ptr<ResidentPairs> upload(const int64_t* src, const int64_t* dst, const int32_t* rank, size_t n,
                                        Stream stream) override {
    auto s = reinterpret_cast<cudaStream_t>(stream);
    const size_t ids = n * sizeof(int64_t);
    auto r = std::make_unique<CudaResidentPairs>(2 * ids + n * sizeof(int32_t), s);
    char* d = static_cast<char*>(r->memory);
    checkCuda(cudaMemcpyAsync(d, src, ids, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync (plan pairs)");
    checkCuda(cudaMemcpyAsync(d + ids, dst, ids, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync (plan pairs)");
    checkCuda(cudaMemcpyAsync(d + 2 * ids, rank, n * sizeof(int32_t), cudaMemcpyHostToDevice, s),
              "cudaMemcpyAsync (plan pairs)");
    checkCuda(cudaEventRecord(r->uploaded, s), "cudaEventRecord (plan pairs)");
    r->src = reinterpret_cast<const int64_t*>(d);
    r->dst = reinterpret_cast<const int64_t*>(d + ids);
    r->rank = reinterpret_cast<const int32_t*>(d + 2 * ids);
    r->count = n;
    return r;
  }

  void launchResident(FetchLaunch f, const ResidentPairs& pairs, Stream stream) override {
    auto s = reinterpret_cast<cudaStream_t>(stream);
    const auto& r = static_cast<const CudaResidentPairs&>(pairs);
    if (s != r.stream) checkCuda(cudaStreamWaitEvent(s, r.uploaded, 0), "cudaStreamWaitEvent (plan pairs)");
    f.numPairs = static_cast<int64_t>(r.count);
    f.inlineCount = 0;
    f.srcBlocks = r.src;
    f.dstBlocks = r.dst;
    f.srcRanks = r.rank;
    launchFetch(f, s);
  }

  void copyPieces(const std::vector<PieceCopy>& pieces, Stream stream) override {
    auto s = reinterpret_cast<cudaStream_t>(stream);
    // Long pieces split, so that one warp's piece is never much longer than another's; the vector width is the
    // widest dividing every address and length (a chunk boundary keeps it: kPieceChunk is a multiple of 16).
    std::vector<PieceCopy> items;
    items.reserve(pieces.size());
    uint64_t bits = 0;
    for (const PieceCopy& p : pieces) {
      bits |= reinterpret_cast<uintptr_t>(p.src) | reinterpret_cast<uintptr_t>(p.dst) | p.bytes;
      for (uint64_t at = 0; at < p.bytes; at += kPieceChunk)
        items.push_back({p.src + at, p.dst + at, std::min<uint64_t>(kPieceChunk, p.bytes - at)});
    }
    if (items.empty()) return;
    PieceLaunch l{};
    l.vec = commonAlignment(bits);
    l.numPieces = static_cast<int64_t>(items.size());
    l.pieces = reinterpret_cast<const PieceCopy*>(staging_.stage({{items.data(), items.size() * sizeof(PieceCopy)}},
                                                                 l.numPieces <= ListStaging::kMappedItems, s));
    launchPieces(l, s);
    staging_.launched(s);
  }

  void convert(ConvertLaunch l, const std::vector<ConvertRun>& runs, const std::vector<uint32_t>& chunkStart,
               const std::vector<int64_t>& tables, Stream stream) override {
    auto s = reinterpret_cast<cudaStream_t>(stream);
    // One staged list: the runs, the chunk starts (padded to 8 bytes), the tables; copied into device memory (each
    // item reads its run and two table entries).
    static const uint64_t kZero = 0;
    const size_t rb = runs.size() * sizeof(ConvertRun), cb = chunkStart.size() * sizeof(uint32_t);
    const size_t pad = (8 - cb % 8) % 8;
    char* d = staging_.stage(
        {{runs.data(), rb}, {chunkStart.data(), cb}, {&kZero, pad}, {tables.data(), tables.size() * sizeof(int64_t)}},
        false, s);
    l.runs = reinterpret_cast<const ConvertRun*>(d);
    l.chunkStart = reinterpret_cast<const uint32_t*>(d + rb);
    l.tables = reinterpret_cast<const int64_t*>(d + rb + cb + pad);
    launchConvert(l, s);
    staging_.launched(s);
  }

  void copies(const std::vector<CopyDesc>& descs, Stream stream) override {
    enqueueCopies(descs, reinterpret_cast<cudaStream_t>(stream), cudaMemcpyDeviceToDevice,
                  cudaMemcpyFlagPreferOverlapWithCompute, true, "fetch run");
  }

  std::unique_ptr<DeviceEvent> record(Stream stream) override {
    return std::make_unique<CudaEvent>(reinterpret_cast<cudaStream_t>(stream));
  }

  bool capturing(Stream stream) override {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(stream), &st);
    return e == cudaSuccess && st != cudaStreamCaptureStatusNone;
  }

  Stream ownStream() override {
    if (!own_) checkCuda(cudaStreamCreateWithFlags(&own_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return reinterpret_cast<Stream>(own_);
  }

  void drain() noexcept override {
    staging_.drain();
    if (own_) cudaStreamSynchronize(own_);
  }

 private:
  ListStaging staging_;
  cudaStream_t own_ = nullptr;
};

class CudaHostStaging : public HostStaging {
 public:
  CudaHostStaging(int device, size_t slotBytes, int slots) : bytes_(slotBytes), events_(static_cast<size_t>(slots)) {
    checkCuda(cudaSetDevice(device), "cudaSetDevice (fetch staging)");
    checkCuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    cudaError_t e = cudaHostAlloc(&host_, slotBytes * static_cast<size_t>(slots), cudaHostAllocDefault);
    if (e != cudaSuccess) {
      cudaStreamDestroy(stream_);
      checkCuda(e, "cudaHostAlloc (fetch network staging)");
    }
  }
  ~CudaHostStaging() override {
    for (auto& ev : events_)
      if (ev) {
        try {
          ev->wait();
        } catch (const std::exception& e) {
          KVCOMM_WARN("fetch staging teardown: ", e.what());
        }
      }
    events_.clear();
    cudaFreeHost(host_);
    cudaStreamDestroy(stream_);
  }
  size_t slotBytes() const override { return bytes_; }
  int slots() const override { return static_cast<int>(events_.size()); }
  char* slot(int i) override { return static_cast<char*>(host_) + static_cast<size_t>(i) * bytes_; }
  void toHost(int i, const std::vector<CopyDesc>& copies) override {
    enqueueCopies(copies, stream_, cudaMemcpyDefault, 0, false, "fetch staging, device to host");
    events_[static_cast<size_t>(i)] = std::make_unique<CudaEvent>(stream_);
  }
  Stream ownStream() override { return reinterpret_cast<Stream>(stream_); }
  void toDevice(int i, const std::vector<CopyDesc>& copies, Stream stream) override {
    cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
    enqueueCopies(copies, s, cudaMemcpyDefault, 0, false, "fetch staging, host to device");
    events_[static_cast<size_t>(i)] = std::make_unique<CudaEvent>(s);
  }
  bool slotDone(int i) override {
    auto& ev = events_[static_cast<size_t>(i)];
    return !ev || ev->done();
  }
  void waitSlot(int i) override {
    auto& ev = events_[static_cast<size_t>(i)];
    if (ev) ev->wait();
  }

 private:
  size_t bytes_;
  void* host_ = nullptr;
  cudaStream_t stream_ = nullptr;
  std::vector<std::unique_ptr<CudaEvent>> events_;
};

}  // namespace

std::unique_ptr<DeviceCopier> makeDeviceCopier() {
  return std::make_unique<CudaCopier>();
}

std::unique_ptr<HostStaging> makeHostStaging(int device, size_t slotBytes, int slots) {
  return std::make_unique<CudaHostStaging>(device, slotBytes, slots);
}

void bindCudaDevice(int device) {
  checkCuda(cudaSetDevice(device), "cudaSetDevice (fetch network thread)");
}

}  // namespace kvcomm::detail
