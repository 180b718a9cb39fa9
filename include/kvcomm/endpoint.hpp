// kvcomm: endpoints. KV transfers between processes that meet at run time -- a prefill and a decode instance, a KV
// server and the engines it serves -- with no communicator and no collective step. Each process makes one Endpoint,
// registers the memory it already has with its KV layout, and hands each registration's metadata (a byte string) to
// its peers over its own channel (vLLM's kv_transfer_params, a bootstrap server, an RPC). A peer connects from the
// metadata alone and reads remote blocks into its own registered memory, or writes its blocks into the remote's.
//
// The same transport plug-ins carry it as the Fetcher (fetch/transport/): peer mappings on the same host (the peer's
// registration mapped here over a Unix socket: SM kernel or copy engine, CPU copies for host memory), RDMA READ/WRITE
// between hosts with RDMA devices, and TCP anywhere. Endpoints also carry notifications: small messages, alone or
// delivered once a transfer's bytes are in place ("blocks landed, free them").
//
// Security (docs/api/endpoint.md#threat-model): each registration has a 128-bit bearer capability in its metadata; the
// endpoint refuses a connection without it before saying anything about the memory. revoke() replaces it and bumps
// the registration's generation, so metadata from before a revoke, an unregister or a restart is refused, naming
// which. TCP carries the capability in plaintext: it guards against stale and confused peers and other local users,
// not against an attacker on the network.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvcomm/api.hpp"
#include "kvcomm/arena.hpp"
#include "kvcomm/device_error.hpp"
#include "kvcomm/fetch.hpp"
#include "kvcomm/kv_contents.hpp"
#include "kvcomm/kv_layout.hpp"
#include "kvcomm/stream.hpp"
#include "kvcomm/symm.hpp"

namespace kvcomm {

/// Options of Endpoint::create.
struct EndpointOptions {
  /// How peers' errors name this endpoint ("" : "pid <pid>"); at most 63 bytes travel in the metadata.
  std::string name;
  /// "a.b.c.d:port" or "[v6]:port" to listen on ("" : this host's address as KVCOMM_SOCKET_IFNAME picks it, an
  /// ephemeral port).
  std::string tcpAddress;
  /// A transfer with no progress for this long fails, naming the peer and the blocks (a dead or hung peer). < 0:
  /// KVCOMM_FETCH_NET_TIMEOUT_MS (3000).
  int64_t timeoutMs = -1;
  /// Parallel connections per (local registration, remote registration) pair.
  int connectionsPerPeer = 4;
  /// Most notifications received and not yet taken (notifications()); a sender beyond it gets a Busy refusal.
  size_t maxQueuedNotifications = 65536;
};

/// Longest notification message (bytes).
inline constexpr size_t kMaxNotificationBytes = 16384;

/// A notification this endpoint received (Endpoint::notifications).
struct Notification {
  uint64_t from = 0;          ///< the sending endpoint's id (Endpoint::id(); a restarted sender has another)
  std::string fromName;       ///< its name (EndpointOptions::name; at most 63 bytes)
  uint64_t registration = 0;  ///< the registration of this endpoint whose metadata the sender used
  std::string message;        ///< the bytes sent (any content, at most kMaxNotificationBytes)
};

/// What a registration lets the holders of its metadata do.
enum class Access {
  ReadWrite,  ///< peers read its blocks and write into them
  ReadOnly,   ///< peers read only: a write is refused before any byte lands
};

/// Options of the register calls.
struct RegisterOptions {
  Access access = Access::ReadWrite;
  /// What the regions hold (kv_contents.hpp), one entry per region; empty: not described. Checked against the
  /// layout at registration (InvalidArgumentError naming the region and field) and carried in the metadata, so that
  /// peers converting from it (readConverted) need not be told separately.
  KvDescription contents;
};

/// Which transport a transfer must take.
enum class TransferVia {
  Auto,  ///< peer mappings when both registrations are on this host, of one memory kind, and the peer's memory can
         ///< be mapped (memfd/shm host memory, VMM or cudaMalloc CUDA memory); between hosts RDMA when both
         ///< endpoints have an RDMA device; else TCP. Transfer::transport() says.
  Peer,  ///< same-host peer mappings; Unsupported (naming why) when the peer cannot be mapped here
  Tcp,   ///< TCP, even on one host
  Rdma,  ///< RDMA READ/WRITE; Unsupported (naming why) when either endpoint has no device or the owner cannot serve it
};

/// Per-transfer options.
struct TransferOptions {
  /// A demanded transport that cannot run is an Unsupported error naming why, never a silent fallback.
  TransferVia via = TransferVia::Auto;
  /// A message for the remote endpoint (at most kMaxNotificationBytes), delivered once this transfer's bytes are
  /// all in place (a write: visible in the remote's memory; a read: read, so the owner may reuse the blocks). The
  /// transfer is Done only once the remote acknowledged it; a transfer that fails never delivers it. Endpoint::notify
  /// says how notifications are ordered.
  std::optional<std::string> notify;
};

/// Block ids in device memory (CUDA registrations) or host memory (host registrations) for Endpoint::readDevice and
/// writeDevice: pair i moves remote block remoteBlocks[i] and local block localBlocks[i]; -1 skips the pair.
struct DeviceTransferBatch {
  const int64_t* remoteBlocks = nullptr;
  const int64_t* localBlocks = nullptr;
  size_t count = 0;
};

class Endpoint;
namespace detail {
struct EndpointAccess;  // the library's own layers above endpoints (converted reads)
}

/// Memory registered with an endpoint (a handle; copies share the registration). Dropping the handles does not
/// unregister: the endpoint serves the memory until Endpoint::unregister() or close(), so unregister before freeing
/// it.
class KVCOMM_API Registration {
 public:
  Registration();
  ~Registration();
  Registration(const Registration&);
  Registration& operator=(const Registration&);
  Registration(Registration&&) noexcept;
  Registration& operator=(Registration&&) noexcept;
  bool valid() const { return impl_ != nullptr; }

