// An engine's cache-store kernel with kvcomm fused in: each token's key row (int16 activations) is quantized to
// int8 plus a per-row scale and stored, Indexer-K style, into every PCP replica; the same kernel then runs the
// barrier. Only public headers: the device API (kvcomm/device/*.hpp) and the host API to set it up.
//   mpirun -np 2 example_fused_cache_store        (one GPU per rank; prints "verified" on success)
#include <cuda_runtime.h>
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "kvcomm/device/barrier.hpp"
#include "kvcomm/device/publish.hpp"
#include "kvcomm/device/symm_device.hpp"
#include "kvcomm/kvcomm.hpp"
#include "kvcomm/mpi_bootstrap.hpp"
#include "kvcomm/publish.hpp"

namespace {

constexpr int kDim = 128;                                // key dimension: 128 int8 values per row
constexpr int kBlock = 64;                               // tokens per cache block
constexpr int kBlockBytes = kBlock * kDim + kBlock * 4;  // [64 x 128 data][64 x 4-byte scale]
constexpr int kWarps = 4;

// Quantizes one row: q = v >> 8, scale = max |v| (integer math, so host and device agree bit for bit).
__host__ __device__ int8_t quantize(int16_t v) {
  return static_cast<int8_t>(v >> 8);
}

__global__ void cacheStoreAndPublish(const int16_t* keys, const int64_t* slots, int tokens,
                                     kvcomm::SymmDeviceHandle replicas, kvcomm::BarrierDeviceHandle barrier,
                                     uint64_t layerOffset) {
  __shared__ alignas(16) int8_t rowQ[kWarps][kDim];
  __shared__ alignas(16) int32_t rowScale[kWarps];
  const uint64_t epoch = kvcomm::barrierNextEpoch(barrier, 0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int t = blockIdx.x * kWarps + warp; t < tokens; t += gridDim.x * kWarps) {
    int64_t slot = slots[t];
    if (slot < 0) continue;  // padding
    int32_t amax = 0;
    for (int d = lane; d < kDim; d += 32) {
      int16_t v = keys[t * kDim + d];
      rowQ[warp][d] = quantize(v);
      amax = max(amax, abs(static_cast<int32_t>(v)));
    }
    for (int o = 16; o > 0; o /= 2) amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (lane == 0) rowScale[warp] = amax;
    __syncwarp();
    // Data at off * 128 inside the block, scale at kBlock * 128 + off * 4: two stores into every replica.
    uint64_t data = kvcomm::slotDestination(slot, layerOffset, kBlock, kBlockBytes, kDim);
    uint64_t scale = kvcomm::slotDestination(slot, layerOffset + kBlock * kDim, kBlock, kBlockBytes, 4);
    kvcomm::warpStoreToReplicas<16>(replicas, data, reinterpret_cast<const char*>(rowQ[warp]), kDim, lane);
    kvcomm::warpStoreToReplicas<4>(replicas, scale, reinterpret_cast<const char*>(&rowScale[warp]), 4, lane);
    __syncwarp();
  }
  kvcomm::barrierAfterGrid(barrier, 0, epoch);  // every replica complete when the kernel ends
}

#define CHECK(x)                                                   \
  do {                                                             \
    cudaError_t e = (x);                                           \
    if (e != cudaSuccess) {                                        \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e)); \
      std::exit(1);                                                \
    }                                                              \
  } while (0)

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int failures = 0;
  try {
    const char* lr = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (kvcomm::useLocalDevice(lr ? std::atoi(lr) : rank) < 0) {
      if (rank == 0)
        std::printf("fused_cache_store: skipped (no GPU: %s)\n", kvcomm::capabilities().cudaReason.c_str());
      MPI_Finalize();
      return 0;
    }
    auto world = kvcomm::Communicator::create(std::make_shared<kvcomm::MpiBootstrap>(MPI_COMM_WORLD));
    const int tokens = 1000, blocks = (size * tokens + kBlock - 1) / kBlock + 1;
    const uint64_t layerOffset = 4096;
    auto cache = kvcomm::SymmetricBuffer::create(world, layerOffset + blocks * kBlockBytes,
                                                 layerOffset + blocks * kBlockBytes, kvcomm::MemoryKind::Cuda);
    auto pub = kvcomm::Publisher::create(cache);  // owns the barrier's flags and error record

    // Inputs: rank r owns slots [r * tokens, (r + 1) * tokens), every 9th token padding.
    auto keysOf = [&](int r) {
      std::vector<int16_t> k(static_cast<size_t>(tokens) * kDim);
      for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<int16_t>((i * 2654435761u + r * 97u) & 0xffff);
      return k;
    };
    auto slotsOf = [&](int r) {
      std::vector<int64_t> s(tokens);
      for (int i = 0; i < tokens; ++i) s[i] = i % 9 == 8 ? -1 : static_cast<int64_t>(r) * tokens + (i * 7) % tokens;
      return s;
    };
    auto keys = keysOf(rank);
    auto slots = slotsOf(rank);
    int16_t* dKeys;
    int64_t* dSlots;
    CHECK(cudaMalloc(&dKeys, keys.size() * sizeof(int16_t)));
    CHECK(cudaMalloc(&dSlots, slots.size() * sizeof(int64_t)));
    CHECK(cudaMemcpy(dKeys, keys.data(), keys.size() * sizeof(int16_t), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dSlots, slots.data(), slots.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
    CHECK(cudaMemset(cache.local(), 0, cache.mappedBytes()));
    CHECK(cudaDeviceSynchronize());  // zeroed before any peer can store into it
    world.barrier();

    cacheStoreAndPublish<<<32, kWarps * 32>>>(dKeys, dSlots, tokens, cache.deviceHandle(), pub.barrier().deviceHandle(),
                                              layerOffset);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    pub.checkErrors();

    // Oracle: every rank's rows, quantized on the host, at their slots.
    std::vector<uint8_t> want(cache.mappedBytes(), 0), got(cache.mappedBytes());
    for (int r = 0; r < size; ++r) {
      auto k = keysOf(r);
      auto s = slotsOf(r);
      for (int t = 0; t < tokens; ++t) {
        if (s[t] < 0) continue;
        int32_t amax = 0;
        uint64_t data = kvcomm::slotDestination(s[t], layerOffset, kBlock, kBlockBytes, kDim);
        for (int d = 0; d < kDim; ++d) {
          int16_t v = k[static_cast<size_t>(t) * kDim + d];
          want[data + d] = static_cast<uint8_t>(quantize(v));
          amax = std::max(amax, std::abs(static_cast<int32_t>(v)));
        }
        uint64_t scale = kvcomm::slotDestination(s[t], layerOffset + kBlock * kDim, kBlock, kBlockBytes, 4);
        std::memcpy(&want[scale], &amax, 4);
      }
    }
    CHECK(cudaMemcpy(got.data(), cache.local(), got.size(), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i] != want[i]) ++failures;
    std::printf("fused_cache_store rank %d: %s (%zu bytes compared, %d differ)\n", rank,
                failures ? "MISMATCH" : "verified", got.size(), failures);
    cudaFree(dKeys);
    cudaFree(dSlots);
    world.barrier();
  } catch (const kvcomm::Error& e) {
    std::fprintf(stderr, "fused_cache_store: %s\n", e.what());
    failures = 1;
  }
  MPI_Finalize();
  return failures ? 1 : 0;
}
