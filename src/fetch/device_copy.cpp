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

// Pinned host + device memory for pair lists; a slot is reused once the kernel that read it finished.
class PairStaging {
 public:
  ~PairStaging() { release(); }

  // Returns device pointers to the three arrays, filled in stream order.
  void stage(const int64_t* src, const int64_t* dst, const int32_t* rank, size_t n, cudaStream_t s, int64_t** dSrc,
             int64_t** dDst, int32_t** dRank) {
    size_t bytes = n * (2 * sizeof(int64_t) + sizeof(int32_t));
    if (last_) last_->wait();  // the previous launch's copy has finished reading the pinned side
    if (bytes > capacity_) {
      if (deviceUser_) deviceUser_->wait();
      release();
      size_t cap = std::max<size_t>(bytes, 1u << 20);
      checkCuda(cudaHostAlloc(&host_, cap, cudaHostAllocDefault), "cudaHostAlloc (fetch staging)");
      checkCuda(cudaMalloc(&device_, cap), "cudaMalloc (fetch staging)");
      capacity_ = cap;
    } else if (deviceUser_) {
      deviceUser_->wait();  // the previous kernel has finished reading the device side
    }
    char* h = static_cast<char*>(host_);
    std::memcpy(h, src, n * sizeof(int64_t));
    std::memcpy(h + n * sizeof(int64_t), dst, n * sizeof(int64_t));
    std::memcpy(h + 2 * n * sizeof(int64_t), rank, n * sizeof(int32_t));
    checkCuda(cudaMemcpyAsync(device_, host_, bytes, cudaMemcpyHostToDevice, s), "cudaMemcpyAsync (fetch ids)");
    last_ = std::make_unique<CudaEvent>(s);
    char* d = static_cast<char*>(device_);
    *dSrc = reinterpret_cast<int64_t*>(d);
    *dDst = reinterpret_cast<int64_t*>(d + n * sizeof(int64_t));
    *dRank = reinterpret_cast<int32_t*>(d + 2 * n * sizeof(int64_t));
  }
  void launched(cudaStream_t s) { deviceUser_ = std::make_unique<CudaEvent>(s); }
  void drain() noexcept {
    try {
      if (last_) last_->wait();
      if (deviceUser_) deviceUser_->wait();
    } catch (const std::exception& e) {
      KVCOMM_WARN("fetch staging drain: ", e.what());
    }
  }

 private:
  void release() noexcept {
    if (host_) cudaFreeHost(host_);
    if (device_) cudaFree(device_);
    host_ = device_ = nullptr;
    capacity_ = 0;
  }
  void* host_ = nullptr;
  void* device_ = nullptr;
  size_t capacity_ = 0;
  std::unique_ptr<CudaEvent> last_;        // H2D copy out of the pinned side
  std::unique_ptr<CudaEvent> deviceUser_;  // kernel reading the device side
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
    staging_.stage(src, dst, rank, n, s, &dSrc, &dDst, &dRank);
    f.srcBlocks = dSrc;
    f.dstBlocks = dDst;
    f.srcRanks = dRank;
    launchFetch(f, s);
    staging_.launched(s);
  }

  void copies(const std::vector<CopyDesc>& descs, Stream stream) override {
    auto s = reinterpret_cast<cudaStream_t>(stream);
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<size_t> sizes;
    for (const CopyDesc& c : descs) {
      if (c.height > 1) {
        checkCuda(cudaMemcpy2DAsync(c.dst, c.dpitch, c.src, c.spitch, c.width, c.height, cudaMemcpyDeviceToDevice, s),
                  "cudaMemcpy2DAsync (fetch run)");
      } else if (s == nullptr) {  // the batch API refuses the legacy default stream
        checkCuda(cudaMemcpyAsync(c.dst, c.src, c.width, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync (fetch run)");
      } else {
        dsts.push_back(c.dst);
        srcs.push_back(c.src);
        sizes.push_back(c.width);
      }
    }
    if (dsts.empty()) return;
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t first = 0;
    checkCuda(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attr, &first, 1, s),
              "cudaMemcpyBatchAsync (fetch runs)");
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

// Copies of one call as few API calls as possible: 2-D copies one by one, plain ones in one batch.
void enqueueCopies(const std::vector<CopyDesc>& descs, cudaStream_t s, const char* what) {
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  for (const CopyDesc& c : descs) {
    if (c.height > 1) {
      checkCuda(cudaMemcpy2DAsync(c.dst, c.dpitch, c.src, c.spitch, c.width, c.height, cudaMemcpyDefault, s), what);
    } else if (s == nullptr || descs.size() == 1) {
      checkCuda(cudaMemcpyAsync(c.dst, c.src, c.width, cudaMemcpyDefault, s), what);
    } else {
      dsts.push_back(c.dst);
      srcs.push_back(c.src);
      sizes.push_back(c.width);
    }
  }
  if (dsts.empty()) return;
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  size_t first = 0;
  checkCuda(cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), dsts.size(), &attr, &first, 1, s), what);
}

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
    enqueueCopies(copies, stream_, "cudaMemcpyAsync (fetch staging, device to host)");
    events_[static_cast<size_t>(i)] = std::make_unique<CudaEvent>(stream_);
  }
  Stream ownStream() override { return reinterpret_cast<Stream>(stream_); }
  void toDevice(int i, const std::vector<CopyDesc>& copies, Stream stream) override {
    cudaStream_t s = reinterpret_cast<cudaStream_t>(stream);
    enqueueCopies(copies, s, "cudaMemcpyAsync (fetch staging, host to device)");
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