  /// Random 64-bit id (in the metadata).
  uint64_t id() const;
  /// Starts at 1; revoke() increments it.
  uint64_t generation() const;
  void* data() const;
  size_t bytes() const;
  MemoryKind kind() const;
  int device() const;
  /// The registered layout, normalised (blockStride 0 reads back as blockBytes).
  const KvLayout& layout() const;
  /// RegisterOptions::contents (empty when not described).
  const KvDescription& contents() const;
  Access access() const;
  /// False once unregistered.
  bool registered() const;

  /// The metadata peers connect with: versioned bytes (endpoint id, addresses, layout, generation and the 128-bit
  /// capability). Anyone holding them may read (and, ReadWrite, write) this memory: hand them to peers only.
  std::vector<uint8_t> metadata() const;
  /// Replaces the capability and increments the generation: every earlier metadata is refused from now on (new
  /// connections: "capability refused"; connections already open: their next request, "stale generation"). Give
  /// peers metadata() again. Transfers in flight end at their next request with that error. Same-host peers that
  /// map the memory are told and waited for (up to the endpoint's timeoutMs) until they unmapped it, so that when
  /// revoke() returns nothing copies through the old metadata any more; Timeout names the pids still mapping it then.
  void revoke();

  struct Impl;

 private:
  friend class Endpoint;
  friend struct detail::EndpointAccess;
  explicit Registration(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

/// A peer's registration as this endpoint knows it from its metadata (Endpoint::connect).
class KVCOMM_API RemoteMemory {
 public:
  RemoteMemory();
  ~RemoteMemory();
  RemoteMemory(const RemoteMemory&);
  RemoteMemory& operator=(const RemoteMemory&);
  RemoteMemory(RemoteMemory&&) noexcept;
  RemoteMemory& operator=(RemoteMemory&&) noexcept;
  bool valid() const { return impl_ != nullptr; }

  /// The peer's name (EndpointOptions::name) and its registration's id and generation, as the metadata says.
  std::string peerName() const;
  uint64_t id() const;
  uint64_t generation() const;
  const KvLayout& layout() const;
  /// What its regions hold, as its owner described them at registration (empty when not described).
  const KvDescription& contents() const;
  MemoryKind kind() const;
  Access access() const;
  /// Where its endpoint listens ("host:port").
  std::string address() const;

  struct Impl;

 private:
  friend class Endpoint;
  friend struct detail::EndpointAccess;
  explicit RemoteMemory(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

/// A polled transfer (Endpoint::read / write). Destroying it waits until nothing it started can still touch either
/// side's memory (a transfer in flight is cancelled first).
class KVCOMM_API Transfer {
 public:
  Transfer();
  ~Transfer();
  Transfer(Transfer&&) noexcept;
  Transfer& operator=(Transfer&&) noexcept;
  bool valid() const { return impl_ != nullptr; }
  /// Non-blocking. failedBlocks are destination ids: local block ids of a read, remote ones of a write.
  FetchStatus test();
  /// Blocks up to `timeoutMs` (< 0: until it ends). Expiry returns InProgress and cancels nothing.
  FetchStatus wait(int64_t timeoutMs = -1);
  /// What the transfer does: pairs, runs after coalescing, bytes, and the runs per transport (tcpRuns, ...).
  const FetchPlanInfo& info() const;
  /// The transport that carries it.
  FetchTransportKind transport() const;

  struct Impl;

 private:
  friend class Endpoint;
  explicit Transfer(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

/// One per process: its listener, its registrations and its connections to peers. Thread-safe.
class KVCOMM_API Endpoint {
 public:
  /// Listens (TCP) and is ready to register memory and connect to peers. Throws SystemError when it cannot listen.
  static Endpoint create(const EndpointOptions& options = {});

  Endpoint();
  /// close().
  ~Endpoint();
  Endpoint(Endpoint&&) noexcept;
  Endpoint& operator=(Endpoint&&) noexcept;
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;
  bool valid() const { return impl_ != nullptr; }

  /// Random 64-bit id of this endpoint (a restarted process has another: its old metadata is refused).
  uint64_t id() const;
  std::string name() const;
  /// Where it listens ("host:port").
  std::string address() const;

  /// Registers [base, base + bytes) of host memory (MemoryKind::Host: any pinned, plain or mapped memory of this
  /// process) or CUDA device memory (MemoryKind::Cuda: cudaMalloc, the caching allocator's blocks, VMM mappings;
  /// `device` is its ordinal) with its KV layout. Throws InvalidArgumentError when the layout is malformed (the
  /// Fetcher's rules) or does not fit in `bytes`, or base is null.
  Registration registerMemory(void* base, size_t bytes, MemoryKind kind, const KvLayout& layout, int device = -1,
                              const RegisterOptions& options = {});
  /// This rank's memory of a SymmetricBuffer (its backed part must hold the layout).
  Registration registerBuffer(const SymmetricBuffer& buffer, const KvLayout& layout,
                              const RegisterOptions& options = {});
  /// An arena this process owns, with its layout; pinned while registered (the arena cannot be freed or shrunk
  /// until it is unregistered).
  Registration registerArena(Arena& arena, const RegisterOptions& options = {});
  /// Unregisters: new connections and requests are refused ("unregistered"), transfers of this endpoint that use
  /// it are waited for up to `timeoutMs` (< 0: no bound) and then cancelled, every request a peer is being served
  /// from it ends, and same-host peers that mapped it are told and waited for (up to `timeoutMs`) until they
  /// stopped their copies and unmapped it; returns when nothing can read or write the memory any more. Throws
  /// Timeout naming the pids when a same-host peer still maps it at the bound (the memory must then stay
  /// allocated; call unregister again to wait on). Idempotent.
  void unregister(Registration& registration, int64_t timeoutMs = -1);

  /// A peer's registration from its metadata. Lazy (nothing is sent until a transfer) and idempotent (the same
  /// metadata gives the same handle). Throws InvalidArgumentError naming what is wrong: not kvcomm metadata,
  /// truncated or corrupted (checksum), a wire version this build does not speak (newer or older), a malformed
  /// layout. Stale metadata (revoked, unregistered, restarted) is refused by its owner at the first transfer.
  RemoteMemory connect(const std::vector<uint8_t>& metadata);
  RemoteMemory connect(const void* metadata, size_t bytes);

  /// Forgets a peer's registration: its transfers still running are cancelled (failed, "disconnected"), its
  /// connections close, a same-host mapping is unmapped (the owner's lease ends) and the handle refuses further
  /// transfers. A long-lived endpoint that meets many peers disconnects those it is done with; connect() again
  /// from the metadata to use it later. Idempotent.
  void disconnect(RemoteMemory& remote);

  /// Pulls remote blocks into local ones: pair i copies remote block remoteBlocks[i] into local block
  /// localBlocks[i], in every region (layouts: same region count and blockBytes). -1 on either side skips the pair;
  /// everything is validated before anything moves (ids in range, no duplicate destination) and consecutive pairs
  /// coalesce into runs. Polled: the returned Transfer says when it ended and which blocks failed.
  Transfer read(const Registration& local, const RemoteMemory& remote, const int64_t* remoteBlocks,
                const int64_t* localBlocks, size_t count, const TransferOptions& options = {});
  /// Pushes local blocks into remote ones (the remote registration must be ReadWrite): pair i copies local block
  /// localBlocks[i] into remote block remoteBlocks[i]. CUDA memory: the blocks must be final when write() is called
  /// (synchronise the stream that produced them).
  Transfer write(const Registration& local, const RemoteMemory& remote, const int64_t* remoteBlocks,
                 const int64_t* localBlocks, size_t count, const TransferOptions& options = {});

  /// Same-host peers only (the path Peer): stream-ordered pull of remote blocks into local ones with the ids in
  /// device memory, by the gather kernel (CUDA; capture-safe: a CUDA graph replays it with whatever ids the arrays
  /// hold then) or the CPU (host registrations: synchronous). Ids are checked when the copy runs: a bad pair copies
  /// nothing and is recorded (pollError). Throws Unsupported when the peer cannot be mapped here, and the owner's
  /// refusal (stale, forged, unregistered) as InvalidArgumentError. The first call for a pair maps the peer and
  /// writes the kernel's tables: make it before a CUDA graph capture (batch.count 0 does only that; captured first,
  /// it is refused with InvalidArgumentError). The registration's device must be current. Once
  /// the peer ends the mapping (unregister, revoke, exit), later runs copy nothing and record BlockOutOfRange; a
  /// graph that captured one must not be replayed after this endpoint closes.
  void readDevice(const Registration& local, const RemoteMemory& remote, const DeviceTransferBatch& batch,
                  Stream stream = nullptr);
  /// The same, pushing local blocks into remote ones (the remote registration must be ReadWrite).
  void writeDevice(const Registration& local, const RemoteMemory& remote, const DeviceTransferBatch& batch,
                   Stream stream = nullptr);
  /// Reads (and clears) the first error a readDevice/writeDevice between these two recorded. Synchronise the
  /// stream first.
  DeviceError pollError(const Registration& local, const RemoteMemory& remote);

  /// Sends `message` (at most kMaxNotificationBytes) to the endpoint that owns `remote`, over TCP, and returns once
  /// that endpoint holds it (notifications() hands it out there). Ordering: this endpoint's notifications to one
  /// endpoint -- these and those of transfers (TransferOptions::notify), through any of its registrations -- are
  /// delivered there in the order they were issued (a transfer's waits for its bytes, so it holds back the ones
  /// issued after it), each once: a notification whose acknowledgement was lost is sent once more and recognised.
  /// Throws InvalidArgumentError for a message too long or metadata the owner refuses (revoked, unregistered, a
  /// restart), Busy when its inbox is full, NetworkError when it cannot be reached (then whether it arrived is
  /// unknown).
  void notify(const RemoteMemory& remote, const std::string& message);
  /// Takes the notifications received so far, oldest first (each sender's in the order it issued them); waits up to
  /// `timeoutMs` (< 0: no bound) for one when there is none. Empty when none came, or once the endpoint closed.
  std::vector<Notification> notifications(int64_t timeoutMs = 0);

  /// Unregisters everything (waiting for transfers as unregister() does, with no bound), stops listening and
  /// drops every connection. Idempotent.
  void close();

  struct Impl;

 private:
  friend struct detail::EndpointAccess;
  explicit Endpoint(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace kvcomm
