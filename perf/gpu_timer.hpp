// CUDA-graph timing for benchmarks: capture K operations into one graph, replay it, time each replay with events.
#pragma once

#include <functional>

#include "bench/bench.hpp"
#include "kvcomm/device/barrier.hpp"

struct CUstream_st;

namespace kvbench {

/// Microseconds per operation over `reps` timed batches (median, p10, p90): `op` enqueues one operation on the
/// stream; `perGraph` of them are captured into one graph, replayed `warmup` times untimed, then in `reps` timed
/// batches of 10 back-to-back replays (events around each batch, time divided by 10 * perGraph).
Stats graphTimeUs(const std::function<void(CUstream_st*)>& op, int perGraph, int reps, int warmup, CUstream_st* stream);

/// An empty kernel (the launch floor).
void launchEmpty(CUstream_st* stream);

/// One block that spins for `ns` nanoseconds of %globaltimer: "unrelated work" of a known length on the stream.
void launchSpin(unsigned long long ns, CUstream_st* stream);

/// A plain SM copy kernel (16-byte vectors, 4 in flight per thread, every SM): `bytes` (a multiple of 16) from `src`
/// to `dst`; into a peer's memory it shows what SM stores over NVLink reach with no scatter at all.
void launchSmCopy(void* dst, const void* src, size_t bytes, CUstream_st* stream);

/// Barrier probes that take the barrier apart (they share the Publisher's flags; give each its own lane):
/// 0 = kvcomm's barrierBlock; 1 = relaxed signal and relaxed wait (no ordering: the bare NVLink round trip, not a
/// correct barrier); 2 = __threadfence_system() then a relaxed signal (fence instead of a release store).
void launchBarrierProbe(const kvcomm::BarrierDeviceHandle& b, int lane, int variant, CUstream_st* stream);

/// The floor of a one-row publish with the fused barrier (PublishThen::Barrier): one block loads *slot (device memory),
/// stores `bytes` (a multiple of 16) from `src` at byte *slot * bytes of `peerDst` with no checks, then runs
/// barrierBlock on `lane` (its own lane: it shares the Publisher's flags). `dependent`: launched with programmatic
/// dependent launch, as kvcomm's kernels.
void launchStoreThenBarrier(const kvcomm::BarrierDeviceHandle& b, int lane, void* peerDst, const void* src,
                            const int64_t* slot, size_t bytes, bool dependent, CUstream_st* stream);

/// Steps from that floor towards kvcomm's one-block publish with the fused barrier (launched dependent; pass `lane` as
/// above): 0 = the floor with 64 threads (as launchStoreThenBarrier), 1 = 256 threads, 2 = also into `localDst` (the
/// own replica), 3 = destination computed the overflow-checked way (slotDestinationChecked; kvcomm's kernels take that
/// path only for slots outside a tensor's safe range); every step carries a 1 KB argument like kvcomm's launches.
void launchLadderProbe(const kvcomm::BarrierDeviceHandle& b, int lane, void* peerDst, void* localDst, const void* src,
                       const int64_t* slot, size_t bytes, int step, CUstream_st* stream);

/// The floor of the scatter: row r of `src` (rowBytes, a multiple of 16) to slot slots[r] (< 0: skipped) of
/// `peerDst`, 16-byte columns over the whole grid, no bounds checks.
void launchScatterProbe(void* peerDst, const void* src, const int64_t* slots, int64_t rows, size_t rowBytes,
                        CUstream_st* stream);

CUstream_st* makeStream();
void syncDevice();

}  // namespace kvbench
