// CPU implementations of publish, barrier and pack over host memory: the host backend's data path, with the same
// semantics as the kernels (padding skipped, rows beyond the backed range refused, bounded barrier waits).
#include <sched.h>

#include <chrono>
#include <cstring>

#include "common/bulk_copy.hpp"
#include "common/check.hpp"
#include "kernels/launch.hpp"
#include "kvcomm/device/publish.hpp"

namespace kvcomm::detail {

namespace {

int64_t slotAt(const PublishLaunch& p, int source, int64_t i) {
  const char* base = static_cast<const char*>(p.slots) + static_cast<uint64_t>(source) * p.sourceStride;
  int64_t s;
  if (p.slot64) {
    std::memcpy(&s, base + i * 8, 8);
  } else {
    int32_t v;
    std::memcpy(&v, base + i * 4, 4);
    s = v;
  }
  return s;
}

}  // namespace

void hostPublish(const PublishLaunch& p) {
  // Validate every row first: a bad slot changes nothing.
  const uint64_t prefix = p.backedPrefix ? *p.backedPrefix : 0;
  for (int s = 0; s < p.numSources; ++s)
    for (int64_t i = 0; i < p.numTokens; ++i) {
      int64_t slot = slotAt(p, s, i);
      if (slot < 0) continue;
      for (int k = 0; k < p.numTensors; ++k) {
        uint64_t dst;
        if (!rowDestination(p, p.t[k], slot, &dst, prefix))
          KVCOMM_THROW(InvalidArgument, "publish", "token ", static_cast<int64_t>(s) * p.numTokens + i, ": slot ", slot,
                       " of tensor ", k,
                       " lands outside the tensor's region (offset + limitBytes) or the backed part of the buffer; "
                       "nothing was written");
      }
    }
  for (int s = 0; s < p.numSources; ++s)
    for (int64_t i = 0; i < p.numTokens; ++i) {
      int64_t slot = slotAt(p, s, i);
      if (slot < 0) continue;
      for (int k = 0; k < p.numTensors; ++k) {
        const PublishTensorDesc& t = p.t[k];
        uint64_t dst = 0;
        rowDestination(p, t, slot, &dst, prefix);  // true: every row was checked above
        const char* src = t.src + static_cast<uint64_t>(s) * t.sourceStride + static_cast<uint64_t>(i) * t.srcStride;
        for (int r = 0; r < p.replicas.size; ++r)
          if (p.replicas.isMapped(r)) std::memcpy(p.replicas.peer(r) + dst, src, t.rowBytes);
      }
    }
}

void hostBarrier(const BarrierDeviceHandle& b, int lane, BarrierStep step) {
  if (step != BarrierStep::Wait) {
    uint64_t next = b.epochs[lane] + 1;
    for (int peer = 0; peer < b.size; ++peer)
      if (peer != b.rank && b.peerSignals[peer])
        __atomic_store_n(barrierFlag(b.peerSignals[peer], lane, b.rank), next, __ATOMIC_RELEASE);
    b.epochs[lane] = next;
  }
  if (step == BarrierStep::Signal) return;
  const uint64_t epoch = b.epochs[lane];
  auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(b.timeoutNs);
  for (int peer = 0; peer < b.size; ++peer) {
    if (peer == b.rank || !b.peerSignals[peer]) continue;
    const uint64_t* flag = barrierFlag(reinterpret_cast<uint64_t>(b.localSignals), lane, peer);
    for (uint32_t spin = 0; __atomic_load_n(flag, __ATOMIC_ACQUIRE) < epoch; ++spin) {
      if ((spin & 255) == 255) {
        if (b.health && __atomic_load_n(b.health, __ATOMIC_ACQUIRE) != 0)
          KVCOMM_THROW(Aborted, "barrier", "rank ", b.rank, " stopped waiting for peer ", peer, " on lane ", lane,
                       ": the communicator was aborted or a member died");
        // A peer that left may have announced the epoch just before it went: the loop's next load decides.
        if (b.health && __atomic_load_n(b.health + kHealthDepartedWord + peer, __ATOMIC_ACQUIRE) != 0 &&
            __atomic_load_n(flag, __ATOMIC_ACQUIRE) < epoch)
          KVCOMM_THROW(NetworkError, "barrier", "rank ", b.rank, " stopped waiting for peer ", peer, " on lane ", lane,
                       ": peer ", peer, " left the group before it arrived");
        if (std::chrono::steady_clock::now() > deadline)
          KVCOMM_THROW(Timeout, "barrier", "rank ", b.rank, " waited for peer ", peer, " on lane ", lane,
                       " longer than ", b.timeoutNs / 1000000, " ms (the peer never arrived)");
        sched_yield();  // ranks may share cores
      }
    }
  }
}

void hostPack(const PackLaunch& p) {
  auto* slotsOut = reinterpret_cast<int64_t*>(p.out);
  for (int64_t i = 0; i < p.numTokens; ++i)
    slotsOut[i] = p.slot64 ? static_cast<const int64_t*>(p.slots)[i] : static_cast<const int32_t*>(p.slots)[i];
  for (int k = 0; k < p.numTensors; ++k)
    for (int64_t i = 0; i < p.numTokens; ++i)
      std::memcpy(p.out + p.partOffset[k] + static_cast<uint64_t>(i) * p.rowBytes[k],
                  p.src[k] + static_cast<uint64_t>(i) * p.srcStride[k], p.rowBytes[k]);
}

void hostFetch(const FetchLaunch& f) {
  auto pair = [&](int64_t p, int64_t* s, int64_t* d, int* r) {
    if (f.inlineCount > 0) {
      *s = f.inlineSrc[p], *d = f.inlineDst[p], *r = f.inlineRank[p];
    } else {
      *s = f.srcBlocks[p], *d = f.dstBlocks[p], *r = f.srcRanks ? f.srcRanks[p] : f.srcRank;
    }
  };
  const int regions = f.h.numRegions;
  // Validate every pair first: a bad one changes nothing.
  for (int64_t p = 0; p < f.numPairs; ++p) {
    int64_t s, d;
    int r;
    pair(p, &s, &d, &r);
    if (s == -1 || d == -1) continue;
    if (r < 0 || r >= f.h.size || f.h.peers[r] == 0)
      KVCOMM_THROW(InvalidArgument, "fetch", "pair ", p, ": source rank ", r,
                   " is not a mapped member; nothing was copied");
    for (int j = 0; j < regions; ++j) {
      const FetchRegionView& sr = f.h.srcRegions[r * regions + j];
      const FetchRegionView& dr = f.h.dstRegions[j];
      uint64_t so = 0, dO = 0;
      if (!fetchBlockOffset(sr, s, &so) || !fetchBlockOffset(dr, d, &dO) || !fetchRangeBacked(f.h, so, sr.blockBytes) ||
          !fetchRangeBacked(f.h, dO, dr.blockBytes))
        KVCOMM_THROW(InvalidArgument, "fetch", "pair ", p, ": block ", s, " of rank ", r, " -> block ", d,
                     " is outside region ", j, " (or not backed); nothing was copied");
    }
  }
  for (int64_t p = 0; p < f.numPairs; ++p) {
    int64_t s, d;
    int r;
    pair(p, &s, &d, &r);
    if (s == -1 || d == -1) continue;
    const char* src = reinterpret_cast<const char*>(f.h.peers[r]);
    for (int j = 0; j < regions; ++j) {
      const FetchRegionView& sr = f.h.srcRegions[r * regions + j];
      const FetchRegionView& dr = f.h.dstRegions[j];
      std::memmove(f.h.local + dr.offset + static_cast<uint64_t>(d) * dr.blockStride,
                   src + sr.offset + static_cast<uint64_t>(s) * sr.blockStride, dr.blockBytes);
    }
  }
}

void hostConvert(const ConvertLaunch& c) {
  const int64_t items = c.numSegments * static_cast<int64_t>(c.itemsPerSegment);
  for (int64_t i = 0; i < items; ++i)
    convertItem(c, i, [](char* d, const char* s, uint64_t bytes) { bulkCopy(d, s, bytes); });
}

}  // namespace kvcomm::detail
