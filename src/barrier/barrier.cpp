// Barrier: a small symmetric signal area per member (flags written by peers, then this rank's epochs, block
// arrivals of fused kernels and the device error record), and the launches of kernels/barrier.cu or their CPU twin.
#include "kvcomm/barrier.hpp"

#include "barrier/barrier_factory.hpp"
#include "barrier/device_errors_of.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "comm/agreement.hpp"
#include "comm/health.hpp"
#include "common/check.hpp"
#include "common/env.hpp"
#include "common/log.hpp"
#include "device/device_errors.hpp"
#include "device/device_memory.hpp"
#include "kernels/launch.hpp"

namespace kvcomm {

using detail::cat;

namespace {

constexpr size_t kFlagsBytes = sizeof(uint64_t) * kMaxBarrierLanes * kMaxHandlePeers;
constexpr size_t kEpochsAt = kFlagsBytes;
constexpr size_t kArrivalsAt = kEpochsAt + sizeof(uint64_t) * kMaxBarrierLanes;
constexpr size_t kErrorAt = kArrivalsAt + sizeof(uint32_t) * kMaxBarrierLanes + 32;
constexpr size_t kSignalBytes = kErrorAt + sizeof(DeviceErrorRecord);

}  // namespace

struct Barrier::Impl {
  Communicator comm;
  SymmetricBuffer signals;  // empty for a collective barrier
  MemoryKind kind = MemoryKind::Host;
  int lanes = 2;
  BarrierDeviceHandle handle{};
  // A collective barrier (a fallback publisher's): sync() and signal() run it, wait() has nothing left to wait for.
  std::function<void(Stream)> collective;
  std::string noHandleWhy;                 // why a collective barrier has no device handle
  std::function<void(const char*)> owner;  // the owner's check before every call (a publisher: its buffer is open)

  void launch(Stream stream, int lane, detail::BarrierStep step, const char* call) {
    detail::RankScope scope(comm.rank());
    if (owner) owner(call);
    KVCOMM_CHECK_ARG(lane >= 0 && lane < lanes, call, "lane ", lane, " outside [0, ", lanes, ")");
    detail::checkHealthy(comm, call);  // aborted, or a member known dead: no wait could end
    if (collective) {
      if (step != detail::BarrierStep::Wait) collective(stream);
      return;
    }
    if (kind == MemoryKind::Cuda) {
      detail::launchBarrier(handle, lane, step, stream);
      return;
    }
    try {
      detail::hostBarrier(handle, lane, step);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::Aborted) detail::checkHealthy(comm, call);  // says why: abort, or which rank died
      if (e.code() == ErrorCode::NetworkError)  // a peer left: name the first member gone, as every member does
        detail::healthOf(comm).checkNoneGone(call,
                                             cat("the barrier on rank ", comm.rank(), " cannot complete without it"));
      throw;
    }
  }
};

Barrier::Barrier() = default;
Barrier::Barrier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Barrier::~Barrier() = default;
Barrier::Barrier(Barrier&&) noexcept = default;
Barrier& Barrier::operator=(Barrier&&) noexcept = default;

Barrier Barrier::create(Communicator comm, const BarrierOptions& options) {
  const char* call = "Barrier::create";
  KVCOMM_CHECK_ARG(comm.valid(), call, "the communicator is empty");
  detail::RankScope scope(comm.rank());
  KVCOMM_CHECK_ARG(comm.size() <= kMaxHandlePeers, call, "a group of ", comm.size(), " members exceeds the ",
                   kMaxHandlePeers, " a device barrier supports");
  // Options are checked by a vote, so a bad value on one member fails every member at once (naming it) instead of
  // leaving the others in the allocation's exchange until the bootstrap timeout.
  detail::allSucceed(comm, call, [&] {
    KVCOMM_CHECK_ARG(options.lanes >= 1 && options.lanes <= kMaxBarrierLanes, call, "lanes ", options.lanes,
                     " outside [1, ", kMaxBarrierLanes, "]");
    KVCOMM_CHECK_ENUM(options.kind, MemoryKind::Host, call, "options.kind");
  });
  // Lanes must agree: a lane that exists on one member only would never be answered there.
  detail::agreeOn<int32_t>(comm, options.lanes, call, "lanes");
  auto impl = std::make_unique<Impl>();
  impl->comm = comm;
  impl->lanes = options.lanes;
  impl->signals = SymmetricBuffer::create(comm, kSignalBytes, kSignalBytes, options.kind);
  SymmetricBuffer& sig = impl->signals;
  impl->kind = sig.kind();
  detail::Outcome reach;
  for (int r = 0; r < comm.size() && reach.ok(); ++r)
    if (!sig.isMapped(r))
      reach = detail::Outcome::failure(
          cat("member ", r, " is not mapped here (another host, or no P2P access between the GPUs)"),
          ErrorCode::Unsupported);
  detail::vote(comm, call, reach);
  char* local = static_cast<char*>(sig.local());
  detail::allSucceed(comm, "Barrier::create (zero the signal area)", [&] {
    if (sig.kind() == MemoryKind::Cuda)
      detail::deviceMemset(local, 0, kSignalBytes);
    else
      std::memset(local, 0, kSignalBytes);
  });
  BarrierDeviceHandle& b = impl->handle;
  for (int r = 0; r < comm.size(); ++r) b.peerSignals[r] = reinterpret_cast<uint64_t>(sig.peer(r));
  b.localSignals = reinterpret_cast<uint64_t*>(local);
  b.epochs = reinterpret_cast<uint64_t*>(local + kEpochsAt);
  b.arrivals = reinterpret_cast<uint32_t*>(local + kArrivalsAt);
  b.error = reinterpret_cast<DeviceErrorRecord*>(local + kErrorAt);
  // Waits stop when the group fails (abort, a member's death): kernels poll the health flag mapped for the device.
  detail::GroupHealth& health = detail::healthOf(comm);
  if (sig.kind() == MemoryKind::Cuda) {
    try {
      b.health = reinterpret_cast<const uint32_t*>(health.deviceFlag());
    } catch (const Error& e) {
      KVCOMM_WARN("Barrier::create: device waits will not watch the group's health (they end at their timeout): ",
                  e.what());
    }
  } else {
    b.health = health.flag();
  }
  int64_t ms = options.timeoutMs >= 0 ? options.timeoutMs : env::barrierTimeoutMs();
  // Every wait stays bounded, whatever the knob says; above a day is a day (nanoseconds of INT64_MAX ms would wrap).
  ms = std::clamp<int64_t>(ms, 1, env::kMaxBarrierTimeoutMs);
  b.timeoutNs = static_cast<uint64_t>(ms) * 1000000ull;
  b.rank = comm.rank();
  b.size = comm.size();
  b.lanes = options.lanes;
  comm.barrier();  // every area is zeroed before anyone signals into it
  return Barrier(std::move(impl));
}

