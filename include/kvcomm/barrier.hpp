// kvcomm: the system-scope barrier of a group, as its own object: sync(), and the split signal()/wait() pair that
// lets an engine signal right after its stores and wait only before the reads, so the round trip overlaps other work.
#pragma once

#include <cstdint>
#include <memory>

#include "kvcomm/api.hpp"
#include "kvcomm/comm.hpp"
#include "kvcomm/device/barrier.hpp"
#include "kvcomm/device_error.hpp"
#include "kvcomm/stream.hpp"
#include "kvcomm/symm.hpp"

namespace kvcomm {

namespace detail {
struct BarrierFactory;  // the library's other barrier shapes (a fallback publisher's collective one)
}  // namespace detail

/// Options of Barrier::create.
struct BarrierOptions {
  /// Independent lanes (one per micro-batch in flight); 1 to kMaxBarrierLanes, the same on every member.
  int lanes = 2;
  /// Bound on every wait; < 0: KVCOMM_BARRIER_TIMEOUT_MS. 0 is taken as 1 ms and anything above a day (86,400,000,
  /// INT64_MAX included) as a day: every wait stays bounded.
  int64_t timeoutMs = -1;
  /// Where the signal area lives: Cuda (device memory, kernels signal and wait) or Host (CPU atomics); Auto picks
  /// Cuda when this rank has a current CUDA context. Must resolve the same on every member.
  MemoryKind kind = MemoryKind::Auto;
};

/// A release/acquire barrier among the members of a communicator, through a small symmetric signal area that every
/// member maps (so every member must be on one host, with P2P access between GPUs; otherwise create() throws
/// Unsupported naming the member).
///
/// Ordering: signal(lane) is a system-scope release of everything the stream did before it (stores into peers'
/// memory included); wait(lane) returns (in stream order) once every member signalled the same epoch on that lane,
/// with acquire semantics. sync(lane) = signal + wait in one kernel. Each lane is its own sequence of epochs:
/// signal() advances it, wait() waits for the epoch of this rank's last signal() on that lane, so per lane the calls
/// alternate signal, wait, signal, wait (sync() counts as both). Epochs live in the signal area, so every call is
/// safe to capture in a CUDA graph and to replay. Waits are bounded: on expiry the device records a BarrierTimeout
/// (rank, peer, lane) that checkErrors() throws, and the barrier's epochs are then out of step (create a new one).
///
/// Call order: create() (collective) -> signal/wait/sync on every member in the same per-lane order ->
/// checkErrors() after synchronising the stream. Host-memory barriers run on the calling thread (stream ignored)
/// and throw a Timeout directly.
///
/// Failures: waits poll the communicator's health (kvcomm/comm.hpp), so when it is aborted or a member dies they stop
/// at once instead of running into the timeout: host waits throw (ErrorCode::Aborted after abort(), NetworkError
/// naming the dead rank), device waits record a PeerFailed error that checkErrors() throws the same way. Calls made
/// after the failure throw at once. The epochs are then out of step: the barrier is not usable again.
///
/// A Publisher's barrier (Publisher::barrier()) is a Barrier too, borrowed from the publisher; in the publisher's
/// Fallback mode it synchronises by a collective instead of a signal area (see Publisher::barrier()).
///
/// Threads: one thread at a time per lane; different lanes may be driven from different threads. deviceHandle(),
/// lanes() and kind() are safe from any thread.
class KVCOMM_API Barrier {
 public:
  /// Collective over `comm`: allocates and zeroes the signal area on every member.
  static Barrier create(Communicator comm, const BarrierOptions& options = {});

  Barrier();
  ~Barrier();
  Barrier(Barrier&&) noexcept;
  Barrier& operator=(Barrier&&) noexcept;

  bool valid() const { return impl_ != nullptr; }

  /// signal() and wait() in one launch.
  void sync(Stream stream = nullptr, int lane = 0);
  /// Announces the next epoch on `lane` to every member (release of this stream's earlier work).
  void signal(Stream stream = nullptr, int lane = 0);
  /// Waits until every member announced this rank's current epoch on `lane` (acquire).
  void wait(Stream stream = nullptr, int lane = 0);

  int lanes() const;
  MemoryKind kind() const;
  Communicator& communicator() const;
  /// For kernels that fuse the barrier (kvcomm/device/barrier.hpp). Valid as long as this object lives.
  BarrierDeviceHandle deviceHandle() const;

  /// Reads (and clears) the first device error since the last call. Synchronise the stream first.
  DeviceError pollError();
  /// Throws the recorded device error, if any: a BarrierTimeout as a Timeout naming rank, peer and lane; a
  /// PeerFailed as the communicator's own error (Aborted, or a NetworkError naming the rank that is gone).
  void checkErrors();

  struct Impl;

 private:
  friend struct detail::BarrierFactory;
  explicit Barrier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvcomm
