// Publisher: validation, mode choice (direct or gather+insert) and launches on either backend.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>

#include "barrier/barrier_factory.hpp"
#include "barrier/device_errors_of.hpp"
#include "comm/agreement.hpp"
#include "comm/health.hpp"
#include "common/check.hpp"
#include "common/env.hpp"
#include "device/device_errors.hpp"
#include "kernels/launch.hpp"
#include "kvcomm/device/publish.hpp"
#include "kvcomm/publish.hpp"
#include "publish/fallback_transport.hpp"
#include "symm/buffer_internals.hpp"
#include "symm/buffer_use.hpp"

namespace kvcomm {

using detail::cat;

const char* publishModeName(PublishMode mode) {
  return mode == PublishMode::Direct ? "direct" : "fallback";
}

namespace {

// What KVCOMM_DIRECT asks for (env::kDirect's choices, in order).
enum class DirectRequest { Auto = 0, Force = 1, Off = 2 };

size_t align16(size_t x) {
  return (x + 15) & ~size_t(15);
}

}  // namespace

struct Publisher::Impl {
  SymmetricBuffer buf;  // the publisher's own handle: the buffer lives as long as either holds it
  MemoryKind kind = MemoryKind::Host;
  PublishMode mode = PublishMode::Fallback;
  std::string reason;
  int lanes = 2;
  SymmDeviceHandle replicas{};   // every member (Direct)
  SymmDeviceHandle localOnly{};  // this rank's replica (Fallback insert)
  Barrier barrier;               // Direct: a Barrier on the group; Fallback: the transport's collective
  BarrierDeviceHandle bar{};     // Direct mode
  std::unique_ptr<detail::ErrorRecordMemory> errors;  // slots found out of range on the device
  DeviceErrorRecord* error = nullptr;
  std::unique_ptr<detail::FallbackTransport> transport;
  size_t packMaxBytes = 0;  // Fallback on GPUs: records up to this size are packed even when the rows are contiguous
  uint64_t backedGeneration = ~0ull;
  std::vector<Range> backed;

  int rank() const { return buf.rank(); }

  void checkLane(int lane, const char* call) const {
    KVCOMM_CHECK_ARG(lane >= 0 && lane < lanes, call, "lane ", lane, " outside [0, ", lanes, ")");
  }

  // Whether [offset, offset + bytes) is backed now (the host-side check; kernels re-check each row on the device).
  bool backedNow(const detail::BufferUse& use, size_t offset, size_t bytes) {
    if (backedGeneration != use.generation()) {
      backed = use.backedRanges();
      backedGeneration = use.generation();
    }
    for (const Range& r : backed)
      if (offset >= r.offset && bytes <= r.bytes && offset - r.offset <= r.bytes - bytes) return true;
    return false;
  }

