// kvcomm: fetch. KV blocks that live in another member's cache are pulled straight into this rank's own cache
// slots: planned in block indices against layouts every member registered once, validated before anything moves,
// coalesced into runs, and copied by the transport that reaches the source (the peer mappings on one host: an SM
// gather kernel, the copy engines or CPU copies; RDMA READ or TCP from other hosts).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvcomm/api.hpp"
#include "kvcomm/device/fetch.hpp"
#include "kvcomm/device_error.hpp"
#include "kvcomm/kv_layout.hpp"
#include "kvcomm/stream.hpp"
#include "kvcomm/symm.hpp"

namespace kvcomm {

namespace detail {
struct FetcherInternals;  // tests and tools: what members exchanged (src/fetch/fetcher_internals.hpp)
}  // namespace detail

/// What moves a fetch's bytes.
enum class FetchPath {
  Auto,        ///< per run: copy engines for runs of at least FetchOptions::copyEngineMinRunBytes, else the kernel
  Kernel,      ///< an SM gather kernel computes every address on the device (CUDA; same host)
  CopyEngine,  ///< one copy-engine descriptor per run (cudaMemcpyBatchAsync / 2-D copies; CUDA; same host); leaves
               ///< the SMs to the engine's kernels
  Host,        ///< CPU copies (host-memory buffers)
  Network,     ///< reported only (FetchPlanInfo::path): every run goes over a network transport (tcpRuns,
               ///< rdmaRuns); not a path to demand (FetchOptions::path refuses it)
};
/// "auto", "kernel", "copy", "host", "network".
KVCOMM_API const char* fetchPathName(FetchPath path);

/// What carries a fetch's bytes from a source member to this rank (Fetcher::transport()).
enum class FetchTransportKind {
  None,  ///< the source cannot be reached (Fetcher::transport() says why in the plan error)
  Peer,  ///< the peer mappings of one host (and this rank's own blocks): the paths above
  Tcp,   ///< the source's fetch server over TCP (other hosts, or KVCOMM_FETCH_TRANSPORT=tcp)
  Rdma,  ///< RDMA READ from the source's registered memory (other hosts where both ends have RDMA)
};
/// "none", "peer", "tcp", "rdma".
KVCOMM_API const char* fetchTransportName(FetchTransportKind kind);

/// Blocks to pull from one source member, in host memory. Pair i copies source block srcBlocks[i] (in the source's
/// layout) into destination block dstBlocks[i] (in this rank's layout), in every region. A pair with -1 on either
/// side is skipped (padding); any other negative id is an error.
struct FetchRequest {
  int srcRank = -1;  ///< member to read from (this rank itself is allowed: a local block copy)
  const int64_t* srcBlocks = nullptr;
  const int64_t* dstBlocks = nullptr;
  size_t count = 0;            ///< pairs
  uint64_t srcLayoutHash = 0;  ///< 0: accept the source's registered layout; else it must equal this hash
};

/// Where fetch() checks a batch of host-named pairs (FetchOptions::validation).
enum class FetchValidation {
  Host,    ///< on the host before anything is enqueued: a bad pair throws, naming it (host work grows with the pairs)
  Device,  ///< CUDA buffers, same-host sources: the gather kernel's first pass checks every pair and refuses the
           ///< whole batch if any is bad (nothing copied; checkErrors() names it); the host only hands the raw ids
           ///< over (O(1) for ids in pinned or device memory, one memcpy for pageable ids). Host buffers: as Host.
};
/// "host", "device".
KVCOMM_API const char* fetchValidationName(FetchValidation validation);

/// Per-call options.
struct FetchOptions {
  /// Demanded path of the same-host runs (Auto, Kernel, CopyEngine or Host); Auto honours KVCOMM_FETCH_PATH (auto |
  /// kernel | copy | host). A path that cannot run on this buffer is an Unsupported error, never a silent
  /// substitute. Runs from sources reached over TCP or RDMA take that transport whatever the path.
  FetchPath path = FetchPath::Auto;
  /// Under Auto on CUDA: runs (contiguous on both sides) of at least this many bytes go to the copy engines, the
  /// rest to the kernel. 0: KVCOMM_FETCH_CE_MIN_BYTES, default 4 MiB.
  size_t copyEngineMinRunBytes = 0;
  /// Polled fetches on host memory: copy at most this many bytes per second (0: unlimited), for background
  /// prefetches that should leave memory bandwidth to the engine.
  uint64_t maxBytesPerSecond = 0;
  /// fetch() only (plan(), start() and fetchAll() always check on the host). Device needs path Auto or Kernel,
  /// every source on the peer path (Unsupported naming the rank otherwise), at most
  /// limits::kMaxDeviceCheckedRequests requests, and ids the GPU can read or the host can copy (pageable, pinned,
  /// device memory of the buffer's GPU, managed). No environment knob: it changes when errors are reported.
  FetchValidation validation = FetchValidation::Host;
};

/// What a plan does (FetchPlan::info(), returned by fetch()).
struct KVCOMM_API FetchPlanInfo {
  size_t pairsIn = 0;         ///< block pairs named by the requests
  size_t pairsSkipped = 0;    ///< pairs with -1 (padding)
  size_t runsOut = 0;         ///< copies after coalescing (a run: consecutive blocks on both sides, one region)
  size_t kernelRuns = 0;      ///< runs the gather kernel moves
  size_t copyEngineRuns = 0;  ///< runs the copy engines move
  size_t hostRuns = 0;        ///< runs CPU copies move
  size_t tcpRuns = 0;         ///< runs the TCP transport moves (sources reached over TCP)
  size_t rdmaRuns = 0;        ///< runs RDMA READs move (sources reached over RDMA)
  size_t bytes = 0;           ///< bytes to copy
  /// The one path the same-host runs use, or Auto when they use both kernel and copy engines (runs of network
  /// transports are counted in tcpRuns/rdmaRuns, not here); Network when every run goes over a network transport.
  FetchPath path = FetchPath::Auto;
  double planMicros = 0;  ///< host time spent validating and coalescing
  std::string toString() const;
};

/// A validated, coalesced batch for one Fetcher, reusable while the buffer's generation does not change.
class KVCOMM_API FetchPlan {
 public:
  FetchPlan();
  ~FetchPlan();
  FetchPlan(FetchPlan&&) noexcept;
  FetchPlan& operator=(FetchPlan&&) noexcept;
  bool valid() const { return impl_ != nullptr; }
  const FetchPlanInfo& info() const;
  /// The buffer generation the plan was validated at.
  uint64_t generation() const;

