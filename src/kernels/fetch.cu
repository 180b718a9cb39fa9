// The fetch gather kernel: every warp takes (pair, region, chunk) items in a grid-stride loop, computes both
// addresses on the device from the region tables, checks them, and copies with 16-byte vectors, four in flight per
// lane (a plain gather of this shape reaches about 0.95 of the copy engine on NVLink for 4 KiB blocks and up).
#include <cuda_runtime.h>

#include <algorithm>

#include "common/check.hpp"
#include "device/launch_limits.hpp"
#include "kernels/dependent_launch.cuh"
#include "kernels/launch.hpp"
#include "kvcomm/device/error_record.hpp"
#include "kvcomm/device/fetch.hpp"

namespace kvcomm::detail {

namespace {

constexpr int kThreads = 256;

// Pair p's ids.
__device__ __forceinline__ void pairAt(const FetchLaunch& f, int64_t p, int64_t* s, int64_t* d, int* r) {
  if (f.inlineCount > 0) {
    *s = f.inlineSrc[p];
    *d = f.inlineDst[p];
    *r = f.inlineRank[p];
  } else {
    *s = f.srcBlocks[p];
    *d = f.dstBlocks[p];
    *r = f.srcRanks ? f.srcRanks[p] : f.srcRank;
  }
}

// Claim (release = false): every pair that names a destination block raises its claim word to (pair + 1), so the
// word ends as the last pair's. Release: every claimed word back to zero for the next launch.
__global__ void __launch_bounds__(kThreads) claimKernel(const __grid_constant__ FetchLaunch f, bool release) {
  awaitPriorKernels();  // the release pass: the copy pass ended
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < f.numPairs; p += step) {
    int64_t s, d;
    int r;
    pairAt(f, p, &s, &d, &r);
    if (s == -1 || d < 0 || d >= f.numClaims) continue;  // padding, or an id the copy pass reports
    if (release)
      f.claims[d] = 0;
    else
      atomicMax(&f.claims[d], static_cast<uint32_t>(p + 1));
  }
}

constexpr unsigned long long kNone = ~0ull;
constexpr uint32_t kSourceBad = 0xffffffffu, kDestinationBad = 0xfffffffeu;  // low words of a range refusal

// A pair's refusal word: the minimum over bad pairs is the first bad pair in batch order (pairs < 2^24).
__device__ __forceinline__ unsigned long long refusal(int64_t pair, uint32_t low) {
  return (static_cast<unsigned long long>(pair) << 32) | low;
}

// Check pass of a batch checked on the device: copies every pair to out*, refuses ids out of range, and claims
// destinations keeping the first pair: a pair that finds another's claim makes (later, earlier) a candidate, and
// the least candidate is the batch's first duplicate in order (its second use, naming the first).
__global__ void __launch_bounds__(kThreads) checkKernel(const __grid_constant__ CheckLaunch c) {
  awaitPriorKernels();  // the previous batch's copy pass reset this launch's words and zeroed the claims
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < c.numPairs; g += step) {
    int k = 0;
    while (k + 1 < c.numRequests && g >= c.req[k + 1].base) ++k;
    const CheckedRequestView& q = c.req[k];
    const int64_t i = g - q.base;
    const int64_t s = q.src[i], d = q.dst[i];
    c.outSrc[g] = s;
    c.outDst[g] = d;
    c.outRank[g] = q.rank;
    unsigned long long bad = kNone;
    if (s != -1 && static_cast<uint64_t>(s) >= q.srcLimit) {
      bad = refusal(g, kSourceBad);
    } else if (d != -1 && static_cast<uint64_t>(d) >= c.dstLimit) {
      bad = refusal(g, kDestinationBad);
    } else if (s != -1 && d != -1) {
      const uint32_t old = atomicMax(&c.claims[d], 0xffffffffu - static_cast<uint32_t>(g));
      if (old != 0) {
        const int64_t other = static_cast<int64_t>(0xffffffffu - old);
        bad = refusal(g > other ? g : other, static_cast<uint32_t>(g > other ? other : g));
      }
    }
    if (bad != kNone) atomicMin(&c.words->refused[c.parity], bad);
  }
}

