// kvcomm: publish-to-peers and the barrier. Producers store their final KV rows straight into every member's replica
// (their own included), then one system-scope barrier; or, where that cannot run, AllGather the rows and insert them
// locally (the fallback), with identical bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvcomm/api.hpp"
#include "kvcomm/barrier.hpp"
#include "kvcomm/device/barrier.hpp"
#include "kvcomm/device_error.hpp"
#include "kvcomm/stream.hpp"
#include "kvcomm/symm.hpp"

namespace kvcomm {

/// Element type of a slot mapping.
enum class SlotType { Int64, Int32 };

/// One cache tensor written by a publish call (all sizes in bytes). Row i of the source lands in every replica at
///   offset + (slot / blockSize) * blockStride + (slot % blockSize) * rowStride,   slot = slotMapping[i],
/// so flat layouts (blockSize 1) and block-major layouts with split regions both work. Example, Indexer-K with 128
/// data bytes at off * 128 and a 4-byte scale at blockSize * 128 + off * 4 inside each block: two tensors,
///   {keys,   128, 128, layer, bs, bs * 132, 128} and {scales, 4, 4, layer + bs * 128, bs, bs * 132, 4}.
///
/// Every step of that computation is checked: a slot or a stride that would wrap modulo 2^64 is refused, never
/// turned into an address inside the buffer. `limitBytes` confines the tensor to its own region (one layer's cache in
/// a buffer that holds all layers): a row that would reach past offset + limitBytes is refused like a slot beyond
/// the backed range, so a wrong slot mapping cannot overwrite another layer.
struct CacheTensor {
  const void* src = nullptr;  ///< row i at src + i * srcStride (device memory for CUDA buffers)
  size_t srcStride = 0;       ///< bytes between source rows (0: rowBytes)
  size_t rowBytes = 0;        ///< bytes per row; any size (bf16, FP8, index keys: bytes are opaque)
  size_t offset = 0;          ///< destination base, bytes from the buffer's base
  size_t blockSize = 1;       ///< tokens per block
  size_t blockStride = 0;     ///< bytes between blocks (0: blockSize * rowStride)
  size_t rowStride = 0;       ///< bytes between rows of a block (0: rowBytes)
  /// Bytes this tensor may address from `offset`: every row must end within [offset, offset + limitBytes).
  /// 0: up to the buffer's capacity. offset + limitBytes must not exceed the capacity.
  size_t limitBytes = 0;
  /// Bytes readable at `src` (0: not stated, the caller guarantees numTokens rows). When set, a call whose rows
  /// (numTokens - 1) * srcStride + rowBytes reach past it is refused before anything is read.
  size_t srcBytes = 0;
};

/// A slot mapping with its length (the sized form of publish()): numTokens must not exceed `count`.
struct SlotMapping {
  const void* data = nullptr;       ///< int64 or int32 slots (device memory for CUDA buffers)
  SlotType type = SlotType::Int64;  ///< element type
  size_t count = 0;                 ///< elements readable at data
};

/// What a publish runs on its lane after the rows are stored (fused into the publish kernel in Direct mode on CUDA).
enum class PublishThen {
  Nothing,  ///< the rows only; synchronise later with barrier().sync(), or signal() and wait()
  Barrier,  ///< then the whole barrier: every member's rows are visible when it returns (in stream order)
  Signal,   ///< then the first half of the barrier: release these rows; barrier().wait() before reading peers' rows
};

/// How a Publisher moves rows.
enum class PublishMode {
  Direct,    ///< stores into peers' memory through symmetric mappings, then a release/acquire barrier
  Fallback,  ///< AllGather of the rows (NCCL on GPUs, kvcomm's bootstrap on host memory) and a local insert
};
KVCOMM_API const char* publishModeName(PublishMode mode);

/// Options of Publisher::create.
struct PublisherOptions {
  /// Independent barrier lanes (overlapped micro-batches); at most kMaxBarrierLanes.
  int lanes = 2;
  /// Bound on every barrier wait; < 0: KVCOMM_BARRIER_TIMEOUT_MS.
  int64_t barrierTimeoutMs = -1;
  /// Fallback staging reserved up front, so that the fallback can be captured in a CUDA graph: tokens per rank
  /// and bytes per token (summed over tensors). Larger calls grow it, outside graph capture only.
  size_t stagingTokens = 4096;
  size_t stagingBytesPerToken = 1024;
};

/// Publication into a SymmetricBuffer's replicas, and its barrier.
///
/// Call order: create() once, collectively, after the buffer exists (it picks the mode: KVCOMM_DIRECT=auto uses
/// Direct where every member is on this host with P2P access, 1 demands it, 0 forces the fallback). Then per step,
/// on every member: publish() for each layer (the last one with PublishThen::Barrier, or barrier().sync() before
/// anyone reads peers' rows) — or PublishThen::Signal on the last publish and barrier().wait() just before the kernel
/// that reads the replicas, so the round trip overlaps the work in between. In Direct mode the publisher owns a
/// Barrier (kvcomm/barrier.hpp) on the buffer's group; in Fallback mode the gather itself synchronises and the
/// barrier is a small NCCL (or bootstrap) allgather (see barrier()). Both are capture-safe (CUDA graphs) and do no
/// host synchronisation. After the stream finished, checkErrors() reports slots found out of range on the device and
/// barrier timeouts. The publisher holds its own handle on the buffer. Rows are checked on the device against the
/// buffer's backed-granule bitmap, so a publish captured in a CUDA graph follows later growth and refuses (reports)
/// rows in released ranges. After a barrier timeout the publisher's epochs are out of step: create a new one.
///
/// numTokens contract: publish() reads numTokens slots at slots.data and numTokens rows at each tensor's src (row i
/// at src + i * srcStride). It checks numTokens against slots.count, and against CacheTensor::srcBytes where that is
/// set (0 means the caller guarantees numTokens rows there), and refuses the call before reading anything.
///
/// Failures and lifetimes: every call checks the communicator first — after Communicator::abort() it throws
/// ErrorCode::Aborted, after a member's death a NetworkError naming it (barrier waits in progress stop the same way,
/// see kvcomm/barrier.hpp). After the buffer is closed (SymmetricBuffer::close(), from any thread) every call throws
/// InvalidArgumentError ("the buffer is closed"); a host-memory publish in progress on another thread finishes
/// first (close() waits for it).
///
/// Threads: one thread at a time per publisher. The buffer's grow/commit/release may run on other threads: a
/// publish sees the backed state before or after the change, never a mix.
class KVCOMM_API Publisher {
 public:
  /// Collective over the buffer's group.
  static Publisher create(SymmetricBuffer& buffer, const PublisherOptions& options = {});

