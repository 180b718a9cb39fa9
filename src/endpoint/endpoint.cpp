// Endpoints (kvcomm/endpoint.hpp): registrations served by the TCP transport's server and the same-host share server
// (one each per endpoint, every registration behind its capability); transfers carried by the peer transport over a
// mapping of the remote registration (same host) or the TCP transport's requester, one of each per pair of local and
// remote registration, planned and validated by the fetch planner over the pair's two layouts.
#include "kvcomm/endpoint.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "arena/arena_access.hpp"
#include "arena/cuda_support.hpp"
#include "common/check.hpp"
#include "common/env.hpp"
#include "common/log.hpp"
#include "common/socket.hpp"
#include "device/device_memory.hpp"
#include "endpoint/endpoint_access.hpp"
#include "endpoint/inbox.hpp"
#include "endpoint/metadata.hpp"
#include "endpoint/notifier.hpp"
#include "endpoint/notify_wire.hpp"
#include "endpoint/peer_link.hpp"
#include "endpoint/peer_mapping.hpp"
#include "endpoint/rdma_side.hpp"
#include "endpoint/share_server.hpp"
#include "fetch/member_layouts.hpp"
#include "fetch/planner.hpp"
#include "fetch/transport/negotiation.hpp"
#include "fetch/transport/net/net_context.hpp"
#include "fetch/transport/rdma/verbs_transport.hpp"
#include "fetch/transport/tcp/tcp_client.hpp"
#include "fetch/transport/tcp/tcp_server.hpp"
#include "fetch/transport/tcp/tcp_transport.hpp"
#include "kernels/launch.hpp"
#include "kvcomm/limits.hpp"
#include "kvlayout/kv_layout.hpp"
#include "symm/buffer_internals.hpp"

namespace kvcomm {

using detail::cat;
using detail::hexId;
using detail::SockAddr;

namespace {

using Clock = std::chrono::steady_clock;

KvLayout normalised(KvLayout l) {
  for (KvRegion& r : l.regions)
    if (r.blockStride == 0) r.blockStride = r.blockBytes;
  return l;
}

detail::WireCapability freshCapability() {
  detail::WireCapability c{};
  detail::randomBytes(c.bytes, sizeof(c.bytes));
  return c;
}

uint64_t freshId() {
  uint64_t id = 0;
  while (id == 0) detail::randomBytes(&id, sizeof(id));
  return id;
}

}  // namespace

// ---- registrations ------------------------------------------------------------------------------------------------

struct Registration::Impl {
  uint64_t id = 0;
  char* base = nullptr;
  size_t bytes = 0;
  MemoryKind kind = MemoryKind::Host;
  int device = -1;
  KvLayout layout;
  KvDescription contents;
  Access access = Access::ReadWrite;
  // The owning endpoint's identity, as metadata carries it.
  uint64_t endpointId = 0;
  std::string endpointName;
  SockAddr tcp;
  uint64_t hostKey = 0;
  std::shared_ptr<detail::ServedMemory> served;  // generation and capability live under served->mu
  std::weak_ptr<detail::ShareServer> share;      // the endpoint's: same-host peers' leases
  std::atomic<bool> leasesPending{false};        // an unregister timed out with peers still mapping it
  ArenaPin arenaPin;                             // arenas: held while registered
  SymmetricBuffer buffer;                        // buffers: a handle of our own while registered
  uint64_t unbackListener = 0;
  std::function<std::vector<detail::Piece>()> ownPieces;  // arenas and buffers: what backs them
  const detail::VerbsApi* verbs = nullptr;                // the endpoint's provider (when it has a device)
  bool rdmaOffered = false;                               // the endpoint has an RDMA device
  int64_t timeoutMs = 3000;
  std::mutex rdmaMu;
  // Its RDMA sides, opened on first use: one that peers connect to (closed and reopened by revoke, so earlier
  // peers' keys stop working) and one that this endpoint's own transfers from it use.
  std::shared_ptr<detail::RdmaSide> rdmaServe, rdmaLocal;
  std::atomic<bool> registered{true};
  std::mutex mu;                                         // transfers
  std::vector<std::weak_ptr<Transfer::Impl>> transfers;  // that use this registration as local memory

