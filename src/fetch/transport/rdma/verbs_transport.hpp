// Fetch by RDMA READ from members on other hosts, through the verbs entry points of platform/ibverbs.hpp (the real
// libibverbs loaded at run time, or the unit tests' fake provider).
//
// Registration: one memory region per piece of this rank's memory (per committed VMM chunk as a dma-buf on GPU
//   memory, per memfd piece on host memory: never one per block), readable by peers (and writable by them where an
//   endpoint registered it read-write) and writable locally. A region
//   exists only while its piece is backed: release()/close() of the buffer first lets the local operation in flight
//   drain, then deregisters the released pieces' regions, so a peer's stale read faults instead of reading reused
//   memory. Legacy CUDA IPC memory cannot be exported as dma-buf and is refused.
// Connection (Fetcher::create, collective): every member allgathers its fabric address (port, LID, GID, MTU, the
//   READ depth it accepts) and its chunk keys (offset, bytes, address, rkey per piece); for every pair where either
//   member reads the other over RDMA both create kQpsPerPeer RC queue pairs, allgather their numbers and connect them
//   (INIT -> RTR -> RTS); the outcome is voted.
// Connection, endpoints (pairwise): fabric address, queue pairs and chunk keys travel in a control request over the
//   TCP connection of the pair (fetch/transport/rdma/rdma_connect.hpp); the connection is the queue pairs' lease.
// Reads: one READ per contiguous remote run (per region; per block where the source's blocks are apart), scattered
//   over local SGEs; a READ is cut where it would exceed the device's max_sge or message size or cross a region
//   (MR) boundary on either side. Every READ is signalled; its completion must be a successful RDMA READ of the
//   bytes it asked for. Writes (endpoints) are the same work requests with the WRITE opcode. Outstanding READs per
//   queue pair stay within the READ depth both ends accept (max_qp_rd_atom / max_qp_init_rd_atom). One operation at a
//   time uses a fabric's completion queue.
// Failure: an error completion, no completion for KVCOMM_FETCH_NET_TIMEOUT_MS, a cancel (the operation destroyed)
//   all drain before anything is reported or released: every queue pair the operation used goes to ERR and every
//   flushed completion is reaped (a completion queue that lost completions, e.g. after an overrun, is given up only
//   after those queue pairs are destroyed). A queue pair that failed cannot be reconnected one-sidedly: fetches from
//   that member fail with a clear error until the fetcher is recreated. GPU memory: where the device orders RDMA
//   writes below "owner", the writes are flushed (cuFlushGPUDirectRDMAWrites) before blocks are reported landed.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "fetch/transport/negotiation.hpp"
#include "fetch/transport/net/net_context.hpp"
#include "fetch/transport/transport.hpp"
#include "kvcomm/comm.hpp"
#include "symm/buffer_internals.hpp"

namespace kvcomm::detail {

struct VerbsApi;  // platform/ibverbs.hpp (builds with rdma-core headers)

/// What a fabric operation's work requests do: READ pulls the remote run into the local SGEs, WRITE pushes the
/// local SGEs into the remote run (both built by buildReads(): the remote side is the "source" of the plan).
enum class RdmaOp { Read, Write };

inline constexpr int kQpsPerPeer = 2;

/// One registered piece as peers address it.
struct ChunkKey {
  uint64_t offset;  ///< from the buffer's base
  uint64_t bytes;
  uint64_t addr;  ///< the address READs name (the piece's virtual address: dma-buf regions use it as iova)
  uint32_t rkey;
  uint32_t lkey;  ///< local use only
};

/// A local piece's key, by offset.
struct LocalKey {
  uint64_t offset;
  uint64_t bytes;
  uint32_t lkey;
};

/// One scatter element (the layout of ibv_sge).
struct ReadSge {
  uint64_t addr;
  uint32_t length;
  uint32_t lkey;
};

inline constexpr uint32_t kMaxReadSges = 16;

/// One READ work request: remote [remoteAddr, + bytes) into the local SGEs.
struct ReadWr {
  uint64_t remoteAddr;
  uint32_t rkey;
  uint32_t numSge;
  uint64_t bytes;
  size_t slice;  ///< index of the slice (RunSlice) it belongs to
  ReadSge sge[kMaxReadSges];
};

/// What buildReads() turns into work requests.
struct ReadPlanInput {
  const FetchRegionView* srcRegions = nullptr;  ///< the source's layout
  const FetchRegionView* dstRegions = nullptr;  ///< this rank's layout
  size_t numRegions = 0;
  const WireRun* src = nullptr;  ///< per slice: source blocks
  const WireRun* dst = nullptr;  ///< per slice: destination blocks
  size_t numSlices = 0;
  const ChunkKey* remote = nullptr;  ///< the source's pieces, sorted by offset
  size_t numRemote = 0;
  const LocalKey* local = nullptr;  ///< this rank's pieces, sorted by offset
  size_t numLocal = 0;
  uint64_t localBase = 0;        ///< this rank's base address
  uint32_t maxSge = 1;           ///< at most kMaxReadSges
  uint64_t maxBytes = 1u << 30;  ///< largest message
};

/// The READs of every slice in order (pure): "" or why not (a byte outside every registered piece on either side).
std::string buildReads(const ReadPlanInput& in, std::vector<ReadWr>* out);

/// How peers reach this rank's RDMA device (allgathered).
struct FabricAddress {
  uint32_t valid;
  uint32_t maxMsg;
  uint16_t lid;
  uint8_t port;
  uint8_t mtu;       ///< ibv_mtu
  uint8_t ethernet;  ///< RoCE: address by GID
  uint8_t gidIndex;
  uint16_t readDepth;  ///< READs it accepts in flight per queue pair, as responder and as requester
  uint8_t gid[16];
};

struct QpAddress {
  uint32_t qpn;
  uint32_t psn;
};

/// What a fabric's fake-provider tests and the transport report.
struct FabricStats {
  uint64_t posted = 0;          ///< READs posted
  uint64_t completed = 0;       ///< completions reaped (success or not)
  uint32_t maxOutstanding = 0;  ///< most READs in flight on one queue pair
  uint32_t readDepth = 0;       ///< the bound that applied
};

/// This rank's RDMA side of a fetcher: device context, protection domain, one completion queue, memory regions of
/// its pieces, queue pairs per connected member. Methods other than the read path are called from one thread.
class VerbsFabric {
 public:
  /// Opens the RDMA device closest to the memory (the one sharing the most of the GPU's PCIe path; the first with an
  /// active port for host memory), or returns nullptr with *why (no rdma-core, no device, no active port, memory
  /// that cannot be registered). `api`: nullptr means the real libibverbs.
  static std::unique_ptr<VerbsFabric> open(const VerbsApi* api, MemoryKind kind, int cudaDevice,
                                           const std::string& gpuPciBusId, const std::string& handleType,
                                           int64_t timeoutMs, std::string* why);
  virtual ~VerbsFabric() = default;

