// SymmetricBuffer: address space per member, chunks exchanged through the rendezvous, windows that never move.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <shared_mutex>

#include "common/check.hpp"
#include "common/env.hpp"
#include "common/log.hpp"
#include "common/socket.hpp"
#include "kvcomm/limits.hpp"
#include "kvcomm/symm.hpp"
#include "platform/gpu_info.hpp"
#include "symm/buffer_internals.hpp"
#include "symm/buffer_use.hpp"
#include "symm/legacy_ipc.hpp"
#include "symm/rendezvous.hpp"

namespace kvcomm {

using detail::cat;
using detail::Chunk;
using detail::HandleKind;
using detail::Mapping;
using detail::Piece;
using detail::Reservation;
using detail::SymmOp;
using detail::SymmRequest;

const char* memoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::Auto:
      return "auto";
    case MemoryKind::Cuda:
      return "cuda";
    case MemoryKind::Host:
      return "host";
  }
  return "?";
}

namespace {

// The largest size that rounds up to a multiple of `g` without wrapping past SIZE_MAX.
size_t maxRoundable(size_t g) {
  return SIZE_MAX - (g - 1);
}

// x rounded up to a multiple of g; x itself where that would wrap (such a size exceeds every capacity, and the
// checks after the agreement refuse it on every rank).
size_t roundUp(size_t x, size_t g) {
  return x > maxRoundable(g) ? x : (x + g - 1) / g * g;
}

// create's sizes, checked after the agreement (every member passed the same ones, so every member throws alike).
void checkCreateSizes(size_t capacity, size_t initialBytes, size_t gran) {
  KVCOMM_CHECK_ARG(capacity > 0 && capacity <= maxRoundable(gran), "SymmetricBuffer::create", "capacity ", capacity,
                   " must be positive and at most ", maxRoundable(gran), " (it is rounded up to the ", gran,
                   "-byte granularity)");
  KVCOMM_CHECK_ARG(initialBytes <= roundUp(capacity, gran), "SymmetricBuffer::create", "initialBytes ", initialBytes,
                   " exceeds capacity ", capacity);
}

// Disjoint, merged byte intervals.
class IntervalSet {
 public:
  // Overflow-safe: off + len is never formed (callers pass sizes from users, up to SIZE_MAX).
  bool covers(size_t off, size_t len) const {
    if (len == 0) return true;
    auto it = map_.upper_bound(off);
    if (it == map_.begin()) return false;
    --it;  // it->first <= off
    size_t into = off - it->first;
    return into < it->second && len <= it->second - into;
  }
  bool overlaps(size_t off, size_t len) const {
    auto it = map_.lower_bound(off + len);
    if (it == map_.begin()) return false;
    --it;
    return it->first + it->second > off;
  }
  void add(size_t off, size_t len) {
    size_t lo = off, hi = off + len;
    auto it = map_.lower_bound(lo);
    if (it != map_.begin() && std::prev(it)->first + std::prev(it)->second >= lo) --it;
    while (it != map_.end() && it->first <= hi) {
      lo = std::min(lo, it->first);
      hi = std::max(hi, it->first + it->second);
      it = map_.erase(it);
    }
    map_[lo] = hi - lo;
  }
  void remove(size_t off, size_t len) {  // [off, off+len) must be covered
    auto it = std::prev(map_.upper_bound(off));
    size_t lo = it->first, hi = it->first + it->second;
    map_.erase(it);
    if (lo < off) map_[lo] = off - lo;
    if (off + len < hi) map_[off + len] = hi - (off + len);
  }
  size_t total() const {
    size_t t = 0;
    for (auto& [o, l] : map_) t += l;
    return t;
  }
  std::vector<Range> ranges() const {
    std::vector<Range> out;
    for (auto& [o, l] : map_) out.push_back({o, l});
    return out;
  }

 private:
  std::map<size_t, size_t> map_;
};

HandleKind chooseHandleKind(MemoryKind kind) {
  if (kind == MemoryKind::Host) return HandleKind::MemFd;
  switch (env::handleType()) {  // throws InvalidArgumentError for a value it does not accept
    case env::HandleType::Ipc:
      return HandleKind::CudaIpc;
    case env::HandleType::Fabric:
      return HandleKind::CudaFabric;
    case env::HandleType::Auto:
    case env::HandleType::PosixFd:
      break;
  }
  return HandleKind::CudaPosixFd;
}

MemoryKind resolveKind(MemoryKind kind) {
  if (kind != MemoryKind::Auto) return kind;
  return detail::currentGpu().device >= 0 ? MemoryKind::Cuda : MemoryKind::Host;
}

}  // namespace