  Publisher();
  ~Publisher();
  Publisher(Publisher&&) noexcept;
  Publisher& operator=(Publisher&&) noexcept;
  /// False for an empty (default-constructed or moved-from) publisher, whose every other method throws
  /// InvalidArgumentError.
  bool valid() const { return impl_ != nullptr; }

  /// Stores row i of every tensor at slots.data[i] (int64 or int32; < 0 = padding, skipped) in every replica, then
  /// runs `then` on `lane` (in Direct mode on CUDA, fused into the same kernel: PublishThen::Barrier is one launch,
  /// PublishThen::Signal lets the kernel's last block release every block's rows and announce them; pair it with
  /// barrier().wait() just before the rows are read).
  ///
  /// Checked before anything is read or written (InvalidArgumentError): numTokens <= slots.count, and for every
  /// tensor with srcBytes set, numTokens rows within it; offsets and strides inside the backed range. A slot beyond
  /// the backed range found on the device is not written and is reported by checkErrors(). In Fallback mode every
  /// member must pass the same numTokens (pad with slot -1).
  void publish(const std::vector<CacheTensor>& tensors, const SlotMapping& slots, size_t numTokens,
               Stream stream = nullptr, PublishThen then = PublishThen::Nothing, int lane = 0);

  /// The publisher's barrier (kvcomm/barrier.hpp: sync(), the split signal()/wait(), deviceHandle() for kernels that
  /// fuse it, pollError()/checkErrors()), borrowed: it lives as long as the publisher, and is not to be moved from.
  /// Every call on it first checks that the publisher's buffer is still open (InvalidArgumentError, "the buffer is
  /// closed"). In Direct mode it is a Barrier on the buffer's group. In Fallback mode there is no signal area: the
  /// gather itself synchronises, and the barrier is a collective (a small NCCL or bootstrap allgather): sync() and
  /// signal() each run the whole collective, wait() only checks its arguments (the signal synchronised), and
  /// deviceHandle() throws InvalidArgumentError (no kernel can fuse it: mode() says which kind it is).
  Barrier& barrier();
  const Barrier& barrier() const;

  PublishMode mode() const;
  /// Why this mode was chosen.
  const std::string& modeReason() const;
  /// Reads (and clears) the first device error since the last call. Synchronise the publishing stream first.
  DeviceError pollError();
  /// Throws the recorded device error, if any: InvalidArgumentError for a slot out of range (naming the token
  /// index), a Timeout for a barrier (naming rank, peer and lane).
  void checkErrors();
  struct Impl;

 private:
  explicit Publisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvcomm
