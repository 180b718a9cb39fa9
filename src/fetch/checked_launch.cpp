#include "fetch/checked_launch.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "common/check.hpp"
#include "common/log.hpp"
#include "kvcomm/limits.hpp"

namespace kvcomm::detail {

static_assert(kMaxCheckedRequests == static_cast<int>(limits::kMaxDeviceCheckedRequests));
static_assert(limits::kMaxFetchPairs < (size_t{1} << 31), "refusal words hold pair indices in 32 bits");

namespace {

void checkCuda(cudaError_t e, const char* call, const char* purpose) {
  if (e != cudaSuccess)
    throwError(ErrorCode::CudaError, cat(call, " (", purpose, ")"),
               cat(cudaGetErrorName(e), ": ", cudaGetErrorString(e)), __FILE__, __LINE__, static_cast<int>(e));
}

// Device memory (device = true) or pinned, device-mapped host memory; freed with the object.
class Memory {
 public:
  Memory() = default;
  Memory(size_t bytes, bool device) : device_(device) {
    if (device)
      checkCuda(cudaMalloc(&p_, bytes), "cudaMalloc", "fetch checked on the device");
    else
      checkCuda(cudaHostAlloc(&p_, bytes, cudaHostAllocMapped | cudaHostAllocPortable), "cudaHostAlloc",
                "fetch checked on the device");
    bytes_ = bytes;
  }
  ~Memory() { reset(); }
  Memory(Memory&& o) noexcept { *this = std::move(o); }
  Memory& operator=(Memory&& o) noexcept {
    if (this != &o) {
      reset();
      std::swap(p_, o.p_);
      std::swap(bytes_, o.bytes_);
      device_ = o.device_;
    }
    return *this;
  }
  void reset() noexcept {
    if (!p_) return;
    if (device_)
      cudaFree(p_);
    else
      cudaFreeHost(p_);
    p_ = nullptr;
    bytes_ = 0;
  }
  char* get() const { return static_cast<char*>(p_); }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
  bool device_ = true;
};

class Event {
 public:
  Event() { checkCuda(cudaEventCreateWithFlags(&ev_, cudaEventDisableTiming), "cudaEventCreateWithFlags", "fetch"); }
  ~Event() { cudaEventDestroy(ev_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return ev_; }

 private:
  cudaEvent_t ev_ = nullptr;
};

// Where the GPU reads `p` (an id array of `count` entries): itself for device, managed and pinned memory (its
// device address), nullptr for pageable memory (staged).
const int64_t* gpuReadable(const int64_t* p, int device, size_t request, const char* which) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // not an error to keep: the pointer is just unknown to CUDA
    return nullptr;
  }
  switch (a.type) {
    case cudaMemoryTypeDevice:
      KVCOMM_CHECK_ARG(a.device == device, "Fetcher::fetch (checked on the device)", "request ", request, ": ", which,
                       " are in the memory of GPU ", a.device, ", but the buffer is on GPU ", device);
      return p;
    case cudaMemoryTypeManaged:
      return p;
    case cudaMemoryTypeHost:
      return static_cast<const int64_t*>(a.devicePointer);  // nullptr if it is not mapped for this device
    default:
      return nullptr;
  }
}

// Makes `device` current for the scope, restoring the caller's afterwards.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    checkCuda(cudaGetDevice(&saved_), "cudaGetDevice", "fetch staging");
    if (saved_ != device) checkCuda(cudaSetDevice(device), "cudaSetDevice", "fetch staging");
  }
  ~DeviceScope() { cudaSetDevice(saved_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int saved_ = 0;
};

class CudaCheckedLauncher : public CheckedLauncher {
 public:
  explicit CudaCheckedLauncher(size_t numClaims) {
    checkCuda(cudaGetDevice(&device_), "cudaGetDevice", "fetch checked on the device");
    words_ = Memory(sizeof(CheckWords), true);
    checkCuda(cudaMemset(words_.get(), 0xff, sizeof(CheckWords)), "cudaMemset", "fetch refusal words");
    claims_ = Memory(std::max<size_t>(numClaims, 1) * sizeof(uint32_t), true);
    checkCuda(cudaMemset(claims_.get(), 0, claims_.bytes()), "cudaMemset", "fetch claim words");
  }
  ~CudaCheckedLauncher() override { drain(); }

  CheckedLaunchInfo launch(FetchLaunch f, const std::vector<CheckedIds>& requests, int myRank, uint64_t dstLimit,
                           Stream stream) override {
    auto s = reinterpret_cast<cudaStream_t>(stream);
    CheckedLaunchInfo info;
    CheckLaunch c{};
    size_t total = 0;
    for (const CheckedIds& q : requests) total += q.count;
    if (total == 0) return info;
    KVCOMM_CHECK_ARG(dstLimit <= claims_.bytes() / sizeof(uint32_t), "fetch (checked on the device)",
                     "internal: ", dstLimit, " destination blocks but claim words for fewer");
    Slot& slot = slots_[next_];
    if (slot.used) checkCuda(cudaEventSynchronize(slot.done.get()), "cudaEventSynchronize", "fetch staging slot");
    // Where each id array is read from; pageable ones are copied into the slot's pinned staging.
    const int64_t* where[kMaxCheckedRequests][2];
    size_t staged = 0;
    for (size_t k = 0; k < requests.size(); ++k)
      for (int side = 0; side < 2; ++side) {
        const int64_t* ids = side ? requests[k].dst : requests[k].src;
        where[k][side] = requests[k].count ? gpuReadable(ids, device_, k, side ? "dstBlocks" : "srcBlocks") : ids;
        if (!where[k][side]) staged += requests[k].count;
      }
    if (slot.out.bytes() < total * kPairBytes || (staged && slot.staging.bytes() < staged * sizeof(int64_t))) {
      DeviceScope scope(device_);  // the fetcher's GPU, whatever the calling thread has current
      if (slot.out.bytes() < total * kPairBytes)
        slot.out = Memory(std::max<size_t>(total * kPairBytes, 1u << 16), true);
      if (staged && slot.staging.bytes() < staged * sizeof(int64_t))
        slot.staging = Memory(std::max<size_t>(staged * sizeof(int64_t), 1u << 16), false);
    }
    int64_t* stage = reinterpret_cast<int64_t*>(slot.staging.get());
    size_t base = 0;
    for (size_t k = 0; k < requests.size(); ++k) {
      const CheckedIds& q = requests[k];
      CheckedRequestView& v = c.req[k];
      for (int side = 0; side < 2; ++side) {
        const int64_t* ids = where[k][side];
        if (!ids) {
          std::memcpy(stage, side ? q.dst : q.src, q.count * sizeof(int64_t));
          void* mapped = nullptr;
          checkCuda(cudaHostGetDevicePointer(&mapped, stage, 0), "cudaHostGetDevicePointer", "fetch ids");
          ids = static_cast<const int64_t*>(mapped);
          stage += q.count;
        }
        (side ? v.dst : v.src) = ids;
      }
      v.base = static_cast<int64_t>(base);
      v.count = static_cast<int64_t>(q.count);
      v.srcLimit = q.srcLimit;
      v.rank = q.rank;
      base += q.count;
    }
    info.stagedBytes = staged * sizeof(int64_t);
    c.numRequests = static_cast<int32_t>(requests.size());
    c.myRank = myRank;
    c.parity = static_cast<int32_t>(launches_ & 1);
    c.numPairs = static_cast<int64_t>(total);
    c.dstLimit = dstLimit;
    c.claims = reinterpret_cast<uint32_t*>(claims_.get());
    c.numClaims = static_cast<int64_t>(claims_.bytes() / sizeof(uint32_t));
    c.words = reinterpret_cast<CheckWords*>(words_.get());
    c.outSrc = reinterpret_cast<int64_t*>(slot.out.get());
    c.outDst = c.outSrc + total;
    c.outRank = reinterpret_cast<int32_t*>(c.outDst + total);
    f.numPairs = c.numPairs;
    f.inlineCount = 0;
    f.trusted = 1;
    f.srcBlocks = c.outSrc;
    f.dstBlocks = c.outDst;
    f.srcRanks = c.outRank;
    f.claims = c.claims;
    f.numClaims = c.numClaims;
    bool readsLocal = false;
    for (const CheckedIds& q : requests) readsLocal = readsLocal || (q.rank == myRank && q.count > 0);
    // The batch before, on another stream, must have reset this batch's words and claims first.
    if (last_ && lastStream_ != s)
      checkCuda(cudaStreamWaitEvent(s, last_->done.get(), 0), "cudaStreamWaitEvent", "fetch checked batches");
    launchCheckedFetch(c, f, readsLocal, s);
    checkCuda(cudaEventRecord(slot.done.get(), s), "cudaEventRecord", "fetch staging slot");
    slot.used = true;
    last_ = &slot;
    lastStream_ = s;
    ++launches_;
    next_ ^= 1;
    return info;
  }

  void drain() noexcept override {
    for (Slot& s : slots_)
      if (s.used) {
        cudaError_t e = cudaEventSynchronize(s.done.get());
        if (e != cudaSuccess) KVCOMM_WARN("fetch (checked) drain: ", cudaGetErrorString(e));
      }
  }

 private:
  static constexpr size_t kPairBytes = 2 * sizeof(int64_t) + sizeof(int32_t);
  struct Slot {
    Memory out;      // device: the pairs as the check pass read them
    Memory staging;  // pinned: pageable ids
    Event done;      // the copy pass that read this slot
    bool used = false;
  };
  int device_ = 0;
  Memory words_, claims_;
  Slot slots_[2];
  int next_ = 0;
  Slot* last_ = nullptr;
  cudaStream_t lastStream_ = nullptr;
  uint64_t launches_ = 0;
};

}  // namespace

std::unique_ptr<CheckedLauncher> makeCheckedLauncher(size_t numClaims) {
  return std::make_unique<CudaCheckedLauncher>(numClaims);
}

}  // namespace kvcomm::detail
