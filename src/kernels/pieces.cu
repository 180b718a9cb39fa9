// The conversion copy kernel: a converted transfer's pieces (contiguous runs of a KV cache laid out differently on
// each side, kv_conversion.hpp) copied in one launch, reading the source where it lies (a peer's memory mapped here,
// or a landing area), so the layout changes in flight with no staging pass and no second kernel. One warp per
// piece in a grid-stride loop, with the gather kernel's warp copy (16-byte vectors, four in flight per lane).
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

}  // namespace

void launchPieces(const PieceLaunch& p, void* stream) {
  if (p.numPieces == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  // Blocks resident at once (2048 threads per SM): the grid-stride loop runs without waves.
  const int64_t resident = static_cast<int64_t>(currentDeviceSmCount()) * (2048 / kThreads);
  const int blocks =
      static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((p.numPieces + kWarps - 1) / kWarps, resident)));
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
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throwError(ErrorCode::CudaError, "converted copy kernel launch",
               cat(cudaGetErrorName(e), ": ", cudaGetErrorString(e)), __FILE__, __LINE__, static_cast<int>(e));
}

}  // namespace kvcomm::detail
