// CUDA kernels behind publish, barrier and the gather+insert fallback. One warp per row: it loads the row once
// and stores it into every replica with the widest vector the row alignment allows.
#include <cuda_runtime.h>

#include "common/check.hpp"
#include "kernels/launch.hpp"
#include "kvcomm/device/barrier.hpp"
#include "kvcomm/device/publish.hpp"

namespace kvcomm::detail {

namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;

void checkLaunch(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throwError(ErrorCode::CudaError, what, cat(cudaGetErrorName(e), ": ", cudaGetErrorString(e)), __FILE__, __LINE__);
}

// Blocks that keep every SM busy without oversubscribing the grid-stride loop.
int maxBlocks() {
  static thread_local int cached = 0;
  if (cached == 0) {
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    cached = (sms > 0 ? sms : 132) * 8;
  }
  return cached;
}

__device__ __forceinline__ int64_t loadSlot(const PublishLaunch& p, int source, int64_t i) {
  const char* base = static_cast<const char*>(p.slots) + static_cast<uint64_t>(source) * p.sourceStride;
  return p.slot64 ? reinterpret_cast<const int64_t*>(base)[i] : reinterpret_cast<const int32_t*>(base)[i];
}

__device__ __forceinline__ void storeRow(const PublishLaunch& p, const PublishTensorDesc& t, int tensor, int source,
                                         int64_t i, int lane) {
  int64_t slot = loadSlot(p, source, i);
  if (slot < 0) return;  // padding
  uint64_t block = static_cast<uint64_t>(slot) / t.blockSize;
  // Checked before computing the address, so a huge slot cannot wrap around into the buffer.
  bool ok = block <= t.limit / (t.blockStride ? t.blockStride : 1);
  uint64_t dst = ok ? slotDestination(slot, t.offset, t.blockSize, t.blockStride, t.rowStride) : 0;
  if (!ok || dst + t.rowBytes > t.limit) {
    if (lane == 0)
      recordDeviceError(p.error, DeviceErrorKind::SlotOutOfRange, static_cast<int64_t>(source) * p.numTokens + i, slot,
                        tensor, p.replicas.rank, -1, -1);
    return;
  }
  const char* src = t.src + static_cast<uint64_t>(source) * p.sourceStride + static_cast<uint64_t>(i) * t.srcStride;
  switch (t.vec) {
    case 16:
      warpStoreToReplicas<16>(p.replicas, dst, src, t.rowBytes, lane);
      break;
    case 8:
      warpStoreToReplicas<8>(p.replicas, dst, src, t.rowBytes, lane);
      break;
    case 4:
      warpStoreToReplicas<4>(p.replicas, dst, src, t.rowBytes, lane);
      break;
    case 2:
      warpStoreToReplicas<2>(p.replicas, dst, src, t.rowBytes, lane);
      break;
    default:
      warpStoreToReplicas<1>(p.replicas, dst, src, t.rowBytes, lane);
      break;
  }
}

template <bool Fused>
__global__ void __launch_bounds__(kThreads)
    publishKernel(const __grid_constant__ PublishLaunch p, const __grid_constant__ BarrierDeviceHandle b,
                  int barrierLane) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  const int64_t perSource = p.numTokens * p.numTensors;
  const int64_t rows = perSource * p.numSources;
  for (int64_t r = warp; r < rows; r += warps) {
    int source = static_cast<int>(r / perSource);
    int64_t rest = r - source * perSource;
    int64_t token = rest / p.numTensors;
    int tensor = static_cast<int>(rest - token * p.numTensors);
#pragma unroll
    for (int k = 0; k < kMaxPublishTensors; ++k)  // static indices keep the descriptors in parameter space
      if (k == tensor) storeRow(p, p.t[k], k, source, token, lane);
  }
  if (Fused) barrierAfterGrid(b, barrierLane);
}

__global__ void barrierKernel(const __grid_constant__ BarrierDeviceHandle b, int lane) {
  barrierBlock(b, lane);
}

__global__ void __launch_bounds__(kThreads) packKernel(const __grid_constant__ PackLaunch p) {
  const int lane = threadIdx.x & 31;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t* slotsOut = reinterpret_cast<int64_t*>(p.out);
  for (int64_t i = tid; i < p.numTokens; i += threads)
    slotsOut[i] = p.slot64 ? static_cast<const int64_t*>(p.slots)[i] : static_cast<const int32_t*>(p.slots)[i];
  const int64_t rows = p.numTokens * p.numTensors;
  for (int64_t r = tid >> 5; r < rows; r += threads >> 5) {
    int64_t token = r / p.numTensors;
    int tensor = static_cast<int>(r - token * p.numTensors);
#pragma unroll
    for (int k = 0; k < kMaxPublishTensors; ++k) {
      if (k != tensor) continue;
      const char* src = p.src[k] + static_cast<uint64_t>(token) * p.srcStride[k];
      char* dst = p.out + p.partOffset[k] + static_cast<uint64_t>(token) * p.rowBytes[k];
      for (uint64_t b = lane; b < p.rowBytes[k]; b += 32) dst[b] = src[b];
    }
  }
}

}  // namespace

void launchPublish(const PublishLaunch& p, void* stream, const BarrierDeviceHandle* fusedBarrier, int lane) {
  int64_t rows = p.numTokens * p.numTensors * p.numSources;
  if (rows == 0 && !fusedBarrier) return;
  int64_t want = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  int blocks = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(want, maxBlocks())));
  auto s = static_cast<cudaStream_t>(stream);
  if (fusedBarrier) {
    publishKernel<true><<<blocks, kThreads, 0, s>>>(p, *fusedBarrier, lane);
  } else {
    publishKernel<false><<<blocks, kThreads, 0, s>>>(p, BarrierDeviceHandle{}, 0);
  }
  checkLaunch("publish kernel launch");
}

void launchBarrier(const BarrierDeviceHandle& b, int lane, void* stream) {
  barrierKernel<<<1, kMaxHandlePeers, 0, static_cast<cudaStream_t>(stream)>>>(b, lane);
  checkLaunch("barrier kernel launch");
}

void launchPack(const PackLaunch& p, void* stream) {
  int64_t rows = p.numTokens * p.numTensors;
  if (rows == 0) return;
  int blocks = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((rows + 7) / 8, maxBlocks())));
  packKernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p);
  checkLaunch("pack kernel launch");
}

}  // namespace kvcomm::detail