  struct Impl;

 private:
  friend class Fetcher;
  explicit FetchPlan(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Block pairs in device memory (CUDA) or host memory (host buffers), for stream-ordered fetches whose ids an
/// engine writes on the device and that a CUDA graph can capture: the kernel validates each pair when it runs.
struct DeviceFetchBatch {
  const int64_t* srcBlocks = nullptr;  ///< [count]; -1 skips the pair
  const int64_t* dstBlocks = nullptr;  ///< [count]; -1 skips the pair
  const int32_t* srcRanks = nullptr;   ///< [count] source member of each pair; nullptr: srcRank for every pair
  int srcRank = -1;
  size_t count = 0;
};

/// State of a polled fetch.
enum class FetchState { InProgress, Done, Failed };

/// What test()/wait() report.
struct FetchStatus {
  FetchState state = FetchState::InProgress;
  size_t bytesDone = 0;  ///< bytes known to have landed (visible in this rank's memory)
  size_t bytesTotal = 0;
  /// Failed: destination block ids whose bytes are not known to have landed (each may be partly written).
  std::vector<int64_t> failedBlocks;
  std::string error;  ///< Failed: why (e.g. "source rank 2 (pid 1234) died")
};

/// A polled fetch (Fetcher::start). It holds what it writes through (the fetcher's buffer and transports) itself,
/// so destroying its Fetcher neither stops nor waits for it; destroying the operation waits until nothing can still
/// write the destination: memory is never released while a copy may still land in it.
class KVCOMM_API FetchOperation {
 public:
  FetchOperation();
  ~FetchOperation();
  FetchOperation(FetchOperation&&) noexcept;
  FetchOperation& operator=(FetchOperation&&) noexcept;
  bool valid() const { return impl_ != nullptr; }
  /// Non-blocking.
  FetchStatus test();
  /// Blocks up to `timeoutMs` (< 0, or above 10^12 ms such as INT64_MAX: until it ends). Expiry returns InProgress
  /// and cancels nothing.
  FetchStatus wait(int64_t timeoutMs = -1);

  struct Impl;

 private:
  friend class Fetcher;
  explicit FetchOperation(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

/// Options of Fetcher::create.
struct FetcherOptions {
  /// Bound on the collective form's barrier waits; < 0: KVCOMM_BARRIER_TIMEOUT_MS.
  int64_t barrierTimeoutMs = -1;
};

/// Fetches of KV blocks between the members of a SymmetricBuffer's group, on one host or across hosts.
///
/// Call order:
///   1. create(buffer, layout) on every member (collective): each member registers its own layout; every member
///      validates its own (checked arithmetic, regions inside the backed part of the buffer), and every member
///      learns every other's through the communicator (layouts, never pointers). Layouts must be compatible (same
///      region count and blockBytes per region) or every rank throws naming the rank and region. Members also
///      negotiate the fetch protocol version and pick a transport per source (peer mappings on one host, RDMA READ
///      or TCP from other hosts; KVCOMM_FETCH_TRANSPORT demands one); a member reached over TCP starts its server.
///   2. Any number of fetches, from any member, at any time (one-sided: the source does nothing):
///      - fetch(requests, stream): validate + coalesce + enqueue (stream-ordered; the bytes are visible to work
///        enqueued after it on the stream; host buffers: done when it returns);
///      - plan(requests) once, submit(plan, stream) many times;
///      - fetchDevice(batch, stream): ids in device memory, capture-safe (CUDA graphs), validated on the device
///        (checkErrors() reports a bad id);
///      - start(requests): polled completion (FetchOperation::test/wait), with the bytes done and failed blocks;
///      - fetchAll(requests, stream): collective form, every member's requests at once (a KV block all-to-all).
///   3. After a grow/commit/release of the buffer, call refresh() (collective) before the next host-planned fetch
///      (a plan made at an older generation is refused as stale).
/// The source's bytes must be final before the fetch reads them (e.g. after a barrier); the fetcher does not order
/// the source's writes (fetchAll does: it starts and ends with a barrier).
///
/// Threads and lifetimes: submissions (fetch, submit, fetchDevice, start) may come from several threads; they are
/// serialised. refresh() and fetchAll() are collective: one thread at a time. The buffer's grow/commit/release on
/// another thread are safe against host-memory copies in progress (they wait for each other; a polled host
/// operation whose buffer changed since its plan fails at its next slice, "the buffer changed"). After the buffer is
/// closed, every submission throws InvalidArgumentError ("the buffer is closed") and a polled operation in progress
/// fails.
class KVCOMM_API Fetcher {
 public:
  static Fetcher create(SymmetricBuffer& buffer, const KvLayout& layout, const FetcherOptions& options = {});

  Fetcher();
  ~Fetcher();
  Fetcher(Fetcher&&) noexcept;
  Fetcher& operator=(Fetcher&&) noexcept;
  bool valid() const { return impl_ != nullptr; }

  /// Validates and coalesces without moving anything. Throws InvalidArgumentError naming the request and pair index
  /// (id out of range, negative id other than -1, duplicate destination block, stale generation, mismatched layout
  /// hash), Unsupported naming the rank when a source cannot be reached by the demanded path.
  FetchPlan plan(const std::vector<FetchRequest>& requests, const FetchOptions& options = {}) const;
  /// Enqueues a plan made by this fetcher (stream-ordered). Refused while the stream is being captured: host ids
  /// would be frozen into the graph (use fetchDevice()). The first submit prepares the plan for repeated submits (on
  /// CUDA, a gather-kernel plan keeps its pairs in device memory: later submits do no host work per pair).
  void submit(const FetchPlan& plan, Stream stream = nullptr);
  /// plan() + submit(); returns the plan's info.
  FetchPlanInfo fetch(const std::vector<FetchRequest>& requests, Stream stream = nullptr,
                      const FetchOptions& options = {});
  /// Stream-ordered fetch of ids in device memory by the gather kernel (CUDA) or the CPU (host buffers); safe to
  /// capture in a CUDA graph: rewrite the ids between replays. An id outside the layout, or a block outside the
  /// backed part of the buffer when the kernel runs, skips that pair and is reported by checkErrors(); a destination
  /// block named by several pairs goes whole to the last of them (never bytes of two sources in one block).
  void fetchDevice(const DeviceFetchBatch& batch, Stream stream = nullptr);
  /// Starts a polled fetch (validated like plan()). `stream`: CUDA buffers enqueue on it (nullptr: the fetcher's
  /// own stream); host buffers copy on a worker thread (at most 256 KiB unpaced: before it returns).
  FetchOperation start(const std::vector<FetchRequest>& requests, const FetchOptions& options = {},
                       Stream stream = nullptr);
  /// Collective: every member passes its own requests; returns (in stream order) once every member's blocks
  /// landed. Starts with a barrier (every source's earlier writes are visible) and ends with one (no source block
  /// is overwritten while a peer still reads it). Needs every member on this host (Unsupported otherwise).
  FetchPlanInfo fetchAll(const std::vector<FetchRequest>& requests, Stream stream = nullptr,
                         const FetchOptions& options = {});
  /// Collective: revalidates every member's layout against the buffer as it is now and adopts its generation.
  /// Returns once every member serves the new generation (a fetch right after it is never refused as stale).
  void refresh();

  /// The transport this rank's fetches from member `rank` take (chosen at create: see KVCOMM_FETCH_TRANSPORT).
  FetchTransportKind transport(int rank) const;

  /// Member `rank`'s registered layout and its hash, normalised: a region's blockStride of 0 (= blockBytes) reads back
  /// as its blockBytes (the hash is of the normalised form, so both spellings hash alike).
  const KvLayout& layout(int rank) const;
  uint64_t layoutHash(int rank) const;
  /// The buffer generation the layouts were validated at.
  uint64_t generation() const;
  SymmetricBuffer& buffer() const;
  /// For engine kernels that pull blocks themselves (kvcomm/device/fetch.hpp: warpPullBlock). Valid while this
  /// fetcher lives; tables are rewritten in place by refresh().
  FetchDeviceHandle deviceHandle() const;

  /// Reads (and clears) the first device error of fetchDevice()/fetchAll(). Synchronise the stream first.
  DeviceError pollError();
  /// Throws it: InvalidArgumentError for a bad block id (naming the pair), Timeout for fetchAll's barrier.
  void checkErrors();

  struct Impl;

 private:
  friend struct detail::FetcherInternals;
  explicit Fetcher(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace kvcomm
