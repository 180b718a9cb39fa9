// CUDA pieces of the same-host fetch path: staging of block-pair lists for the gather kernel, copy-engine batches,
// events for polled completion. Compiled with CUDA only (fetch/no_cuda.cpp says "built without CUDA" otherwise).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/launch.hpp"
#include "kvcomm/stream.hpp"

namespace kvcomm::detail {

/// One copy-engine descriptor: `height` rows of `width` bytes (height 1: a plain copy).
struct CopyDesc {
  char* dst;
  const char* src;
  size_t width;
  size_t height;
  size_t dpitch;
  size_t spitch;
};

/// A recorded point in a stream; done() polls, wait() blocks. Destruction never blocks.
class DeviceEvent {
 public:
  virtual ~DeviceEvent() = default;
  virtual bool done() = 0;
  virtual void wait() = 0;
};

/// Pairs kept in device memory for repeated launches (a reused plan's); the memory is freed with it.
class ResidentPairs {
 public:
  virtual ~ResidentPairs() = default;
  const int64_t* src = nullptr;
  const int64_t* dst = nullptr;
  const int32_t* rank = nullptr;
  size_t count = 0;
};

class DeviceCopier {
 public:
  virtual ~DeviceCopier() = default;
  /// Launches the gather kernel over `n` pairs (host arrays): inline in the launch for small batches, else written
  /// into pinned, device-mapped staging the kernel reads directly (or, for long lists, copies into device memory in
  /// stream order first). A staging slot is reused only after the kernel that read it finished.
  virtual void launchPairs(FetchLaunch base, const int64_t* src, const int64_t* dst, const int32_t* rank, size_t n,
                           Stream stream) = 0;
  /// Copies `n` pairs (host arrays that stay until the copy ran) into device memory of their own, in `stream`'s
  /// order; launches on other streams wait for that copy.
  virtual std::unique_ptr<ResidentPairs> upload(const int64_t* src, const int64_t* dst, const int32_t* rank, size_t n,
                                                Stream stream) = 0;
  /// Launches the gather kernel over pairs uploaded before: no staging, no host work per pair.
  virtual void launchResident(FetchLaunch base, const ResidentPairs& pairs, Stream stream) = 0;
  /// Launches the conversion kernel over `pieces` (absolute addresses, checked by the caller), staged as the pairs
  /// of launchPairs are.
  virtual void copyPieces(const std::vector<PieceCopy>& pieces, Stream stream) = 0;
  /// Launches the conversion kernel over `l`, its runs, chunk starts and block tables staged for the GPU first (the
  /// pointers of `l` to them are filled here).
  virtual void convert(ConvertLaunch l, const std::vector<ConvertRun>& runs, const std::vector<uint32_t>& chunkStart,
                       const std::vector<int64_t>& tables, Stream stream) = 0;
  /// Enqueues copy-engine descriptors (one batch where the API allows, else one call each).
  virtual void copies(const std::vector<CopyDesc>& descs, Stream stream) = 0;
  virtual std::unique_ptr<DeviceEvent> record(Stream stream) = 0;
  /// Whether `stream` is being captured into a CUDA graph.
  virtual bool capturing(Stream stream) = 0;
  /// A non-blocking stream of the copier's own (polled fetches without a stream).
  virtual Stream ownStream() = 0;
  /// Waits for everything the copier enqueued (teardown).
  virtual void drain() noexcept = 0;
};

/// Throws Unsupported in a build without CUDA.
std::unique_ptr<DeviceCopier> makeDeviceCopier();

/// Pinned host memory between the network and a CUDA buffer: `slots` buffers of `slotBytes`; copies between a slot
/// and device memory are enqueued as one batch per call and tracked by an event per slot, so one slot is filled or
/// sent while another's copy runs (double buffering). Creation binds the calling thread to the buffer's device;
/// another thread that uses it (a pooled connection's next user) binds itself first (bindCudaDevice). One thread at a
/// time. Destruction waits for every copy.
class HostStaging {
 public:
  virtual ~HostStaging() = default;
  virtual size_t slotBytes() const = 0;
  virtual int slots() const = 0;
  virtual char* slot(int i) = 0;
  /// Device -> slot `i` (each desc's dst lies in the slot), on the staging's own stream; waitSlot(i) before reading.
  virtual void toHost(int i, const std::vector<CopyDesc>& copies) = 0;
  /// Slot `i` -> device (each desc's src lies in the slot), on `stream` (nullptr: the legacy default stream), in
  /// that stream's order; the slot may be refilled once slotDone(i).
  virtual void toDevice(int i, const std::vector<CopyDesc>& copies, Stream stream) = 0;
  /// The staging's own non-blocking stream (polled fetches given no stream).
  virtual Stream ownStream() = 0;
  virtual bool slotDone(int i) = 0;
  virtual void waitSlot(int i) = 0;
};

/// Throws Unsupported in a build without CUDA; CudaError when pinned memory cannot be had.
std::unique_ptr<HostStaging> makeHostStaging(int device, size_t slotBytes, int slots);
/// Makes `device` current on the calling thread (threads that use a staging made on another thread).
void bindCudaDevice(int device);

}  // namespace kvcomm::detail