struct SymmetricBuffer::Impl {
  struct Window {
    std::unique_ptr<Reservation> va;
    std::map<size_t, std::unique_ptr<Mapping>> maps;  // by offset
  };

  Communicator comm;
  std::shared_ptr<detail::MemoryBackend> backend;
  HandleKind handles = HandleKind::MemFd;
  MemoryKind kind = MemoryKind::Host;
  bool adopted = false;
  // Threads: collective calls (grow/commit/release) hold opMu, one at a time (a second one is refused). stateMu is
  // shared by operations through the mappings (publish, fetch: detail::BufferUse) and by readers of the backed
  // state, exclusive where that state changes and at close. close() marks `closing` at once (every later call
  // throws) and frees now, or when the collective call in flight ends: it never waits on peers.
  std::mutex opMu;
  mutable std::shared_mutex stateMu;
  std::atomic<bool> closing{false};
  bool closed = false;  // resources released (stateMu)
  char* base = nullptr;
  size_t capacity = 0;
  size_t gran = 0;
  std::unique_ptr<Reservation> localVa;             // created buffers
  std::vector<std::unique_ptr<Mapping>> localMaps;  // created buffers
  std::map<size_t, Piece> localPieces;              // what this rank exports, by offset
  std::vector<Window> windows;                      // by rank; empty for self and unmapped members
  std::vector<bool> mapped;                         // by rank
  std::vector<uint64_t> bases;                      // by rank
  uint64_t* table = nullptr;
  uint64_t* backedBits = nullptr;         // granule bitmap kernels check rows against
  uint64_t* backedPrefix = nullptr;       // the word after it: bytes backed from offset 0
  detail::TableMemory* tables = nullptr;  // the backend, or the legacy-IPC state
  IntervalSet backed;
  uint64_t id = 0;
  uint64_t generation = 0;
  std::unique_ptr<detail::LegacyIpc> ipc;  // legacy CUDA IPC mode
  std::mutex listenersMu;
  std::map<uint64_t, detail::UnbackListener> unbackListeners;  // fetch's network transports
  uint64_t nextListener = 1;

  ~Impl() { closeNow(); }

  // Tells the layers above that `ranges` of this rank's memory are about to go (they stop serving them first).
  void notifyUnback(const std::vector<Range>& ranges) noexcept {
    std::lock_guard<std::mutex> lock(listenersMu);
    for (auto& [id, fn] : unbackListeners) {
      try {
        fn(ranges);
      } catch (const std::exception& e) {
        KVCOMM_WARN("SymmetricBuffer: a listener failed before memory was unmapped: ", e.what());
      }
    }
  }

  void checkOpen(const char* call) const { KVCOMM_CHECK_ARG(!closing, call, "the buffer is closed"); }

  // close(): local, never waits on peers; waits only for operations through the mappings in flight on other threads.
  void close() {
    closing = true;
    std::unique_lock<std::mutex> op(opMu, std::try_to_lock);
    if (!op.owns_lock()) return;  // the collective call in flight closes the buffer when it ends (Op below)
    std::unique_lock<std::shared_mutex> state(stateMu);
    closeNow();
  }

  // A collective call in progress on this thread; another thread's is refused, a close() meanwhile runs at its end.
  class Op {
   public:
    Op(Impl& impl, const char* call) : impl_(impl), lock_(impl.opMu, std::try_to_lock) {
      KVCOMM_CHECK_ARG(lock_.owns_lock(), call,
                       "another thread is in a collective call on this buffer (grow, commit and release are called "
                       "from one thread at a time, in the same order on every member)");
      impl.checkOpen(call);
    }
    ~Op() {
      lock_.unlock();
      if (impl_.closing) impl_.close();
    }
    Op(const Op&) = delete;
    Op& operator=(const Op&) = delete;

   private:
    Impl& impl_;
    std::unique_lock<std::mutex> lock_;
  };

  // Teardown order: peer windows first (our view of others), then this rank's own memory. Never talks to peers.
  void closeNow() noexcept {
    if (closed) return;
    notifyUnback({Range{0, capacity}});
    closed = true;
    try {
      windows.clear();
      if (tables && backedBits) tables->freeTable(backedBits);
      backedBits = nullptr;
      backedPrefix = nullptr;
      if (table && backend) backend->freeTable(table);  // the legacy-IPC state frees its own peer table
      table = nullptr;
      ipc.reset();
      tables = nullptr;
      localMaps.clear();
      localPieces.clear();
      localVa.reset();
    } catch (const std::exception& e) {
      KVCOMM_WARN("SymmetricBuffer::close: ", e.what());
    }
  }

