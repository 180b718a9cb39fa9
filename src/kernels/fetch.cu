// The fetch gather kernel: every warp takes (pair, region, chunk) items in a grid-stride loop, computes both
// addresses on the device from the region tables, checks them, and copies with 16-byte vectors, four in flight per
// lane (a plain gather of this shape reaches about 0.95 of the copy engine on NVLink for 4 KiB blocks and up).
#include <cuda_runtime.h>

#include <algorithm>

#include "common/check.hpp"
#include "device/launch_limits.hpp"
#include "kernels/launch.hpp"
#include "kvcomm/device/error_record.hpp"
#include "kvcomm/device/fetch.hpp"

namespace kvcomm::detail {

namespace {

constexpr int kThreads = 256;

template <int VEC>
__global__ void __launch_bounds__(kThreads) fetchKernel(const __grid_constant__ FetchLaunch f) {
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
    if (f.inlineCount > 0) {
      s = f.inlineSrc[p];
      d = f.inlineDst[p];
      r = f.inlineRank[p];
    } else {
      s = f.srcBlocks[p];
      d = f.dstBlocks[p];
      r = f.srcRanks ? f.srcRanks[p] : f.srcRank;
    }
    if (s == -1 || d == -1) continue;  // padding
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
  switch (f.vec) {
    case 16:
      fetchKernel<16><<<blocks, kThreads, 0, s>>>(f);
      break;
    case 8:
      fetchKernel<8><<<blocks, kThreads, 0, s>>>(f);
      break;
    case 4:
      fetchKernel<4><<<blocks, kThreads, 0, s>>>(f);
      break;
    case 2:
      fetchKernel<2><<<blocks, kThreads, 0, s>>>(f);
      break;
    default:
      fetchKernel<1><<<blocks, kThreads, 0, s>>>(f);
      break;
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throwError(ErrorCode::CudaError, "fetch kernel launch", cat(cudaGetErrorName(e), ": ", cudaGetErrorString(e)),
               __FILE__, __LINE__, static_cast<int>(e));
}

}  // namespace kvcomm::detail
