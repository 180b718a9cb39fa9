// Fetch inside CUDA graphs (mpirun -np 2 on the GPU machine): the gather kernel reads block ids from device memory,
// so a captured fetch is replayed 1,000 times with new ids written between replays, every replay's whole buffer
// checked against the per-block oracle; a capture of a host-id fetch is refused.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <random>
#include <vector>

#include "kvcomm/error.hpp"
#include "kvcomm/fetch.hpp"
#include "mpi/mpi_util.hpp"
#include "verify/fetch_oracle.hpp"
#include "verify/memory.hpp"

namespace {

using kvcomm::MemoryKind;

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

class GraphFetch : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kvtest::haveGpu()) GTEST_SKIP() << "CUDA graph tests skipped: " << kvtest::noGpuReason();
    if (kvtest::worldSize() < 2) GTEST_SKIP() << "needs 2 ranks";
    seed_ = kvtest::sharedSeed();
  }
  uint64_t seed_ = 0;
};

// New random ids for one replay: `count` pairs (a few padded), sources in [0, half), distinct destinations in
// [half, blocks), from `peer`.
kvtest::FetchBatch replayIds(std::mt19937_64& rng, int peer, size_t count, size_t blocks) {
  const int64_t half = static_cast<int64_t>(blocks / 2);
  std::vector<int64_t> dsts;
  for (int64_t d = half; d < static_cast<int64_t>(blocks); ++d) dsts.push_back(d);
  std::shuffle(dsts.begin(), dsts.end(), rng);
  kvtest::FetchBatch b;
  b.ranks = {peer};
  b.src.resize(1);
  b.dst.resize(1);
  for (size_t i = 0; i < count; ++i) {
    bool pad = rng() % 8 == 0;
    b.src[0].push_back(pad ? -1 : static_cast<int64_t>(rng() % static_cast<uint64_t>(half)));
    b.dst[0].push_back(dsts[i]);
  }
  return b;
}

// Every member's layout for `c`: `most` the largest extent, `extent` this rank's.
std::vector<kvcomm::KvLayout> layoutsFor(const kvcomm::Communicator& world, const kvtest::FetchCase& c, uint64_t seed,
                                         size_t* most, size_t* extent) {
  std::vector<kvcomm::KvLayout> layouts;
  for (int r = 0; r < world.size(); ++r) {
    size_t e = 0;
    layouts.push_back(kvtest::makeFetchLayout(c, seed, r, &e));
    *most = std::max(*most, e);
    if (r == world.rank()) *extent = e;
  }
  return layouts;
}