  SymmRequest request(SymmOp op, uint64_t opBytes, const std::vector<Range>& ranges) const {
    SymmRequest r{};
    r.version = kProtocolVersion;
    r.op = static_cast<uint32_t>(op);
    r.bufferId = id;
    r.generation = generation + 1;
    r.capacity = capacity;
    r.opBytes = opBytes;
    r.rangesHash = detail::hashRanges(ranges);
    r.numRanges = static_cast<uint32_t>(ranges.size());
    r.granularity = gran;
    r.memKind = static_cast<uint32_t>(kind);
    r.handleKind = static_cast<uint32_t>(handles);
    r.pid = static_cast<int32_t>(getpid());
    r.uid = getuid();
    r.device = backend ? backend->device() : -1;
    r.hostIndex = comm.topology().members[static_cast<size_t>(comm.rank())].hostIndex;
    std::snprintf(r.socketName, sizeof(r.socketName), "%s", detail::FdServer::instance().name().c_str());
    return r;
  }

  // Phase 3 + import: exchange `mine`, map every peer's pieces into its window, vote. Undoes its own mappings when
  // any rank fails. Returns normally only when every member mapped everything.
  void exchangeAndMap(const std::vector<SymmRequest>& reqs, const std::vector<Piece>& mine, uint64_t gen) {
    auto sets = detail::exchange(comm, reqs, mine, mapped, id, gen);
    std::vector<std::pair<int, size_t>> added;
    auto importAll = [&] {
      for (int p = 0; p < comm.size(); ++p) {
        auto& set = sets[static_cast<size_t>(p)];
        for (size_t i = 0; i < set.metas.size(); ++i) {
          const detail::PieceMeta& m = set.metas[i];
          KVCOMM_CHECK_ARG(m.offset % gran == 0 && m.bytes % gran == 0 && m.bytes > 0 && m.offset <= capacity &&
                               m.bytes <= capacity - m.offset,
                           "SymmetricBuffer import", "rank ", p, " declared a piece [", m.offset, ", +", m.bytes,
                           ") outside its ", capacity, "-byte buffer or off the ", gran, "-byte granularity");
          Window& w = windows[static_cast<size_t>(p)];
          KVCOMM_CHECK_ARG(!w.maps.count(m.offset), "SymmetricBuffer import", "rank ", p,
                           " declared a piece at offset ", m.offset, " that is already mapped");
          auto chunk = backend->importFd(std::move(set.fds[i]), m);
          w.maps[m.offset] = backend->map(w.va->base() + m.offset, m.bytes, std::move(chunk), m.chunkOffset);
          added.emplace_back(p, m.offset);
        }
      }
    };
    detail::allSucceedOrUndo(comm, "SymmetricBuffer import", importAll, [&] {
      for (auto& [p, off] : added) windows[static_cast<size_t>(p)].maps.erase(off);
    });
  }

  // Phase 2 for create/adopt: windows for every mapped member, the peer table.
  void reserveWindows(size_t windowBytes) {
    int n = comm.size();
    windows.resize(static_cast<size_t>(n));
    bases.assign(static_cast<size_t>(n), 0);
    for (int r = 0; r < n; ++r) {
      if (r == comm.rank()) {
        bases[static_cast<size_t>(r)] = reinterpret_cast<uint64_t>(base);
      } else if (mapped[static_cast<size_t>(r)]) {
        windows[static_cast<size_t>(r)].va = backend->reserve(windowBytes);
        bases[static_cast<size_t>(r)] = reinterpret_cast<uint64_t>(windows[static_cast<size_t>(r)].va->base());
      }
    }
    table = backend->allocTable(static_cast<size_t>(n));
    backend->writeTable(table, bases);
    tables = backend.get();
    writeBacked();
  }

  // Whether [offset, offset + bytes) lies inside the capacity and is backed; never forms offset + bytes (sizes come
  // from users, up to SIZE_MAX). The caller holds stateMu.
  bool backedLocked(size_t offset, size_t bytes) const {
    return offset <= capacity && bytes <= capacity - offset && backed.covers(offset, bytes);
  }

