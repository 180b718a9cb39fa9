// CUDA graphs and symmetric memory (mpirun -np 2 on the GPU machine): a graph captured before a growth, or before a
// release/recommit of adopted memory, keeps storing into peer memory through the device peer table.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <vector>

#include "kvcomm/symm.hpp"
#include "mpi/mpi_util.hpp"
#include "verify/memory.hpp"

namespace {

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x << ": " << cudaGetErrorString(x)

__host__ __device__ uint32_t valueOf(uint32_t replay, uint32_t rank, uint32_t word) {
  uint32_t x = replay * 0x9E3779B9u ^ (rank + 1) * 0x85EBCA6Bu ^ word * 0xC2B2AE35u;
  x ^= x >> 15;
  x *= 0x2C1B3C6Du;
  return x ^ (x >> 12);
}

__global__ void fillSource(uint32_t* src, size_t words, const uint32_t* replay, int me) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += gridDim.x * blockDim.x)
    src[i] = valueOf(*replay, static_cast<uint32_t>(me), static_cast<uint32_t>(i));
}

// Stores this rank's words into slot `me` of every other member's region at `offset`, through the peer table.
__global__ void stampPeers(const uint64_t* table, int size, int me, size_t offset, const uint32_t* src, size_t words) {
  for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += gridDim.x * blockDim.x)
    for (int r = 0; r < size; ++r)
      if (r != me) reinterpret_cast<uint32_t*>(table[r] + offset)[me * words + i] = src[i];
}

class GraphSymm : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kvtest::haveGpu()) GTEST_SKIP() << "CUDA graph tests skipped: " << kvtest::noGpuReason();
    if (kvtest::worldSize() < 2) GTEST_SKIP() << "needs 2 ranks";
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&src_, kWords * sizeof(uint32_t)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&replay_, sizeof(uint32_t)), cudaSuccess);
  }
  void TearDown() override {
    if (src_) cudaFree(src_);
    if (replay_) cudaFree(replay_);
    if (stream_) cudaStreamDestroy(stream_);
  }
  // Captures one stamp of `offset` into a graph (the source is refreshed outside the graph).
  cudaGraphExec_t capture(const kvcomm::SymmetricBuffer& buf, size_t offset) {
    cudaGraph_t g;
    cudaGraphExec_t exec = nullptr;
    EXPECT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    stampPeers<<<64, 256, 0, stream_>>>(buf.peerTable(), buf.size(), buf.rank(), offset, src_, kWords);
    EXPECT_EQ(cudaStreamEndCapture(stream_, &g), cudaSuccess);
    EXPECT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
    cudaGraphDestroy(g);
    return exec;
  }
  // Replays `exec` `times` times with fresh words each time; checks every peer's slot in `local` + offset.
  void replayAndVerify(cudaGraphExec_t exec, const kvcomm::SymmetricBuffer& buf, char* local, size_t offset,
                       int times) {
    int n = buf.size(), me = buf.rank();
    std::vector<uint32_t> got(kWords);
    for (int t = 0; t < times; ++t) {
      uint32_t replay = static_cast<uint32_t>(t + 1);
      CUDA_OK(cudaMemcpyAsync(replay_, &replay, sizeof(replay), cudaMemcpyHostToDevice, stream_));
      fillSource<<<64, 256, 0, stream_>>>(src_, kWords, replay_, me);
      CUDA_OK(cudaGraphLaunch(exec, stream_));
      CUDA_OK(cudaStreamSynchronize(stream_));
      MPI_Barrier(MPI_COMM_WORLD);  // every peer's stores are complete
      for (int r = 0; r < n; ++r) {
        if (r == me) continue;
        CUDA_OK(cudaMemcpy(got.data(), local + offset + r * kWords * sizeof(uint32_t), kWords * sizeof(uint32_t),
                           cudaMemcpyDeviceToHost));
        for (size_t w = 0; w < kWords; ++w)
          ASSERT_EQ(got[w], valueOf(replay, static_cast<uint32_t>(r), static_cast<uint32_t>(w)))
              << "replay " << t << " from rank " << r << " word " << w;
      }
      MPI_Barrier(MPI_COMM_WORLD);  // nobody overwrites before everyone checked
    }
  }

  static constexpr size_t kWords = 8192;
  cudaStream_t stream_ = nullptr;
  uint32_t* src_ = nullptr;
  uint32_t* replay_ = nullptr;
};

TEST_F(GraphSymm, GraphCapturedBeforeGrowthStaysValid) {
  auto world = kvtest::tcpWorld();
  auto buf = kvcomm::SymmetricBuffer::create(world, 1, 1, kvcomm::MemoryKind::Cuda);
  size_t g = buf.granularity();
  buf = kvcomm::SymmetricBuffer::create(world, 8 * g, g, kvcomm::MemoryKind::Cuda);
  cudaGraphExec_t before = capture(buf, 0);
  buf.grow(2 * g);
  buf.grow(4 * g);
  replayAndVerify(before, buf, static_cast<char*>(buf.local()), 0, 1000);
  cudaGraphExec_t after = capture(buf, 3 * g);  // the new region
  replayAndVerify(after, buf, static_cast<char*>(buf.local()), 3 * g, 200);
  replayAndVerify(before, buf, static_cast<char*>(buf.local()), 0, 10);  // both graphs keep working together
  cudaGraphExecDestroy(before);
  cudaGraphExecDestroy(after);
}

TEST_F(GraphSymm, GraphCapturedBeforeReleaseAndRecommitStaysValid) {
  auto world = kvtest::tcpWorld();
  kvtest::EngineCache cache(kvcomm::MemoryKind::Cuda, 1u << 21);
  size_t g = cache.granularity();
  kvtest::EngineCache kv(kvcomm::MemoryKind::Cuda, 8 * g);
  kv.commit(0, g);
  auto buf = kvcomm::SymmetricBuffer::adopt(world, kv.base(), 8 * g, kvcomm::MemoryKind::Cuda);
  buf.commit({{0, g}});
  const uint64_t* table = buf.peerTable();
  cudaGraphExec_t graph = capture(buf, 0);
  replayAndVerify(graph, buf, kv.base(), 0, 10);
  // Sleep mode: peers unmap, the engine frees and recommits new physical memory at the same addresses.
  buf.release({{0, g}});
  kv.release(0);
  kv.commit(0, g);
  kvtest::fillMemory(kvcomm::MemoryKind::Cuda, kv.base(), 0, g);
  buf.commit({{0, g}});
  ASSERT_EQ(buf.peerTable(), table);
  replayAndVerify(graph, buf, kv.base(), 0, 1000);
  cudaGraphExecDestroy(graph);
}

}  // namespace