  // Checks one tensor (every size computation checked: nothing may wrap) and fills its descriptor.
  detail::PublishTensorDesc describe(const detail::BufferUse& use, const CacheTensor& c, int k, size_t numTokens) {
    const char* call = "publish";
    const uint64_t capacity = buf.capacity();
    KVCOMM_CHECK_ARG(c.rowBytes > 0, call, "tensor ", k, ": rowBytes is 0");
    KVCOMM_CHECK_ARG(c.src != nullptr || numTokens == 0, call, "tensor ", k, ": src is null");
    KVCOMM_CHECK_ARG(c.blockSize >= 1, call, "tensor ", k, ": blockSize is 0");
    detail::PublishTensorDesc t{};
    t.src = static_cast<const char*>(c.src);
    t.srcStride = c.srcStride ? c.srcStride : c.rowBytes;
    t.rowBytes = c.rowBytes;
    t.offset = c.offset;
    t.blockSize = c.blockSize;
    t.rowStride = c.rowStride ? c.rowStride : c.rowBytes;
    if (c.blockStride) {
      t.blockStride = c.blockStride;
    } else {
      KVCOMM_CHECK_ARG(!mulOverflows(c.blockSize, t.rowStride, &t.blockStride), call, "tensor ", k, ": blockSize ",
                       c.blockSize, " x rowStride ", t.rowStride, " overflows 64 bits");
    }
    uint64_t span = 0, need = 0;
    KVCOMM_CHECK_ARG(!mulOverflows(c.blockSize - 1, t.rowStride, &span) && !addOverflows(span, c.rowBytes, &need) &&
                         need <= t.blockStride,
                     call, "tensor ", k, ": rows of a block (", c.blockSize, " x stride ", t.rowStride, ", ",
                     c.rowBytes, " bytes each) overflow the block stride ", t.blockStride);
    KVCOMM_CHECK_ARG(c.offset <= capacity, call, "tensor ", k, ": offset ", c.offset, " is beyond the buffer's ",
                     capacity, " bytes");
    KVCOMM_CHECK_ARG(c.limitBytes <= capacity - c.offset, call, "tensor ", k, ": offset ", c.offset, " + limitBytes ",
                     c.limitBytes, " exceeds the buffer's capacity of ", capacity, " bytes");
    t.limit = c.limitBytes ? c.limitBytes : capacity - c.offset;
    KVCOMM_CHECK_ARG(backedNow(use, c.offset, c.rowBytes), call, "tensor ", k, ": offset ", c.offset, " (+", c.rowBytes,
                     " bytes) is not inside the backed part of the buffer (", use.mappedBytes(), " bytes backed)");
    KVCOMM_CHECK_ARG(c.rowBytes <= t.limit, call, "tensor ", k, ": a row of ", c.rowBytes,
                     " bytes does not fit in its region (limitBytes ", t.limit, ")");
    t.safeSlots = detail::safeSlotsOf(t);  // after every check safeSlotsOf relies on
    t.blockShift = detail::blockShiftOf(t.blockSize);
    if (c.srcBytes != 0 && numTokens > 0) {
      uint64_t last = 0, end = 0;
      KVCOMM_CHECK_ARG(!mulOverflows(numTokens - 1, t.srcStride, &last) && !addOverflows(last, c.rowBytes, &end) &&
                           end <= c.srcBytes,
                       call, "tensor ", k, ": ", numTokens, " rows of srcStride ", t.srcStride, " (", c.rowBytes,
                       " bytes each) reach past srcBytes ", c.srcBytes, "; nothing was read or written");
    }
    t.vec = commonAlignment(reinterpret_cast<uintptr_t>(t.src), t.srcStride, t.offset, t.blockStride,
                            c.blockSize > 1 ? t.rowStride : 0);
    return t;
  }

  detail::PublishLaunch launchFor(const detail::BufferUse& use, const std::vector<CacheTensor>& tensors,
                                  const void* slots, SlotType type, size_t numTokens) {
    KVCOMM_CHECK_ARG(!tensors.empty() && tensors.size() <= static_cast<size_t>(detail::kMaxPublishTensors), "publish",
                     tensors.size(), " tensors; 1 to ", detail::kMaxPublishTensors, " per call");
    KVCOMM_CHECK_ARG(slots != nullptr || numTokens == 0, "publish", "slotMapping is null");
    KVCOMM_CHECK_ARG(numTokens <= static_cast<size_t>(INT64_MAX), "publish", "numTokens ", numTokens, " is too large");
    detail::PublishLaunch p{};
    for (size_t k = 0; k < tensors.size(); ++k) p.t[k] = describe(use, tensors[k], static_cast<int>(k), numTokens);
    p.numTensors = static_cast<int32_t>(tensors.size());
    p.replicas = replicas;
    p.slots = slots;
    p.slot64 = type == SlotType::Int64 ? 1 : 0;
    p.numTokens = static_cast<int64_t>(numTokens);
    p.numSources = 1;
    p.error = error;
    p.backed = use.backedBitmap();
    p.backedPrefix = use.backedPrefix();
    p.capacity = buf.capacity();
    p.granShift = static_cast<int32_t>(__builtin_ctzll(buf.granularity()));
    return p;
  }