  // Members mapped here: same host and, for GPU memory, P2P access both ways (the exchange is symmetric).
  void computeMapped() {
    const Topology& t = comm.topology();
    int me = comm.rank();
    mapped.assign(static_cast<size_t>(comm.size()), false);
    for (int r = 0; r < comm.size(); ++r)
      mapped[static_cast<size_t>(r)] =
          r == me ||
          (t.sameHost(me, r) && (kind == MemoryKind::Host || (t.canAccessPeer(me, r) && t.canAccessPeer(r, me))));
  }

  // Rewrites the granule bitmap from `backed` (allocated on first use; its address never changes afterwards), and
  // the word after it: how many bytes from offset 0 are backed, which kernels load once (not per row) and check most
  // rows against before they look at the bitmap.
  void writeBacked() {
    size_t granules = (capacity + gran - 1) / gran;
    size_t bitWords = (granules + 63) / 64 + 1;
    std::vector<uint64_t> words(bitWords + 1, 0);
    for (const Range& r : backed.ranges())
      for (size_t g = r.offset / gran; g < (r.offset + r.bytes) / gran; ++g) words[g / 64] |= 1ull << (g % 64);
    size_t prefix = 0;
    while (prefix < granules && ((words[prefix / 64] >> (prefix % 64)) & 1u)) ++prefix;
    words[bitWords] = std::min<uint64_t>(static_cast<uint64_t>(prefix) * gran, capacity);
    if (!backedBits) backedBits = tables->allocTable(words.size());
    tables->writeTable(backedBits, words);
    backedPrefix = backedBits + bitWords;
  }
};

namespace {

std::unique_ptr<SymmetricBuffer::Impl> begin(Communicator& comm, MemoryKind requested, const char* call) {
  KVCOMM_CHECK_ARG(comm.valid(), call, "the communicator is empty");
  KVCOMM_CHECK_ENUM(requested, MemoryKind::Host, call, "kind");
  auto impl = std::make_unique<SymmetricBuffer::Impl>();
  impl->comm = comm;
  impl->kind = resolveKind(requested);
  impl->handles = chooseHandleKind(impl->kind);
  return impl;
}

// Everyone agrees on rank 0's id; the id names tokens, so it must not repeat across buffers.
uint64_t agreeOnId(Communicator& comm) {
  std::vector<uint64_t> ids(static_cast<size_t>(comm.size()));
  detail::randomBytes(&ids[static_cast<size_t>(comm.rank())], sizeof(uint64_t));
  comm.allgather(ids.data(), sizeof(uint64_t));
  return ids[0];
}

// Backend creation can fail on one rank (no CUDA context); make it a collective failure.
void makeBackend(SymmetricBuffer::Impl& impl, const char* call) {
  detail::allSucceed(impl.comm, call, [&] {
    impl.backend = impl.kind == MemoryKind::Cuda ? detail::makeCudaBackend(impl.handles) : detail::makeHostBackend();
    impl.gran = impl.backend->granularity();
  });
}

void requireBuffer(const void* impl, const char* call) {
  KVCOMM_CHECK_ARG(impl != nullptr, call, "empty buffer (default-constructed or moved-from)");
}

}  // namespace

SymmetricBuffer::SymmetricBuffer() = default;
SymmetricBuffer::SymmetricBuffer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
SymmetricBuffer::~SymmetricBuffer() = default;
SymmetricBuffer::SymmetricBuffer(SymmetricBuffer&&) noexcept = default;
SymmetricBuffer& SymmetricBuffer::operator=(SymmetricBuffer&&) noexcept = default;

