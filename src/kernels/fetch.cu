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

template <int VEC>
__global__ void __launch_bounds__(kThreads) fetchKernel(const __grid_constant__ FetchLaunch f) {
  awaitPriorKernels();  // after a claim pass: its words are final
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
    if (f.claims && d >= 0 && d < f.numClaims && f.claims[d] != static_cast<uint32_t>(p + 1)) continue;
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

}  // namespace

void launchFetch(const FetchLaunch& f, void* stream) {
  const int64_t items = f.numPairs * f.h.numRegions * f.chunksPerBlock;
  if (items == 0) return;
  const int64_t warpsPerBlock = kThreads / 32;
  int blocks = static_cast<int>(std::min<int64_t>((items + warpsPerBlock - 1) / warpsPerBlock, maxBlocks()));
  auto s = static_cast<cudaStream_t>(stream);
  // Duplicates are possible only between two pairs of unvalidated ids.
  const bool claim = f.claims && !f.trusted && f.numPairs > 1;
  const int claimBlocks = static_cast<int>(std::min<int64_t>((f.numPairs + kThreads - 1) / kThreads, maxBlocks()));
  FetchLaunch g = f;
  if (!claim) g.claims = nullptr;
  // The claim pass, then the copy and release passes launched dependently (each waits for the one before, without
  // the launch gap between them).
  cudaError_t e = cudaSuccess;
  if (claim) claimKernel<<<claimBlocks, kThreads, 0, s>>>(g, false);
  auto copy = [&](auto kernel) {
    return claim ? launchDependent(kernel, blocks, kThreads, s, g)
                 : (kernel<<<blocks, kThreads, 0, s>>>(g), cudaSuccess);
  };
  switch (f.vec) {
    case 16:
      e = copy(fetchKernel<16>);
      break;
    case 8:
      e = copy(fetchKernel<8>);
      break;
    case 4:
      e = copy(fetchKernel<4>);
      break;
    case 2:
      e = copy(fetchKernel<2>);
      break;
    default:
      e = copy(fetchKernel<1>);
      break;
  }
  if (e == cudaSuccess && claim) e = launchDependent(claimKernel, claimBlocks, kThreads, s, g, true);
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e != cudaSuccess)
    throwError(ErrorCode::CudaError, "fetch kernel launch", cat(cudaGetErrorName(e), ": ", cudaGetErrorString(e)),
               __FILE__, __LINE__, static_cast<int>(e));
}

}  // namespace kvcomm::detail