  // publish(): the buffer is held steady (and checked open) only while rows go into it; `then` runs after the rows,
  // in the same kernel in Direct mode on CUDA.
  void run(const std::vector<CacheTensor>& tensors, const void* slots, SlotType type, size_t numTokens, Stream stream,
           PublishThen then, int lane, const char* call) {
    using Then = PublishThen;
    detail::checkHealthy(buf.communicator(), call);
    if (then != Then::Nothing) checkLane(lane, call);
    if (mode == PublishMode::Direct) {
      {
        detail::BufferUse use(buf, call);
        auto p = launchFor(use, tensors, slots, type, numTokens);
        if (kind == MemoryKind::Cuda) {
          auto step = then == Then::Signal ? detail::BarrierStep::Signal : detail::BarrierStep::Both;
          detail::launchPublish(p, stream, then != Then::Nothing ? &bar : nullptr, lane, step);
          return;
        }
        detail::hostPublish(p);
      }
      if (then == Then::Barrier) barrier.sync(stream, lane);
      if (then == Then::Signal) barrier.signal(stream, lane);
      return;
    }
    detail::PublishLaunch p;
    {
      detail::BufferUse use(buf, call);
      p = launchFor(use, tensors, slots, type, numTokens);
    }
    publishFallback(p, stream, call);
    if (then != Then::Nothing) transport->barrier(stream);  // the fallback's signal is the whole barrier
  }

  // Sized calls: the counts the caller states are checked before anything is read.
  static void checkSlots(const SlotMapping& slots, size_t numTokens, const char* call) {
    KVCOMM_CHECK_ARG(numTokens <= slots.count, call, "numTokens ", numTokens, " exceeds the slot mapping's ",
                     slots.count, " entries; nothing was read or written");
  }

  void checkOpen(const char* call) {
    detail::BufferUse use(buf, call);  // throws when the buffer was closed
    detail::checkHealthy(buf.communicator(), call);
  }

