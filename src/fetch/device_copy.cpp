#include "fetch/device_copy.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "common/check.hpp"
#include "common/log.hpp"

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

// Pair lists for the gather kernel. Lists of up to kMappedItems warp items stay in pinned, device-mapped host memory
// that the kernel reads over PCIe (no host-to-device copy in the stream before it); longer ones are copied into
// device memory in stream order first, because then every warp item re-reading its ids over PCIe costs more than
// the copy (measured on H200: 100k items of 4 KiB ran at 0.75 of the copy engine mapped, 0.83 copied). Two slots in
// turn: a slot is rewritten only after the kernel that read it finished.
class PairStaging {
 public:
  static constexpr int64_t kMappedItems = 32768;

  ~PairStaging() {
    drain();
    for (Slot& s : slots_) {
      if (s.host) cudaFreeHost(s.host);
      if (s.device) cudaFree(s.device);
    }
  }

  // Fills the next slot (for a launch of `items` warp items, enqueued on `stream`); returns pointers the kernel can
  // read.
  void stage(const int64_t* src, const int64_t* dst, const int32_t* rank, size_t n, int64_t items, cudaStream_t stream,
             int64_t** dSrc, int64_t** dDst, int32_t** dRank) {
    Slot& slot = slots_[next_];
    if (slot.reader) slot.reader->wait();
    size_t bytes = n * (2 * sizeof(int64_t) + sizeof(int32_t));
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
    std::memcpy(h, src, n * sizeof(int64_t));
    std::memcpy(h + n * sizeof(int64_t), dst, n * sizeof(int64_t));
    std::memcpy(h + 2 * n * sizeof(int64_t), rank, n * sizeof(int32_t));
    void* d = nullptr;
    if (items <= kMappedItems) {
      checkCuda(cudaHostGetDevicePointer(&d, slot.host, 0), "cudaHostGetDevicePointer (fetch ids)");
    } else {
      checkCuda(cudaMemcpyAsync(slot.device, slot.host, bytes, cudaMemcpyHostToDevice, stream),
                "cudaMemcpyAsync (fetch ids)");
      d = slot.device;
    }
    char* dc = static_cast<char*>(d);
    *dSrc = reinterpret_cast<int64_t*>(dc);
    *dDst = reinterpret_cast<int64_t*>(dc + n * sizeof(int64_t));
    *dRank = reinterpret_cast<int32_t*>(dc + 2 * n * sizeof(int64_t));
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

class CudaCopier : public DeviceCopier {
 public:
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
    int64_t *dSrc = nullptr, *dDst = nullptr;
    int32_t* dRank = nullptr;
    staging_.stage(src, dst, rank, n, static_cast<int64_t>(n) * f.h.numRegions * f.chunksPerBlock, s, &dSrc, &dDst,
                   &dRank);
    f.srcBlocks = dSrc;
    f.dstBlocks = dDst;
    f.srcRanks = dRank;
    launchFetch(f, s);
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
  PairStaging staging_;
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
