// The barrier's kernels: one block per launch, one thread per member (kvcomm/device/barrier.hpp does the work).
#include <cuda_runtime.h>

#include "common/check.hpp"
#include "kernels/dependent_launch.cuh"
#include "kernels/launch.hpp"
#include "kvcomm/device/barrier.hpp"

namespace kvcomm::detail {

namespace {

// One thread per member. The signal is an atomic increment of this rank's flag at the member: every signal on a
// lane advances it by one, so it still holds the last epoch announced (the device API's contract, which its stores
// keep too), and the signal does not wait for this rank's epoch to be loaded first; the load overlaps the
// increment's flight and only the wait needs it. System-scope release: cumulative over the earlier kernels' stores.
template <BarrierStep Step>
__global__ void barrierKernel(const __grid_constant__ BarrierDeviceHandle b, int lane) {
  awaitPriorKernels();
  const int t = static_cast<int>(threadIdx.x);
  const bool member = t < b.size && t != b.rank && b.peerSignals[t] != 0;
  if constexpr (Step != BarrierStep::Wait) {
    if (member) {
      uint64_t* flag = barrierFlag(b.peerSignals[t], lane, b.rank);
      asm volatile("red.release.sys.global.add.u64 [%0], 1;" ::"l"(flag) : "memory");
    }
  }
  const uint64_t epoch = b.epochs[lane] + (Step == BarrierStep::Wait ? 0 : 1);
  if constexpr (Step != BarrierStep::Signal) {
    if (member) barrierWait(b, lane, t, epoch);
  }
  __syncthreads();  // every thread read the old epoch before it changes
  if constexpr (Step != BarrierStep::Wait) {
    if (t == 0) b.epochs[lane] = epoch;
  }
}

}  // namespace

void launchBarrier(const BarrierDeviceHandle& b, int lane, BarrierStep step, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  cudaError_t e = cudaSuccess;
  switch (step) {
    case BarrierStep::Both:
      e = launchDependent(barrierKernel<BarrierStep::Both>, 1, kMaxHandlePeers, s, b, lane);
      break;
    case BarrierStep::Signal:
      e = launchDependent(barrierKernel<BarrierStep::Signal>, 1, kMaxHandlePeers, s, b, lane);
      break;
    case BarrierStep::Wait:
      e = launchDependent(barrierKernel<BarrierStep::Wait>, 1, kMaxHandlePeers, s, b, lane);
      break;
  }
  if (e == cudaSuccess) e = cudaGetLastError();
  if (e != cudaSuccess)
    throwError(ErrorCode::CudaError, "barrier kernel launch", cat(cudaGetErrorName(e), ": ", cudaGetErrorString(e)),
               __FILE__, __LINE__, static_cast<int>(e));
}

}  // namespace kvcomm::detail