SymmetricBuffer SymmetricBuffer::create(Communicator comm, size_t capacity, size_t initialBytes, MemoryKind kind) {
  detail::RankScope scope(comm.valid() ? comm.rank() : -1);
  auto impl = begin(comm, kind, "SymmetricBuffer::create");
  impl->id = agreeOnId(impl->comm);
  if (impl->handles == HandleKind::CudaIpc) {
    // Agree first (sizes and handle type), so that a rank with another KVCOMM_HANDLE_TYPE gets the clear error.
    impl->gran = detail::LegacyIpc::kGranularity;
    impl->capacity = roundUp(capacity, impl->gran);
    detail::agree(impl->comm, impl->request(SymmOp::Create, roundUp(initialBytes, impl->gran), {}));
    checkCreateSizes(capacity, initialBytes, impl->gran);
    impl->ipc = detail::LegacyIpc::create(impl->comm, capacity, initialBytes);
    impl->capacity = impl->ipc->capacity();
    impl->base = impl->ipc->local();
    impl->mapped = impl->ipc->mappedMembers();
    impl->bases = impl->ipc->bases();
    impl->table = impl->ipc->table();
    impl->tables = impl->ipc.get();
    impl->backed.add(0, impl->ipc->mappedBytes());
    impl->writeBacked();
    return SymmetricBuffer(std::move(impl));
  }
  makeBackend(*impl, "SymmetricBuffer::create");
  impl->capacity = roundUp(capacity, impl->gran);
  size_t init = roundUp(initialBytes, impl->gran);
  auto reqs = detail::agree(impl->comm, impl->request(SymmOp::Create, init, {}));
  checkCreateSizes(capacity, initialBytes, impl->gran);
  impl->computeMapped();
  std::vector<Piece> mine;
  detail::allSucceed(impl->comm, "SymmetricBuffer::create (allocation)", [&] {
    impl->localVa = impl->backend->reserve(impl->capacity);
    impl->base = impl->localVa->base();
    impl->reserveWindows(impl->capacity);
    if (init > 0) {
      Piece p{0, init, 0, impl->backend->allocate(init)};
      impl->localMaps.push_back(impl->backend->map(impl->base, init, p.chunk, 0));
      mine.push_back(p);
    }
  });
  impl->exchangeAndMap(reqs, mine, impl->generation + 1);
  for (auto& p : mine) impl->localPieces[p.offset] = p;
  if (init) impl->backed.add(0, init);
  impl->writeBacked();
  impl->generation++;
  return SymmetricBuffer(std::move(impl));
}

SymmetricBuffer SymmetricBuffer::adopt(Communicator comm, void* base, size_t reservedBytes, MemoryKind kind) {
  detail::RankScope scope(comm.valid() ? comm.rank() : -1);
  auto impl = begin(comm, kind, "SymmetricBuffer::adopt");
  KVCOMM_CHECK_ARG(impl->handles != HandleKind::CudaIpc, "SymmetricBuffer::adopt",
                   "legacy CUDA IPC cannot share an engine's VMM allocations; adopt needs "
                   "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (unset KVCOMM_HANDLE_TYPE=ipc)");
  impl->id = agreeOnId(impl->comm);
  impl->adopted = true;
  makeBackend(*impl, "SymmetricBuffer::adopt");
  impl->capacity = reservedBytes;
  detail::agree(impl->comm, impl->request(SymmOp::Adopt, reservedBytes, {}));
  impl->base = static_cast<char*>(base);
  impl->computeMapped();
  detail::allSucceed(impl->comm, "SymmetricBuffer::adopt (reservation)", [&] {
    // The base differs per rank: checked inside the vote, so a bad one fails every rank at once.
    KVCOMM_CHECK_ARG(base != nullptr && reservedBytes > 0 && reservedBytes % impl->gran == 0 &&
                         reinterpret_cast<uintptr_t>(base) % impl->gran == 0,
                     "SymmetricBuffer::adopt", "base ", base, " and reservedBytes ", reservedBytes,
                     " must be non-zero multiples of the ", impl->gran, "-byte granularity");
    impl->reserveWindows(reservedBytes);
  });
  impl->generation++;
  return SymmetricBuffer(std::move(impl));
}

void SymmetricBuffer::grow(size_t newBytes) {
  KVCOMM_CHECK_ARG(impl_, "SymmetricBuffer::grow", "empty buffer");
  detail::RankScope scope(impl_->comm.rank());
  Impl::Op op(*impl_, "SymmetricBuffer::grow");
  KVCOMM_CHECK_ARG(!impl_->adopted, "SymmetricBuffer::grow", "adopted buffers change through commit()/release()");
  size_t want = roundUp(newBytes, impl_->gran);
  if (impl_->ipc) {
    auto reqs = detail::agree(impl_->comm, impl_->request(SymmOp::Grow, want, {}));
    (void)reqs;
    impl_->ipc->grow(want);
    std::unique_lock<std::shared_mutex> state(impl_->stateMu);
    impl_->backed.add(0, impl_->ipc->mappedBytes());
    impl_->writeBacked();
    impl_->generation++;
    return;
  }
  auto reqs = detail::agree(impl_->comm, impl_->request(SymmOp::Grow, want, {}));
  size_t have = impl_->backed.total();
  KVCOMM_CHECK_ARG(want <= impl_->capacity, "SymmetricBuffer::grow", "newBytes ", newBytes, " exceeds the capacity ",
                   impl_->capacity);
  if (want <= have) return;  // every member agreed on the same no-op
  std::vector<Piece> mine;
  std::vector<std::unique_ptr<Mapping>> maps;
  detail::allSucceed(impl_->comm, "SymmetricBuffer::grow (allocation)", [&] {
    Piece p{have, want - have, 0, impl_->backend->allocate(want - have)};
    maps.push_back(impl_->backend->map(impl_->base + have, want - have, p.chunk, 0));
    mine.push_back(p);
  });
  impl_->exchangeAndMap(reqs, mine, impl_->generation + 1);
  // The new bytes become visible to operations on other threads at once, with the bitmap that admits them.
  std::unique_lock<std::shared_mutex> state(impl_->stateMu);
  for (auto& m : maps) impl_->localMaps.push_back(std::move(m));
  for (auto& p : mine) impl_->localPieces[p.offset] = p;
  impl_->backed.add(have, want - have);
  impl_->writeBacked();
  impl_->generation++;
}