  // Gather+insert: gather every rank's slots and rows, insert them all locally with one kernel. Large calls whose rows
  // are already back to back are gathered straight from the caller's buffers by grouped AllGathers (no pack copy);
  // otherwise the rows are packed into one record per rank first and gathered by one AllGather. Small records are
  // packed even when contiguous: on 2 x H200 a group of two AllGathers cost 1.6-2.1 us more than one at 16-256 rows
  // of 656 B (0.5 us at 4096), while the pack kernel costs 0.5-0.8 us there (1.4 us at 4096) on one H200.
  void publishFallback(const detail::PublishLaunch& p, Stream stream, const char* call) {
    size_t T = static_cast<size_t>(p.numTokens);
    // The packed record's layout: [int64 slots][tensor 0 rows][tensor 1 rows]..., each part 16-byte aligned.
    detail::PackLaunch pack{};
    size_t packed = align16(T * sizeof(int64_t));
    for (int k = 0; k < p.numTensors; ++k) {
      pack.partOffset[k] = packed;
      packed += align16(T * p.t[k].rowBytes);
    }
    bool contiguous = kind == MemoryKind::Cuda && transport->gathersParts() && packed > packMaxBytes;
    for (int k = 0; k < p.numTensors; ++k) contiguous = contiguous && p.t[k].srcStride == p.t[k].rowBytes;
    if (contiguous) {
      const size_t n = static_cast<size_t>(buf.size()), slotBytes = p.slot64 ? 8 : 4;
      std::vector<detail::FallbackTransport::Part> parts{{p.slots, T * slotBytes}};
      for (int k = 0; k < p.numTensors; ++k) parts.push_back({p.t[k].src, T * p.t[k].rowBytes});
      const char* all = transport->gatherParts(parts, stream);
      detail::PublishLaunch ins = p;
      ins.replicas = localOnly;
      ins.slots = all;
      ins.sourceStride = T * slotBytes;
      ins.numSources = buf.size();
      size_t at = align16(n * T * slotBytes);
      for (int k = 0; k < p.numTensors; ++k) {
        ins.t[k].src = all + at;
        ins.t[k].sourceStride = T * p.t[k].rowBytes;
        ins.t[k].srcStride = p.t[k].rowBytes;
        ins.t[k].vec =
            commonAlignment(reinterpret_cast<uintptr_t>(ins.t[k].src), T * p.t[k].rowBytes, p.t[k].rowBytes,
                            p.t[k].offset, p.t[k].blockStride | (p.t[k].blockSize > 1 ? p.t[k].rowStride : 0));
        at += align16(n * T * p.t[k].rowBytes);
      }
      detail::BufferUse use(buf, call);  // the buffer may have been closed, or grown, while the rows were gathered
      ins.backed = use.backedBitmap();
      ins.backedPrefix = use.backedPrefix();
      detail::launchPublish(ins, stream, nullptr, 0);
      return;
    }
    for (int k = 0; k < p.numTensors; ++k) {
      pack.src[k] = p.t[k].src;
      pack.srcStride[k] = p.t[k].srcStride;
      pack.rowBytes[k] = p.t[k].rowBytes;
    }
    size_t record = std::max<size_t>(packed, 16);
    pack.slots = p.slots;
    pack.slot64 = p.slot64;
    pack.numTokens = p.numTokens;
    pack.numTensors = p.numTensors;
    pack.out = transport->sendBuffer(record, stream);
    if (kind == MemoryKind::Cuda)
      detail::launchPack(pack, stream);
    else
      detail::hostPack(pack);
    detail::FallbackTransport::Shape shape;
    shape.numTokens = p.numTokens;
    shape.numTensors = static_cast<uint64_t>(p.numTensors);
    for (int k = 0; k < p.numTensors; ++k) shape.rowBytes[k] = p.t[k].rowBytes;
    const char* all = transport->gather(record, shape, stream);
    detail::PublishLaunch ins = p;
    ins.replicas = localOnly;
    ins.slots = all;
    ins.slot64 = 1;
    ins.numSources = buf.size();
    ins.sourceStride = record;
    for (int k = 0; k < p.numTensors; ++k) {
      ins.t[k].src = all + pack.partOffset[k];
      ins.t[k].sourceStride = record;
      ins.t[k].srcStride = p.t[k].rowBytes;
      ins.t[k].vec = commonAlignment(reinterpret_cast<uintptr_t>(ins.t[k].src), record, p.t[k].rowBytes, p.t[k].offset,
                                     p.t[k].blockStride | (p.t[k].blockSize > 1 ? p.t[k].rowStride : 0));
    }
    detail::BufferUse use(buf, call);  // the buffer may have been closed, or grown, while the rows were gathered
    ins.backed = use.backedBitmap();
    ins.backedPrefix = use.backedPrefix();
    if (kind == MemoryKind::Cuda)
      detail::launchPublish(ins, stream, nullptr, 0);
    else
      detail::hostPublish(ins);
  }
};

Publisher::Publisher() = default;
Publisher::Publisher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Publisher::~Publisher() = default;
Publisher::Publisher(Publisher&&) noexcept = default;
Publisher& Publisher::operator=(Publisher&&) noexcept = default;

Publisher Publisher::create(SymmetricBuffer& buffer, const PublisherOptions& options) {
  KVCOMM_CHECK_ARG(buffer.valid(), "Publisher::create", "the buffer is empty");
  Communicator comm = buffer.communicator();
  detail::RankScope scope(comm.rank());
  // A vote: a bad value on one member fails every member at once instead of leaving them in the mode exchange.
  detail::allSucceed(comm, "Publisher::create", [&] {
    KVCOMM_CHECK_ARG(options.lanes >= 1 && options.lanes <= kMaxBarrierLanes, "Publisher::create", "lanes ",
                     options.lanes, " outside [1, ", kMaxBarrierLanes, "]");
  });
  KVCOMM_CHECK_ARG((buffer.granularity() & (buffer.granularity() - 1)) == 0, "Publisher::create", "granularity ",
                   buffer.granularity(), " is not a power of two");
  auto impl = std::make_unique<Impl>();
  impl->buf = detail::BufferAccess::share(buffer);
  impl->kind = buffer.kind();
  impl->lanes = options.lanes;

  // Mode: every member must ask for the same, and Direct only where every member can reach every replica.
  struct ModeVote {
    int64_t packMaxBytes;  // decides which collectives a fallback call issues: must agree, like the mode
    int32_t requested;
    int32_t directOk;
    char why[248];
  };
  std::vector<ModeVote> votes(static_cast<size_t>(comm.size()));
  ModeVote& mine = votes[static_cast<size_t>(comm.rank())];
  mine.requested = static_cast<int32_t>(env::choice(env::kDirect));
  mine.packMaxBytes = env::fallbackPackMaxBytes();
  mine.directOk = 1;
  std::string why;
  if (buffer.size() > kMaxHandlePeers) why = cat(buffer.size(), " members exceed the direct path's ", kMaxHandlePeers);
  for (int r = 0; r < buffer.size() && why.empty(); ++r)
    if (!buffer.isMapped(r))
      why = cat("member ", r, " is not mapped here (another host, or no P2P access between the GPUs)");
  if (!why.empty()) mine.directOk = 0;
  std::snprintf(mine.why, sizeof(mine.why), "%s", why.c_str());
  comm.allgather(votes.data(), sizeof(ModeVote));
  detail::requireSame(
      votes, [](const ModeVote& v) { return v.requested; }, "Publisher::create", "KVCOMM_DIRECT",
      [](int32_t m) { return env::word(env::kDirect, m); }, detail::worldRanksOf(comm));
  detail::requireSame(
      votes, [](const ModeVote& v) { return v.packMaxBytes; }, "Publisher::create", "KVCOMM_FALLBACK_PACK_MAX_BYTES",
      detail::asPrinted, detail::worldRanksOf(comm));
  bool allOk = true;
  for (int r = 0; r < comm.size(); ++r) {
    const ModeVote& v = votes[static_cast<size_t>(r)];
    if (!v.directOk && allOk) {
      allOk = false;
      why = cat("rank ", r, ": ", std::string(v.why, strnlen(v.why, sizeof(v.why))));
    }
  }
  impl->packMaxBytes = static_cast<size_t>(votes[0].packMaxBytes);
  auto requested = static_cast<DirectRequest>(votes[0].requested);
  if (requested == DirectRequest::Force && !allOk)
    KVCOMM_THROW(Unsupported, "Publisher::create", "KVCOMM_DIRECT=1 demands direct publication, which cannot run on ",
                 "this group: ", why);
  if (requested == DirectRequest::Off) {
    impl->mode = PublishMode::Fallback;
    impl->reason = "KVCOMM_DIRECT=0 forces the gather+insert fallback";
  } else if (allOk) {
    impl->mode = PublishMode::Direct;
    impl->reason = cat("every member is mapped (", requested == DirectRequest::Force ? "KVCOMM_DIRECT=1" : "auto", ")");
  } else {
    impl->mode = PublishMode::Fallback;
    impl->reason = cat("direct publication cannot run: ", why);
  }

  detail::allSucceed(comm, "Publisher::create (error record)",
                     [&] { impl->errors = std::make_unique<detail::ErrorRecordMemory>(impl->kind); });
  impl->error = impl->errors->get();
  impl->replicas = buffer.size() <= kMaxHandlePeers ? buffer.deviceHandle() : SymmDeviceHandle{};
  impl->localOnly = impl->replicas;
  impl->localOnly.mappedMask = 1ull << comm.rank();
  if (buffer.size() > kMaxHandlePeers) {  // fallback only: the insert needs this rank's base alone
    impl->localOnly.rank = 0;
    impl->localOnly.size = 1;
    impl->localOnly.peers[0] = reinterpret_cast<uint64_t>(buffer.local());
    impl->localOnly.mappedMask = 1;
  }
  if (impl->mode == PublishMode::Direct) {
    BarrierOptions bo;
    bo.lanes = options.lanes;
    bo.timeoutMs = options.barrierTimeoutMs;
    bo.kind = impl->kind;
    impl->barrier = Barrier::create(comm, bo);
    impl->bar = impl->barrier.deviceHandle();
  }
  if (impl->mode == PublishMode::Fallback) {
    if (impl->kind == MemoryKind::Cuda) {
      // NCCL refuses two ranks on one GPU; say which members share one instead of passing on "invalid usage".
      auto [a, b] = comm.topology().sharedGpu();
      if (a >= 0)
        KVCOMM_THROW(Unsupported, "Publisher::create", "the NCCL fallback needs one GPU per member, but members ", a,
                     " and ", b, " share ", comm.topology().members[static_cast<size_t>(a)].gpu.uuid,
                     " (direct publication supports that: KVCOMM_DIRECT=auto or 1)");
      size_t record = align16(options.stagingTokens * sizeof(int64_t)) +
                      align16(options.stagingTokens * options.stagingBytesPerToken) + 16 * detail::kMaxPublishTensors;
      impl->transport = detail::makeNcclTransport(comm, record);
    } else {
      impl->transport = detail::makeHostTransport(comm);
    }
    detail::FallbackTransport* transport = impl->transport.get();
    impl->barrier = detail::BarrierFactory::collective(
        comm, options.lanes, impl->kind, [transport](Stream stream) { transport->barrier(stream); },
        cat("a Fallback-mode publisher's barrier is a collective and has no device handle (", impl->reason, ")"));
  }
  Impl* self = impl.get();  // the barrier lives in *impl: the pointer outlives every call on it
  detail::BarrierFactory::ownedBy(impl->barrier, [self](const char* call) { self->checkOpen(call); });
  comm.barrier();
  return Publisher(std::move(impl));
}

void Publisher::publish(const std::vector<CacheTensor>& tensors, const SlotMapping& slots, size_t numTokens,
                        Stream stream, PublishThen then, int lane) {
  const char* call = "Publisher::publish";
  KVCOMM_CHECK_ARG(impl_, call, "empty publisher");
  detail::RankScope scope(impl_->rank());
  KVCOMM_CHECK_ENUM(slots.type, SlotType::Int32, call, "slots.type");
  KVCOMM_CHECK_ENUM(then, PublishThen::Signal, call, "then");
  Impl::checkSlots(slots, numTokens, call);
  impl_->run(tensors, slots.data, slots.type, numTokens, stream, then, lane, call);
}

Barrier& Publisher::barrier() {
  KVCOMM_CHECK_ARG(impl_, "Publisher::barrier", "empty publisher");
  return impl_->barrier;
}

const Barrier& Publisher::barrier() const {
  KVCOMM_CHECK_ARG(impl_, "Publisher::barrier", "empty publisher");
  return impl_->barrier;
}

PublishMode Publisher::mode() const {
  KVCOMM_CHECK_ARG(impl_, "Publisher::mode", "empty publisher");
  return impl_->mode;
}
const std::string& Publisher::modeReason() const {
  KVCOMM_CHECK_ARG(impl_, "Publisher::modeReason", "empty publisher");
  return impl_->reason;
}
DeviceError Publisher::pollError() {
  KVCOMM_CHECK_ARG(impl_, "Publisher::pollError", "empty publisher");
  detail::RankScope scope(impl_->rank());
  return detail::pollDeviceErrors(impl_->kind, impl_->error, &impl_->barrier);
}

void Publisher::checkErrors() {
  KVCOMM_CHECK_ARG(impl_, "Publisher::checkErrors", "empty publisher");
  DeviceError e = pollError();
  detail::RankScope scope(impl_->rank());
  detail::throwDeviceErrors(e, impl_->buf.communicator(), impl_->bar.timeoutNs / 1000000);
}

}  // namespace kvcomm
