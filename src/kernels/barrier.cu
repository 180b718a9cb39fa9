// The barrier's kernels: one block per launch, one thread per member (kvcomm/device/barrier.hpp does the work).
#include <cuda_runtime.h>

#include "common/check.hpp"
#include "kernels/launch.hpp"
#include "kvcomm/device/barrier.hpp"

namespace kvcomm::detail {

namespace {

template <BarrierStep Step>
__global__ void barrierKernel(const __grid_constant__ BarrierDeviceHandle b, int lane) {
  if constexpr (Step == BarrierStep::Both) barrierBlock(b, lane);
  if constexpr (Step == BarrierStep::Signal) barrierSignalBlock(b, lane);
  if constexpr (Step == BarrierStep::Wait) barrierWaitBlock(b, lane);
}

}  // namespace

void launchBarrier(const BarrierDeviceHandle& b, int lane, BarrierStep step, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  switch (step) {
    case BarrierStep::Both:
      barrierKernel<BarrierStep::Both><<<1, kMaxHandlePeers, 0, s>>>(b, lane);
      break;
    case BarrierStep::Signal:
      barrierKernel<BarrierStep::Signal><<<1, kMaxHandlePeers, 0, s>>>(b, lane);
      break;
    case BarrierStep::Wait:
      barrierKernel<BarrierStep::Wait><<<1, kMaxHandlePeers, 0, s>>>(b, lane);
      break;
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throwError(ErrorCode::CudaError, "barrier kernel launch", cat(cudaGetErrorName(e), ": ", cudaGetErrorString(e)),
               __FILE__, __LINE__, static_cast<int>(e));
}

}  // namespace kvcomm::detail