// Reads-written pass (a request reads this rank): a local source block that a pair of the batch writes.
__global__ void __launch_bounds__(kThreads) readsWrittenKernel(const __grid_constant__ CheckLaunch c) {
  awaitPriorKernels();  // every claim landed
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < c.numPairs; g += step) {
    if (c.outRank[g] != c.myRank) continue;
    const int64_t s = c.outSrc[g], d = c.outDst[g];
    if (s == -1 || d == -1 || static_cast<uint64_t>(s) >= c.dstLimit) continue;
    const uint32_t w = c.claims[s];
    if (w != 0) atomicMin(&c.words->readsWritten[c.parity], refusal(g, 0xffffffffu - w));
  }
}

// What the copy pass of a checked batch needs besides its FetchLaunch (empty for the other launches).
struct CheckTail {
  CheckWords* words;
  int32_t parity;
  int32_t numRequests;
  int64_t base[kMaxCheckedRequests];
};

// A checked batch's copy pass: resets the other parity's words for the next launch, zeroes the claims, and when a
// pair was refused, records the first refusal and copies nothing. True: copy.
__device__ bool settleChecked(const FetchLaunch& f, const CheckTail& t) {
  const unsigned long long refused = *static_cast<volatile unsigned long long*>(&t.words->refused[t.parity]);
  const unsigned long long readsWritten = *static_cast<volatile unsigned long long*>(&t.words->readsWritten[t.parity]);
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (first == 0) {
    t.words->refused[t.parity ^ 1] = kNone;
    t.words->readsWritten[t.parity ^ 1] = kNone;
  }
  for (int64_t p = first; p < f.numPairs; p += step) {
    const int64_t d = f.dstBlocks[p];
    if (d >= 0 && d < f.numClaims) f.claims[d] = 0;
  }
  if (refused == kNone && readsWritten == kNone) return true;
  if (first == 0) {
    const unsigned long long w = refused != kNone ? refused : readsWritten;
    const int64_t g = static_cast<int64_t>(w >> 32);
    const uint32_t low = static_cast<uint32_t>(w);
    RefusalReason why = refused == kNone         ? RefusalReason::ReadsWrittenBlock
                        : low == kSourceBad      ? RefusalReason::SourceOutOfRange
                        : low == kDestinationBad ? RefusalReason::DestinationOutOfRange
                                                 : RefusalReason::DuplicateDestination;
    int k = 0;
    while (k + 1 < t.numRequests && g >= t.base[k + 1]) ++k;
    const bool sourceSide = why == RefusalReason::SourceOutOfRange || why == RefusalReason::ReadsWrittenBlock;
    recordDeviceError(f.error, DeviceErrorKind::BatchRefused, g - t.base[k],
                      sourceSide ? f.srcBlocks[g] : f.dstBlocks[g], k, f.h.rank, f.srcRanks[g], static_cast<int>(why));
  }
  return false;
}

template <int VEC, bool CHECKED>
__global__ void __launch_bounds__(kThreads)
    fetchKernel(const __grid_constant__ FetchLaunch f, const __grid_constant__ CheckTail t) {
  awaitPriorKernels();  // after a claim or check pass: its words are final
  if (CHECKED && !settleChecked(f, t)) return;
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  const int64_t regions = f.h.numRegions, chunks = f.chunksPerBlock;
  const int64_t items = f.numPairs * regions * chunks;
  for (int64_t it = warp; it < items; it += warps) {
    const int64_t t = it / chunks;
    const int64_t c = it - t * chunks;
    const int64_t p = t / regions;
    const int j = static_cast<int>(t - p * regions);
    int64_t s, d;
    int r;
    pairAt(f, p, &s, &d, &r);
    if (s == -1 || d == -1) continue;  // padding
    // A later pair names this destination block: it takes the whole block.
    if (!CHECKED && f.claims && d >= 0 && d < f.numClaims && f.claims[d] != static_cast<uint32_t>(p + 1)) continue;
    const uint64_t blockBytes = f.h.dstRegions[j].blockBytes;
    const uint64_t from = static_cast<uint64_t>(c) * f.chunkBytes;
    if (from >= blockBytes) continue;  // a region with smaller blocks than the largest
    const uint64_t len = blockBytes - from < f.chunkBytes ? blockBytes - from : f.chunkBytes;
    if (f.trusted) {  // validated on the host (a plan of the current generation): straight to the copy
      const FetchRegionView& sr = f.h.srcRegions[r * regions + j];
      const FetchRegionView& dr = f.h.dstRegions[j];
      warpCopy<VEC>(
          f.h.local + dr.offset + static_cast<uint64_t>(d) * dr.blockStride + from,
          reinterpret_cast<const char*>(f.h.peers[r]) + sr.offset + static_cast<uint64_t>(s) * sr.blockStride + from,
          len, lane);
      continue;
    }
    if (!warpPullBlock<VEC>(f.h, r, j, s, d, from, len, lane) && lane == 0 && c == 0) {
      bool srcBad = r < 0 || r >= f.h.size || f.h.peers[r] == 0 ||
                    static_cast<uint64_t>(s) >= f.h.srcRegions[r * regions + j].numBlocks;
      recordDeviceError(f.error, DeviceErrorKind::BlockOutOfRange, p, srcBad ? s : d, j, f.h.rank, r, -1);
    }
  }
}