  std::string who() const { return cat("local registration ", hexId(id)); }
  void cancelTransfers(const std::string& why);
  /// The RDMA side of `which` (rdmaServe or rdmaLocal), opened on first use; nullptr with *why. Hold rdmaMu.
  std::shared_ptr<detail::RdmaSide> rdmaSide(std::shared_ptr<detail::RdmaSide>& which, std::string* why);
  /// Closes both RDMA sides: no peer's READ or WRITE reaches the memory afterwards.
  void closeRdma();
};

std::shared_ptr<detail::RdmaSide> Registration::Impl::rdmaSide(std::shared_ptr<detail::RdmaSide>& which,
                                                               std::string* why) {
  if (which) return which;
  if (!rdmaOffered) {
    *why = "this endpoint has no RDMA device";
    return nullptr;
  }
  detail::RdmaSide::Memory m;
  m.base = base;
  m.bytes = bytes;
  m.kind = kind;
  m.device = device;
  m.remoteWrite = access == Access::ReadWrite;
  if (ownPieces)
    for (const detail::Piece& p : ownPieces()) m.pieces.push_back({p.offset, p.bytes, base + p.offset});
  else
    m.pieces.push_back({0, bytes, base});
  which = detail::RdmaSide::open(verbs, m, timeoutMs, why);
  return which;
}

void Registration::Impl::closeRdma() {
  std::lock_guard<std::mutex> lock(rdmaMu);
  for (auto* side : {&rdmaServe, &rdmaLocal})
    if (*side) (*side)->close();
}

Registration::Registration() = default;
Registration::~Registration() = default;
Registration::Registration(const Registration&) = default;
Registration& Registration::operator=(const Registration&) = default;
Registration::Registration(Registration&&) noexcept = default;
Registration& Registration::operator=(Registration&&) noexcept = default;
Registration::Registration(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

namespace {

template <typename P>
P* require(const std::shared_ptr<P>& p, const char* call, const char* what) {
  KVCOMM_CHECK_ARG(p != nullptr, call, "an empty ", what, " handle");
  return p.get();
}

}  // namespace

uint64_t Registration::id() const {
  return require(impl_, "Registration::id", "Registration")->id;
}
uint64_t Registration::generation() const {
  auto* r = require(impl_, "Registration::generation", "Registration");
  std::shared_lock<std::shared_mutex> lock(r->served->mu);
  return r->served->generation;
}
void* Registration::data() const {
  return require(impl_, "Registration::data", "Registration")->base;
}
size_t Registration::bytes() const {
  return require(impl_, "Registration::bytes", "Registration")->bytes;
}
MemoryKind Registration::kind() const {
  return require(impl_, "Registration::kind", "Registration")->kind;
}
int Registration::device() const {
  return require(impl_, "Registration::device", "Registration")->device;
}
const KvLayout& Registration::layout() const {
  return require(impl_, "Registration::layout", "Registration")->layout;
}
const KvDescription& Registration::contents() const {
  return require(impl_, "Registration::contents", "Registration")->contents;
}
Access Registration::access() const {
  return require(impl_, "Registration::access", "Registration")->access;
}
bool Registration::registered() const {
  return require(impl_, "Registration::registered", "Registration")->registered.load();
}

std::vector<uint8_t> Registration::metadata() const {
  const char* call = "Registration::metadata";
  auto* r = require(impl_, call, "Registration");
  KVCOMM_CHECK_ARG(r->registered, call, r->who(), " is unregistered");
  detail::EndpointMetadata m;
  m.endpointId = r->endpointId;
  m.regionId = r->id;
  {
    std::shared_lock<std::shared_mutex> lock(r->served->mu);
    m.generation = r->served->generation;
    m.capability = r->served->capability;
  }
  m.memoryKind = static_cast<uint32_t>(r->kind);
  m.access = static_cast<uint32_t>(r->access);
  m.pid = static_cast<int32_t>(::getpid());
  m.hostKey = r->hostKey;
  m.tcp = r->tcp;
  m.transports = r->rdmaOffered ? detail::kMetaRdma : 0u;
  m.name = r->endpointName.substr(0, detail::kMaxNameBytes);
  m.layout = r->layout;
  m.layoutHash = layoutHash(r->layout);
  m.contents = r->contents;
  return detail::encodeMetadata(m);
}

void Registration::revoke() {
  const char* call = "Registration::revoke";
  auto* r = require(impl_, call, "Registration");
  KVCOMM_CHECK_ARG(r->registered, call, r->who(), " is unregistered");
  std::unique_lock<std::shared_mutex> lock(r->served->mu);  // waits for requests being served
  r->served->generation++;
  r->served->capability = freshCapability();
  lock.unlock();
  // Same-host peers copy through their mapping without a request that could be refused: the revocation holds only
  // once each has unmapped, so it waits for them (bounded) as unregister does.
  std::vector<int> holders;
  if (auto share = r->share.lock()) holders = share->end(r->id, detail::ShareEnd::Revoked, r->timeoutMs);
  // RDMA peers hold keys of its memory regions: they go (the peers' next work request fails); the next peer with
  // the new metadata gets new ones.
  {
    std::lock_guard<std::mutex> rl(r->rdmaMu);
    if (r->rdmaServe) r->rdmaServe->close();
    r->rdmaServe.reset();
  }
  if (holders.empty()) return;
  std::string pids;
  for (int p : holders) pids += cat(pids.empty() ? "" : ", ", p);
  KVCOMM_THROW(Timeout, call, r->who(), ": revoked (its earlier metadata is refused), but same-host peers (pid ", pids,
               ") still map it after ", r->timeoutMs, " ms and can copy through their mappings until they unmap");
}

// ---- remote memory ------------------------------------------------------------------------------------------------

struct RemoteMemory::Impl {
  detail::EndpointMetadata meta;
  detail::RemoteDescriptor desc{};
  std::mutex mu;
  std::shared_ptr<detail::PeerMapping> mapping;  // same host: mapped at the first peer transfer
  std::string notShareable;                      // the owner said its memory cannot be mapped (asked once)
  std::atomic<bool> disconnected{false};
  std::string who() const {
    return cat("registration ", hexId(meta.regionId), " of endpoint '", meta.name, "' (", meta.tcp.toString(), ")");
  }
};

namespace {

// How this endpoint reaches the owner of `remote` outside a transfer (its RDMA connection, notifications): member 1
// of the context is the remote registration, with its capability.
detail::NetContext ownerContext(const RemoteMemory::Impl& remote, std::string localName, int64_t timeoutMs) {
  detail::NetContext ctx;
  ctx.rank = 0;
  ctx.groupId = remote.meta.endpointId;
  ctx.descs = {detail::RemoteDescriptor{}, remote.desc};
  ctx.netTimeoutMs = timeoutMs;
  ctx.capabilities = {detail::WireCapability{}, remote.meta.capability};
  ctx.sourceNames = {std::move(localName), cat("endpoint '", remote.meta.name, "'")};
  return ctx;
}

}  // namespace

RemoteMemory::RemoteMemory() = default;
RemoteMemory::~RemoteMemory() = default;
RemoteMemory::RemoteMemory(const RemoteMemory&) = default;
RemoteMemory& RemoteMemory::operator=(const RemoteMemory&) = default;
RemoteMemory::RemoteMemory(RemoteMemory&&) noexcept = default;
RemoteMemory& RemoteMemory::operator=(RemoteMemory&&) noexcept = default;
RemoteMemory::RemoteMemory(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::string RemoteMemory::peerName() const {
  return require(impl_, "RemoteMemory::peerName", "RemoteMemory")->meta.name;
}
uint64_t RemoteMemory::id() const {
  return require(impl_, "RemoteMemory::id", "RemoteMemory")->meta.regionId;
}
uint64_t RemoteMemory::generation() const {
  return require(impl_, "RemoteMemory::generation", "RemoteMemory")->meta.generation;
}
const KvLayout& RemoteMemory::layout() const {
  return require(impl_, "RemoteMemory::layout", "RemoteMemory")->meta.layout;
}
const KvDescription& RemoteMemory::contents() const {
  return require(impl_, "RemoteMemory::contents", "RemoteMemory")->meta.contents;
}
MemoryKind RemoteMemory::kind() const {
  return static_cast<MemoryKind>(require(impl_, "RemoteMemory::kind", "RemoteMemory")->meta.memoryKind);
}
Access RemoteMemory::access() const {
  return static_cast<Access>(require(impl_, "RemoteMemory::access", "RemoteMemory")->meta.access);
}
std::string RemoteMemory::address() const {
  return require(impl_, "RemoteMemory::address", "RemoteMemory")->meta.tcp.toString();
}

// ---- transfers ----------------------------------------------------------------------------------------------------

namespace {

// A local registration and a remote one, as the TCP requester and the peer transport move blocks between them:
// member 0 is the local memory, member 1 the remote (writes are validated over the other order: the destination is
// member 0).
struct Link {
  detail::MemberLayouts table;       // 0: local, 1: remote
  detail::MemberLayouts writeTable;  // 0: remote, 1: local
  std::unique_ptr<detail::FetchTransport> tcp;
  std::vector<std::string> names, writeNames;
  std::mutex peerMu;
  std::unique_ptr<detail::PeerLink> peer;                    // same host, once mapped
  std::vector<std::weak_ptr<Transfer::Impl>> peerTransfers;  // that use `peer` (cancelled when its mapping ends)
  std::vector<std::weak_ptr<Transfer::Impl>> netTransfers;   // over `tcp` or `rdma` (cancelled at disconnect)
  // RDMA, once connected: the local registration's side, the peer number of the owner's queue pairs on it, the TCP
  // connection that asked for them (their lease: the owner drops them when it closes), the transport.
  std::mutex rdmaMu;
  std::shared_ptr<detail::RdmaSide> rdmaSide;
  int rdmaPeer = -1;
  detail::Fd rdmaControl;
  std::unique_ptr<detail::FetchTransport> rdma;

  void dropRdma() {
    rdma.reset();
    if (rdmaSide) rdmaSide->drop(rdmaPeer);
    rdmaSide.reset();
    rdmaControl = detail::Fd();
  }
  ~Link() { dropRdma(); }
};

}  // namespace

struct Transfer::Impl {
  std::mutex mu;
  std::shared_ptr<Link> link;
  std::shared_ptr<Registration::Impl> local;
  std::shared_ptr<const detail::PlanOutput> plan;
  std::shared_ptr<detail::TransportOp> op;  // shared with a waiter (Transfer::wait) between its polls
  bool push = false;
  bool dstIsRunSrc = false;  // a TCP write: the runs were turned round, the destination ids are their `src`
  FetchTransportKind transport = FetchTransportKind::Tcp;
  std::vector<int64_t> blocksDone;
  bool ended = false;
  FetchStatus final;
  // A notification (TransferOptions::notify): once the bytes moved (`moved`) the transfer stays InProgress until
  // the endpoint's notifier has sent it (Sending while it does) and ends it with the outcome.
  enum class Note { None, Waiting, Sending };
  Note note = Note::None;
  bool moved = false;
  std::condition_variable noted;  // `note` left Sending, or the transfer ended

  // Under mu.
  FetchStatus poll() {
    if (ended) return final;
    if (moved) return movedStatus();
    bool finished = false;
    std::string error;
    op->poll(blocksDone, &finished, &error);
    FetchStatus s = statusOf(finished, error);
    if (finished && error.empty() && note != Note::None) {
      moved = true;  // the notifier sends the notification now, and ends the transfer
      return movedStatus();
    }
    if (finished) end(s);
    return s;
  }
  FetchStatus movedStatus() const {
    FetchStatus s;
    s.bytesTotal = s.bytesDone = plan->info.bytes;
    return s;
  }
  FetchStatus statusOf(bool finished, const std::string& error) const {
    FetchStatus s;
    s.bytesTotal = plan->info.bytes;
    const uint64_t perBlock = link->table.blockBytesSum;
    for (int64_t b : blocksDone) s.bytesDone += static_cast<size_t>(b) * perBlock;
    if (!finished) return s;
    if (error.empty()) {
      s.state = FetchState::Done;
      s.bytesDone = s.bytesTotal;
      return s;
    }
    s.state = FetchState::Failed;
    s.error = error;
    for (size_t i = 0; i < plan->runs.size(); ++i) {
      const detail::BlockRun& r = plan->runs[i];
      const int64_t first = dstIsRunSrc ? r.src : r.dst;  // destination ids: the remote's for a write
      for (int64_t k = blocksDone[i]; k < r.blocks; ++k) s.failedBlocks.push_back(first + k);
    }
    return s;
  }
  void end(const FetchStatus& s) {
    final = s;
    ended = true;
    if (op) op->stop();  // finished: joins a thread that has nothing left to do
    op.reset();
    noted.notify_all();
  }
  // Under `lock` (of mu): stops it (nothing it started touches memory after this), failing it with `why` unless it
  // ended. A notification being sent is waited for: once delivered, the transfer is Done.
  void cancel(std::unique_lock<std::mutex>& lock, const std::string& why) {
    if (ended) return;
    if (moved) {
      noted.wait(lock, [&] { return ended || note != Note::Sending; });
      if (!ended) end(statusOf(true, cat(why, " (its blocks had moved; its notification was not sent)")));
      return;
    }
    bool finished = false;
    std::string error;
    op->poll(blocksDone, &finished, &error);
    op->stop();  // cancels and joins: nothing it started writes after this
    end(statusOf(true, finished && error.empty() ? "" : (error.empty() ? why : error)));
  }
};

namespace {

using TransferList = std::vector<std::weak_ptr<Transfer::Impl>>;

// Adds `t`, dropping the entries of transfers that ended and went away (a long-lived list stays short). The caller
// holds the list's lock.
void track(TransferList& list, const std::shared_ptr<Transfer::Impl>& t) {
  std::erase_if(list, [](const std::weak_ptr<Transfer::Impl>& w) { return w.expired(); });
  list.push_back(t);
}

// Moves the transfers still alive out of `list` (the caller holds its lock), to be cancelled after it is released.
void takeLive(TransferList& list, std::vector<std::shared_ptr<Transfer::Impl>>& out) {
  for (auto& w : list)
    if (auto t = w.lock()) out.push_back(std::move(t));
  list.clear();
}

// Stops each (nothing it started touches memory after this), failing those still running with `why`.
void cancelAll(const std::vector<std::shared_ptr<Transfer::Impl>>& live, const std::string& why) {
  for (auto& t : live) {
    std::unique_lock<std::mutex> lock(t->mu);
    t->cancel(lock, why);
  }
}

}  // namespace

void Registration::Impl::cancelTransfers(const std::string& why) {
  std::vector<std::shared_ptr<Transfer::Impl>> live;
  {
    std::lock_guard<std::mutex> lock(mu);
    takeLive(transfers, live);
  }
  cancelAll(live, why);
}

Transfer::Transfer() = default;
Transfer::~Transfer() {
  if (!impl_) return;
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->cancel(lock, "the Transfer handle was destroyed before it ended");
}
Transfer::Transfer(Transfer&&) noexcept = default;
Transfer& Transfer::operator=(Transfer&& o) noexcept {
  if (this != &o) {
    if (impl_) {
      std::unique_lock<std::mutex> lock(impl_->mu);
      impl_->cancel(lock, "the Transfer handle was replaced before it ended");
    }
    impl_ = std::move(o.impl_);
  }
  return *this;
}
Transfer::Transfer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

FetchStatus Transfer::test() {
  auto* t = require(impl_, "Transfer::test", "Transfer");
  std::lock_guard<std::mutex> lock(t->mu);
  return t->poll();
}

FetchStatus Transfer::wait(int64_t timeoutMs) {
  auto* t = require(impl_, "Transfer::wait", "Transfer");
  const bool bounded = timeoutMs >= 0 && timeoutMs < 1000000000000ll;
  const auto deadline = Clock::now() + std::chrono::milliseconds(bounded ? timeoutMs : 0);
  for (bool first = true;; first = false) {
    // Woken when it ends, in slices so that a bounded wait keeps its bound.
    int64_t slice = 50;
    if (bounded)
      slice = std::max<int64_t>(
          std::min<int64_t>(slice,
                            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count() + 1),
          0);
    std::shared_ptr<detail::TransportOp> op;
    {
      std::unique_lock<std::mutex> lock(t->mu);
      FetchStatus s = t->poll();
      if (s.state != FetchState::InProgress || (bounded && Clock::now() >= deadline)) return s;
      if (t->moved) {  // its notification is on its way: the notifier ends it
        t->noted.wait_for(lock, std::chrono::milliseconds(slice));
        continue;
      }
      op = t->op;
    }
    // An unbounded wait runs a transfer no worker has started yet itself (a small one then costs what a synchronous
    // call does); a bounded one must return at its bound, so it only waits.
    if (first && !bounded && op->runHere()) continue;
    // Outside the lock: an unregister may cancel it meanwhile (stop() leaves the object alive for this wait).
    op->waitEnded(slice);
  }
}

const FetchPlanInfo& Transfer::info() const {
  return require(impl_, "Transfer::info", "Transfer")->plan->info;
}
FetchTransportKind Transfer::transport() const {
  return require(impl_, "Transfer::transport", "Transfer")->transport;
}

// ---- the endpoint -------------------------------------------------------------------------------------------------

struct Endpoint::Impl {
  uint64_t id = 0;
  std::string name;
  int64_t timeoutMs = 3000;
  int connections = 4;
  uint64_t hostKey = 0;
  std::shared_ptr<detail::ServedDirectory> directory;
  std::unique_ptr<detail::TcpServer> server;
  std::shared_ptr<detail::ShareServer> share;
  SockAddr address;
  const detail::VerbsApi* verbs = nullptr;  // the provider fabrics open (tests: a fake)
  bool rdma = false;                        // an RDMA device opened at create
  std::string noRdma;                       // why not
  std::shared_ptr<detail::Inbox> inbox;     // notifications received (the server's threads deliver them)
  std::unique_ptr<detail::Notifier> notifier;

  std::mutex mu;
  bool closed = false;
  std::map<uint64_t, std::shared_ptr<Registration::Impl>> registrations;
  std::map<std::string, std::shared_ptr<RemoteMemory::Impl>> remotes;  // by metadata bytes (connect is idempotent)
  std::map<std::pair<uint64_t, const RemoteMemory::Impl*>, std::shared_ptr<Link>> links;
  std::map<int, std::unique_ptr<detail::DeviceCopier>> copiers;  // by device: same-host CUDA copies
  // Peer links whose mapping ended or whose registration went away: graphs may still hold their tables (they copy
  // nothing now); freed when the endpoint closes.
  std::vector<std::unique_ptr<detail::PeerLink>> retired;

  // The lease watcher: one thread that reads the owners' notices on every mapping this endpoint holds.
  struct Watch {
    std::shared_ptr<detail::PeerMapping> mapping;
    std::string owner;
  };
  std::mutex watchMu;
  std::vector<Watch> watches;
  bool watchStop = false;
  detail::Fd watchWake;
  std::thread watcher;

  void requireOpen(const char* call) { KVCOMM_CHECK_ARG(!closed, call, "the endpoint is closed"); }
  Registration add(const char* call, char* base, size_t bytes, MemoryKind kind, int device, const KvLayout& layout,
                   const RegisterOptions& options, const std::vector<Range>& backed,
                   std::function<std::vector<detail::Piece>()> ownPieces = {});
  void unregister(Registration::Impl& r, int64_t timeoutMs);
  void waitLeases(Registration::Impl& r, int64_t timeoutMs);
  std::shared_ptr<Link> linkFor(const std::shared_ptr<Registration::Impl>& local,
                                const std::shared_ptr<RemoteMemory::Impl>& remote);
  /// The two handles of a transfer, checked: valid, the local one ours and registered, the remote connected.
  std::pair<std::shared_ptr<Registration::Impl>, std::shared_ptr<RemoteMemory::Impl>> checkPair(
      const char* call, const Registration& local, const RemoteMemory& remote);
  /// The link's RDMA transport, connected on first use; nullptr with *why (*refused: the owner refused the metadata
  /// itself, which fails the transfer as TCP would).
  detail::FetchTransport* rdmaFor(Link& link, Registration::Impl& local,
                                  const std::shared_ptr<RemoteMemory::Impl>& remote, std::string* why, bool* refused);
  // The same-host mapping of `remote` for copies with `local` (one host, one memory kind, granted by the owner:
  // cached per remote), or null with *status and *why.
  std::shared_ptr<detail::PeerMapping> mappingFor(const Registration::Impl& local,
                                                  const std::shared_ptr<RemoteMemory::Impl>& remote,
                                                  detail::ShareStatus* status, std::string* why);
  detail::PeerLink* peerFor(Link& link, const Registration::Impl& local,
                            const std::shared_ptr<RemoteMemory::Impl>& remote, detail::ShareStatus* status,
                            std::string* why);
  Transfer start(const char* call, bool push, const Registration& local, const RemoteMemory& remote,
                 const int64_t* remoteBlocks, const int64_t* localBlocks, size_t count, const TransferOptions& options);
  void startDevice(const char* call, bool push, const Registration& local, const RemoteMemory& remote,
                   const DeviceTransferBatch& batch, Stream stream);
  detail::NotifyTarget notifyTarget(const RemoteMemory::Impl& remote) const;
  /// Queues `t`'s notification: sent once its bytes moved, dropped when it fails; its outcome ends `t`.
  void postNotification(const std::shared_ptr<Transfer::Impl>& t, const RemoteMemory::Impl& remote,
                        std::string message);
  void watch(std::shared_ptr<detail::PeerMapping> mapping, std::string owner);
  /// Makes the watcher look at `watches` again (hold watchMu).
  void wakeWatcher();
  void watchLoop();
  void endMapping(const std::shared_ptr<detail::PeerMapping>& mapping, const std::string& why);
};

Endpoint::Endpoint() = default;
Endpoint::~Endpoint() {
  try {
    close();
  } catch (const std::exception& e) {
    KVCOMM_WARN("Endpoint: close at destruction: ", e.what());
  }
}
Endpoint::Endpoint(Endpoint&&) noexcept = default;
Endpoint& Endpoint::operator=(Endpoint&& o) noexcept {
  if (this != &o) {
    try {
      close();
    } catch (const std::exception& e) {
      KVCOMM_WARN("Endpoint: close at assignment: ", e.what());
    }
    impl_ = std::move(o.impl_);
  }
  return *this;
}
Endpoint::Endpoint(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Endpoint Endpoint::create(const EndpointOptions& options) {
  const char* call = "Endpoint::create";
  KVCOMM_CHECK_ARG(options.connectionsPerPeer >= 1 && options.connectionsPerPeer <= 64, call, "connectionsPerPeer ",
                   options.connectionsPerPeer, " is outside [1, 64]");
  auto impl = std::make_shared<Impl>();
  impl->id = freshId();
  impl->name = options.name.empty() ? cat("pid ", ::getpid()) : options.name;
  KVCOMM_CHECK_ARG(impl->name.size() <= detail::kMaxNameBytes, call, "the name '", impl->name, "' is longer than ",
                   detail::kMaxNameBytes, " bytes");
  impl->timeoutMs = options.timeoutMs < 0 ? env::fetchNetTimeoutMs() : options.timeoutMs;
  KVCOMM_CHECK_ARG(impl->timeoutMs > 0, call, "timeoutMs must be positive (or < 0 for the default)");
  impl->connections = options.connectionsPerPeer;
  KVCOMM_CHECK_ARG(options.maxQueuedNotifications >= 1, call, "maxQueuedNotifications must be at least 1");
  impl->inbox = std::make_shared<detail::Inbox>(options.maxQueuedNotifications);
  impl->notifier = std::make_unique<detail::Notifier>(impl->id, impl->name, impl->timeoutMs);
  impl->hostKey = detail::thisHostKey();
  SockAddr at = options.tcpAddress.empty() ? detail::pickLocalAddress() : SockAddr::parse(options.tcpAddress);
  impl->directory = std::make_shared<detail::ServedDirectory>(impl->id);
  detail::TcpServerOptions so;
  so.netTimeoutMs = impl->timeoutMs;
  so.maxConnections = 1024;  // every client of a KV server, a few connections each
  impl->server = std::make_unique<detail::TcpServer>(impl->directory, at, so);
  impl->address = impl->server->endpoint();
  impl->server->start();
  impl->share = std::make_shared<detail::ShareServer>(impl->id);
  // RDMA: offered (in every registration's metadata) when a device opens here; registrations open their own
  // fabric on first use.
  impl->verbs = detail::fetchTestHooks().verbs;
  impl->rdma = detail::VerbsFabric::open(impl->verbs, MemoryKind::Host, -1, "", "memfd", impl->timeoutMs,
                                         &impl->noRdma) != nullptr;
  return Endpoint(std::move(impl));
}

uint64_t Endpoint::id() const {
  return require(impl_, "Endpoint::id", "Endpoint")->id;
}
std::string Endpoint::name() const {
  return require(impl_, "Endpoint::name", "Endpoint")->name;
}
std::string Endpoint::address() const {
  return require(impl_, "Endpoint::address", "Endpoint")->address.toString();
}

namespace {

// The one bound on a notification's message, for every call that takes one.
void checkMessage(const char* call, size_t bytes) {
  KVCOMM_CHECK_ARG(bytes <= kMaxNotificationBytes, call, "a notification of ", bytes,
                   " bytes (at most kMaxNotificationBytes = ", kMaxNotificationBytes, ")");
}

// A notification's control request, for registration `regionId` (the endpoint's inbox: null once it is gone).
detail::WireStatus receiveNotification(detail::Inbox* inbox, uint64_t regionId, const uint8_t* body, size_t n,
                                       std::string* why) {
  detail::NotifyMessage m;
  *why = detail::decodeNotify(body, n, &m);
  if (!why->empty()) return detail::WireStatus::Malformed;
  switch (inbox ? inbox->deliver(std::move(m), regionId) : detail::Inbox::Delivery::Closed) {
    case detail::Inbox::Delivery::Delivered:
    case detail::Inbox::Delivery::Duplicate:  // a resend after a lost acknowledgement: delivered already
      return detail::WireStatus::Ok;
    case detail::Inbox::Delivery::Full:
      *why = "the endpoint's inbox is full (maxQueuedNotifications not taken yet)";
      return detail::WireStatus::Busy;
    case detail::Inbox::Delivery::Closed:
      break;
  }
  *why = "the endpoint is closing";
  return detail::WireStatus::Closing;
}

}  // namespace

Registration Endpoint::Impl::add(const char* call, char* base, size_t bytes, MemoryKind kind, int device,
                                 const KvLayout& layout, const RegisterOptions& options,
                                 const std::vector<Range>& backed,
                                 std::function<std::vector<detail::Piece>()> ownPieces) {
  KVCOMM_CHECK_ARG(base != nullptr, call, "a null base address");
  KVCOMM_CHECK_ARG(bytes > 0, call, "0 bytes");
  KVCOMM_CHECK_ARG(kind == MemoryKind::Host || kind == MemoryKind::Cuda, call,
                   "memory kind must be Host or Cuda (Auto cannot tell what a pointer is)");
  KVCOMM_CHECK_ARG(kind == MemoryKind::Host || device >= 0, call, "CUDA memory needs its device ordinal (", device,
                   ")");
  KVCOMM_CHECK_ARG(options.access == Access::ReadWrite || options.access == Access::ReadOnly, call, "access ",
                   static_cast<int>(options.access), " is not an Access");
  KVCOMM_CHECK_ARG(!layout.regions.empty(), call, "the layout has no region");
  detail::validateLayout(
      layout, bytes,
      [&](uint64_t off, uint64_t n) { return detail::rangeCovered(backed.data(), backed.size(), off, n); }, call);
  auto r = std::make_shared<Registration::Impl>();
  r->id = freshId();
  r->base = base;
  r->bytes = bytes;
  r->kind = kind;
  r->device = kind == MemoryKind::Cuda ? device : -1;
  r->layout = normalised(layout);
  if (!options.contents.regions.empty()) checkDescription(r->layout, options.contents, call);
  r->contents = options.contents;
  r->access = options.access;
  r->endpointId = id;
  r->endpointName = name;
  r->tcp = address;
  r->hostKey = hostKey;
  auto served = std::make_shared<detail::ServedMemory>();
  served->base = base;
  served->kind = kind;
  served->device = r->device;
  served->regionId = r->id;
  served->groupId = id;
  uint64_t minBlocks = ~0ull;
  for (const KvRegion& g : r->layout.regions) {
    served->regions.push_back({g.offset, g.blockBytes, g.blockStride, g.numBlocks});
    served->blockBytesSum += g.blockBytes;
    minBlocks = std::min<uint64_t>(minBlocks, g.numBlocks);
  }
  served->minBlocks = minBlocks;
  served->writable = options.access == Access::ReadWrite;
  served->staleAdvice = "the registration was revoked by its owner: connect with its new metadata";
  served->closedReason = cat("registration ", hexId(r->id), " was unregistered by its owner");
  served->generation = 1;
  served->layoutHash = layoutHash(r->layout);
  served->backed = backed;
  served->needsCapability = true;
  served->capability = freshCapability();
  r->ownPieces = ownPieces;
  r->verbs = verbs;
  r->rdmaOffered = rdma;
  r->timeoutMs = timeoutMs;
  // A peer's RDMA connect request or notification (over its TCP connection, capability and generation checked by
  // the server).
  std::weak_ptr<Registration::Impl> weak = r;
  std::weak_ptr<detail::Inbox> inboxOf = inbox;
  served->control = [weak, inboxOf, regionId = r->id](uint32_t kind, const uint8_t* body, size_t n,
                                                      std::vector<uint8_t>* reply, std::shared_ptr<void>* hold,
                                                      std::string* why) {
    auto me = weak.lock();
    if (!me) {
      *why = "the registration is gone";
      return detail::WireStatus::Closing;
    }
    if (kind == detail::kControlNotify) return receiveNotification(inboxOf.lock().get(), regionId, body, n, why);
    if (kind != detail::kControlRdmaConnect) {
      *why = cat("control request kind ", kind, " is not one this endpoint answers");
      return detail::WireStatus::Unsupported;
    }
    std::lock_guard<std::mutex> lock(me->rdmaMu);
    auto side = me->rdmaSide(me->rdmaServe, why);
    if (!side) {
      *why = cat("the owner cannot serve RDMA: ", *why);
      return detail::WireStatus::Unsupported;
    }
    return side->accept(body, n, reply, hold, why);
  };
  r->served = served;
  auto shared = std::make_shared<detail::SharedMemory>();
  shared->served = served;
  shared->bytes = bytes;
  shared->ownPieces = std::move(ownPieces);
  std::lock_guard<std::mutex> lock(mu);
  requireOpen(call);
  r->share = share;
  registrations[r->id] = r;
  directory->add(served);
  share->add(shared);
  return Registration(r);
}

Registration Endpoint::registerMemory(void* base, size_t bytes, MemoryKind kind, const KvLayout& layout, int device,
                                      const RegisterOptions& options) {
  const char* call = "Endpoint::registerMemory";
  auto* e = require(impl_, call, "Endpoint");
  return e->add(call, static_cast<char*>(base), bytes, kind, device, layout, options, {{0, bytes}});
}

Registration Endpoint::registerBuffer(const SymmetricBuffer& buffer, const KvLayout& layout,
                                      const RegisterOptions& options) {
  const char* call = "Endpoint::registerBuffer";
  auto* e = require(impl_, call, "Endpoint");
  KVCOMM_CHECK_ARG(buffer.valid(), call, "an empty SymmetricBuffer");
  auto symm = detail::BufferAccess::impl(buffer);
  Registration reg =
      e->add(call, static_cast<char*>(buffer.local()), buffer.capacity(), buffer.kind(), detail::bufferDevice(*symm),
             layout, options, buffer.backedRanges(), [symm] { return detail::localChunks(*symm); });
  Registration::Impl& r = *reg.impl_;
  r.buffer = detail::BufferAccess::share(buffer);
  // Memory the buffer stops backing is neither served nor written by a transfer of ours afterwards.
  std::weak_ptr<Registration::Impl> weak = reg.impl_;
  r.unbackListener = detail::addUnbackListener(*symm, [weak](const std::vector<Range>& ranges) {
    if (auto me = weak.lock()) {
      me->served->unback(ranges);
      std::lock_guard<std::mutex> lock(me->rdmaMu);  // peers' READs and WRITEs of those pieces fail from now on
      for (auto* side : {&me->rdmaServe, &me->rdmaLocal})
        if (*side && (*side)->fabric()) (*side)->fabric()->unback(ranges);
      me->cancelTransfers(cat(me->who(), ": the buffer stopped backing part of its memory"));
    }
  });
  return reg;
}

Registration Endpoint::registerArena(Arena& arena, const RegisterOptions& options) {
  const char* call = "Endpoint::registerArena";
  auto* e = require(impl_, call, "Endpoint");
  KVCOMM_CHECK_ARG(arena.valid() && !arena.freed(), call, "an empty or freed Arena");
  ArenaPin pin = arena.pin(0, arena.bytes());  // no free or shrink while registered
  // Its pieces as they are now: the pin keeps them, and what a later grow adds lies beyond the registration.
  std::vector<detail::Piece> pieces = detail::ArenaAccess::pieces(arena);
  Registration reg = e->add(call, static_cast<char*>(arena.data()), arena.bytes(), arena.kind(), arena.device(),
                            arena.layout(), options, {{0, arena.bytes()}}, [pieces] { return pieces; });
  reg.impl_->arenaPin = std::move(pin);
  return reg;
}

void Endpoint::Impl::waitLeases(Registration::Impl& r, int64_t timeoutMs) {
  auto s = r.share.lock();
  if (!s) return;
  std::vector<int> holders = s->end(r.id, detail::ShareEnd::Unregistered, timeoutMs);
  r.leasesPending = !holders.empty();
  if (holders.empty()) return;
  std::string pids;
  for (int p : holders) pids += cat(pids.empty() ? "" : ", ", p);
  KVCOMM_THROW(Timeout, "Endpoint::unregister", r.who(), ": same-host peers (pid ", pids, ") still map it after ",
               timeoutMs, " ms; it stays allocated-in-use for them: keep the memory and call unregister again");
}

void Endpoint::Impl::unregister(Registration::Impl& r, int64_t timeoutMs) {
  if (!r.registered.exchange(false)) {
    if (r.leasesPending) {
      waitLeases(r, timeoutMs);
      r.buffer = SymmetricBuffer();
      r.arenaPin.release();
    }
    return;
  }
  directory->remove(r.id);  // no new connection names it
  if (auto s = r.share.lock()) s->remove(r.id);
  // Our transfers that use it: waited for up to the bound, then cancelled.
  const bool bounded = timeoutMs >= 0;
  const auto deadline = Clock::now() + std::chrono::milliseconds(bounded ? timeoutMs : 0);
  for (;;) {
    bool running = false;
    {
      std::lock_guard<std::mutex> lock(r.mu);
      for (auto& w : r.transfers)
        if (auto t = w.lock()) {
          std::lock_guard<std::mutex> tl(t->mu);
          running |= t->poll().state == FetchState::InProgress;
        }
    }
    if (!running || (bounded && Clock::now() >= deadline)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  r.cancelTransfers(cat(r.who(), " was unregistered while the transfer ran"));
  r.served->close();  // waits for every request being served from it; later ones are refused
  r.closeRdma();      // RDMA peers' work requests on it fail from now on (their queue pairs and its regions are gone)
  {
    std::lock_guard<std::mutex> lock(mu);
    registrations.erase(r.id);
    for (auto it = links.begin(); it != links.end();) {
      if (it->first.first != r.id) {
        ++it;
        continue;
      }
      {
        // Scoped: erasing may destroy the link, and its mutex with it.
        std::lock_guard<std::mutex> pl(it->second->peerMu);
        if (it->second->peer) {
          it->second->peer->disable();  // device-id runs into or out of it copy nothing from now on
          retired.push_back(std::move(it->second->peer));
        }
      }
      it = links.erase(it);
    }
  }
  if (r.unbackListener) {
    detail::removeUnbackListener(*detail::BufferAccess::impl(r.buffer), r.unbackListener);
    r.unbackListener = 0;
  }
  waitLeases(r, timeoutMs);  // same-host peers stopped and unmapped (or the Timeout names them: the holds stay)
  r.buffer = SymmetricBuffer();
  r.arenaPin.release();
}

void Endpoint::unregister(Registration& registration, int64_t timeoutMs) {
  const char* call = "Endpoint::unregister";
  auto* e = require(impl_, call, "Endpoint");
  auto* r = require(registration.impl_, call, "Registration");
  KVCOMM_CHECK_ARG(r->endpointId == e->id, call, r->who(), " belongs to another endpoint");
  e->unregister(*r, timeoutMs);
}

RemoteMemory Endpoint::connect(const std::vector<uint8_t>& metadata) {
  return connect(metadata.data(), metadata.size());
}

RemoteMemory Endpoint::connect(const void* metadata, size_t bytes) {
  const char* call = "Endpoint::connect";
  auto* e = require(impl_, call, "Endpoint");
  KVCOMM_CHECK_ARG(metadata != nullptr || bytes == 0, call, "null metadata");
  std::string key(static_cast<const char*>(metadata), bytes);
  {
    std::lock_guard<std::mutex> lock(e->mu);
    e->requireOpen(call);
    auto it = e->remotes.find(key);
    if (it != e->remotes.end()) return RemoteMemory(it->second);
  }
  auto r = std::make_shared<RemoteMemory::Impl>();
  std::string why = detail::decodeMetadata(metadata, bytes, &r->meta);
  KVCOMM_CHECK_ARG(why.empty(), call, why);
  detail::RemoteDescriptor& d = r->desc;
  d.head =
      detail::makeHead(detail::kCapDirect | detail::kCapTcp |
                       (r->meta.access == static_cast<uint32_t>(Access::ReadWrite) ? uint32_t{detail::kCapWrite} : 0u));
  d.memoryKind = r->meta.memoryKind;
  d.regionId = r->meta.regionId;
  d.generation = r->meta.generation;
  d.layoutHash = r->meta.layoutHash;
  d.tcp = r->meta.tcp;
  std::lock_guard<std::mutex> lock(e->mu);
  e->requireOpen(call);
  auto [it, fresh] = e->remotes.emplace(key, r);
  (void)fresh;  // a racing connect of the same metadata: both get the first
  return RemoteMemory(it->second);
}

std::shared_ptr<Link> Endpoint::Impl::linkFor(const std::shared_ptr<Registration::Impl>& local,
                                              const std::shared_ptr<RemoteMemory::Impl>& remote) {
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_pair(local->id, remote.get());
  auto it = links.find(key);
  if (it != links.end()) return it->second;
  const char* call = "Endpoint (transfer)";
  auto link = std::make_shared<Link>();
  const std::string me = local->who(), peer = cat("remote ", remote->who());
  link->table = detail::pairLayouts(local->layout, remote->meta.layout, call, me, peer);
  link->writeTable = detail::pairLayouts(remote->meta.layout, local->layout, call, peer, me);
  link->names = {me, peer};
  link->writeNames = {peer, me};
  detail::NetContext ctx;
  ctx.local = local->base;
  ctx.kind = local->kind;
  ctx.device = local->device;
  ctx.rank = 0;
  ctx.groupId = remote->meta.endpointId;
  ctx.table = &link->table;
  ctx.descs = {detail::RemoteDescriptor{}, remote->desc};
  ctx.netTimeoutMs = timeoutMs;
  ctx.connectionsPerSource = connections;
  ctx.capabilities = {detail::WireCapability{}, remote->meta.capability};
  ctx.sourceNames = {local->who(), cat("endpoint '", remote->meta.name, "'")};
  link->tcp = detail::makeTcpTransport(std::move(ctx));
  links[key] = link;
  return link;
}

std::pair<std::shared_ptr<Registration::Impl>, std::shared_ptr<RemoteMemory::Impl>> Endpoint::Impl::checkPair(
    const char* call, const Registration& localReg, const RemoteMemory& remoteMem) {
  auto local = localReg.impl_;
  auto remote = remoteMem.impl_;
  require(local, call, "Registration");
  require(remote, call, "RemoteMemory");
  {
    std::lock_guard<std::mutex> lock(mu);
    requireOpen(call);
  }
  KVCOMM_CHECK_ARG(local->endpointId == id, call, local->who(), " belongs to another endpoint");
  KVCOMM_CHECK_ARG(local->registered, call, local->who(), " is unregistered");
  KVCOMM_CHECK_ARG(!remote->disconnected, call, "remote ", remote->who(),
                   " was disconnected (Endpoint::disconnect): connect again from its metadata");
  return {std::move(local), std::move(remote)};
}

std::shared_ptr<detail::PeerMapping> Endpoint::Impl::mappingFor(const Registration::Impl& local,
                                                                const std::shared_ptr<RemoteMemory::Impl>& remote,
                                                                detail::ShareStatus* status, std::string* why) {
  *status = detail::ShareStatus::NotShareable;
  if (remote->meta.hostKey != hostKey) {
    *why = cat("remote ", remote->who(), " is on another host (or network namespace)");
    return {};
  }
  if (remote->meta.memoryKind != static_cast<uint32_t>(local.kind)) {
    *why = cat("remote ", remote->who(), " holds ", memoryKindName(static_cast<MemoryKind>(remote->meta.memoryKind)),
               " memory and ", local.who(), " ", memoryKindName(local.kind),
               " memory: the peer path copies between memory of one kind (host and CUDA meet over TCP)");
    return {};
  }
  std::shared_ptr<detail::PeerMapping> mapping;
  {
    std::lock_guard<std::mutex> rl(remote->mu);
    if (!remote->notShareable.empty()) {
      *why = remote->notShareable;
      return {};
    }
    if (!remote->mapping || !remote->mapping->mapped()) {
      remote->mapping.reset();
      detail::PeerMapping::Opened o;
      try {
        o = detail::PeerMapping::open(remote->meta, local.device, timeoutMs);
      } catch (const Error& e) {  // granted but not mappable here: Auto goes over TCP, a demanded Peer says why
        o.status = detail::ShareStatus::MapFailed;
        o.why = cat("mapping remote ", remote->who(), " here failed: ", e.what());
      }
      if (!o.mapping) {
        *status = o.status;
        *why = o.why;
        if (o.status == detail::ShareStatus::NotShareable) remote->notShareable = o.why;
        return {};
      }
      remote->mapping = o.mapping;
      watch(o.mapping, cat("endpoint '", remote->meta.name, "' (pid ", remote->meta.pid, ")"));
    }
    mapping = remote->mapping;
  }
  KVCOMM_CHECK_ARG(mapping->kind() == local.kind, "Endpoint (peer mapping)", "remote ", remote->who(),
                   " shared memory of another kind than its metadata says");
  return mapping;
}

detail::PeerLink* Endpoint::Impl::peerFor(Link& link, const Registration::Impl& local,
                                          const std::shared_ptr<RemoteMemory::Impl>& remote,
                                          detail::ShareStatus* status, std::string* why) {
  std::lock_guard<std::mutex> lock(link.peerMu);
  if (link.peer && !link.peer->disabled() && link.peer->mapping()->mapped()) return link.peer.get();
  if (link.peer) {  // its mapping ended: ask the owner again (it answers why not, or maps afresh)
    link.peer->disable();
    std::lock_guard<std::mutex> el(mu);
    retired.push_back(std::move(link.peer));
  }
  std::shared_ptr<detail::PeerMapping> mapping = mappingFor(local, remote, status, why);
  if (!mapping) return nullptr;
  detail::PeerLinkSpec spec;
  spec.localBase = local.base;
  spec.localBytes = local.bytes;
  spec.kind = local.kind;
  spec.device = local.device;
  spec.table = &link.table;
  spec.writeTable = &link.writeTable;
  spec.mapping = mapping;
  spec.remotePid = remote->meta.pid;
  spec.remoteName = cat("endpoint '", remote->meta.name, "'");
  if (local.kind == MemoryKind::Cuda) {
    std::lock_guard<std::mutex> el(mu);
    auto& c = copiers[local.device];
    if (!c) detail::onDevice(local.device, [&] { c = detail::makeDeviceCopier(); });
    spec.copier = c.get();
  }
  link.peer = std::make_unique<detail::PeerLink>(spec);
  return link.peer.get();
}

detail::FetchTransport* Endpoint::Impl::rdmaFor(Link& link, Registration::Impl& local,
                                                const std::shared_ptr<RemoteMemory::Impl>& remote, std::string* why,
                                                bool* refused) {
  std::lock_guard<std::mutex> lock(link.rdmaMu);
  *refused = false;
  if (link.rdma) {
    const std::string broken = link.rdma->unreachable(1);
    if (broken.empty()) return link.rdma.get();
    KVCOMM_DEBUG("Endpoint (rdma): reconnecting to remote ", remote->who(), ": ", broken);
    link.dropRdma();  // a failed queue pair cannot be reused: connect afresh (a restarted owner refuses, naming why)
  }
  if (!rdma) {
    *why = cat("this endpoint has no RDMA device (", noRdma, ")");
    return nullptr;
  }
  if (!(remote->meta.transports & detail::kMetaRdma)) {
    *why = cat("remote ", remote->who(), " offers no RDMA (its endpoint has no RDMA device)");
    return nullptr;
  }
  std::shared_ptr<detail::RdmaSide> side;
  {
    std::lock_guard<std::mutex> rl(local.rdmaMu);
    if (local.rdmaLocal && !local.rdmaLocal->fabric()->failed().empty()) {
      // Its completion queue failed (completions lost): a fresh fabric; links on the old one reconnect likewise.
      KVCOMM_DEBUG("Endpoint (rdma): reopening ", local.who(), "'s fabric: ", local.rdmaLocal->fabric()->failed());
      local.rdmaLocal->close();
      local.rdmaLocal.reset();
    }
    side = local.rdmaSide(local.rdmaLocal, why);
  }
  if (!side) {
    *why = cat(local.who(), " cannot be registered for RDMA: ", *why);
    return nullptr;
  }
  // The owner's queue pairs: asked for over a TCP connection of its own (hello with the capability), which stays
  // open as their lease.
  const char* call = "Endpoint (rdma connect)";
  const detail::NetContext ctx = ownerContext(*remote, local.who(), timeoutMs);
  const std::string who = detail::describePeer(ctx, 1);
  int peer = -1;
  try {
    detail::HelloedConnection c = detail::connectHello(ctx, 1);
    std::vector<uint8_t> request;
    peer = side->newPeer(&request);
    detail::ControlAnswer a = detail::controlRequest(c.fd.get(), detail::kControlRdmaConnect, remote->meta.generation,
                                                     request, timeoutMs, who);
    if (a.status != detail::WireStatus::Ok) {
      side->drop(peer);
      *refused = a.status != detail::WireStatus::Unsupported;  // stale, closed: the metadata itself is refused
      *why = cat(who, " refused the RDMA connection: ", detail::wireStatusName(a.status), ": ", a.why);
      return nullptr;
    }
    // The metadata does not carry the registration's size: pieces are checked for order and overlap, and work
    // requests only ever name bytes of the layout's blocks.
    std::string bad = side->finish(peer, a.reply, ~0ull, cat("endpoint '", remote->meta.name, "'"));
    if (!bad.empty()) {
      side->drop(peer);
      *why = cat(who, " answered the RDMA connection with a malformed reply: ", bad);
      return nullptr;
    }
    link.rdmaControl = std::move(c.fd);
  } catch (const Error& e) {
    if (peer >= 0) side->drop(peer);
    // Refused at the hello (capability, restart, unregistered) or unreachable: the transfer fails as TCP's would.
    *refused = true;
    *why = cat(call, ": ", e.what());
    return nullptr;
  }
  detail::NetContext net;
  net.local = local.base;
  net.kind = local.kind;
  net.device = local.device;
  net.rank = 0;
  net.groupId = remote->meta.endpointId;
  net.table = &link.table;
  net.descs = {detail::RemoteDescriptor{}, remote->desc};
  net.netTimeoutMs = timeoutMs;
  net.sourceNames = ctx.sourceNames;
  link.rdmaSide = side;
  link.rdmaPeer = peer;
  link.rdma = detail::makeVerbsTransport(std::move(net), side->fabric(), {-1, peer});
  return link.rdma.get();
}

namespace {

// The pair arrays of a transfer as the planner reads them: member 1 is always the source, so a peer write plans
// the local blocks as the source and the remote blocks as the destination.
struct Planned {
  std::shared_ptr<detail::PlanOutput> plan;
  bool dstIsRunSrc = false;
};

}  // namespace

Transfer Endpoint::Impl::start(const char* call, bool push, const Registration& localReg, const RemoteMemory& remoteMem,
                               const int64_t* remoteBlocks, const int64_t* localBlocks, size_t count,
                               const TransferOptions& options) {
  auto [local, remote] = checkPair(call, localReg, remoteMem);
  switch (options.via) {
    case TransferVia::Auto:
    case TransferVia::Tcp:
    case TransferVia::Peer:
    case TransferVia::Rdma:
      break;
    default:
      KVCOMM_THROW(InvalidArgument, call, "via ", static_cast<int>(options.via), " is not a TransferVia");
  }
  if (push && remote->meta.access != static_cast<uint32_t>(Access::ReadWrite))
    KVCOMM_THROW(InvalidArgument, call, "remote ", remote->who(), " is registered read-only: it cannot be written");
  KVCOMM_CHECK_ARG(count == 0 || (remoteBlocks && localBlocks), call, count, " pairs but a null id array");
  if (options.notify) checkMessage(call, options.notify->size());
  std::shared_ptr<Link> link = linkFor(local, remote);

  // The path: peer mappings when demanded, or (Auto) when both ends are on this host with memory of one kind that
  // the owner can share; an owner's refusal of the metadata itself (stale, forged, gone) fails the transfer as TCP
  // would.
  detail::PeerLink* peer = nullptr;
  std::string refusal;
  if (options.via == TransferVia::Peer || (options.via == TransferVia::Auto && remote->meta.hostKey == hostKey &&
                                           remote->meta.memoryKind == static_cast<uint32_t>(local->kind))) {
    detail::ShareStatus status = detail::ShareStatus::Granted;
    std::string why;
    peer = peerFor(*link, *local, remote, &status, &why);
    if (!peer) {
      // Refusals of the metadata fail the transfer as TCP would; an owner that is gone is left to TCP under Auto
      // (it names a restart).
      const bool refused = status == detail::ShareStatus::Unknown || status == detail::ShareStatus::Unauthorized ||
                           status == detail::ShareStatus::Stale ||
                           (status == detail::ShareStatus::Gone && options.via == TransferVia::Peer);
      if (refused)
        refusal = why;
      else if (options.via == TransferVia::Peer)
        KVCOMM_THROW(Unsupported, call, "the peer path cannot reach remote ", remote->who(), ": ", why);
      else
        KVCOMM_DEBUG(call, ": over TCP: ", why);
    }
  }
  // RDMA when demanded, or (Auto) between hosts when both endpoints have a device; a refusal of the metadata fails
  // the transfer, an owner that cannot serve RDMA leaves Auto to TCP.
  detail::FetchTransport* rdma = nullptr;
  if (options.via == TransferVia::Rdma ||
      (options.via == TransferVia::Auto && !peer && refusal.empty() && remote->meta.hostKey != hostKey && this->rdma &&
       (remote->meta.transports & detail::kMetaRdma))) {
    std::string why;
    bool refused = false;
    rdma = rdmaFor(*link, *local, remote, &why, &refused);
    if (!rdma) {
      if (refused)
        refusal = why;
      else if (options.via == TransferVia::Rdma)
        KVCOMM_THROW(Unsupported, call, "RDMA cannot reach remote ", remote->who(), ": ", why);
      else
        KVCOMM_DEBUG(call, ": over TCP: ", why);
    }
  }
  if (!peer && !rdma && refusal.empty() && remote->meta.tcp.len == 0)
    KVCOMM_THROW(Unsupported, call, "remote ", remote->who(), " offers no TCP address");

  auto plan = std::make_shared<detail::PlanOutput>();
  detail::PlanInput in;
  in.myRank = 0;
  in.reachable = {1, 1};
  in.unreachableWhy = {"", ""};
  // TCP: the runs' same-host path is not used (every run goes over the network); peer: copies of the memory kind.
  in.path = peer && local->kind == MemoryKind::Cuda ? FetchPath::Auto : FetchPath::Host;
  std::vector<size_t FetchPlanInfo::*> counters = {
      nullptr, peer ? nullptr : (rdma ? &FetchPlanInfo::rdmaRuns : &FetchPlanInfo::tcpRuns)};
  in.counters = &counters;
  in.call = call;
  FetchRequest q;
  q.srcRank = 1;
  q.count = count;
  bool dstIsRunSrc = false;
  if (!push) {
    in.table = &link->table;
    in.names = &link->names;
    q.srcBlocks = remoteBlocks;
    q.dstBlocks = localBlocks;
    detail::planFetch({q}, in, *plan);
  } else {
    // Validated with the remote as the destination (its blocks must not be written twice). The peer transport
    // copies in that order (member 0, the remote's mapping, is the destination); TCP and RDMA turn it round into the
    // pair's order (member 1, the remote: src; the local blocks: dst).
    in.table = &link->writeTable;
    in.names = &link->writeNames;
    q.srcBlocks = localBlocks;
    q.dstBlocks = remoteBlocks;
    detail::planFetch({q}, in, *plan);
    if (!peer) {
      for (detail::BlockRun& r : plan->runs) {
        std::swap(r.src, r.dst);
        r.rank = 1;
      }
      for (size_t i = 0; i < plan->pairs.count; ++i) {
        std::swap(plan->pairs.src[i], plan->pairs.dst[i]);
        plan->pairs.rank[i] = 1;
      }
      plan->push = true;
      dstIsRunSrc = true;
    }
  }
  plan->generation = peer ? 0 : remote->meta.generation;
  if (!peer) plan->info.path = FetchPath::Network;

  auto t = std::make_shared<Transfer::Impl>();
  t->link = link;
  t->local = local;
  t->plan = plan;
  t->push = push;
  t->dstIsRunSrc = dstIsRunSrc;
  t->transport = peer ? FetchTransportKind::Peer : (rdma ? FetchTransportKind::Rdma : FetchTransportKind::Tcp);
  t->blocksDone.assign(plan->runs.size(), 0);
  if (!refusal.empty()) {
    t->end(t->statusOf(true, refusal));
    return Transfer(t);
  }
  if (options.notify) t->note = Transfer::Impl::Note::Waiting;
  if (plan->runs.empty()) {
    if (!options.notify) {
      t->end(t->statusOf(true, ""));
      return Transfer(t);
    }
    t->moved = true;  // nothing to move: the notification goes at once (in order with the others)
    postNotification(t, *remote, *options.notify);
    return Transfer(t);
  }
  std::vector<size_t> runs(plan->runs.size());
  for (size_t i = 0; i < runs.size(); ++i) runs[i] = i;
  if (peer) {
    detail::arena::CudaContextScope scope(peer->cudaContext());
    t->op = peer->transport(push).start(plan, std::move(runs), FetchOptions{}, nullptr);
    std::lock_guard<std::mutex> pl(link->peerMu);
    track(link->peerTransfers, t);
  } else {
    t->op = (rdma ? rdma : link->tcp.get())->start(plan, std::move(runs), FetchOptions{}, nullptr);
    std::lock_guard<std::mutex> pl(link->peerMu);
    track(link->netTransfers, t);
  }
  std::lock_guard<std::mutex> lock(local->mu);
  if (!local->registered) {  // unregistered while this one started: it must not run past the unregistration
    std::unique_lock<std::mutex> tl(t->mu);
    t->cancel(tl, cat(local->who(), " was unregistered while the transfer started"));
  } else {
    track(local->transfers, t);
  }
  if (options.notify) postNotification(t, *remote, *options.notify);
  return Transfer(t);
}

detail::NotifyTarget Endpoint::Impl::notifyTarget(const RemoteMemory::Impl& remote) const {
  detail::NotifyTarget t;
  t.endpointId = remote.meta.endpointId;
  t.regionId = remote.meta.regionId;
  t.generation = remote.meta.generation;
  t.ctx = ownerContext(remote, cat("endpoint '", name, "'"), timeoutMs);
  t.who = detail::describePeer(t.ctx, 1);
  return t;
}

void Endpoint::Impl::postNotification(const std::shared_ptr<Transfer::Impl>& t, const RemoteMemory::Impl& remote,
                                      std::string message) {
  using Note = Transfer::Impl::Note;
  detail::NotifyJob job;
  job.target = notifyTarget(remote);
  job.message = std::move(message);
  std::weak_ptr<Transfer::Impl> weak = t;
  // On the notifier's worker: until the bytes moved (send) or the transfer failed, was cancelled or went away (drop).
  job.await = [weak] {
    for (;;) {
      auto t = weak.lock();
      if (!t) return false;
      std::shared_ptr<detail::TransportOp> op;
      {
        std::lock_guard<std::mutex> lock(t->mu);
        t->poll();
        if (t->ended) return false;
        if (t->moved) {
          t->note = Note::Sending;
          return true;
        }
        op = t->op;
      }
      op->waitEnded(50);
    }
  };
  job.done = [weak](const detail::NotifyOutcome& o) {
    auto t = weak.lock();
    if (!t) return;
    std::unique_lock<std::mutex> lock(t->mu);
    t->note = Note::None;
    if (!o.error.empty())
      t->cancel(lock, cat("the notification was not delivered: ", o.error));
    else if (!t->ended)
      t->end(t->statusOf(true, ""));
    t->noted.notify_all();
  };
  notifier->post(std::move(job));
}

void Endpoint::Impl::startDevice(const char* call, bool push, const Registration& localReg,
                                 const RemoteMemory& remoteMem, const DeviceTransferBatch& batch, Stream stream) {
  auto [local, remote] = checkPair(call, localReg, remoteMem);
  KVCOMM_CHECK_ARG(batch.count <= limits::kMaxFetchPairs, call, "count ", batch.count,
                   " exceeds kvcomm::limits::kMaxFetchPairs (", limits::kMaxFetchPairs, ")");
  KVCOMM_CHECK_ARG(batch.count == 0 || (batch.remoteBlocks && batch.localBlocks), call, batch.count,
                   " pairs but a null id array");
  if (push && remote->meta.access != static_cast<uint32_t>(Access::ReadWrite))
    KVCOMM_THROW(InvalidArgument, call, "remote ", remote->who(), " is registered read-only: it cannot be written");
  std::shared_ptr<Link> link = linkFor(local, remote);
  if (local->kind == MemoryKind::Cuda && detail::streamCapturing(stream)) {
    std::lock_guard<std::mutex> lock(link->peerMu);
    KVCOMM_CHECK_ARG(link->peer && !link->peer->disabled(), call, "the first device-id transfer between ", local->who(),
                     " and remote ", remote->who(),
                     " maps the peer and writes the kernel's tables, which a CUDA graph capture cannot hold: call it "
                     "once before capturing (batch.count 0 does only that)");
  }
  detail::ShareStatus status = detail::ShareStatus::Granted;
  std::string why;
  detail::PeerLink* peer = peerFor(*link, *local, remote, &status, &why);
  if (!peer) {
    if (status == detail::ShareStatus::NotShareable || status == detail::ShareStatus::Busy)
      KVCOMM_THROW(Unsupported, call, "device-side ids need the same-host peer path: ", why);
    KVCOMM_THROW(InvalidArgument, call, why);
  }
  if (batch.count == 0) return;
  detail::FetchLaunch f = detail::makeFetchLaunch(peer->context(push), batch.count);
  f.srcBlocks = push ? batch.localBlocks : batch.remoteBlocks;
  f.dstBlocks = push ? batch.remoteBlocks : batch.localBlocks;
  f.srcRanks = nullptr;
  f.srcRank = 1;
  if (local->kind == MemoryKind::Cuda) {
    detail::arena::CudaContextScope scope(peer->cudaContext());
    detail::launchFetch(f, stream);
  } else {
    auto run = peer->hostRun();
    auto use = peer->context(push).memory->use(call);
    detail::hostFetch(f);
  }
}

Transfer Endpoint::read(const Registration& local, const RemoteMemory& remote, const int64_t* remoteBlocks,
                        const int64_t* localBlocks, size_t count, const TransferOptions& options) {
  const char* call = "Endpoint::read";
  return require(impl_, call, "Endpoint")->start(call, false, local, remote, remoteBlocks, localBlocks, count, options);
}

Transfer Endpoint::write(const Registration& local, const RemoteMemory& remote, const int64_t* remoteBlocks,
                         const int64_t* localBlocks, size_t count, const TransferOptions& options) {
  const char* call = "Endpoint::write";
  return require(impl_, call, "Endpoint")->start(call, true, local, remote, remoteBlocks, localBlocks, count, options);
}

void Endpoint::readDevice(const Registration& local, const RemoteMemory& remote, const DeviceTransferBatch& batch,
                          Stream stream) {
  const char* call = "Endpoint::readDevice";
  require(impl_, call, "Endpoint")->startDevice(call, false, local, remote, batch, stream);
}

void Endpoint::writeDevice(const Registration& local, const RemoteMemory& remote, const DeviceTransferBatch& batch,
                           Stream stream) {
  const char* call = "Endpoint::writeDevice";
  require(impl_, call, "Endpoint")->startDevice(call, true, local, remote, batch, stream);
}

void Endpoint::notify(const RemoteMemory& remote, const std::string& message) {
  const char* call = "Endpoint::notify";
  auto* e = require(impl_, call, "Endpoint");
  auto* r = require(remote.impl_, call, "RemoteMemory");
  {
    std::lock_guard<std::mutex> lock(e->mu);
    e->requireOpen(call);
  }
  KVCOMM_CHECK_ARG(!r->disconnected, call, "remote ", r->who(),
                   " was disconnected (Endpoint::disconnect): connect again from its metadata");
  checkMessage(call, message.size());
  const detail::NotifyOutcome o = e->notifier->send(e->notifyTarget(*r), message);
  if (!o.error.empty()) detail::throwError(o.code, call, o.error, __FILE__, __LINE__);
}

std::vector<Notification> Endpoint::notifications(int64_t timeoutMs) {
  return require(impl_, "Endpoint::notifications", "Endpoint")->inbox->take(timeoutMs);
}

DeviceError Endpoint::pollError(const Registration& local, const RemoteMemory& remote) {
  const char* call = "Endpoint::pollError";
  auto* e = require(impl_, call, "Endpoint");
  require(local.impl_, call, "Registration");
  require(remote.impl_, call, "RemoteMemory");
  std::shared_ptr<Link> link;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    auto it = e->links.find(std::make_pair(local.impl_->id, remote.impl_.get()));
    if (it != e->links.end()) link = it->second;
  }
  if (!link) return DeviceError{};
  std::lock_guard<std::mutex> lock(link->peerMu);
  return link->peer ? link->peer->pollError() : DeviceError{};
}

// ---- leases on peers' memory --------------------------------------------------------------------------------------

void Endpoint::Impl::watch(std::shared_ptr<detail::PeerMapping> mapping, std::string owner) {
  std::lock_guard<std::mutex> lock(watchMu);
  if (!watchWake) watchWake.reset(KVCOMM_CHECK_SYS(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)));
  watches.push_back({std::move(mapping), std::move(owner)});
  if (!watcher.joinable())
    watcher = std::thread([this, rank = detail::currentRank()] {
      detail::RankScope scope(rank);
      watchLoop();
    });
  wakeWatcher();
}

void Endpoint::Impl::wakeWatcher() {
  if (!watchWake) return;  // no watcher yet
  uint64_t one = 1;
  (void)!::write(watchWake.get(), &one, sizeof(one));
}

void Endpoint::Impl::watchLoop() {
  std::vector<Watch> now;
  for (;;) {
    std::vector<pollfd> pfds;
    {
      std::lock_guard<std::mutex> lock(watchMu);
      if (watchStop) return;
      // Mappings unmapped elsewhere (a new transfer found them ended) are no longer watched.
      std::erase_if(watches, [](const Watch& w) { return !w.mapping->mapped(); });
      now = watches;
      pfds.push_back({watchWake.get(), POLLIN, 0});
      for (const Watch& w : now) pfds.push_back({w.mapping->leaseFd(), POLLIN, 0});
    }
    int rc = poll(pfds.data(), pfds.size(), 1000);
    if (rc < 0 && errno != EINTR) {
      KVCOMM_WARN("endpoint lease watcher: poll: ", std::strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    if (pfds[0].revents) {
      uint64_t v;
      (void)!::read(watchWake.get(), &v, sizeof(v));
    }
    for (size_t i = 0; i < now.size(); ++i) {
      if (!pfds[i + 1].revents) continue;
      std::string why = now[i].mapping->readEnd(now[i].owner);
      if (why.empty()) continue;
      endMapping(now[i].mapping, why);
      std::lock_guard<std::mutex> lock(watchMu);
      std::erase_if(watches, [&](const Watch& w) { return w.mapping == now[i].mapping; });
    }
  }
}

void Endpoint::Impl::endMapping(const std::shared_ptr<detail::PeerMapping>& mapping, const std::string& why) {
  std::vector<std::shared_ptr<Link>> users;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto& [key, link] : links) users.push_back(link);
  }
  for (auto& link : users) {
    std::vector<std::shared_ptr<Transfer::Impl>> live;
    {
      std::lock_guard<std::mutex> lock(link->peerMu);
      if (!link->peer || link->peer->mapping() != mapping) continue;
      link->peer->disable();  // device-id runs copy nothing from now on, and those running ended
      takeLive(link->peerTransfers, live);
    }
    cancelAll(live, why);  // their copies joined: nothing they started touches the mapping after this
  }
  mapping->unmap(why);  // waits for every use, unmaps, and closes the lease: the owner's acknowledgement
}

void Endpoint::disconnect(RemoteMemory& remote) {
  const char* call = "Endpoint::disconnect";
  auto* e = require(impl_, call, "Endpoint");
  auto r = remote.impl_;
  require(r, call, "RemoteMemory");
  if (r->disconnected.exchange(true)) return;
  const std::string why = cat("remote ", r->who(), " was disconnected by this endpoint");
  std::vector<std::shared_ptr<Link>> gone;
  bool lastOfItsEndpoint = true;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    for (auto it = e->remotes.begin(); it != e->remotes.end();)
      it = it->second == r ? e->remotes.erase(it) : std::next(it);
    for (auto& [bytes, other] : e->remotes) lastOfItsEndpoint &= other->meta.endpointId != r->meta.endpointId;
    for (auto it = e->links.begin(); it != e->links.end();) {
      if (it->first.second == r.get()) {
        gone.push_back(it->second);
        it = e->links.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& link : gone) {
    std::vector<std::shared_ptr<Transfer::Impl>> live;
    {
      std::lock_guard<std::mutex> lock(link->peerMu);
      takeLive(link->peerTransfers, live);
      takeLive(link->netTransfers, live);
      if (link->peer) {
        link->peer->disable();
        std::lock_guard<std::mutex> el(e->mu);
        e->retired.push_back(std::move(link->peer));  // a captured graph may still name its tables
      }
    }
    cancelAll(live, why);
    std::lock_guard<std::mutex> rl(link->rdmaMu);
    link->dropRdma();  // our queue pairs go, and the owner drops its own when the connection closes
  }
  if (lastOfItsEndpoint) e->notifier->forget(r->meta.endpointId);  // its notification connections close
  std::shared_ptr<detail::PeerMapping> mapping;
  {
    std::lock_guard<std::mutex> lock(r->mu);
    mapping = std::move(r->mapping);
  }
  if (mapping) mapping->unmap(why);  // the owner's lease ends; the watcher forgets it at its next pass
  {
    std::lock_guard<std::mutex> lock(e->watchMu);
    std::erase_if(e->watches, [&](const Impl::Watch& w) { return w.mapping == mapping; });
    e->wakeWatcher();
  }
}

void Endpoint::close() {
  if (!impl_) return;
  Impl& e = *impl_;
  std::vector<std::shared_ptr<Registration::Impl>> regs;
  {
    std::lock_guard<std::mutex> lock(e.mu);
    if (e.closed) return;
    e.closed = true;
    for (auto& [id, r] : e.registrations) regs.push_back(r);
  }
  for (auto& r : regs) e.unregister(*r, -1);  // every transfer ended (a notification being sent first)
  e.notifier->close();
  e.inbox->close();
  // Our mappings of peers' memory: every transfer on them stopped, unmapped, leases closed.
  {
    std::lock_guard<std::mutex> lock(e.watchMu);
    e.watchStop = true;
    e.wakeWatcher();
  }
  if (e.watcher.joinable()) e.watcher.join();
  for (auto& w : e.watches) e.endMapping(w.mapping, "this endpoint closed");
  e.watches.clear();
  e.share.reset();   // ends every lease on our memory (all unregistered by now) and joins its thread
  e.server.reset();  // ends every connection and joins its threads
  for (auto& [device, c] : e.copiers) c->drain();
  std::lock_guard<std::mutex> lock(e.mu);
  e.links.clear();
  e.retired.clear();
  e.remotes.clear();
  e.copiers.clear();
}

// ---- for converted reads ------------------------------------------------------------------------------------------

namespace detail {

std::unique_ptr<DirectMapping> EndpointAccess::map(Endpoint& endpoint, const Registration& localReg,
                                                   const RemoteMemory& remoteMem, const char* call, std::string* why,
                                                   bool* refused) {
  Endpoint::Impl& e = *require(endpoint.impl_, call, "Endpoint");
  auto [local, remote] = e.checkPair(call, localReg, remoteMem);
  *refused = false;
  ShareStatus status = ShareStatus::Granted;
  std::shared_ptr<PeerMapping> mapping = e.mappingFor(*local, remote, &status, why);
  if (!mapping) {
    *refused = status == ShareStatus::Unknown || status == ShareStatus::Unauthorized || status == ShareStatus::Stale;
    return nullptr;
  }
  auto out = std::make_unique<DirectMapping>();
  out->mapping = std::move(mapping);
  out->use = out->mapping->use(call);
  out->base = out->mapping->base();
  return out;
}

}  // namespace detail

}  // namespace kvcomm
