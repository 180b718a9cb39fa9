// The conversion copy kernels. convertKernel: a converted copy described compactly (convert_launch.hpp), each warp
// computing its items' addresses from the block tables. pieceKernel: a converted transfer's pieces (contiguous runs of
// a KV cache laid out differently on each side, kv_conversion.hpp) copied in one launch, reading the source where it
// lies (a peer's memory mapped here, or a landing area), so the layout changes in flight with no staging pass and no
// second kernel. One warp per piece in a grid-stride loop, with the gather kernel's warp copy (16-byte vectors, four in
// flight per lane).
#include <cuda_runtime.h>

#include <algorithm>

#include "common/check.hpp"
#include "device/launch_limits.hpp"
#include "kernels/launch.hpp"
#include "kvcomm/device/fetch.hpp"

namespace kvcomm::detail {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

template <int VEC>
__global__ void __launch_bounds__(kThreads) pieceKernel(const PieceCopy* pieces, int64_t n) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; i < n; i += step) {
    const PieceCopy p = pieces[i];
    warpCopy<VEC>(p.dst, p.src, p.bytes, lane);
  }
}

template <int VEC>
__global__ void __launch_bounds__(kThreads) convertKernel(const __grid_constant__ ConvertLaunch c, int64_t n) {
  const int lane = static_cast<int>(threadIdx.x & 31);
  const int64_t step = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; i < n; i += step)
    convertItem(c, i, [lane](char* d, const char* s, uint64_t bytes) { warpCopy<VEC>(d, s, bytes, lane); });
}

int gridFor(int64_t items) {
  // Blocks resident at once (2048 threads per SM): the grid-stride loop runs without waves.
  const int64_t resident = static_cast<int64_t>(currentDeviceSmCount()) * (2048 / kThreads);
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((items + kWarps - 1) / kWarps, resident)));
}

void checkLaunch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throwError(ErrorCode::CudaError, what, cat(cudaGetErrorName(e), ": ", cudaGetErrorString(e)), __FILE__, __LINE__,
               static_cast<int>(e));
}

}  // namespace

void launchConvert(const ConvertLaunch& c, void* stream) {
  const int64_t n = c.numSegments * static_cast<int64_t>(c.itemsPerSegment);
  if (n <= 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  const int blocks = gridFor(n);
  switch (c.vec) {
    case 16:
      convertKernel<16><<<blocks, kThreads, 0, s>>>(c, n);
      break;
    case 8:
      convertKernel<8><<<blocks, kThreads, 0, s>>>(c, n);
      break;
    case 4:
      convertKernel<4><<<blocks, kThreads, 0, s>>>(c, n);
      break;
    case 2:
      convertKernel<2><<<blocks, kThreads, 0, s>>>(c, n);
      break;
    default:
      convertKernel<1><<<blocks, kThreads, 0, s>>>(c, n);
      break;
  }
  checkLaunch("conversion kernel launch");
}

void launchPieces(const PieceLaunch& p, void* stream) {
  if (p.numPieces == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  const int blocks = gridFor(p.numPieces);
  switch (p.vec) {
    case 16:
      pieceKernel<16><<<blocks, kThreads, 0, s>>>(p.pieces, p.numPieces);
      break;
    case 8:
      pieceKernel<8><<<blocks, kThreads, 0, s>>>(p.pieces, p.numPieces);
      break;
    case 4:
      pieceKernel<4><<<blocks, kThreads, 0, s>>>(p.pieces, p.numPieces);
      break;
    case 2:
      pieceKernel<2><<<blocks, kThreads, 0, s>>>(p.pieces, p.numPieces);
      break;
    default:
      pieceKernel<1><<<blocks, kThreads, 0, s>>>(p.pieces, p.numPieces);
      break;
  }
  checkLaunch("converted copy kernel launch");
}

}  // namespace kvcomm::detail