// Blocks resident at once (2048 threads per SM): the grid-stride loop runs without waves.
int maxBlocks() {
  return currentDeviceSmCount() * (2048 / kThreads);
}

// The copy pass at f.vec's width, dependently on the kernel before it (a claim or check pass) or plainly.
template <bool CHECKED>
cudaError_t launchCopy(const FetchLaunch& f, const CheckTail& t, int blocks, cudaStream_t s, bool dependent) {
  auto copy = [&](auto kernel) {
    return dependent ? launchDependent(kernel, blocks, kThreads, s, f, t)
                     : (kernel<<<blocks, kThreads, 0, s>>>(f, t), cudaSuccess);
  };
  switch (f.vec) {
    case 16:
      return copy(fetchKernel<16, CHECKED>);
    case 8:
      return copy(fetchKernel<8, CHECKED>);
    case 4:
      return copy(fetchKernel<4, CHECKED>);
    case 2:
      return copy(fetchKernel<2, CHECKED>);
    default:
      return copy(fetchKernel<1, CHECKED>);
  }
}

int copyBlocks(const FetchLaunch& f) {
  const int64_t items = f.numPairs * f.h.numRegions * f.chunksPerBlock;
  const int64_t warpsPerBlock = kThreads / 32;
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>((items + warpsPerBlock - 1) / warpsPerBlock, maxBlocks())));
}

int pairBlocks(int64_t pairs) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((pairs + kThreads - 1) / kThreads, maxBlocks())));
}

void checkLaunch(cudaError_t e) {
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e != cudaSuccess)
    throwError(ErrorCode::CudaError, "fetch kernel launch", cat(cudaGetErrorName(e), ": ", cudaGetErrorString(e)),
               __FILE__, __LINE__, static_cast<int>(e));
}

}  // namespace

void launchCheckedFetch(const CheckLaunch& c, const FetchLaunch& f, bool readsLocal, void* stream) {
  if (c.numPairs == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  CheckTail t{};
  t.words = c.words;
  t.parity = c.parity;
  t.numRequests = c.numRequests;
  for (int k = 0; k < c.numRequests; ++k) t.base[k] = c.req[k].base;
  // Every pass waits for the one before (dependent launches: no launch gap); the check pass also for the copy pass
  // of the batch before, which reset its words.
  cudaError_t e = launchDependent(checkKernel, pairBlocks(c.numPairs), kThreads, s, c);
  if (e == cudaSuccess && readsLocal) e = launchDependent(readsWrittenKernel, pairBlocks(c.numPairs), kThreads, s, c);
  if (e == cudaSuccess) e = launchCopy<true>(f, t, copyBlocks(f), s, true);
  checkLaunch(e);
}

void launchFetch(const FetchLaunch& f, void* stream) {
  if (f.numPairs * f.h.numRegions * f.chunksPerBlock == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  // Duplicates are possible only between two pairs of unvalidated ids.
  const bool claim = f.claims && !f.trusted && f.numPairs > 1;
  const int claimBlocks = pairBlocks(f.numPairs);
  FetchLaunch g = f;
  if (!claim) g.claims = nullptr;
  // The claim pass, then the copy and release passes launched dependently (each waits for the one before, without
  // the launch gap between them).
  if (claim) claimKernel<<<claimBlocks, kThreads, 0, s>>>(g, false);
  cudaError_t e = launchCopy<false>(g, CheckTail{}, copyBlocks(g), s, claim);
  if (e == cudaSuccess && claim) e = launchDependent(claimKernel, claimBlocks, kThreads, s, g, true);
  checkLaunch(e);
}

}  // namespace kvcomm::detail
