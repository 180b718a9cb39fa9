// publish + barrier inside CUDA graphs (mpirun -np 2 on the GPU machine): 1,000 replays with new inputs written
// between replays, every replay's bytes checked against the gather-then-insert oracle; two lanes on two streams.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <vector>

#include "kvcomm/error.hpp"
#include "kvcomm/publish.hpp"
#include "mpi/mpi_util.hpp"
#include "verify/memory.hpp"
#include "verify/publish_oracle.hpp"

namespace {

using kvcomm::MemoryKind;
using kvtest::CacheLayout;

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

// Device copies of one rank's inputs at fixed addresses (what a captured graph reads on every replay).
struct Fixed {
  std::vector<char*> rows;
  int64_t* slots = nullptr;
  std::vector<kvcomm::CacheTensor> tensors;
  size_t tokens = 0;
  Fixed(const kvtest::Geometry& g, const kvtest::Inputs& in) : tokens(in.slots.size()) {
    for (size_t k = 0; k < g.tensors.size(); ++k) {
      char* p = nullptr;
      cudaMalloc(&p, in.rows[k].size());
      rows.push_back(p);
      kvcomm::CacheTensor t = g.tensors[k];
      t.src = p;
      t.srcStride = in.srcStride[k];
      tensors.push_back(t);
    }
    cudaMalloc(&slots, tokens * sizeof(int64_t));
  }
  ~Fixed() {
    for (char* p : rows) cudaFree(p);
    cudaFree(slots);
  }
  void load(const kvtest::Inputs& in, cudaStream_t s) {
    for (size_t k = 0; k < rows.size(); ++k)
      cudaMemcpyAsync(rows[k], in.rows[k].data(), in.rows[k].size(), cudaMemcpyHostToDevice, s);
    cudaMemcpyAsync(slots, in.slots.data(), tokens * sizeof(int64_t), cudaMemcpyHostToDevice, s);
  }
};

class GraphPublish : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kvtest::haveGpu()) GTEST_SKIP() << "CUDA graph tests skipped: " << kvtest::noGpuReason();
    if (kvtest::worldSize() < 2) GTEST_SKIP() << "needs 2 ranks";
    seed_ = kvtest::sharedSeed();
  }
  std::vector<uint8_t> local(const kvcomm::SymmetricBuffer& buf, size_t bytes) {
    std::vector<uint8_t> v(bytes);
    cudaMemcpy(v.data(), buf.local(), bytes, cudaMemcpyDeviceToHost);
    return v;
  }
  uint64_t seed_ = 0;
};

