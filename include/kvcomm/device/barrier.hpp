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
  uint64_t timeoutNs;  ///< bound on every wait
  int32_t rank;
  int32_t size;
  int32_t lanes;
  int32_t reserved;
};

static_assert(std::is_trivially_copyable<BarrierDeviceHandle>::value, "passed to kernels by value");

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

KVCOMM_DEVICE_INLINE uint64_t globalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// Announces `epoch` on `lane` to member `peer` (release, system scope). One thread per peer.
KVCOMM_DEVICE_INLINE void barrierSignal(const BarrierDeviceHandle& b, int lane, int peer, uint64_t epoch) {
  storeReleaseSystem(barrierFlag(b.peerSignals[peer], lane, b.rank), epoch);
}

/// Waits until member `peer` announced `epoch` on `lane` (acquire, system scope), at most b.timeoutNs. On expiry
/// records a BarrierTimeout naming rank, peer and lane and returns false.
KVCOMM_DEVICE_INLINE bool barrierWait(const BarrierDeviceHandle& b, int lane, int peer, uint64_t epoch) {
  const uint64_t* flag = barrierFlag(reinterpret_cast<uint64_t>(b.localSignals), lane, peer);
  if (loadAcquireSystem(flag) >= epoch) return true;
  uint64_t start = globalTimerNs();
  while (loadAcquireSystem(flag) < epoch) {
    if (globalTimerNs() - start > b.timeoutNs) {
      recordDeviceError(b.error, DeviceErrorKind::BarrierTimeout, -1, -1, -1, b.rank, peer, lane);
      return false;
    }
  }
  return true;
}

/// Block-scope barrier: the calling block's threads [0, size) each signal and wait for one member; the block's
/// earlier stores (and earlier kernels' in stream order) are released before the signals. Call from every thread
/// of exactly one block per rank and lane; advances the lane's epoch.
KVCOMM_DEVICE_INLINE void barrierBlock(const BarrierDeviceHandle& b, int lane) {
  __syncthreads();
  uint64_t epoch = b.epochs[lane] + 1;
  int t = static_cast<int>(threadIdx.x);
  if (t < b.size && t != b.rank && b.peerSignals[t] != 0) {
    __threadfence_system();
    barrierSignal(b, lane, t, epoch);
    barrierWait(b, lane, t, epoch);
  }
  __syncthreads();
  if (t == 0) b.epochs[lane] = epoch;
}

/// For kernels that write with many blocks and then synchronise: every block calls it once after its last store;
/// the last block to arrive runs barrierBlock() and resets the arrival count (so graph replays start at zero).
/// Returns true in the block that ran the barrier.
KVCOMM_DEVICE_INLINE bool barrierAfterGrid(const BarrierDeviceHandle& b, int lane) {
  __shared__ uint32_t last;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();  // this block's stores before its arrival
    last = atomicAdd(&b.arrivals[lane], 1u) == gridDim.x - 1 ? 1u : 0u;
  }
  __syncthreads();
  if (!last) return false;
  __threadfence();
  barrierBlock(b, lane);
  if (threadIdx.x == 0) b.arrivals[lane] = 0;
  return true;
}

#endif  // KVCOMM_ON_DEVICE_COMPILER

}  // namespace kvcomm
