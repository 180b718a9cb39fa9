// The fetch gather kernel: every warp takes (pair, region, chunk) items in a grid-stride loop, computes both
// addresses on the device from the region tables, checks them, and copies with 16-byte vectors, four in flight per
// lane (a plain gather of this shape reaches about 0.95 of the copy engine on NVLink for 4 KiB blocks and up).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>

#include "common/check.hpp"
#include "device/launch_limits.hpp"
#include "kernels/dependent_launch.cuh"
#include "kernels/launch.hpp"
#include "kvcomm/device/error_record.hpp"
#include "kvcomm/device/fetch.hpp"

namespace kvcomm::detail {

namespace {

namespace cg = cooperative_groups;

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
__device__ void checkPairs(const CheckLaunch& c) {
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
__device__ void checkReadsWritten(const CheckLaunch& c) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < c.numPairs; g += step) {
    if (c.outRank[g] != c.myRank) continue;
    const int64_t s = c.outSrc[g], d = c.outDst[g];
    if (s == -1 || d == -1 || static_cast<uint64_t>(s) >= c.dstLimit) continue;
    const uint32_t w = c.claims[s];
    if (w != 0) atomicMin(&c.words->readsWritten[c.parity], refusal(g, 0xffffffffu - w));
  }
}

// A checked batch's copy pass: resets the other parity's words for the next launch, zeroes the claims, and when a
// pair was refused, records the first refusal and copies nothing. True: copy.
__device__ bool settleChecked(const FetchLaunch& f, const CheckLaunch& t) {
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
    while (k + 1 < t.numRequests && g >= t.req[k + 1].base) ++k;
    const bool sourceSide = why == RefusalReason::SourceOutOfRange || why == RefusalReason::ReadsWrittenBlock;
    recordDeviceError(f.error, DeviceErrorKind::BatchRefused, g - t.req[k].base,
                      sourceSide ? f.srcBlocks[g] : f.dstBlocks[g], k, f.h.rank, f.srcRanks[g], static_cast<int>(why));
  }
  return false;
}

// The copy loop: (pair, region, chunk) items over the grid's warps. CHECKED: the pairs passed the check pass (the
// claim words are not the device-id path's).
template <int VEC, bool CHECKED>
__device__ void copyPairs(const FetchLaunch& f) {
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

template <int VEC>
__global__ void __launch_bounds__(kThreads) fetchKernel(const __grid_constant__ FetchLaunch f) {
  awaitPriorKernels();  // after a claim pass: its words are final
  copyPairs<VEC, false>(f);
}

// A batch checked on the device, in one cooperative launch (one launch is most of its host cost): check, then
// (readsLocal) the reads-written check, then settle and copy, a grid-wide sync between the phases.
template <int VEC>
__global__ void __launch_bounds__(kThreads)
    checkedFetchKernel(const __grid_constant__ CheckLaunch c, const __grid_constant__ FetchLaunch f, int readsLocal) {
  cg::grid_group grid = cg::this_grid();
  checkPairs(c);
  grid.sync();
  if (readsLocal) {
    checkReadsWritten(c);
    grid.sync();
  }
  if (settleChecked(f, c)) copyPairs<VEC, true>(f);
}

// Blocks resident at once (2048 threads per SM): the grid-stride loop runs without waves.
int maxBlocks() {
  return currentDeviceSmCount() * (2048 / kThreads);
}

void checkLaunch(cudaError_t e) {
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e != cudaSuccess)
    throwError(ErrorCode::CudaError, "fetch kernel launch", cat(cudaGetErrorName(e), ": ", cudaGetErrorString(e)),
               __FILE__, __LINE__, static_cast<int>(e));
}

// The copy pass at f.vec's width, dependently on the claim pass before it or plainly.
cudaError_t launchCopy(const FetchLaunch& f, int blocks, cudaStream_t s, bool dependent) {
  auto copy = [&](auto kernel) {
    return dependent ? launchDependent(kernel, blocks, kThreads, s, f)
                     : (kernel<<<blocks, kThreads, 0, s>>>(f), cudaSuccess);
  };
  switch (f.vec) {
    case 16:
      return copy(fetchKernel<16>);
    case 8:
      return copy(fetchKernel<8>);
    case 4:
      return copy(fetchKernel<4>);
    case 2:
      return copy(fetchKernel<2>);
    default:
      return copy(fetchKernel<1>);
  }
}

// Blocks of `kernel` resident at once on the current device (a cooperative launch may not ask for more); cached per
// device and vector width.
template <int VEC>
int residentCheckedBlocks() {
  constexpr int kDevices = 64;
  static std::atomic<int> cache[kDevices];
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) checkLaunch(e);
  if (device >= 0 && device < kDevices)
    if (int n = cache[device].load(std::memory_order_relaxed); n > 0) return n;
  int perSm = 0;
  checkLaunch(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perSm, checkedFetchKernel<VEC>, kThreads, 0));
  const int n = std::max(1, perSm) * currentDeviceSmCount();
  if (device >= 0 && device < kDevices) cache[device].store(n, std::memory_order_relaxed);
  return n;
}

template <int VEC>
cudaError_t launchChecked(const CheckLaunch& c, const FetchLaunch& f, int readsLocal, int wanted, cudaStream_t s) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(std::min(wanted, residentCheckedBlocks<VEC>())));
  config.blockDim = dim3(static_cast<unsigned>(kThreads));
  config.stream = s;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeCooperative;
  attribute[0].val.cooperative = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, checkedFetchKernel<VEC>, c, f, readsLocal);
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

}  // namespace

void launchCheckedFetch(const CheckLaunch& c, const FetchLaunch& f, bool readsLocal, void* stream) {
  if (c.numPairs == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  const int wanted = std::max(pairBlocks(c.numPairs), copyBlocks(f));
  const int local = readsLocal ? 1 : 0;
  cudaError_t e;
  switch (f.vec) {
    case 16:
      e = launchChecked<16>(c, f, local, wanted, s);
      break;
    case 8:
      e = launchChecked<8>(c, f, local, wanted, s);
      break;
    case 4:
      e = launchChecked<4>(c, f, local, wanted, s);
      break;
    case 2:
      e = launchChecked<2>(c, f, local, wanted, s);
      break;
    default:
      e = launchChecked<1>(c, f, local, wanted, s);
      break;
  }
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
  cudaError_t e = launchCopy(g, copyBlocks(g), s, claim);
  if (e == cudaSuccess && claim) e = launchDependent(claimKernel, claimBlocks, kThreads, s, g, true);
  checkLaunch(e);
}

}  // namespace kvcomm::detail
