#include "nccl_baseline.hpp"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kvcomm/device/publish.hpp"

namespace kvbench {

namespace {

// The NCCL entry points the baseline calls, loaded once.
struct Nccl {
  decltype(&::ncclGetUniqueId) getUniqueId = nullptr;
  decltype(&::ncclCommInitRank) commInitRank = nullptr;
  decltype(&::ncclCommDestroy) commDestroy = nullptr;
  decltype(&::ncclAllGather) allGather = nullptr;
  decltype(&::ncclGroupStart) groupStart = nullptr;
  decltype(&::ncclGroupEnd) groupEnd = nullptr;
  decltype(&::ncclGetErrorString) getErrorString = nullptr;
};

const Nccl& nccl() {
  static const Nccl lib = [] {
    Nccl n;
    void* h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen("libnccl.so", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* e = dlerror();
      throw std::runtime_error(std::string("NCCL baseline: dlopen(libnccl.so.2) failed: ") + (e ? e : "?"));
    }
    auto sym = [&](const char* name) {
      void* p = dlsym(h, name);
      if (!p) throw std::runtime_error(std::string("NCCL baseline: libnccl lacks ") + name);
      return p;
    };
    n.getUniqueId = reinterpret_cast<decltype(n.getUniqueId)>(sym("ncclGetUniqueId"));
    n.commInitRank = reinterpret_cast<decltype(n.commInitRank)>(sym("ncclCommInitRank"));
    n.commDestroy = reinterpret_cast<decltype(n.commDestroy)>(sym("ncclCommDestroy"));
    n.allGather = reinterpret_cast<decltype(n.allGather)>(sym("ncclAllGather"));
    n.groupStart = reinterpret_cast<decltype(n.groupStart)>(sym("ncclGroupStart"));
    n.groupEnd = reinterpret_cast<decltype(n.groupEnd)>(sym("ncclGroupEnd"));
    n.getErrorString = reinterpret_cast<decltype(n.getErrorString)>(sym("ncclGetErrorString"));
    return n;
  }();
  return lib;
}

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + nccl().getErrorString(r));
}

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

template <int VEC>
__global__ void __launch_bounds__(kThreads) insertKernel(const __grid_constant__ InsertArgs a) {
  using V = typename kvcomm::detail::VecType<VEC>::type;
  const int64_t fullCols = static_cast<int64_t>(a.rowBytes / VEC);
  const int64_t cols = fullCols + (a.rowBytes % VEC ? 1 : 0);
  const int64_t total = static_cast<int64_t>(a.sources) * a.tokens * cols;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t base = tid; base < total; base += threads * kUnroll) {
    V v[kUnroll];
    const char* src[kUnroll];
    int64_t col[kUnroll], slot[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      col[u] = -1;
      int64_t c = base + u * threads;
      if (c >= total) continue;
      int64_t row = c / cols;
      col[u] = c - row * cols;
      int64_t source = row / a.tokens, i = row - source * a.tokens;
      const char* record = a.records + static_cast<uint64_t>(source) * a.recordBytes;
      src[u] = record + a.rowsAt + static_cast<uint64_t>(i) * a.rowBytes;
      if (col[u] < fullCols) v[u] = reinterpret_cast<const V*>(src[u])[col[u]];
      slot[u] = reinterpret_cast<const int64_t*>(record)[i];
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (col[u] < 0 || slot[u] < 0) continue;
      uint64_t dst = kvcomm::slotDestination(slot[u], 0, 1, a.rowBytes, a.rowBytes);
      // The same check as kvcomm's kernels: the row lies wholly in backed granules.
      bool backed = dst < a.capacity && a.rowBytes <= a.capacity - dst;
      for (uint64_t g = dst >> a.granShift, last = (dst + a.rowBytes - 1) >> a.granShift; backed && g <= last; ++g)
        backed = (a.backed[g >> 6] >> (g & 63)) & 1u;
      if (!backed) continue;
      if (col[u] < fullCols) {
        reinterpret_cast<V*>(a.replica + dst)[col[u]] = v[u];
      } else {
        for (uint64_t b = static_cast<uint64_t>(fullCols) * VEC; b < a.rowBytes; ++b) a.replica[dst + b] = src[u][b];
      }
    }
  }
}

}  // namespace

NcclBaseline::NcclBaseline() {
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ncclUniqueId id{};
  if (rank == 0) check(nccl().getUniqueId(&id), "ncclGetUniqueId");
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclComm_t c = nullptr;
  check(nccl().commInitRank(&c, size, id, rank), "ncclCommInitRank");
  comm_ = c;
}

NcclBaseline::~NcclBaseline() {
  if (comm_) nccl().commDestroy(static_cast<ncclComm_t>(comm_));
}

void NcclBaseline::allGather(const void* send, void* recv, size_t bytes, CUstream_st* stream) {
  check(nccl().allGather(send, recv, bytes, ncclUint8, static_cast<ncclComm_t>(comm_), stream), "ncclAllGather");
}

void NcclBaseline::allGatherPair(const void* sendA, void* recvA, size_t bytesA, const void* sendB, void* recvB,
                                 size_t bytesB, CUstream_st* stream) {
  auto c = static_cast<ncclComm_t>(comm_);
  check(nccl().groupStart(), "ncclGroupStart");
  check(nccl().allGather(sendA, recvA, bytesA, ncclUint8, c, stream), "ncclAllGather");
  check(nccl().allGather(sendB, recvB, bytesB, ncclUint8, c, stream), "ncclAllGather");
  check(nccl().groupEnd(), "ncclGroupEnd");
}

void launchInsert(const InsertArgs& a, CUstream_st* stream) {
  static int maxBlocks = 0;
  if (!maxBlocks) {
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    maxBlocks = (sms > 0 ? sms : 132) * 4;
  }
  int vec = kvcomm::commonAlignment(reinterpret_cast<uintptr_t>(a.records), a.recordBytes, a.rowsAt, a.rowBytes);
  int64_t items = static_cast<int64_t>(a.sources) * a.tokens * static_cast<int64_t>((a.rowBytes + vec - 1) / vec);
  if (items == 0) return;
  int blocks = static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>((items + kThreads * kUnroll - 1) / (kThreads * kUnroll), maxBlocks)));
  switch (vec) {
    case 16:
      insertKernel<16><<<blocks, kThreads, 0, stream>>>(a);
      break;
    case 8:
      insertKernel<8><<<blocks, kThreads, 0, stream>>>(a);
      break;
    case 4:
      insertKernel<4><<<blocks, kThreads, 0, stream>>>(a);
      break;
    case 2:
      insertKernel<2><<<blocks, kThreads, 0, stream>>>(a);
      break;
    default:
      insertKernel<1><<<blocks, kThreads, 0, stream>>>(a);
      break;
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("insert kernel launch: ") + cudaGetErrorString(e));
}

}  // namespace kvbench