void Barrier::sync(Stream stream, int lane) {
  KVCOMM_CHECK_ARG(impl_, "Barrier::sync", "empty barrier");
  impl_->launch(stream, lane, detail::BarrierStep::Both, "Barrier::sync");
}
void Barrier::signal(Stream stream, int lane) {
  KVCOMM_CHECK_ARG(impl_, "Barrier::signal", "empty barrier");
  impl_->launch(stream, lane, detail::BarrierStep::Signal, "Barrier::signal");
}
void Barrier::wait(Stream stream, int lane) {
  KVCOMM_CHECK_ARG(impl_, "Barrier::wait", "empty barrier");
  impl_->launch(stream, lane, detail::BarrierStep::Wait, "Barrier::wait");
}

int Barrier::lanes() const {
  KVCOMM_CHECK_ARG(impl_, "Barrier::lanes", "empty barrier");
  return impl_->lanes;
}
MemoryKind Barrier::kind() const {
  KVCOMM_CHECK_ARG(impl_, "Barrier::kind", "empty barrier");
  return impl_->kind;
}
Communicator& Barrier::communicator() const {
  KVCOMM_CHECK_ARG(impl_, "Barrier::communicator", "empty barrier");
  return impl_->comm;
}
BarrierDeviceHandle Barrier::deviceHandle() const {
  KVCOMM_CHECK_ARG(impl_, "Barrier::deviceHandle", "empty barrier");
  KVCOMM_CHECK_ARG(!impl_->collective, "Barrier::deviceHandle", impl_->noHandleWhy);
  return impl_->handle;
}

DeviceError Barrier::pollError() {
  KVCOMM_CHECK_ARG(impl_, "Barrier::pollError", "empty barrier");
  detail::RankScope scope(impl_->comm.rank());
  // A collective records nothing on the device: its failures throw at the call.
  return detail::pollDeviceErrors(impl_->kind, impl_->collective ? nullptr : impl_->handle.error, nullptr);
}

void Barrier::checkErrors() {
  KVCOMM_CHECK_ARG(impl_, "Barrier::checkErrors", "empty barrier");
  DeviceError e = pollError();
  detail::RankScope scope(impl_->comm.rank());
  detail::throwDeviceErrors(e, impl_->comm, impl_->handle.timeoutNs / 1000000);
}

namespace detail {

Barrier BarrierFactory::collective(Communicator comm, int lanes, MemoryKind kind, std::function<void(Stream)> run,
                                   std::string noHandleWhy) {
  auto impl = std::make_unique<Barrier::Impl>();
  impl->comm = std::move(comm);
  impl->lanes = lanes;
  impl->kind = kind;
  impl->collective = std::move(run);
  impl->noHandleWhy = std::move(noHandleWhy);
  return Barrier(std::move(impl));
}

void BarrierFactory::ownedBy(Barrier& barrier, std::function<void(const char*)> check) {
  KVCOMM_CHECK_ARG(barrier.impl_, "BarrierFactory::ownedBy", "empty barrier");
  barrier.impl_->owner = std::move(check);
}

DeviceError pollDeviceErrors(MemoryKind kind, DeviceErrorRecord* record, Barrier* barrier) {
  DeviceError e = record ? readDeviceError(kind, record) : DeviceError{};
  if (!e && barrier && barrier->valid()) e = barrier->pollError();
  return e;
}

void throwDeviceErrors(const DeviceError& e, Communicator& comm, uint64_t timeoutMs) {
  if (e.kind == DeviceErrorKind::PeerFailed) explainPeerFailed(comm, e.peer, "barrier (device)");
  throwDeviceError(e, timeoutMs);
}

}  // namespace detail

}  // namespace kvcomm