TEST_F(GraphPublish, ThousandReplaysWithNewInputsEveryReplay) {
  auto world = kvtest::tcpWorld();
  auto buf = kvcomm::SymmetricBuffer::create(world, 32u << 20, 32u << 20, MemoryKind::Cuda);
  auto pub = kvcomm::Publisher::create(buf);
  ASSERT_EQ(pub.mode(), kvcomm::PublishMode::Direct) << pub.modeReason();
  const size_t tokens = 64;
  auto g = kvtest::makeGeometry(CacheLayout::Flat, 656, world.size() * tokens * 24);
  kvtest::fillMemory(MemoryKind::Cuda, buf.local(), kvtest::kPoison, g.regionBytes);
  std::vector<uint8_t> want(g.regionBytes, kvtest::kPoison);
  Fixed in(g, kvtest::makeInputs(seed_, world.rank(), world.size(), tokens, g, 1));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // Three graphs: publish then barrier (two kernels), the fused kernel, and the fused publish + signal then the wait;
  // replays rotate among them.
  cudaGraphExec_t exec[3];
  for (int how = 0; how < 3; ++how) {
    cudaGraph_t graph;
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    if (how == 0) {
      pub.publish(in.tensors, {in.slots, kvcomm::SlotType::Int64, tokens}, tokens, s);
      pub.barrier().sync(s, 0);
    } else if (how == 1) {
      pub.publish(in.tensors, {in.slots, kvcomm::SlotType::Int64, tokens}, tokens, s, kvcomm::PublishThen::Barrier);
    } else {
      pub.publish(in.tensors, {in.slots, kvcomm::SlotType::Int64, tokens}, tokens, s, kvcomm::PublishThen::Signal);
      pub.barrier().wait(s, 0);
    }
    CUDA_OK(cudaStreamEndCapture(s, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec[how], graph, 0));
    cudaGraphDestroy(graph);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  for (int replay = 0; replay < 1000; ++replay) {
    auto mine = kvtest::makeInputs(seed_, world.rank(), world.size(), tokens, g, replay + 1);
    in.load(mine, s);
    CUDA_OK(cudaGraphLaunch(exec[replay % 3], s));
    CUDA_OK(cudaStreamSynchronize(s));
    for (int r = 0; r < world.size(); ++r)
      kvtest::applyOracle(want, g, kvtest::makeInputs(seed_, r, world.size(), tokens, g, replay + 1));
    ASSERT_EQ(local(buf, g.regionBytes), want) << "replay " << replay;
    MPI_Barrier(MPI_COMM_WORLD);  // no peer starts the next replay before everyone checked
  }
  pub.checkErrors();
  for (auto e : exec) cudaGraphExecDestroy(e);
  cudaStreamDestroy(s);
}

TEST_F(GraphPublish, CapturedPublishFollowsGrowthAndRefusesReleasedRanges) {
  auto world = kvtest::tcpWorld();
  auto probe = kvcomm::SymmetricBuffer::create(world, 1, 1, MemoryKind::Cuda);
  const size_t g = probe.granularity();
  auto buf = kvcomm::SymmetricBuffer::create(world, 8 * g, g, MemoryKind::Cuda);
  auto pub = kvcomm::Publisher::create(buf);
  // Rows land in [g, 3g): not backed when the graph is captured.
  const size_t tokens = 256, rowBytes = 656;
  kvtest::Geometry geom;
  geom.tensors = {kvcomm::CacheTensor{nullptr, 0, rowBytes, 0, 1, rowBytes, rowBytes}};
  geom.slots = (3 * g) / rowBytes;
  geom.regionBytes = 3 * g;
  auto mine = kvtest::makeInputs(seed_, world.rank(), world.size(), tokens, geom);
  const int64_t first = static_cast<int64_t>(g / rowBytes) + 1;  // the first slot wholly past the first granule
  for (size_t i = 0; i < tokens; ++i) mine.slots[i] = first + static_cast<int64_t>(world.rank() * tokens + i);
  Fixed in(geom, mine);
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  in.load(mine, s);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  pub.publish(in.tensors, {in.slots, kvcomm::SlotType::Int64, tokens}, tokens, s);
  pub.barrier().sync(s, 0);
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  // Before growth: every row is refused on the device and reported.
  CUDA_OK(cudaGraphLaunch(exec, s));
  CUDA_OK(cudaStreamSynchronize(s));
  EXPECT_THROW(pub.checkErrors(), kvcomm::InvalidArgumentError);
  // After growth: the same graph stores the rows.
  buf.grow(4 * g);
  kvtest::fillMemory(MemoryKind::Cuda, buf.local(), kvtest::kPoison, 4 * g);
  MPI_Barrier(MPI_COMM_WORLD);
  CUDA_OK(cudaGraphLaunch(exec, s));
  CUDA_OK(cudaStreamSynchronize(s));
  pub.checkErrors();
  MPI_Barrier(MPI_COMM_WORLD);
  std::vector<uint8_t> want(4 * g, kvtest::kPoison);
  for (int r = 0; r < world.size(); ++r) {
    auto x = kvtest::makeInputs(seed_, r, world.size(), tokens, geom);
    for (size_t i = 0; i < tokens; ++i) x.slots[i] = first + static_cast<int64_t>(r * tokens + i);
    kvtest::applyOracle(want, geom, x);
  }
  EXPECT_EQ(local(buf, 4 * g), want);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

TEST_F(GraphPublish, TwoLanesOnTwoStreamsInterleaved) {
  auto world = kvtest::tcpWorld();
  auto buf = kvcomm::SymmetricBuffer::create(world, 32u << 20, 32u << 20, MemoryKind::Cuda);
  auto pub = kvcomm::Publisher::create(buf);
  const size_t tokens = 128;
  auto a = kvtest::makeGeometry(CacheLayout::Flat, 656, world.size() * tokens * 8, 0);
  auto b = kvtest::makeGeometry(CacheLayout::BlockSplit, 132, world.size() * tokens * 8,
                                (a.regionBytes + 4095) / 4096 * 4096);
  kvtest::fillMemory(MemoryKind::Cuda, buf.local(), kvtest::kPoison, b.regionBytes);
  std::vector<uint8_t> want(b.regionBytes, kvtest::kPoison);
  Fixed ia(a, kvtest::makeInputs(seed_, world.rank(), world.size(), tokens, a, 1));
  Fixed ib(b, kvtest::makeInputs(seed_, world.rank(), world.size(), tokens, b, 2));
  cudaStream_t sa, sb;
  CUDA_OK(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
  CUDA_OK(cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking));
  MPI_Barrier(MPI_COMM_WORLD);
  for (int step = 0; step < 200; ++step) {
    ia.load(kvtest::makeInputs(seed_, world.rank(), world.size(), tokens, a, 2 * step + 1), sa);
    ib.load(kvtest::makeInputs(seed_, world.rank(), world.size(), tokens, b, 2 * step + 2), sb);
    // Micro-batch A on lane 0 (stream A) and B on lane 1 (stream B), launched alternately and running concurrently.
    pub.publish(ia.tensors, {ia.slots, kvcomm::SlotType::Int64, tokens}, tokens, sa);
    pub.publish(ib.tensors, {ib.slots, kvcomm::SlotType::Int64, tokens}, tokens, sb);
    pub.barrier().sync(sb, 1);
    pub.barrier().sync(sa, 0);
    CUDA_OK(cudaStreamSynchronize(sa));
    CUDA_OK(cudaStreamSynchronize(sb));
    for (int r = 0; r < world.size(); ++r) {
      kvtest::applyOracle(want, a, kvtest::makeInputs(seed_, r, world.size(), tokens, a, 2 * step + 1));
      kvtest::applyOracle(want, b, kvtest::makeInputs(seed_, r, world.size(), tokens, b, 2 * step + 2));
    }
    ASSERT_EQ(local(buf, b.regionBytes), want) << "step " << step;
    MPI_Barrier(MPI_COMM_WORLD);
  }
  pub.checkErrors();
  cudaStreamDestroy(sa);
  cudaStreamDestroy(sb);
}

TEST_F(GraphPublish, FallbackCapturedInAGraph) {
  auto world = kvtest::tcpWorld();
  if (!kvtest::distinctGpus(world)) GTEST_SKIP() << "ranks share a GPU here; NCCL needs one GPU per rank";
  auto buf = kvcomm::SymmetricBuffer::create(world, 16u << 20, 16u << 20, MemoryKind::Cuda);
  setenv("KVCOMM_DIRECT", "0", 1);
  auto pub = kvcomm::Publisher::create(buf);
  unsetenv("KVCOMM_DIRECT");
  ASSERT_EQ(pub.mode(), kvcomm::PublishMode::Fallback);
  const size_t tokens = 256;
  auto g = kvtest::makeGeometry(CacheLayout::BlockSplit, 656, world.size() * tokens * 8);
  kvtest::fillMemory(MemoryKind::Cuda, buf.local(), kvtest::kPoison, g.regionBytes);
  std::vector<uint8_t> want(g.regionBytes, kvtest::kPoison);
  Fixed in(g, kvtest::makeInputs(seed_, world.rank(), world.size(), tokens, g, 1));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  pub.publish(in.tensors, {in.slots, kvcomm::SlotType::Int64, tokens}, tokens, s, kvcomm::PublishThen::Barrier);
  CUDA_OK(cudaStreamEndCapture(s, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  MPI_Barrier(MPI_COMM_WORLD);
  for (int replay = 0; replay < 100; ++replay) {
    in.load(kvtest::makeInputs(seed_, world.rank(), world.size(), tokens, g, replay + 1), s);
    CUDA_OK(cudaGraphLaunch(exec, s));
    CUDA_OK(cudaStreamSynchronize(s));
    for (int r = 0; r < world.size(); ++r)
      kvtest::applyOracle(want, g, kvtest::makeInputs(seed_, r, world.size(), tokens, g, replay + 1));
    ASSERT_EQ(local(buf, g.regionBytes), want) << "replay " << replay;
    MPI_Barrier(MPI_COMM_WORLD);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(s);
}

}  // namespace