TEST_F(GraphFetch, ThousandReplaysWithNewIdsEveryReplay) {
  auto world = kvtest::tcpWorld();
  const kvtest::FetchCase c{16 << 10, 2, true, 128};
  size_t most = 0, extent = 0;
  const auto layouts = layoutsFor(world, c, seed_, &most, &extent);
  const kvcomm::KvLayout& mine = layouts[static_cast<size_t>(world.rank())];
  auto buf = kvcomm::SymmetricBuffer::create(world, most, most, MemoryKind::Cuda);
  const auto initial = kvtest::initialImage(mine, seed_, world.rank(), extent);
  kvtest::toMemory(MemoryKind::Cuda, buf.local(), initial.data(), extent);
  auto f = kvcomm::Fetcher::create(buf, mine);
  world.barrier();  // every source filled

  const size_t count = 48;
  int64_t *src = nullptr, *dst = nullptr;
  CUDA_OK(cudaMalloc(&src, count * sizeof(int64_t)));
  CUDA_OK(cudaMalloc(&dst, count * sizeof(int64_t)));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const int peer = (world.rank() + 1) % world.size();
  kvcomm::DeviceFetchBatch batch{src, dst, nullptr, peer, count};
  cudaGraph_t graph;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  f.fetchDevice(batch, reinterpret_cast<kvcomm::Stream>(s));
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

  std::mt19937_64 rng(seed_ + static_cast<uint64_t>(world.rank()));
  std::vector<uint8_t> got(extent);
  int bad = 0;
  for (int replay = 0; replay < 1000 && bad == 0; ++replay) {
    kvtest::FetchBatch ids = replayIds(rng, peer, count, c.numBlocks);
    CUDA_OK(cudaMemcpyAsync(buf.local(), initial.data(), extent, cudaMemcpyHostToDevice, s));  // undo the last one
    CUDA_OK(cudaMemcpyAsync(src, ids.src[0].data(), count * sizeof(int64_t), cudaMemcpyHostToDevice, s));
    CUDA_OK(cudaMemcpyAsync(dst, ids.dst[0].data(), count * sizeof(int64_t), cudaMemcpyHostToDevice, s));
    CUDA_OK(cudaGraphLaunch(exec, s));
    CUDA_OK(cudaMemcpyAsync(got.data(), buf.local(), extent, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    auto want = initial;
    kvtest::applyFetchOracle(want, layouts, world.rank(), seed_, ids);
    std::string diff = kvtest::describeMismatch(got, want, mine);
    if (!diff.empty()) {
      ++bad;
      ADD_FAILURE() << "replay " << replay << ": " << diff;
    }
  }
  f.checkErrors();
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
  cudaFree(src);
  cudaFree(dst);
  world.barrier();  // nobody frees a buffer a peer still reads
}

TEST_F(GraphFetch, CapturingAHostIdFetchIsRefused) {
  auto world = kvtest::tcpWorld();
  kvcomm::KvLayout l;
  l.regions.push_back({0, 4096, 0, 64});
  auto buf = kvcomm::SymmetricBuffer::create(world, 1u << 21, 1u << 21, MemoryKind::Cuda);
  auto f = kvcomm::Fetcher::create(buf, l);
  std::vector<int64_t> src{1, 2}, dst{40, 41};
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  std::string message;
  try {
    f.fetch({{(world.rank() + 1) % world.size(), src.data(), dst.data(), 2, 0}}, reinterpret_cast<kvcomm::Stream>(s));
  } catch (const kvcomm::Error& e) {
    message = e.what();
  }
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(s, &graph);
  if (graph) cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
  EXPECT_NE(message.find("cannot be captured"), std::string::npos) << message;
  EXPECT_NE(message.find("fetchDevice"), std::string::npos) << message;
  world.barrier();
}

__global__ void sleepKernel(uint64_t ns) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

// A reused plan keeps its pairs in device memory, uploaded in the order of the stream of its first submit. Here that
// stream is held back (a 50 ms kernel) when the plan is submitted on a second stream at once: the second launch must
// wait for the upload (else it reads pairs not yet there), and both copies land the oracle's bytes.
TEST_F(GraphFetch, ReusedPlanSubmittedOnASecondStreamWaitsForItsPairs) {
  auto world = kvtest::tcpWorld();
  const kvtest::FetchCase c{16 << 10, 2, true, 256};
  size_t most = 0, extent = 0;
  const auto layouts = layoutsFor(world, c, seed_, &most, &extent);
  const kvcomm::KvLayout& mine = layouts[static_cast<size_t>(world.rank())];
  auto buf = kvcomm::SymmetricBuffer::create(world, most, most, MemoryKind::Cuda);
  auto image = kvtest::initialImage(mine, seed_, world.rank(), extent);
  kvtest::toMemory(MemoryKind::Cuda, buf.local(), image.data(), extent);
  auto f = kvcomm::Fetcher::create(buf, mine);
  const auto batch = kvtest::makeFetchBatch(seed_, world.rank(), world.size(), c.numBlocks, 200, 1);
  ASSERT_GT(batch.pairs(), 32u);
  kvcomm::FetchOptions o;
  o.path = kvcomm::FetchPath::Kernel;
  const kvcomm::FetchPlan plan = f.plan(batch.requests(), o);
  world.barrier();  // every source filled
  cudaStream_t a, b;
  CUDA_OK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  sleepKernel<<<1, 1, 0, a>>>(50'000'000);
  CUDA_OK(cudaGetLastError());
  f.submit(plan, reinterpret_cast<kvcomm::Stream>(a));  // the upload waits behind the sleep
  f.submit(plan, reinterpret_cast<kvcomm::Stream>(b));  // must wait for it
  CUDA_OK(cudaStreamSynchronize(b));
  CUDA_OK(cudaStreamSynchronize(a));
  std::vector<uint8_t> got(extent);
  kvtest::fromMemory(MemoryKind::Cuda, got.data(), buf.local(), extent);
  kvtest::applyFetchOracle(image, layouts, world.rank(), seed_, batch);
  EXPECT_EQ(kvtest::describeMismatch(got, image, mine), "");
  f.checkErrors();
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
  world.barrier();  // nobody frees a buffer a peer still reads
}

}  // namespace
