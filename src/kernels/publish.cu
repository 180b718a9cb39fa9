// CUDA kernels behind publish, barrier and the gather+insert fallback. Publish spreads every (row, vector column) of
// a call over the whole grid: each vector is loaded once and stored into every replica, with the widest vector the
// row alignment allows. The fallback's pack copies (row, vector) items too, in the widest vectors its rows allow.
#include <cuda_runtime.h>

#include "common/check.hpp"
#include "device/launch_limits.hpp"
#include "kernels/dependent_launch.cuh"
#include "kernels/launch.hpp"
#include "kvcomm/device/barrier.hpp"
#include "kvcomm/device/publish.hpp"

namespace kvcomm::detail {

namespace {

constexpr int kThreads = 256;

// Throws for a failed launch: `e` from the launch call, else the last error it left.
void checkLaunch(const char* what, cudaError_t e = cudaGetLastError()) {
  if (e != cudaSuccess)
    throwError(ErrorCode::CudaError, what, cat(cudaGetErrorName(e), ": ", cudaGetErrorString(e)), __FILE__, __LINE__,
               static_cast<int>(e));
}

// Blocks resident at once (4 per SM for the specialised publish kernels): the grid-stride loops run without waves.
int maxBlocks() {
  return currentDeviceSmCount() * 4;
}

__device__ __forceinline__ int64_t loadSlot(const PublishLaunch& p, int source, int64_t i) {
  const char* base = static_cast<const char*>(p.slots) + static_cast<uint64_t>(source) * p.sourceStride;
  return p.slot64 ? reinterpret_cast<const int64_t*>(base)[i] : reinterpret_cast<const int32_t*>(base)[i];
}

constexpr int kUnroll = 4;  // vectors in flight per thread

constexpr int kStaticReplicas = 8;
constexpr uint64_t kRefused = ~uint64_t(0);  // no row ends there: dst + rowBytes <= capacity

// A row's checked destination (rowDestination), or kRefused.
__device__ __forceinline__ uint64_t destinationOf(const PublishLaunch& p, const PublishTensorDesc& t, int64_t slot,
                                                  uint64_t prefix) {
  uint64_t dst = 0;
  return rowDestination(p, t, slot, &dst, prefix) ? dst : kRefused;
}

__device__ __forceinline__ void recordRefused(const PublishLaunch& p, int tensor, int64_t row, int64_t slot) {
  recordDeviceError(p.error, DeviceErrorKind::SlotOutOfRange, row, slot, tensor, p.replicas.rank, -1, -1);
}

// The bytes of a row past its last whole vector, into every mapped replica.
__device__ __forceinline__ void storeTail(const PublishLaunch& p, const PublishTensorDesc& t, uint64_t from,
                                          const char* src, uint64_t dst) {
  for (uint64_t b = from; b < t.rowBytes; ++b) {
    char x = src[b];
    for (int r = 0; r < p.replicas.size; ++r)
      if (p.replicas.isMapped(r)) p.replicas.peer(r)[dst + b] = x;
  }
}

// The lean kernel's cold paths, out of line so its hot path stays a short straight run of code (the general
// kernel keeps them inline: calls would make its unrolled loop spill).
__device__ __noinline__ uint64_t destinationOutOfLine(const PublishLaunch& p, const PublishTensorDesc& t, int64_t slot,
                                                      uint64_t prefix) {
  return destinationOf(p, t, slot, prefix);
}
__device__ __noinline__ void recordRefusedOutOfLine(const PublishLaunch& p, int tensor, int64_t row, int64_t slot) {
  recordRefused(p, tensor, row, slot);
}
__device__ __noinline__ void storeTailOutOfLine(const PublishLaunch& p, const PublishTensorDesc& t, uint64_t from,
                                                const char* src, uint64_t dst) {
  storeTail(p, t, from, src, dst);
}

// Stores item (row, col) of tensor `t`, whose vector `v` was loaded from the row at `src` (unless col is the tail
// column), at the row's slot in every mapped replica. Every step of the destination is checked: no slot or stride
// wraps into the buffer, and a row never leaves its tensor's region; a refused row is recorded once (by column 0).
// The last column of a row that is not a multiple of VEC copies its tail bytes. Lean (the lean kernel): the replica
// loop is unrolled over the first kStaticReplicas members (measured 0.05 us less per one-row publish), and only a
// safe slot whose row lies in the backed prefix is placed inline (rowDestination's answer for it too); every other
// slot, a refusal and a tail go out of line.
template <int VEC, typename Index, bool Lean = false>
__device__ __forceinline__ void storeItem(const PublishLaunch& p, const PublishTensorDesc& t, int tensor, Index row,
                                          Index col, Index fullCols, const char* src,
                                          const typename kvcomm::detail::VecType<VEC>::type& v, int64_t slot,
                                          uint64_t prefix) {
  using V = typename kvcomm::detail::VecType<VEC>::type;
  if (slot < 0) return;  // padding
  uint64_t dst;
  if constexpr (Lean) {
    if (!safeSlotDestination(t, slot, &dst) || dst + t.rowBytes > prefix)
      dst = destinationOutOfLine(p, t, slot, prefix);
  } else {
    dst = destinationOf(p, t, slot, prefix);
  }
  if (dst == kRefused) {
    if (col == 0) {
      if constexpr (Lean)
        recordRefusedOutOfLine(p, tensor, static_cast<int64_t>(row), slot);
      else
        recordRefused(p, tensor, static_cast<int64_t>(row), slot);
    }
    return;
  }
  if (col < fullCols) {
    int r = 0;
    if constexpr (Lean) {  // the first replicas' bases as constant-offset parameters: no indexed loads
#pragma unroll
      for (; r < kStaticReplicas; ++r) {
        if (r >= p.replicas.size) break;
        if (p.replicas.isMapped(r)) reinterpret_cast<V*>(p.replicas.peer(r) + dst)[col] = v;
      }
    }
    for (; r < p.replicas.size; ++r)
      if (p.replicas.isMapped(r)) reinterpret_cast<V*>(p.replicas.peer(r) + dst)[col] = v;
  } else if constexpr (Lean) {
    storeTailOutOfLine(p, t, static_cast<uint64_t>(fullCols) * VEC, src, dst);
  } else {
    storeTail(p, t, static_cast<uint64_t>(fullCols) * VEC, src, dst);
  }
}

// Every (row, column) of VEC bytes is one work item, spread over all threads of the grid: full lanes whatever the
// row size, contiguous source reads, and kUnroll loads issued before their stores. The source vector is loaded
// before the slot is known (its address does not depend on it), so the two loads overlap instead of forming a chain.
// Index is int32_t when the item count allows it (cheaper division), else int64_t.
template <int VEC, typename Index>
__device__ __forceinline__ void copyTensor(const PublishLaunch& p, const PublishTensorDesc& t, int tensor, Index tid,
                                           Index threads, uint64_t prefix) {
  using V = typename kvcomm::detail::VecType<VEC>::type;  // the device API's vector types
  const Index fullCols = static_cast<Index>(t.rowBytes / VEC);
  const Index cols = fullCols + (t.rowBytes % VEC ? 1 : 0);
  const Index tokens = static_cast<Index>(p.numTokens);
  const Index total = static_cast<Index>(p.numSources) * tokens * cols;
  for (Index base = tid; base < total; base += threads * kUnroll) {
    V v[kUnroll];
    const char* src[kUnroll];
    Index row[kUnroll], col[kUnroll];
    int64_t slot[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      col[u] = -1;
      Index c = base + u * threads;
      if (c >= total) continue;
      row[u] = c / cols;
      col[u] = c - row[u] * cols;
      Index source = row[u] / tokens;
      Index i = row[u] - source * tokens;
      src[u] = t.src + static_cast<uint64_t>(source) * t.sourceStride + static_cast<uint64_t>(i) * t.srcStride;
      if (col[u] < fullCols) v[u] = reinterpret_cast<const V*>(src[u])[col[u]];
      slot[u] = loadSlot(p, static_cast<int>(source), i);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (col[u] >= 0) storeItem<VEC, Index>(p, t, tensor, row[u], col[u], fullCols, src[u], v[u], slot[u], prefix);
  }
}

// The kernels' end: the fused barrier, or its signal, after the grid's stores (After: 0, or a BarrierStep).
template <int After>
__device__ __forceinline__ void publishEnd(const BarrierDeviceHandle& b, int lane, uint64_t epoch) {
  if constexpr (After == static_cast<int>(BarrierStep::Both)) barrierAfterGrid(b, lane, epoch);
  if constexpr (After == static_cast<int>(BarrierStep::Signal)) barrierSignalAfterGrid(b, lane, epoch);
}

// Item `item` (< rows x cols) of tensor `k`: its row and column by fast division, the vector, the slot, the stores.
template <int VEC>
__device__ __forceinline__ void publishItem(const PublishLaunch& p, const PublishTensorDesc& t, int k, uint32_t item,
                                            uint64_t prefix) {
  using V = typename kvcomm::detail::VecType<VEC>::type;
  const int32_t fullCols = static_cast<int32_t>(t.rowBytes / VEC);
  const int32_t row = static_cast<int32_t>(fastDivide(item, t.cols));
  const int32_t col = static_cast<int32_t>(item - static_cast<uint32_t>(row) * t.cols.d);
  // One source (every publish; the insert has one per rank): no division by the token count.
  const int32_t source = p.numSources == 1 ? 0 : static_cast<int32_t>(fastDivide(row, p.tokens));
  const int32_t i = row - source * static_cast<int32_t>(p.numTokens);
  const char* src = t.src + static_cast<uint64_t>(source) * t.sourceStride + static_cast<uint64_t>(i) * t.srcStride;
  V v{};
  if (col < fullCols) v = reinterpret_cast<const V*>(src)[col];
  storeItem<VEC, int32_t, true>(p, t, k, row, col, fullCols, src, v, loadSlot(p, source, i), prefix);
}

// Publishes of at most one item per thread of the grid (decode steps, prefill chunks) whose tensors have widths of
// 16, 8 or 4 bytes (VEC: the width they share, or 0 for mixed ones, each tensor's item code picked by its width):
// one item per thread, no copy loop, a few dozen instructions from the wait to the stores: the descriptors read at
// static indices (constant operands), the row found by a multiply instead of a division, the cold paths out of line.
// Measured on 2 x H200 against the general kernel (its loop inlined once per tensor): publish alone 1.86 -> 1.30 us
// at one row of 656 bytes (the bare scatter probe: 1.37), 2.22 -> 1.81 at 256 rows.
template <int After, int VEC>
__global__ void __launch_bounds__(kThreads, 4)
    publishItemsKernel(const __grid_constant__ PublishLaunch p, const __grid_constant__ BarrierDeviceHandle b,
                       int barrierLane) {
  awaitPriorKernels();  // before any memory access: the rows, slots and epochs come from earlier kernels
  const uint64_t epoch = After != 0 ? barrierNextEpoch(b, barrierLane) : 0;
  const uint64_t prefix = p.backedPrefix ? *p.backedPrefix : 0;
  uint32_t item = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t rows = static_cast<uint32_t>(p.numSources) * static_cast<uint32_t>(p.numTokens);
#pragma unroll
  for (int k = 0; k < kMaxPublishTensors; ++k) {
    if (k >= p.numTensors) break;
    const uint32_t items = rows * p.t[k].cols.d;
    if (item < items) {
      if constexpr (VEC != 0) {
        publishItem<VEC>(p, p.t[k], k, item, prefix);
      } else if (p.t[k].vec == 16) {
        publishItem<16>(p, p.t[k], k, item, prefix);
      } else if (p.t[k].vec == 8) {
        publishItem<8>(p, p.t[k], k, item, prefix);
      } else {
        publishItem<4>(p, p.t[k], k, item, prefix);
      }
      break;
    }
    item -= items;
  }
  publishEnd<After>(b, barrierLane, epoch);
}

// One kernel per vector width: when every tensor of a call shares it (the common case) the kernel holds a single
// copy loop, uses fewer registers and runs more blocks per SM; mixed widths take the generic kernel (VEC = 0).
// After: 0 (publish only), or the BarrierStep the kernel's end runs (Both, or Signal for the split barrier).
template <int After, int VEC, typename Index>
__global__ void __launch_bounds__(kThreads, VEC == 0 ? 2 : (sizeof(Index) == 8 ? 3 : 4))
    publishKernel(const __grid_constant__ PublishLaunch p, const __grid_constant__ BarrierDeviceHandle b,
                  int barrierLane) {
  awaitPriorKernels();  // before any memory access: the rows, slots and epochs come from earlier kernels
  const uint64_t epoch = After != 0 ? barrierNextEpoch(b, barrierLane) : 0;
  // Loaded once, beside the first slots and rows: rows below it skip the bitmap load that would follow the slot's.
  const uint64_t prefix = p.backedPrefix ? *p.backedPrefix : 0;
  const Index tid = static_cast<Index>(blockIdx.x) * blockDim.x + threadIdx.x;
  const Index threads = static_cast<Index>(gridDim.x) * blockDim.x;
#pragma unroll
  for (int k = 0; k < kMaxPublishTensors; ++k) {  // static indices keep the descriptors in parameter space
    if (k >= p.numTensors) break;
    if constexpr (VEC != 0) {
      copyTensor<VEC, Index>(p, p.t[k], k, tid, threads, prefix);
    } else {
      switch (p.t[k].vec) {
        case 16:
          copyTensor<16, Index>(p, p.t[k], k, tid, threads, prefix);
          break;
        case 8:
          copyTensor<8, Index>(p, p.t[k], k, tid, threads, prefix);
          break;
        case 4:
          copyTensor<4, Index>(p, p.t[k], k, tid, threads, prefix);
          break;
        case 2:
          copyTensor<2, Index>(p, p.t[k], k, tid, threads, prefix);
          break;
        default:
          copyTensor<1, Index>(p, p.t[k], k, tid, threads, prefix);
          break;
      }
    }
  }
  publishEnd<After>(b, barrierLane, epoch);
}

// Whether every tensor's width is one the lean kernel has item code for (16, 8 or 4 bytes).
bool leanWidths(const PublishLaunch& p) {
  for (int k = 0; k < p.numTensors; ++k)
    if (p.t[k].vec != 16 && p.t[k].vec != 8 && p.t[k].vec != 4) return false;
  return true;
}

// The vector width every tensor of the call shares, or 0 when they differ.
int sharedVec(const PublishLaunch& p) {
  int vec = p.t[0].vec;
  for (int k = 1; k < p.numTensors; ++k)
    if (p.t[k].vec != vec) vec = 0;
  return vec;
}

// Vectors of the tensor's width per row, rounded up (the last one copies the row's tail bytes).
uint64_t vectorsPerRow(const PublishTensorDesc& t) {
  const uint64_t vec = t.vec > 0 ? static_cast<uint64_t>(t.vec) : 1;
  return (t.rowBytes + vec - 1) / vec;
}

// oneItemPerThread: a grid with a thread per item, and leanWidths(p).
template <int After, typename Index>
cudaError_t launchWith(const PublishLaunch& p, int blocks, cudaStream_t s, const BarrierDeviceHandle& b, int lane,
                       bool oneItemPerThread) {
  const int vec = sharedVec(p);
  if (oneItemPerThread) {
    switch (vec) {
      case 16:
        return launchDependent(publishItemsKernel<After, 16>, blocks, kThreads, s, p, b, lane);
      case 8:
        return launchDependent(publishItemsKernel<After, 8>, blocks, kThreads, s, p, b, lane);
      case 4:
        return launchDependent(publishItemsKernel<After, 4>, blocks, kThreads, s, p, b, lane);
      default:
        return launchDependent(publishItemsKernel<After, 0>, blocks, kThreads, s, p, b, lane);
    }
  }
  switch (vec) {
    case 16:
      return launchDependent(publishKernel<After, 16, Index>, blocks, kThreads, s, p, b, lane);
    case 8:
      return launchDependent(publishKernel<After, 8, Index>, blocks, kThreads, s, p, b, lane);
    case 4:
      return launchDependent(publishKernel<After, 4, Index>, blocks, kThreads, s, p, b, lane);
    case 2:
      return launchDependent(publishKernel<After, 2, Index>, blocks, kThreads, s, p, b, lane);
    case 1:
      return launchDependent(publishKernel<After, 1, Index>, blocks, kThreads, s, p, b, lane);
    default:
      return launchDependent(publishKernel<After, 0, Index>, blocks, kThreads, s, p, b, lane);
  }
}

// launchWith for the call's index width: 32-bit work indices where `narrow` (a wide call never fits one item per
// thread, so `one` only matters on the narrow side).
template <int After>
cudaError_t launchAfter(const PublishLaunch& p, int blocks, cudaStream_t s, const BarrierDeviceHandle& b, int lane,
                        bool narrow, bool one) {
  return narrow ? launchWith<After, int32_t>(p, blocks, s, b, lane, one)
                : launchWith<After, int64_t>(p, blocks, s, b, lane, false);
}

// Copies tensor k's rows into the record in vectors of VEC bytes (every row start, stride and the record part
// VEC-aligned), one (row, vector) item per thread of a grid-stride loop.
template <int VEC>
__device__ __forceinline__ void packTensor(const PackLaunch& p, int k, int64_t tid, int64_t threads) {
  using V = typename kvcomm::detail::VecType<VEC>::type;
  const int64_t cols = static_cast<int64_t>(p.rowBytes[k] / VEC);
  const int64_t items = p.numTokens * cols;
  for (int64_t i = tid; i < items; i += threads) {
    const int64_t token = i / cols, col = i - token * cols;
    const V* src = reinterpret_cast<const V*>(p.src[k] + static_cast<uint64_t>(token) * p.srcStride[k]);
    reinterpret_cast<V*>(p.out + p.partOffset[k] + static_cast<uint64_t>(token) * p.rowBytes[k])[col] = src[col];
  }
}

__global__ void __launch_bounds__(kThreads) packKernel(const __grid_constant__ PackLaunch p) {
  awaitPriorKernels();  // the rows and slots come from earlier kernels
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t* slotsOut = reinterpret_cast<int64_t*>(p.out);
  for (int64_t i = tid; i < p.numTokens; i += threads)
    slotsOut[i] = p.slot64 ? static_cast<const int64_t*>(p.slots)[i] : static_cast<const int32_t*>(p.slots)[i];
#pragma unroll
  for (int k = 0; k < kMaxPublishTensors; ++k) {
    if (k >= p.numTensors) break;
    switch (p.vec[k]) {
      case 16:
        packTensor<16>(p, k, tid, threads);
        break;
      case 8:
        packTensor<8>(p, k, tid, threads);
        break;
      case 4:
        packTensor<4>(p, k, tid, threads);
        break;
      case 2:
        packTensor<2>(p, k, tid, threads);
        break;
      default:
        packTensor<1>(p, k, tid, threads);
        break;
    }
  }
}

// `in` with the lean kernel's divisors (a divisor of 0 is never used: no item reaches it).
PublishLaunch withDivisors(const PublishLaunch& in) {
  PublishLaunch p = in;
  constexpr uint64_t kMax = uint64_t(1) << 31;
  for (int k = 0; k < p.numTensors; ++k) {
    const uint64_t cols = vectorsPerRow(p.t[k]);
    p.t[k].cols = cols >= 1 && cols < kMax ? fastDivOf(static_cast<uint32_t>(cols)) : FastDiv{};
  }
  const auto tokens = static_cast<uint64_t>(p.numTokens);
  p.tokens = tokens >= 1 && tokens < kMax ? fastDivOf(static_cast<uint32_t>(tokens)) : FastDiv{};
  return p;
}

}  // namespace

void launchPublish(const PublishLaunch& call, void* stream, const BarrierDeviceHandle* fusedBarrier, int lane,
                   BarrierStep after) {
  const PublishLaunch p = withDivisors(call);
  int64_t items = 0;  // (row, vector column) pairs over all tensors
  for (int k = 0; k < p.numTensors; ++k)
    items += p.numTokens * p.numSources * static_cast<int64_t>(vectorsPerRow(p.t[k]));
  if (items == 0 && !fusedBarrier) return;
  // One vector per thread until every resident block is busy, then up to kUnroll in flight per thread: small and
  // mid sizes spread over as many SMs as they can fill (the NVLink store rate of a few SMs was the limit: 256 tokens
  // of 656 B ran on 11 blocks when the grid was sized for 4 vectors per thread).
  // The lean kernel (one item per thread; every tensor 16, 8 or 4 bytes wide) also runs beyond one resident
  // grid, in up to kLeanWaves waves of blocks. Measured on one H200 (one rank), publish alone at 4096 / 8192 / 16384
  // rows of 656 B against the general kernel: 3.05 -> 2.45, 4.31 -> 3.51, 7.16 -> 5.84 us (8 waves; 2: only 4096).
  constexpr int64_t kLeanWaves = 8;
  int64_t want = (items + kThreads - 1) / kThreads;
  const bool one = leanWidths(p) && want <= maxBlocks() * kLeanWaves;
  int blocks = static_cast<int>(std::max<int64_t>(1, one ? want : std::min<int64_t>(want, maxBlocks())));
  auto s = static_cast<cudaStream_t>(stream);
  // 32-bit work indices (cheaper division) when the item count summed over all tensors, plus one grid-stride step,
  // stays below 2^31: a bound on every tensor's indices.
  bool narrow = items + static_cast<int64_t>(blocks) * kThreads * kUnroll < (int64_t(1) << 31);
  BarrierDeviceHandle none{};
  const BarrierDeviceHandle& b = fusedBarrier ? *fusedBarrier : none;
  constexpr int kBoth = static_cast<int>(BarrierStep::Both), kSignal = static_cast<int>(BarrierStep::Signal);
  // A grid of several blocks ends its fused barrier with GPU-scope arrivals and a last block that releases for all;
  // with dependent launch the barrier kernel's start overlaps the publish kernel's end instead, and measured faster
  // (2 x H200: 256 rows of 656 B, 4.49 against 4.76 us per op in a graph). One block keeps the single kernel.
  const bool barrierKernel = fusedBarrier && blocks > 1 && dependentLaunchOn();
  cudaError_t e;
  if (!fusedBarrier || barrierKernel)
    e = launchAfter<0>(p, blocks, s, b, lane, narrow, one);
  else if (after == BarrierStep::Signal)
    e = launchAfter<kSignal>(p, blocks, s, b, lane, narrow, one);
  else
    e = launchAfter<kBoth>(p, blocks, s, b, lane, narrow, one);
  checkLaunch("publish kernel launch", e == cudaSuccess ? cudaGetLastError() : e);
  if (barrierKernel) launchBarrier(*fusedBarrier, lane, after, stream);
}

void launchPack(const PackLaunch& call, void* stream) {
  if (call.numTokens == 0) return;
  PackLaunch p = call;
  int64_t items = p.numTokens;  // the slots, then every tensor's (row, vector) items
  for (int k = 0; k < p.numTensors; ++k) {
    // The widest vector every row's source, the source stride, the row size and the record part are aligned to.
    const uint64_t bits = reinterpret_cast<uintptr_t>(p.src[k]) | p.srcStride[k] | p.rowBytes[k] | p.partOffset[k] |
                          reinterpret_cast<uintptr_t>(p.out);
    p.vec[k] = bits % 16 == 0 ? 16 : bits % 8 == 0 ? 8 : bits % 4 == 0 ? 4 : bits % 2 == 0 ? 2 : 1;
    items = std::max<int64_t>(items, p.numTokens * static_cast<int64_t>(p.rowBytes[k] / p.vec[k]));
  }
  const int blocks =
      static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((items + kThreads - 1) / kThreads, maxBlocks())));
  const cudaError_t e = launchDependent(packKernel, blocks, kThreads, static_cast<cudaStream_t>(stream), p);
  checkLaunch("pack kernel launch", e == cudaSuccess ? cudaGetLastError() : e);
}

}  // namespace kvcomm::detail
