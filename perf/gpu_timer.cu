#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench/bench.hpp"
#include "gpu_timer.hpp"
#include "kvcomm/device/publish.hpp"

namespace kvbench {

namespace {
__global__ void emptyKernel() {}

__global__ void __launch_bounds__(256) smCopy(uint4* __restrict__ dst, const uint4* __restrict__ src, size_t n) {
  size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  size_t threads = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t base = tid; base < n; base += 4 * threads) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (base + u * threads < n) v[u] = src[base + u * threads];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (base + u * threads < n) dst[base + u * threads] = v[u];
  }
}

__global__ void barrierProbe(const __grid_constant__ kvcomm::BarrierDeviceHandle b, int lane, int variant) {
  if (variant == 0) {
    kvcomm::barrierBlock(b, lane);
    return;
  }
  __syncthreads();
  uint64_t epoch = b.epochs[lane] + 1;
  int t = static_cast<int>(threadIdx.x);
  if (t < b.size && t != b.rank && b.peerSignals[t] != 0) {
    uint64_t* remote = kvcomm::barrierFlag(b.peerSignals[t], lane, b.rank);
    if (variant == 2) __threadfence_system();
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(remote), "l"(epoch) : "memory");
    const uint64_t* flag = kvcomm::barrierFlag(reinterpret_cast<uint64_t>(b.localSignals), lane, t);
    while (kvcomm::loadRelaxedSystem(flag) < epoch) {
    }
  }
  __syncthreads();
  if (t == 0) b.epochs[lane] = epoch;
}

// The ladder from the floor of a one-row publish with the fused barrier (PublishThen::Barrier) to kvcomm's one-block
// kernel, one difference added per step. The floor: one block of 64 threads loads the row's slot from memory, stores
// the row there in the peer (no checks, one replica), then runs kvcomm's barrierBlock (its release orders the row
// before the flag); launched like kvcomm's kernels (dependent launch where on), so it waits for the kernel before it
// first. Then 0 = the floor with launch parameters of kvcomm's size (Pad: an unused 1 KB argument, carried by every
// later step); 1 = 256 threads instead of 64; 2 = the row also into this rank's own replica; 3 = the destination
// computed the overflow-checked way (slotDestinationChecked, against a limit that does not bound the store: the check's
// cost, not its effect).
struct NoPad {};
struct LadderPad {
  uint64_t word[124];
};
template <int Step, typename Pad>
__global__ void ladderProbe(const __grid_constant__ kvcomm::BarrierDeviceHandle b, int lane, char* peer, char* local,
                            const uint4* src, const int64_t* slot, int vecs, const __grid_constant__ Pad pad) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  (void)pad;
  uint64_t epoch = kvcomm::barrierNextEpoch(b, lane);
  const uint64_t rowBytes = static_cast<uint64_t>(vecs) * 16;
  for (int i = threadIdx.x; i < vecs; i += blockDim.x) {
    uint4 v = src[i];
    int64_t s = *slot;
    uint64_t dst = static_cast<uint64_t>(s) * rowBytes;
    if constexpr (Step >= 3) {
      if (!kvcomm::slotDestinationChecked(s, 0, 1, rowBytes, rowBytes, rowBytes, uint64_t(1) << 40, &dst)) continue;
    }
    reinterpret_cast<uint4*>(peer + dst)[i] = v;
    if constexpr (Step >= 2) reinterpret_cast<uint4*>(local + dst)[i] = v;
  }
  kvcomm::barrierBlock(b, lane, epoch);
}

// Floor of the scatter: row r (rowBytes, a multiple of 16) to slot slots[r] of the peer, one 16-byte column per
// thread over the whole grid, with no bounds checks and nothing else.
__global__ void __launch_bounds__(256)
    scatterRows(char* dst, const char* src, const int64_t* slots, int64_t rows, int64_t cols) {
  int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < rows * cols; c += threads) {
    int64_t r = c / cols, col = c - r * cols;
    uint4 v = reinterpret_cast<const uint4*>(src + r * cols * 16)[col];
    int64_t slot = slots[r];
    if (slot >= 0) reinterpret_cast<uint4*>(dst + slot * cols * 16)[col] = v;
  }
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::abort();
  }
}
}  // namespace