  virtual std::string deviceName() const = 0;
  virtual std::string linkLayer() const = 0;
  virtual FabricAddress address() const = 0;

  /// Registers every piece not registered yet and deregisters those gone (after draining); returns the keys of
  /// every piece, sorted by offset. `remoteWrite`: peers may also WRITE into them (an endpoint's read-write
  /// registration). Throws naming the piece.
  virtual std::vector<ChunkKey> registerPieces(char* base, const std::vector<LocalPiece>& pieces, bool remoteWrite) = 0;
  /// Pieces stop being readable (release/close): waits for the local operation in flight, then deregisters every
  /// region that overlaps `ranges`.
  virtual void unback(const std::vector<Range>& ranges) = 0;

  /// Creates the queue pairs to `peer` (kQpsPerPeer) and returns their addresses.
  virtual std::vector<QpAddress> createQps(int peer) = 0;
  /// Connects them to the peer's (INIT -> RTR -> RTS).
  virtual void connectQps(int peer, const FabricAddress& remote, const std::vector<QpAddress>& remoteQps) = 0;
  /// The peer's chunk keys (sorted by offset): what READs from it address.
  virtual void setRemoteChunks(int peer, std::vector<ChunkKey> chunks) = 0;
  /// How errors name `peer` (default "rank N").
  virtual void namePeer(int peer, std::string name) = 0;
  /// Destroys the queue pairs to `peer` (waits for the operation in flight): nothing reaches it or comes from it
  /// over them afterwards. An endpoint's peer that disconnected.
  virtual void dropPeer(int peer) = 0;

  /// Why READs from `peer` cannot run ("" when they can).
  virtual std::string unreachable(int peer) const = 0;
  /// Why nothing can run on this fabric any more ("" while it can): its completion queue failed (an overrun), so
  /// completions of any queue pair may be lost. Reopen the fabric.
  virtual std::string failed() const = 0;

  /// Runs the work requests (READs or WRITEs, with the peers their slices' runs name) to completion or failure,
  /// draining on failure or when `stop` is set. `slicePeers[slice]` names the peer of each slice; `landed(slice)` is
  /// called once all of a slice's work requests completed (READs into GPU memory: after the GPUDirect flush where
  /// one is needed). Returns "" or the error; never throws.
  virtual std::string run(RdmaOp op, const std::vector<ReadWr>& wrs, const std::vector<int>& slicePeers,
                          const std::function<void(size_t slice)>& landed, const std::atomic<bool>* stop) = 0;

  /// Keys the local side of buildReads() needs.
  virtual std::vector<LocalKey> localKeys() const = 0;
  virtual std::vector<ChunkKey> remoteChunks(int peer) const = 0;
  virtual uint32_t maxSge() const = 0;
  /// Largest READ both ends accept to/from `peer`.
  virtual uint64_t maxMessage(int peer) const = 0;
  virtual FabricStats stats() const = 0;
  /// Stream-ordered fetches into GPU memory: wait for the stream before the NIC writes.
  virtual bool needsStreamSync() const = 0;

  /// Collective over `comm`: chunk keys and fabric addresses of every member, queue pairs for every pair where
  /// the route matrix (routes[reader * n + source], allgathered) says rdma, connected; voted. `mine` may be null
  /// (this rank has no RDMA device): it still takes part in every allgather.
  static void connectAll(Communicator& comm, VerbsFabric* mine, char* base, const std::vector<LocalPiece>& pieces,
                         const std::vector<Route>& routes);
  /// Collective: registers the pieces as they are now and re-exchanges every member's chunk keys (after
  /// grow/commit/release); voted. `mine` may be null.
  static void refreshAll(Communicator& comm, VerbsFabric* mine, char* base, const std::vector<LocalPiece>& pieces);
};

/// The FetchTransport over a connected fabric (this rank's destination and layouts in `context`): plans whose
/// `push` is set WRITE (the runs' `src` are the remote blocks, as a TCP push). `fabricPeers[rank]`: the fabric's peer
/// number of a member (empty: the rank itself; an endpoint's link numbers its peers per registration).
std::unique_ptr<FetchTransport> makeVerbsTransport(NetContext context, VerbsFabric* fabric,
                                                   std::vector<int> fabricPeers = {});

}  // namespace kvcomm::detail
