// kvcomm device API: the system-scope barrier among the members of a buffer's group, by lane.
//
// Memory-ordering contract: barrier() is a release of every memory operation the calling stream performed before it
// (including stores into peers' memory by earlier kernels) and an acquire of every peer's operations before its
// matching barrier(). Each lane is an independent sequence of epochs (one per micro-batch in flight); epochs live in
// device memory, so a barrier captured in a CUDA graph advances them on every replay.
#pragma once

#include <stdint.h>

#include <type_traits>

#include "kvcomm/device/error_record.hpp"
#include "kvcomm/device/group_health.hpp"
#include "kvcomm/device/macros.hpp"
#include "kvcomm/device/symm_device.hpp"

namespace kvcomm {

/// Lanes a barrier handle supports.
inline constexpr int kMaxBarrierLanes = 8;

/// Plain view of a barrier for kernels (pass by value). Signal flags: member m's area holds
/// flags[lane * kMaxHandlePeers + r] = the last epoch member r announced to m on `lane`.
struct BarrierDeviceHandle {
  uint64_t peerSignals[kMaxHandlePeers];  ///< each member's flag area as mapped here (0: not mapped)
  uint64_t* localSignals;                 ///< this rank's flag area
  uint64_t* epochs;                       ///< [kMaxBarrierLanes] this rank's epoch per lane
  uint32_t* arrivals;                     ///< [kMaxBarrierLanes] block arrivals of fused kernels
  DeviceErrorRecord* error;
  /// The group's health area, mapped for this code (nullptr: not watched): health[0] is non-zero once the
  /// communicator was aborted or a member died; health[kHealthDepartedWord + r] once member r left. Waits poll it and
  /// stop, recording a PeerFailed error (naming the peer), instead of running into the timeout.
  const uint32_t* health;
  uint64_t timeoutNs;  ///< bound on every wait
  int32_t rank;
  int32_t size;
  int32_t lanes;
  int32_t reserved;
};

static_assert(std::is_trivially_copyable<BarrierDeviceHandle>::value, "passed to kernels by value");

/// Which threads call a device barrier primitive together (all of them must call it).
enum class BarrierScope {
  Thread,  ///< one thread does everything (other threads of the block do not call it)
  Warp,    ///< all 32 lanes of one warp: the members are split over the lanes
  Block,   ///< every thread of one block: threads [0, size) take a member each
};

/// The memory ordering a signal or wait provides.
enum class BarrierOrder {
  Relaxed,  ///< arrival only: no ordering of the caller's data (e.g. a pure rendezvous, or ordered by other means)
  Ordered,  ///< signal = system-scope release of what the scope wrote before (and earlier kernels of the stream);
            ///< wait = system-scope acquire shared with the scope
};

KVCOMM_HOST_DEVICE_INLINE uint64_t* barrierFlag(uint64_t areaBase, int lane, int fromRank) {
  return reinterpret_cast<uint64_t*>(areaBase) + lane * kMaxHandlePeers + fromRank;
}

#if KVCOMM_ON_DEVICE_COMPILER

/// Store with release semantics at system scope: orders this thread's earlier memory operations (and, through the
/// fence the caller issues, its block's) before the flag becomes visible to other GPUs and the CPU.
KVCOMM_DEVICE_INLINE void storeReleaseSystem(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

/// Load with acquire semantics at system scope.
KVCOMM_DEVICE_INLINE uint64_t loadAcquireSystem(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

/// Relaxed load at system scope (polling: no ordering, but never served from a stale cached copy).
KVCOMM_DEVICE_INLINE uint64_t loadRelaxedSystem(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

/// 32-bit relaxed load at system scope (the host-written health flag).
KVCOMM_DEVICE_INLINE uint32_t loadRelaxedSystem32(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

/// Whether the group failed (abort, or a member's death), as the host announced it in b.health.
KVCOMM_DEVICE_INLINE bool barrierGroupFailed(const BarrierDeviceHandle& b) {
  return b.health != nullptr && loadRelaxedSystem32(b.health) != 0;
}

/// Whether member `peer` left the group (destroyed its communicator or exited), as the host announced it.
KVCOMM_DEVICE_INLINE bool barrierPeerLeft(const BarrierDeviceHandle& b, int peer) {
  return b.health != nullptr && loadRelaxedSystem32(b.health + kHealthDepartedWord + peer) != 0;
}

/// Atomic add with acquire-release semantics at GPU scope; returns the old value.
KVCOMM_DEVICE_INLINE uint32_t addAcqRelGpu(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

KVCOMM_DEVICE_INLINE uint64_t globalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// Announces `epoch` on `lane` to member `peer` (release, system scope). One thread per peer.
KVCOMM_DEVICE_INLINE void barrierSignal(const BarrierDeviceHandle& b, int lane, int peer, uint64_t epoch) {
  storeReleaseSystem(barrierFlag(b.peerSignals[peer], lane, b.rank), epoch);
}

namespace detail {
/// barrierWait's loop, with acquire (Ordered) or relaxed (arrival only) polls: one bound and one health check for both.
template <bool Acquire>
KVCOMM_DEVICE_INLINE bool barrierPoll(const BarrierDeviceHandle& b, int lane, int peer, uint64_t epoch) {
  const uint64_t* flag = barrierFlag(reinterpret_cast<uint64_t>(b.localSignals), lane, peer);
  auto load = [flag] { return Acquire ? loadAcquireSystem(flag) : loadRelaxedSystem(flag); };
  if (load() >= epoch) return true;
  uint64_t start = globalTimerNs();
  for (uint32_t spin = 1; load() < epoch; ++spin) {
    // A member that left may have announced the epoch just before it went: one more load decides.
    if ((spin & 63) == 0 && (barrierGroupFailed(b) || (barrierPeerLeft(b, peer) && load() < epoch))) {
      recordDeviceError(b.error, DeviceErrorKind::PeerFailed, -1, -1, -1, b.rank, peer, lane);
      return false;
    }
    if (globalTimerNs() - start > b.timeoutNs) {
      recordDeviceError(b.error, DeviceErrorKind::BarrierTimeout, -1, -1, -1, b.rank, peer, lane);
      return false;
    }
  }
  return true;
}
}  // namespace detail

/// Waits until member `peer` announced `epoch` on `lane` (acquire, system scope), at most b.timeoutNs. On expiry
/// records a BarrierTimeout naming rank, peer and lane and returns false; when the host marks the group failed
/// (b.health: abort, a member's death, or `peer` left without announcing the epoch) records a PeerFailed and returns
/// false. Polls with acquire loads, so the
/// load that sees the epoch is the acquire (no second load after it); the health flag, in host memory, every 64 polls.
/// Like barrierSignal, it takes a lane the caller checked (see barrierLaneValid).
KVCOMM_DEVICE_INLINE bool barrierWait(const BarrierDeviceHandle& b, int lane, int peer, uint64_t epoch) {
  return detail::barrierPoll<true>(b, lane, peer, epoch);
}

/// Whether `lane` is one of the barrier's lanes ([0, b.lanes)); records a LaneOutOfRange (rank, lane) when not. The
/// scope and split functions (barrierSignalScope, barrierWaitScope, barrierSyncScope, barrierSignalBlock,
/// barrierWaitBlock, the two-argument barrierBlock) check it and do nothing else on a bad lane. The fused-kernel
/// primitives (barrierSignal, barrierWait, barrierNextEpoch, the three-argument barrierBlock, barrierLastBlock,
/// barrierAfterGrid, barrierSignalAfterGrid) stay unchecked on their hot path: give them a lane checked once (by this
/// function at the kernel's start, or by the host call that launches the kernel).
KVCOMM_DEVICE_INLINE bool barrierLaneValid(const BarrierDeviceHandle& b, int lane) {
  if (lane >= 0 && lane < b.lanes) return true;
  recordDeviceError(b.error, DeviceErrorKind::LaneOutOfRange, -1, -1, -1, b.rank, -1, lane);
  return false;
}

/// Block-scope barrier: the calling block's threads [0, size) each signal `epoch` (barrierNextEpoch()) and wait for
/// one member each. The signal is a
/// system-scope release, cumulative over everything the block (through __syncthreads) and earlier kernels of the
/// stream wrote; the wait is a system-scope acquire shared with the block by the closing __syncthreads. Call from
/// every thread of exactly one block per rank and lane; advances the lane's epoch.
KVCOMM_DEVICE_INLINE void barrierBlock(const BarrierDeviceHandle& b, int lane, uint64_t epoch) {
  __syncthreads();
  int t = static_cast<int>(threadIdx.x);
  if (t < b.size && t != b.rank && b.peerSignals[t] != 0) {
    barrierSignal(b, lane, t, epoch);
    barrierWait(b, lane, t, epoch);
  }
  __syncthreads();
  if (t == 0) b.epochs[lane] = epoch;
}

/// The epoch barrierBlock() will announce next on `lane`. Kernels that barrier at their end read it at their start,
/// so the load overlaps their other work instead of delaying the signal.
KVCOMM_DEVICE_INLINE uint64_t barrierNextEpoch(const BarrierDeviceHandle& b, int lane) {
  return b.epochs[lane] + 1;
}

KVCOMM_DEVICE_INLINE void barrierBlock(const BarrierDeviceHandle& b, int lane) {
  if (!barrierLaneValid(b, lane)) return;
  barrierBlock(b, lane, barrierNextEpoch(b, lane));
}

/// Block scope, the first half of a split barrier: threads [0, size) announce the lane's next epoch to one member
/// each (system-scope release, cumulative over the block's writes through the opening __syncthreads and over earlier
/// kernels of the stream), then the lane's epoch advances. Call from every thread of exactly one block per rank and
/// lane; pair it with barrierWaitBlock() before reading what peers wrote.
KVCOMM_DEVICE_INLINE void barrierSignalBlock(const BarrierDeviceHandle& b, int lane) {
  if (!barrierLaneValid(b, lane)) return;
  __syncthreads();
  const uint64_t epoch = barrierNextEpoch(b, lane);
  int t = static_cast<int>(threadIdx.x);
  if (t < b.size && t != b.rank && b.peerSignals[t] != 0) barrierSignal(b, lane, t, epoch);
  __syncthreads();  // every thread read the old epoch before it changes
  if (t == 0) b.epochs[lane] = epoch;
}

/// Block scope, the second half: waits until every member announced this rank's current epoch on `lane` (the one
/// its last barrierSignalBlock() announced), with system-scope acquire shared with the block by the closing
/// __syncthreads. Bounded by b.timeoutNs (records a BarrierTimeout).
KVCOMM_DEVICE_INLINE void barrierWaitBlock(const BarrierDeviceHandle& b, int lane) {
  if (!barrierLaneValid(b, lane)) return;
  const uint64_t epoch = b.epochs[lane];
  int t = static_cast<int>(threadIdx.x);
  if (t < b.size && t != b.rank && b.peerSignals[t] != 0) barrierWait(b, lane, t, epoch);
  __syncthreads();
}

namespace detail {
template <BarrierScope S>
KVCOMM_DEVICE_INLINE void barrierScopeSync() {
  if constexpr (S == BarrierScope::Warp) __syncwarp();
  if constexpr (S == BarrierScope::Block) __syncthreads();
}
template <BarrierScope S>
KVCOMM_DEVICE_INLINE int barrierScopeRank() {
  if constexpr (S == BarrierScope::Thread) return 0;
  if constexpr (S == BarrierScope::Warp) return static_cast<int>(threadIdx.x & 31);
  return static_cast<int>(threadIdx.x);
}
template <BarrierScope S>
KVCOMM_DEVICE_INLINE int barrierScopeSize() {
  if constexpr (S == BarrierScope::Thread) return 1;
  if constexpr (S == BarrierScope::Warp) return 32;
  return static_cast<int>(blockDim.x);
}
}  // namespace detail

/// The first half of a split barrier, at any cooperation scope and memory order: announces the lane's next epoch to
/// every mapped member (the scope's threads share the members), then advances the lane's epoch. Ordered: a
/// system-scope release per member, cumulative over what the scope's threads wrote before the call (through the
/// scope's own sync) and over earlier kernels of the stream; Relaxed: a relaxed system-scope store (arrival only).
/// One scope per rank and lane calls it; pair with barrierWaitScope() (or the host's Barrier::wait()). A lane outside
/// [0, b.lanes) is recorded (LaneOutOfRange) and nothing is signalled.
template <BarrierScope S>
KVCOMM_DEVICE_INLINE void barrierSignalScope(const BarrierDeviceHandle& b, int lane,
                                             BarrierOrder order = BarrierOrder::Ordered) {
  if (!barrierLaneValid(b, lane)) return;
  detail::barrierScopeSync<S>();
  const uint64_t epoch = barrierNextEpoch(b, lane);
  for (int peer = detail::barrierScopeRank<S>(); peer < b.size; peer += detail::barrierScopeSize<S>()) {
    if (peer == b.rank || b.peerSignals[peer] == 0) continue;
    uint64_t* flag = barrierFlag(b.peerSignals[peer], lane, b.rank);
    if (order == BarrierOrder::Ordered) {
      storeReleaseSystem(flag, epoch);
    } else {
      asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(flag), "l"(epoch) : "memory");
    }
  }
  detail::barrierScopeSync<S>();  // every thread read the old epoch before it changes
  if (detail::barrierScopeRank<S>() == 0) b.epochs[lane] = epoch;
}

/// The second half: waits until every member announced this rank's current epoch on `lane`. Ordered: system-scope
/// acquire, shared with the scope by its closing sync; Relaxed: arrival only. Either order is bounded and stops when
/// the group fails (records BarrierTimeout or PeerFailed, like barrierWait). Returns false in a thread whose wait
/// failed, and in every thread for a lane outside [0, b.lanes) (recorded: LaneOutOfRange).
template <BarrierScope S>
KVCOMM_DEVICE_INLINE bool barrierWaitScope(const BarrierDeviceHandle& b, int lane,
                                           BarrierOrder order = BarrierOrder::Ordered) {
  if (!barrierLaneValid(b, lane)) return false;
  const uint64_t epoch = b.epochs[lane];
  bool ok = true;
  for (int peer = detail::barrierScopeRank<S>(); peer < b.size; peer += detail::barrierScopeSize<S>()) {
    if (peer == b.rank || b.peerSignals[peer] == 0) continue;
    const bool arrived = order == BarrierOrder::Ordered ? detail::barrierPoll<true>(b, lane, peer, epoch)
                                                        : detail::barrierPoll<false>(b, lane, peer, epoch);
    ok = arrived && ok;
  }
  detail::barrierScopeSync<S>();
  return ok;
}

/// signal + wait at one scope and order.
template <BarrierScope S>
KVCOMM_DEVICE_INLINE bool barrierSyncScope(const BarrierDeviceHandle& b, int lane,
                                           BarrierOrder order = BarrierOrder::Ordered) {
  barrierSignalScope<S>(b, lane, order);
  return barrierWaitScope<S>(b, lane, order);
}

/// True in exactly one block of the grid: the last to arrive on `lane` after its stores (call from every thread of
/// every block, once). Arrivals synchronise at GPU scope (release by each block, acquire by the last), so a
/// system-scope release by the last block then covers every block's stores, by cumulativity. The last block resets
/// the arrival count (graph replays start at zero).
KVCOMM_DEVICE_INLINE bool barrierLastBlock(const BarrierDeviceHandle& b, int lane) {
  if (gridDim.x == 1) return true;
  __shared__ uint32_t last;
  __syncthreads();
  if (threadIdx.x == 0) last = addAcqRelGpu(&b.arrivals[lane], 1u) == gridDim.x - 1 ? 1u : 0u;
  __syncthreads();
  if (!last) return false;
  if (threadIdx.x == 0) b.arrivals[lane] = 0;  // the next launch starts from zero (this kernel is the last user)
  return true;
}

/// For kernels that write with many blocks and then synchronise: every block calls it once after its last store,
/// with barrierNextEpoch() read at the kernel's start; the last block to arrive (barrierLastBlock()) runs
/// barrierBlock(). Returns true in the block that ran the barrier.
KVCOMM_DEVICE_INLINE bool barrierAfterGrid(const BarrierDeviceHandle& b, int lane, uint64_t epoch) {
  if (!barrierLastBlock(b, lane)) return false;
  barrierBlock(b, lane, epoch);
  return true;
}

/// The first half of barrierAfterGrid(): the last block to arrive announces `epoch` (barrierNextEpoch(), read at the
/// kernel's start) to every member with a system-scope release covering every block's stores, and advances the
/// lane's epoch; nobody waits. Pair it with barrierWaitBlock() (or the host's Barrier::wait()) before the reads.
KVCOMM_DEVICE_INLINE bool barrierSignalAfterGrid(const BarrierDeviceHandle& b, int lane, uint64_t epoch) {
  if (!barrierLastBlock(b, lane)) return false;
  __syncthreads();
  int t = static_cast<int>(threadIdx.x);
  if (t < b.size && t != b.rank && b.peerSignals[t] != 0) barrierSignal(b, lane, t, epoch);
  __syncthreads();
  if (t == 0) b.epochs[lane] = epoch;
  return true;
}

#endif  // KVCOMM_ON_DEVICE_COMPILER

}  // namespace kvcomm
