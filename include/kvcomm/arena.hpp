// kvcomm: arenas. KV memory shared between independent processes of one host (a KV offload/cache server and the
// engine processes it serves): an owner allocates an Arena described by a KV layout and exports it; an importer maps
// it into its own address space. Either side may own: an engine exports its own KV cache to a server
// (client-owned), or a server allocates from an engine's layout and the engine imports it as its KV cache
// (server-owned). Processes meet through an ArenaServer's socket address; no communicator is involved.
//
// Rules every direction follows:
//   - an import holds a lease; the owner's free()/shrink() are refused with ErrorCode::Busy while leases or operations
//     (ArenaPin) exist, so memory is never released or reused under an importer's feet;
//   - a capability (ArenaCapability) is one-use, expires, and is bound to the arena, its generation and the importer's
//     pid and uid; the file descriptors travel over the session (SCM_RIGHTS), never as numbers in a message;
//   - a dead importer's lease is reclaimed within 5 s (socket end of stream + pidfd); a dead owner makes the
//     importer's calls throw, while its mapped bytes stay readable until it closes the import.
// See docs/api/arena.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "kvcomm/api.hpp"
#include "kvcomm/error.hpp"
#include "kvcomm/kv_layout.hpp"
#include "kvcomm/symm.hpp"

namespace kvcomm {

/// How an Arena is allocated.
struct ArenaOptions {
  /// Auto: CUDA when the calling thread has a current CUDA context, else host memory.
  MemoryKind kind = MemoryKind::Auto;
  /// Address space reserved for growth (bytes; rounded up to the granularity). 0: the layout's extent, no growth.
  size_t capacity = 0;
  /// CUDA only: allocate the whole capacity with cuMemAlloc and make it exportable as a legacy CUDA IPC handle
  /// (ipcHandle()). Such memory cannot be exported as a POSIX fd, and an importer cannot register it with a NIC or
  /// re-export it as a dma-buf.
  bool legacyIpc = false;
};

/// What an importer presents to import an arena: a one-use 128-bit token bound to (arena, generation, importer pid
/// and uid) with an expiry. Plain bytes (48, trivially copyable): send it over the session (ArenaSession::send) or
/// any RPC of your own; it is useless to any other process.
struct ArenaCapability {
  uint64_t arenaId = 0;
  uint64_t generation = 0;  ///< the arena's generation when issued; a grow or shrink since makes it stale
  uint8_t token[16] = {};
  int32_t importerPid = 0;   ///< the only process that may present it
  uint32_t importerUid = 0;  ///< and its user
  uint64_t expiresAtMs = 0;  ///< CLOCK_REALTIME milliseconds; informational (the owner's clock decides)
};
static_assert(sizeof(ArenaCapability) == 48, "ArenaCapability is sent as plain bytes");
static_assert(std::is_trivially_copyable<ArenaCapability>::value, "ArenaCapability is sent as plain bytes");

/// A legacy CUDA IPC handle (CUipcMemHandle, 64 bytes) of a legacyIpc arena, for servers whose RPC carries it.
/// Opened with ArenaImport::openIpc. No lease, no dead-process detection, not RDMA-registrable by the importer.
struct ArenaIpcHandle {
  uint8_t bytes[64] = {};
};
static_assert(sizeof(ArenaIpcHandle) == 64, "ArenaIpcHandle is the 64-byte CUipcMemHandle");

/// A reference on (arena, range) held by an operation in flight (a copy, a transfer, a registered memory region).
/// While it exists the owner cannot free or shrink that memory, and an importer's close() waits for it. Move-only;
/// released by release() or destruction.
class KVCOMM_API ArenaPin {
 public:
  ArenaPin();
  ~ArenaPin();
  ArenaPin(ArenaPin&&) noexcept;
  ArenaPin& operator=(ArenaPin&&) noexcept;
  ArenaPin(const ArenaPin&) = delete;
  ArenaPin& operator=(const ArenaPin&) = delete;
  bool valid() const { return impl_ != nullptr; }
  /// Start of the pinned range in this process (device memory for CUDA arenas).
  void* data() const;
  size_t offset() const;
  size_t bytes() const;
  /// Ends the operation (idempotent).
  void release();

  struct Impl;

 private:
  friend class Arena;
  friend class ArenaImport;
  explicit ArenaPin(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// What a grow() did: the new generation and the importers that mapped it.
struct ArenaGrowth {
  uint64_t generation = 0;
  size_t importersUpdated = 0;        ///< importers that mapped the new bytes before grow() returned
  std::vector<std::string> failures;  ///< one line per importer that failed or did not answer in time
};

/// Memory this process owns, described by a KV layout, exportable to other local processes.
namespace detail {
struct ArenaAccess;  // the layers above arena (endpoints): the pieces behind an arena (arena/arena_access.hpp)
}  // namespace detail

class KVCOMM_API Arena {
 public:
  /// Allocates the layout's extent (rounded up to the granularity) and reserves `options.capacity` bytes of address
  /// space for growth. Throws InvalidArgumentError for a malformed layout (see Fetcher: positive sizes, stride >=
  /// blockBytes, no 64-bit overflow, at most kMaxRegions regions), Unsupported for CUDA without a usable driver or
  /// current context, CudaError/SystemError when allocation fails.
  static Arena create(const KvLayout& layout, const ArenaOptions& options = {});
  /// Most regions a layout may have (what one session message carries).
  static constexpr size_t kMaxRegions = 1024;
  /// Default time to live of a capability.
  static constexpr int64_t kDefaultTtlMs = 60000;

  Arena();
  /// Destroying an arena that is not freed releases this process's references: importers are told (their calls
  /// then throw) and keep their mappings until they close them; the memory is returned when the last one does.
  ~Arena();
  Arena(Arena&&) noexcept;
  Arena& operator=(Arena&&) noexcept;
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  bool valid() const { return impl_ != nullptr; }

  /// Base address (device memory for CUDA arenas); stable for the arena's life, across grow() and shrink().
  void* data() const;
  /// Bytes backed now (a multiple of granularity()).
  size_t bytes() const;
  size_t capacity() const;
  size_t granularity() const;
  MemoryKind kind() const;
  /// "memfd" (host), "posix_fd" (CUDA VMM) or "cuda_ipc" (legacyIpc).
  std::string handleType() const;
  /// CUDA ordinal of the memory (-1 for host memory).
  int device() const;
  /// Random 64-bit id, unique per arena.
  uint64_t id() const;
  /// Starts at 1; increments with every grow() and shrink().
  uint64_t generation() const;
  KvLayout layout() const;
  /// Imports that hold a lease now.
  size_t leases() const;
  /// Pins (operations in flight) on this arena in this process.
  size_t operations() const;
  /// Pids of the processes holding leases (one entry per lease).
  std::vector<int> importers() const;
  /// Capabilities issued and not yet used, expired or revoked.
  size_t liveCapabilities() const;

  /// A one-use capability for process `pid` (user `uid`) to import this arena within `ttlMs` milliseconds (over an
  /// ArenaSession whose peer is that process). ArenaSession::offer binds it to the session's peer.
  ArenaCapability offer(int pid, uint32_t uid, int64_t ttlMs = kDefaultTtlMs);
  /// Withdraws every capability not yet used (imports already made keep their leases).
  void revokeCapabilities();

  /// Maps [bytes(), newBytes) (rounded up to the granularity) at the same addresses, here and in every importer:
  /// grow() tells each importer and waits up to `timeoutMs` (< 0: 10 s) for each to map the new bytes. Existing
  /// bytes and addresses stay. Throws InvalidArgumentError beyond capacity(); capabilities issued before are stale.
  ArenaGrowth grow(size_t newBytes, int64_t timeoutMs = -1);
  /// grow() to the new layout's extent, then the new layout is the arena's (and the importers').
  ArenaGrowth grow(const KvLayout& layout, int64_t timeoutMs = -1);
  /// Releases whole chunks from the top, keeping at least `newBytes` (bytes() may stay larger: a chunk made by one
  /// create/grow is released whole). Refused with Busy while any lease exists (even when nothing would be released)
  /// or a pin overlaps the released bytes, after waiting up to `waitMs` (0: no wait; < 0: no bound) for them to end.
  /// The layout must fit in what is kept.
  void shrink(size_t newBytes, int64_t waitMs = 0);
  /// shrink() to the new layout's extent, which becomes the arena's layout.
  void shrink(const KvLayout& layout, int64_t waitMs = 0);
  /// Unmaps and releases the memory now. Refused with Busy (nothing changed) while leases or pins exist, after
  /// waiting up to `waitMs` (0: no wait; < 0: no bound) for them to end. After free() every call except valid() and
  /// the accessors throws InvalidArgumentError; data() is nullptr.
  void free(int64_t waitMs = 0);
  bool freed() const;

  /// Pins [offset, offset + bytes) for an operation in flight. Throws InvalidArgumentError outside bytes().
  ArenaPin pin(size_t offset, size_t bytes);
  /// Synchronous copies into and out of the arena (memcpy, or cuMemcpy for CUDA arenas), pinned while they run.
  void write(size_t offset, const void* src, size_t bytes);
  void read(size_t offset, void* dst, size_t bytes) const;

  /// The legacy CUDA IPC handle of a legacyIpc arena; InvalidArgumentError for other arenas.
  ArenaIpcHandle ipcHandle() const;

  struct Impl;

 private:
  friend struct detail::ArenaAccess;
  explicit Arena(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

/// What an import does when its owner goes away (process death, closed session, or the owner released the arena).
enum class OwnerLoss {
  Keep,     ///< keep the mapping until close() (readable; the physical memory stays alive); calls throw NetworkError
  Release,  ///< unmap as soon as no pin is left (servers reclaiming a dead client's memory); data() is then unusable
};

/// Per-import options.
struct ImportOptions {
  OwnerLoss onOwnerLoss = OwnerLoss::Keep;
  /// Bound on the import request (< 0: the session's timeout).
  int64_t timeoutMs = -1;
};

/// Another process's arena mapped into this one. Holds a lease on it until close().
class KVCOMM_API ArenaImport {
 public:
  /// Opens a legacy CUDA IPC handle (the whole of it: `layout`'s extent must fit in the owner's allocation). No
  /// lease: the owner learns nothing of this import, and a dead owner is not detected. The memory cannot be
  /// registered with a NIC or re-exported as a dma-buf by this process.
  static ArenaImport openIpc(const ArenaIpcHandle& handle, const KvLayout& layout);

  ArenaImport();
  /// Like close() without waiting: an import with pins left is closed when the last pin is released.
  ~ArenaImport();
  ArenaImport(ArenaImport&&) noexcept;
  ArenaImport& operator=(ArenaImport&&) noexcept;
  ArenaImport(const ArenaImport&) = delete;
  ArenaImport& operator=(const ArenaImport&) = delete;
  bool valid() const { return impl_ != nullptr; }

  /// Base address of the mapping (device memory for CUDA arenas): stable while the import is open, across growth;
  /// nullptr after close() (or after an OwnerLoss::Release unmapped it).
  void* data() const;
  /// Bytes mapped now (follows the owner's grow()).
  size_t bytes() const;
  size_t capacity() const;
  MemoryKind kind() const;
  /// "memfd", "posix_fd" or "cuda_ipc".
  std::string handleType() const;
  uint64_t arenaId() const;
  /// The owner's generation this import has mapped.
  uint64_t generation() const;
  KvLayout layout() const;
  int ownerPid() const;
  /// False once the owner is known gone (process death, closed session, arena released); always true for openIpc.
  bool ownerAlive() const;
  /// Why the owner is gone ("" while alive).
  std::string ownerLostReason() const;
  /// Throws NetworkError naming the owner and the reason when it is gone, InvalidArgumentError when closed.
  void check() const;
  /// Pins (operations in flight) on this import.
  size_t operations() const;

  /// Pins [offset, offset + bytes) for an operation in flight. Throws NetworkError when the owner is gone,
  /// Aborted while closing, InvalidArgumentError outside bytes() or after close().
  ArenaPin pin(size_t offset, size_t bytes);
  /// Synchronous copies into and out of the mapping, pinned while they run (same errors as pin()).
  void write(size_t offset, const void* src, size_t bytes);
  void read(size_t offset, void* dst, size_t bytes) const;

  /// Drains (waits up to `timeoutMs` for every pin to be released; < 0: no bound; Timeout leaves the import
  /// closing), unmaps, and tells the owner, which drops the lease before close() returns (bounded by the session's
  /// timeout; an owner already gone is not waited for). Idempotent. Works after the owner is gone.
  void close(int64_t timeoutMs = -1);
  bool closed() const;

  struct Impl;

 private:
  friend class ArenaSession;
  explicit ArenaImport(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

/// Options of ArenaSession::connect.
struct ArenaSessionOptions {
  /// Bound on connecting (the server may appear during it) and the handshake, and the default bound of import
  /// and close requests (< 0: 10 s).
  int64_t timeoutMs = -1;
};

/// One connection between two processes (a client and an ArenaServer). Either side may offer its arenas to the
/// other and import the other's; small application messages travel on it too. Leases live on their session: when it
/// ends (either process closes it or dies), the owner reclaims them and the importer's owner is gone.
class KVCOMM_API ArenaSession {
 public:
  /// Connects to the server at `address` ("@name": abstract Unix socket; otherwise a filesystem path), waiting for
  /// it to appear until the timeout. The server must run as the same uid (checked with SO_PEERCRED on both sides).
  /// Throws NetworkError (refused, with the server's reason; Timeout when it never answered).
  static ArenaSession connect(const std::string& address, const ArenaSessionOptions& options = {});
  /// Largest application message.
  static constexpr size_t kMaxMessageBytes = 60 * 1024;

  ArenaSession();
  /// Ends the session once no import made over it remains (see close()).
  ~ArenaSession();
  ArenaSession(ArenaSession&&) noexcept;
  ArenaSession& operator=(ArenaSession&&) noexcept;
  ArenaSession(const ArenaSession&) = delete;
  ArenaSession& operator=(const ArenaSession&) = delete;
  bool valid() const { return impl_ != nullptr; }

  /// The peer process (from SO_PEERCRED).
  int peerPid() const;
  uint32_t peerUid() const;
  /// False once the session ended (peer closed or died, protocol error, close()).
  bool alive() const;
  /// Why it ended ("" while alive).
  std::string lostReason() const;

  /// Owner side: a capability for the peer process to import `arena` (Arena::offer bound to peerPid()/peerUid()).
  ArenaCapability offer(Arena& arena, int64_t ttlMs = Arena::kDefaultTtlMs);
  /// Importer side: imports the arena the peer offered. Throws InvalidArgumentError with the owner's reason when the
  /// capability is refused (forged, already used, expired, issued to another process or generation, arena freed) —
  /// no descriptor is received then; NetworkError when the session is gone; Timeout after the bound.
  ArenaImport import(const ArenaCapability& capability, const ImportOptions& options = {});

  /// Sends an application message (at most kMaxMessageBytes) to the peer. Throws NetworkError when the session is
  /// gone.
  void send(const void* data, size_t bytes);
  /// The next application message from the peer, waiting up to `timeoutMs` (< 0: no bound). Throws NetworkError
  /// (code Timeout) on expiry, NetworkError when the session ended and no message is left.
  std::vector<uint8_t> receive(int64_t timeoutMs = -1);

  /// Ends the session now: leases held over it are dropped on both sides (the peer's imports of this process's
  /// arenas are reclaimed; this process's imports over it lose their owner). Idempotent.
  void close();

  struct Impl;

 private:
  friend class ArenaServer;
  explicit ArenaSession(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

/// Options of ArenaServer::listen.
struct ArenaServerOptions {
  /// Most connections at once (handshaking or established); more are refused with a reason.
  size_t maxSessions = 1024;
  /// Most connections still handshaking at once; more are refused.
  size_t maxPendingHandshakes = 64;
  /// A connection must complete its handshake within this (< 0: 1 s), or it is dropped.
  int64_t handshakeTimeoutMs = -1;
  /// Default bound of requests made over accepted sessions (< 0: 10 s).
  int64_t requestTimeoutMs = -1;
};

/// Where clients meet a server: one thread serves every connection (non-blocking; credentials checked before
/// anything is read; handshakes bounded; connections capped), so an idle or hostile local connection cannot stall
/// the others.
class KVCOMM_API ArenaServer {
 public:
  /// Listens on `address`: "@name" for an abstract Unix socket, a filesystem path (its directory must be mode 0700
  /// and owned by this user; a stale socket file is replaced), or "" for a fresh abstract name (see address()).
  static ArenaServer listen(const std::string& address = "", const ArenaServerOptions& options = {});

  ArenaServer();
  /// close().
  ~ArenaServer();
  ArenaServer(ArenaServer&&) noexcept;
  ArenaServer& operator=(ArenaServer&&) noexcept;
  ArenaServer(const ArenaServer&) = delete;
  ArenaServer& operator=(const ArenaServer&) = delete;
  bool valid() const { return impl_ != nullptr; }

  /// The address clients pass to ArenaSession::connect.
  std::string address() const;
  /// The next client whose handshake completed, waiting up to `timeoutMs` (< 0: no bound). Throws NetworkError
  /// (code Timeout) on expiry, Aborted after close().
  ArenaSession accept(int64_t timeoutMs = -1);
  /// Connections established now.
  size_t sessions() const;
  /// Connections refused or dropped before or during the handshake so far (wrong uid, over a cap, no hello in time,
  /// malformed hello).
  uint64_t refusedConnections() const;
  /// Stops listening and ends every session (leases over them are dropped on both sides). Idempotent.
  void close();

  struct Impl;

 private:
  explicit ArenaServer(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace kvcomm