void SymmetricBuffer::commit(const std::vector<Range>& ranges) {
  KVCOMM_CHECK_ARG(impl_, "SymmetricBuffer::commit", "empty buffer");
  detail::RankScope scope(impl_->comm.rank());
  Impl::Op op(*impl_, "SymmetricBuffer::commit");
  KVCOMM_CHECK_ARG(impl_->adopted, "SymmetricBuffer::commit", "only adopted buffers commit; use grow()");
  KVCOMM_CHECK_ARG(ranges.size() <= limits::kMaxBufferRanges, "SymmetricBuffer::commit", ranges.size(),
                   " ranges exceed kvcomm::limits::kMaxBufferRanges (", limits::kMaxBufferRanges, ")");
  auto reqs = detail::agree(impl_->comm, impl_->request(SymmOp::Commit, 0, ranges));
  IntervalSet fresh;
  for (const Range& r : ranges) {
    KVCOMM_CHECK_ARG(r.bytes > 0 && r.offset % impl_->gran == 0 && r.bytes % impl_->gran == 0 &&
                         r.offset <= impl_->capacity && r.bytes <= impl_->capacity - r.offset,
                     "SymmetricBuffer::commit", "range [", r.offset, ", +", r.bytes, ") must lie in the ",
                     impl_->capacity, "-byte reservation on ", impl_->gran, "-byte granularity");
    KVCOMM_CHECK_ARG(!impl_->backed.overlaps(r.offset, r.bytes) && !fresh.overlaps(r.offset, r.bytes),
                     "SymmetricBuffer::commit", "range [", r.offset, ", +", r.bytes,
                     ") overlaps a committed range (release it first)");
    fresh.add(r.offset, r.bytes);
  }
  std::vector<Piece> mine;
  detail::allSucceed(impl_->comm, "SymmetricBuffer::commit (export)", [&] {
    for (const Range& r : ranges)
      for (auto& p : impl_->backend->retain(impl_->base + r.offset, r.bytes, r.offset)) mine.push_back(std::move(p));
  });
  impl_->exchangeAndMap(reqs, mine, impl_->generation + 1);
  std::unique_lock<std::shared_mutex> state(impl_->stateMu);
  for (auto& p : mine) impl_->localPieces[p.offset] = p;
  for (const Range& r : ranges) impl_->backed.add(r.offset, r.bytes);
  impl_->writeBacked();
  impl_->generation++;
}