__global__ void spinKernel(unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

void launchSpin(unsigned long long ns, CUstream_st* stream) {
  spinKernel<<<1, 32, 0, stream>>>(ns);
}

void launchEmpty(CUstream_st* stream) {
  emptyKernel<<<1, 32, 0, stream>>>();
}

void launchSmCopy(void* dst, const void* src, size_t bytes, CUstream_st* stream) {
  static int blocks = 0;
  if (!blocks) {
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    blocks = sms * 4;
  }
  size_t n = bytes / 16;
  int grid = static_cast<int>(std::min<size_t>(blocks, (n + 1023) / 1024 + 1));
  smCopy<<<grid, 256, 0, stream>>>(static_cast<uint4*>(dst), static_cast<const uint4*>(src), n);
}

void launchBarrierProbe(const kvcomm::BarrierDeviceHandle& b, int lane, int variant, CUstream_st* stream) {
  barrierProbe<<<1, 32, 0, stream>>>(b, lane, variant);
}

// One block of `threads`, with programmatic stream serialisation where `dependent` (as kvcomm launches its kernels).
template <typename... Params, typename... Args>
void launchOneBlock(void (*kernel)(Params...), int threads, bool dependent, CUstream_st* stream, const char* what,
                    Args... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(1);
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = dependent ? 1 : 0;
  check(cudaLaunchKernelEx(&config, kernel, args...), what);
}

void launchStoreThenBarrier(const kvcomm::BarrierDeviceHandle& b, int lane, void* peerDst, const void* src,
                            const int64_t* slot, size_t bytes, bool dependent, CUstream_st* stream) {
  launchOneBlock(ladderProbe<1, NoPad>, 64, dependent, stream, "store-then-barrier probe launch", b, lane,
                 static_cast<char*>(peerDst), static_cast<char*>(nullptr), static_cast<const uint4*>(src), slot,
                 static_cast<int>(bytes / 16), NoPad{});
}

void launchLadderProbe(const kvcomm::BarrierDeviceHandle& b, int lane, void* peerDst, void* localDst, const void* src,
                       const int64_t* slot, size_t bytes, int step, CUstream_st* stream) {
  auto* peer = static_cast<char*>(peerDst);
  auto* local = static_cast<char*>(localDst);
  auto* s = static_cast<const uint4*>(src);
  int vecs = static_cast<int>(bytes / 16);
  const int threads = step >= 1 ? 256 : 64;
  const char* what = "ladder probe launch";
  if (step <= 1)
    launchOneBlock(ladderProbe<1, LadderPad>, threads, true, stream, what, b, lane, peer, local, s, slot, vecs,
                   LadderPad{});
  else if (step == 2)
    launchOneBlock(ladderProbe<2, LadderPad>, threads, true, stream, what, b, lane, peer, local, s, slot, vecs,
                   LadderPad{});
  else
    launchOneBlock(ladderProbe<3, LadderPad>, threads, true, stream, what, b, lane, peer, local, s, slot, vecs,
                   LadderPad{});
}

void launchScatterProbe(void* peerDst, const void* src, const int64_t* slots, int64_t rows, size_t rowBytes,
                        CUstream_st* stream) {
  static int blocks = 0;
  if (!blocks) {
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    blocks = sms * 8;
  }
  int64_t cols = static_cast<int64_t>(rowBytes / 16);
  int grid = static_cast<int>(std::min<int64_t>(blocks, (rows * cols + 255) / 256));
  if (grid > 0)
    scatterRows<<<grid, 256, 0, stream>>>(static_cast<char*>(peerDst), static_cast<const char*>(src), slots, rows,
                                          cols);
}

CUstream_st* makeStream() {
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  return s;
}

void syncDevice() {
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

Stats graphTimeUs(const std::function<void(CUstream_st*)>& op, int perGraph, int reps, int warmup,
                  CUstream_st* stream) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
  for (int i = 0; i < perGraph; ++i) op(stream);
  check(cudaStreamEndCapture(stream, &graph), "end capture");
  check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int i = 0; i < warmup; ++i) check(cudaGraphLaunch(exec, stream), "warm-up launch");
  check(cudaStreamSynchronize(stream), "warm-up sync");
  // Replays run back to back in batches (as a serving loop launches them); each batch is timed with events and
  // the statistics over batches are reported per operation.
  const int batch = 10;
  std::vector<double> us;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a, stream);
    for (int j = 0; j < batch; ++j) check(cudaGraphLaunch(exec, stream), "launch");
    cudaEventRecord(b, stream);
    check(cudaEventSynchronize(b), "sync");
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    us.push_back(1000.0 * ms / (batch * perGraph));
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return stats(us);
}

}  // namespace kvbench