void SymmetricBuffer::release(const std::vector<Range>& ranges) {
  KVCOMM_CHECK_ARG(impl_, "SymmetricBuffer::release", "empty buffer");
  detail::RankScope scope(impl_->comm.rank());
  Impl::Op op(*impl_, "SymmetricBuffer::release");
  KVCOMM_CHECK_ARG(impl_->adopted, "SymmetricBuffer::release", "only adopted buffers release");
  KVCOMM_CHECK_ARG(ranges.size() <= limits::kMaxBufferRanges, "SymmetricBuffer::release", ranges.size(),
                   " ranges exceed kvcomm::limits::kMaxBufferRanges (", limits::kMaxBufferRanges, ")");
  auto reqs = detail::agree(impl_->comm, impl_->request(SymmOp::Release, 0, ranges));
  (void)reqs;
  for (const Range& r : ranges)
    KVCOMM_CHECK_ARG(r.bytes > 0 && impl_->backed.covers(r.offset, r.bytes), "SymmetricBuffer::release", "range [",
                     r.offset, ", +", r.bytes, ") is not committed");
  // Mappings must lie wholly inside or outside every range (a mapping cannot be split).
  auto inside = [&](size_t off, size_t len) {
    for (const Range& r : ranges) {
      if (off >= r.offset && off + len <= r.offset + r.bytes) return 1;
      if (off < r.offset + r.bytes && r.offset < off + len) return -1;
    }
    return 0;
  };
  detail::Outcome local;
  for (auto& [off, p] : impl_->localPieces)
    if (inside(off, p.bytes) < 0)
      local = detail::Outcome::failure(cat("range cuts through the allocation at offset ", off));
  detail::vote(impl_->comm, "SymmetricBuffer::release", local);
  impl_->notifyUnback(ranges);  // servers of this memory stop reading it before the engine may unmap it
  // Exclusive: no operation on another thread writes through a window while it is unmapped.
  std::unique_lock<std::shared_mutex> state(impl_->stateMu);
  for (const Range& r : ranges) impl_->backed.remove(r.offset, r.bytes);
  impl_->writeBacked();  // kernels captured earlier now refuse these ranges instead of touching unmapped pages
  for (auto& w : impl_->windows)
    std::erase_if(w.maps, [&](const auto& kv) { return inside(kv.first, kv.second->bytes()) > 0; });
  std::erase_if(impl_->localPieces, [&](const auto& kv) { return inside(kv.first, kv.second.bytes) > 0; });
  impl_->generation++;
}

void SymmetricBuffer::close() {
  if (impl_) impl_->close();
}

// After close() the queries describe no memory (nullptr, unmapped, nothing backed), never the unmapped addresses.
void* SymmetricBuffer::local() const {
  requireBuffer(impl_.get(), "SymmetricBuffer::local");
  std::shared_lock<std::shared_mutex> state(impl_->stateMu);
  return impl_->closing ? nullptr : impl_->base;
}
void* SymmetricBuffer::peer(int r) const {
  requireBuffer(impl_.get(), "SymmetricBuffer::peer");
  KVCOMM_CHECK_ARG(r >= 0 && r < size(), "SymmetricBuffer::peer", "rank ", r, " out of range");
  std::shared_lock<std::shared_mutex> state(impl_->stateMu);
  return impl_->closing ? nullptr : reinterpret_cast<void*>(impl_->bases[static_cast<size_t>(r)]);
}
bool SymmetricBuffer::isMapped(int r) const {
  requireBuffer(impl_.get(), "SymmetricBuffer::isMapped");
  std::shared_lock<std::shared_mutex> state(impl_->stateMu);
  return !impl_->closing && r >= 0 && r < size() && impl_->mapped[static_cast<size_t>(r)];
}
int SymmetricBuffer::rank() const {
  requireBuffer(impl_.get(), "SymmetricBuffer::rank");
  return impl_->comm.rank();
}
int SymmetricBuffer::size() const {
  requireBuffer(impl_.get(), "SymmetricBuffer::size");
  return impl_->comm.size();
}
size_t SymmetricBuffer::capacity() const {
  requireBuffer(impl_.get(), "SymmetricBuffer::capacity");
  return impl_->capacity;
}
size_t SymmetricBuffer::mappedBytes() const {
  requireBuffer(impl_.get(), "SymmetricBuffer::mappedBytes");
  std::shared_lock<std::shared_mutex> state(impl_->stateMu);
  return impl_->closing ? 0 : impl_->backed.total();
}
bool SymmetricBuffer::isBacked(size_t offset, size_t bytes) const {
  if (!impl_) return false;
  std::shared_lock<std::shared_mutex> state(impl_->stateMu);
  return !impl_->closing && impl_->backedLocked(offset, bytes);
}
std::vector<Range> SymmetricBuffer::backedRanges() const {
  requireBuffer(impl_.get(), "SymmetricBuffer::backedRanges");
  std::shared_lock<std::shared_mutex> state(impl_->stateMu);
  return impl_->closing ? std::vector<Range>{} : impl_->backed.ranges();
}
uint64_t SymmetricBuffer::generation() const {
  requireBuffer(impl_.get(), "SymmetricBuffer::generation");
  std::shared_lock<std::shared_mutex> state(impl_->stateMu);
  return impl_->generation;
}
size_t SymmetricBuffer::granularity() const {
  requireBuffer(impl_.get(), "SymmetricBuffer::granularity");
  return impl_->gran;
}
MemoryKind SymmetricBuffer::kind() const {
  requireBuffer(impl_.get(), "SymmetricBuffer::kind");
  return impl_->kind;
}
bool SymmetricBuffer::adopted() const {
  requireBuffer(impl_.get(), "SymmetricBuffer::adopted");
  return impl_->adopted;
}
std::string SymmetricBuffer::handleType() const {
  requireBuffer(impl_.get(), "SymmetricBuffer::handleType");
  return detail::handleKindName(impl_->handles);
}
Communicator& SymmetricBuffer::communicator() const {
  requireBuffer(impl_.get(), "SymmetricBuffer::communicator");
  return impl_->comm;
}
const uint64_t* SymmetricBuffer::peerTable() const {
  requireBuffer(impl_.get(), "SymmetricBuffer::peerTable");
  std::shared_lock<std::shared_mutex> state(impl_->stateMu);
  return impl_->closing ? nullptr : impl_->table;
}
const uint64_t* SymmetricBuffer::backedBitmap() const {
  requireBuffer(impl_.get(), "SymmetricBuffer::backedBitmap");
  std::shared_lock<std::shared_mutex> state(impl_->stateMu);
  return impl_->closing ? nullptr : impl_->backedBits;
}

namespace detail {

std::vector<LocalPiece> localPieces(const SymmetricBuffer::Impl& impl) {
  std::shared_lock<std::shared_mutex> state(impl.stateMu);
  std::vector<LocalPiece> out;
  if (impl.closed) return out;
  if (impl.ipc) {  // legacy IPC: one allocation, as far as it is mapped
    if (impl.backed.total()) out.push_back({0, impl.backed.total(), impl.base});
    return out;
  }
  for (const auto& [off, p] : impl.localPieces) out.push_back({off, p.bytes, impl.base + off});
  return out;
}

std::vector<Piece> localChunks(const SymmetricBuffer::Impl& impl) {
  std::shared_lock<std::shared_mutex> state(impl.stateMu);
  std::vector<Piece> out;
  if (impl.closed || impl.ipc) return out;
  for (const auto& [off, p] : impl.localPieces) out.push_back(p);
  return out;
}

int bufferDevice(const SymmetricBuffer::Impl& impl) {
  return impl.backend ? impl.backend->device() : -1;
}

uint64_t addUnbackListener(SymmetricBuffer::Impl& impl, UnbackListener listener) {
  std::lock_guard<std::mutex> lock(impl.listenersMu);
  uint64_t id = impl.nextListener++;
  impl.unbackListeners[id] = std::move(listener);
  return id;
}

void removeUnbackListener(SymmetricBuffer::Impl& impl, uint64_t id) noexcept {
  std::lock_guard<std::mutex> lock(impl.listenersMu);
  impl.unbackListeners.erase(id);
}

}  // namespace detail

SymmDeviceHandle SymmetricBuffer::deviceHandle() const {
  KVCOMM_CHECK_ARG(impl_ && !impl_->closing, "SymmetricBuffer::deviceHandle", "empty or closed buffer");
  KVCOMM_CHECK_ARG(size() <= kMaxHandlePeers, "SymmetricBuffer::deviceHandle", "group of ", size(),
                   " members exceeds the by-value handle's ", kMaxHandlePeers, "; pass peerTable() instead");
  SymmDeviceHandle h{};
  for (int r = 0; r < size(); ++r) {
    h.peers[r] = impl_->bases[static_cast<size_t>(r)];
    if (impl_->mapped[static_cast<size_t>(r)]) h.mappedMask |= (1ull << r);
  }
  h.capacity = impl_->capacity;
  h.rank = rank();
  h.size = size();
  return h;
}

namespace detail {

BufferUse::BufferUse(const SymmetricBuffer& buffer, const char* call) {
  KVCOMM_CHECK_ARG(buffer.impl_, call, "the buffer is empty");
  impl_ = buffer.impl_.get();
  lock_ = std::shared_lock<std::shared_mutex>(impl_->stateMu);
  KVCOMM_CHECK_ARG(!impl_->closing, call, "the buffer is closed");
}

BufferUse::~BufferUse() = default;

uint64_t BufferUse::generation() const {
  return impl_->generation;
}
std::vector<Range> BufferUse::backedRanges() const {
  return impl_->backed.ranges();
}
size_t BufferUse::mappedBytes() const {
  return impl_->backed.total();
}
bool BufferUse::isBacked(size_t offset, size_t bytes) const {
  return impl_->backedLocked(offset, bytes);
}
const uint64_t* BufferUse::backedBitmap() const {
  return impl_->backedBits;
}
const uint64_t* BufferUse::backedPrefix() const {
  return impl_->backedPrefix;
}

}  // namespace detail

}  // namespace kvcomm
