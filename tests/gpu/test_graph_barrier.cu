// kvcomm::Barrier on GPUs (mpirun -np 2): split signal/wait captured in a CUDA graph and replayed 1,000 times with
// new values stored into peers before every replay (each replay's view checked), two lanes on two streams, and the
// device API's scoped primitives (thread, warp, block; ordered and relaxed) inside an engine-style kernel.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "kvcomm/barrier.hpp"
#include "kvcomm/device/barrier.hpp"
#include "kvcomm/symm.hpp"
#include "mpi/mpi_util.hpp"
#include "support/expect_error.hpp"
#include "verify/memory.hpp"

namespace {

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

// Every member's slot `me` of `slots` (an area of the buffer) gets *value.
__global__ void stampKernel(kvcomm::SymmDeviceHandle h, uint64_t area, const uint64_t* value) {
  int r = static_cast<int>(threadIdx.x);
  if (r < h.size && h.isMapped(r)) reinterpret_cast<uint64_t*>(h.peer(r) + area)[h.rank] = *value;
}

// out[r] = this rank's slot r.
__global__ void collectKernel(kvcomm::SymmDeviceHandle h, uint64_t area, uint64_t* out) {
  int r = static_cast<int>(threadIdx.x);
  if (r < h.size) out[r] = reinterpret_cast<const uint64_t*>(h.local() + area)[r];
}

// One engine-style kernel: stamp every peer, barrier at scope S, read every peer's stamp into out.
template <kvcomm::BarrierScope S>
__global__ void scopedKernel(kvcomm::SymmDeviceHandle h, uint64_t area, kvcomm::BarrierDeviceHandle b, int lane,
                             uint64_t value, int relaxedProbe, uint64_t* out) {
  const bool caller =
      S == kvcomm::BarrierScope::Block || (S == kvcomm::BarrierScope::Warp && threadIdx.x < 32) || threadIdx.x == 0;
  if (!caller) return;
  int t = S == kvcomm::BarrierScope::Thread ? 0 : static_cast<int>(threadIdx.x);
  int step = S == kvcomm::BarrierScope::Thread ? 1 : (S == kvcomm::BarrierScope::Warp ? 32 : blockDim.x);
  for (int r = t; r < h.size; r += step)
    if (h.isMapped(r)) reinterpret_cast<uint64_t*>(h.peer(r) + area)[h.rank] = value;
  kvcomm::BarrierOrder order = relaxedProbe ? kvcomm::BarrierOrder::Relaxed : kvcomm::BarrierOrder::Ordered;
  kvcomm::barrierSignalScope<S>(b, lane, order);
  kvcomm::barrierWaitScope<S>(b, lane, order);
  for (int r = t; r < h.size; r += step) out[r] = reinterpret_cast<const uint64_t*>(h.local() + area)[r];
}

// Signal then wait at scope S and order `relaxed` on `lane`; ok[thread] = what the wait returned. Block scope also
// runs the split block functions and the two-argument barrierBlock.
template <kvcomm::BarrierScope S>
__global__ void signalWaitKernel(kvcomm::BarrierDeviceHandle b, int lane, int relaxed, int* ok) {
  const bool caller =
      S == kvcomm::BarrierScope::Block || (S == kvcomm::BarrierScope::Warp && threadIdx.x < 32) || threadIdx.x == 0;
  if (!caller) return;
  kvcomm::BarrierOrder order = relaxed ? kvcomm::BarrierOrder::Relaxed : kvcomm::BarrierOrder::Ordered;
  kvcomm::barrierSignalScope<S>(b, lane, order);
  ok[threadIdx.x] = kvcomm::barrierWaitScope<S>(b, lane, order) ? 1 : 0;
  if constexpr (S == kvcomm::BarrierScope::Block) {
    kvcomm::barrierSignalBlock(b, lane);
    kvcomm::barrierWaitBlock(b, lane);
    kvcomm::barrierBlock(b, lane);
  }
}

uint64_t valueOf(uint64_t seed, int replay, int rank) {
  return seed ^ (static_cast<uint64_t>(replay) << 20) ^ static_cast<uint64_t>(rank + 1);
}

class GraphBarrier : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kvtest::haveGpu()) GTEST_SKIP() << "CUDA barrier tests skipped: " << kvtest::noGpuReason();
    if (kvtest::worldSize() < 2) GTEST_SKIP() << "needs 2 ranks";
    seed_ = kvtest::sharedSeed();
  }
  uint64_t seed_ = 0;
};

TEST_F(GraphBarrier, ThousandReplaysOfSplitSignalWaitWithNewValues) {
  auto world = kvtest::tcpWorld();
  const int n = world.size(), me = world.rank();
  auto buf = kvcomm::SymmetricBuffer::create(world, 1u << 21, 1u << 21, kvcomm::MemoryKind::Cuda);
  kvcomm::BarrierOptions o;
  o.kind = kvcomm::MemoryKind::Cuda;
  auto bar = kvcomm::Barrier::create(world, o);
  const kvcomm::SymmDeviceHandle h = buf.deviceHandle();
  uint64_t *value = nullptr, *out = nullptr;
  CUDA_OK(cudaMalloc(&value, 8));
  CUDA_OK(cudaMalloc(&out, 8 * n));
  cudaStream_t s;
  CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto ks = reinterpret_cast<kvcomm::Stream>(s);
  cudaGraph_t g;
  CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  stampKernel<<<1, 32, 0, s>>>(h, 0, value);
  bar.signal(ks, 0);
  bar.wait(ks, 0);  // after this every member's stamp of this replay is here
  collectKernel<<<1, 32, 0, s>>>(h, 0, out);
  bar.sync(ks, 0);  // nobody stamps the next replay before everyone collected this one
  CUDA_OK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t exec;
  CUDA_OK(cudaGraphInstantiate(&exec, g, 0));
  std::vector<uint64_t> got(static_cast<size_t>(n));
  int bad = 0;
  for (int replay = 0; replay < 1000 && bad < 3; ++replay) {
    uint64_t v = valueOf(seed_, replay, me);
    CUDA_OK(cudaMemcpyAsync(value, &v, 8, cudaMemcpyHostToDevice, s));
    CUDA_OK(cudaGraphLaunch(exec, s));
    CUDA_OK(cudaMemcpyAsync(got.data(), out, 8 * n, cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaStreamSynchronize(s));
    for (int r = 0; r < n; ++r)
      if (got[static_cast<size_t>(r)] != valueOf(seed_, replay, r))
        ADD_FAILURE() << "replay " << replay << ": rank " << r << "'s stamp not visible after wait()", ++bad;
  }
  bar.checkErrors();
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
  cudaFree(value);
  cudaFree(out);
  world.barrier();
}

TEST_F(GraphBarrier, TwoLanesOnTwoStreams) {
  auto world = kvtest::tcpWorld();
  const int n = world.size(), me = world.rank();
  auto buf = kvcomm::SymmetricBuffer::create(world, 1u << 21, 1u << 21, kvcomm::MemoryKind::Cuda);
  auto bar = kvcomm::Barrier::create(world, {2, -1, kvcomm::MemoryKind::Cuda});
  const kvcomm::SymmDeviceHandle h = buf.deviceHandle();
  cudaStream_t st[2];
  uint64_t* value[2];
  uint64_t* out[2];
  for (int l = 0; l < 2; ++l) {
    CUDA_OK(cudaStreamCreateWithFlags(&st[l], cudaStreamNonBlocking));
    CUDA_OK(cudaMalloc(&value[l], 8));
    CUDA_OK(cudaMalloc(&out[l], 8 * n));
  }
  std::vector<uint64_t> got(static_cast<size_t>(n));
  for (int step = 0; step < 200; ++step) {
    for (int l = 0; l < 2; ++l) {  // each lane its own area (offset 4 KiB apart) and stream
      uint64_t v = valueOf(seed_ + static_cast<uint64_t>(l), step, me);
      CUDA_OK(cudaMemcpyAsync(value[l], &v, 8, cudaMemcpyHostToDevice, st[l]));
      stampKernel<<<1, 32, 0, st[l]>>>(h, 4096u * l, value[l]);
      bar.signal(reinterpret_cast<kvcomm::Stream>(st[l]), l);
    }
    for (int l = 1; l >= 0; --l) {
      bar.wait(reinterpret_cast<kvcomm::Stream>(st[l]), l);
      collectKernel<<<1, 32, 0, st[l]>>>(h, 4096u * l, out[l]);
      bar.sync(reinterpret_cast<kvcomm::Stream>(st[l]), l);
    }
    for (int l = 0; l < 2; ++l) {
      CUDA_OK(cudaMemcpyAsync(got.data(), out[l], 8 * n, cudaMemcpyDeviceToHost, st[l]));
      CUDA_OK(cudaStreamSynchronize(st[l]));
      for (int r = 0; r < n; ++r)
        ASSERT_EQ(got[static_cast<size_t>(r)], valueOf(seed_ + static_cast<uint64_t>(l), step, r))
            << "step " << step << " lane " << l << " rank " << r;
    }
  }
  bar.checkErrors();
  for (int l = 0; l < 2; ++l) {
    cudaStreamDestroy(st[l]);
    cudaFree(value[l]);
    cudaFree(out[l]);
  }
  world.barrier();
}

TEST_F(GraphBarrier, ScopedDevicePrimitivesInsideAnEngineKernel) {
  auto world = kvtest::tcpWorld();
  const int n = world.size(), me = world.rank();
  auto buf = kvcomm::SymmetricBuffer::create(world, 1u << 21, 1u << 21, kvcomm::MemoryKind::Cuda);
  auto bar = kvcomm::Barrier::create(world, {3, -1, kvcomm::MemoryKind::Cuda});
  const kvcomm::SymmDeviceHandle h = buf.deviceHandle();
  const kvcomm::BarrierDeviceHandle b = bar.deviceHandle();
  uint64_t* out = nullptr;
  CUDA_OK(cudaMalloc(&out, 8 * n));
  std::vector<uint64_t> got(static_cast<size_t>(n));
  for (int step = 0; step < 300; ++step) {
    const int scope = step % 3;  // thread, warp, block; a lane each
    const uint64_t area = 4096u * scope;
    uint64_t v = valueOf(seed_, step, me);
    if (scope == 0) scopedKernel<kvcomm::BarrierScope::Thread><<<1, 64, 0, 0>>>(h, area, b, 0, v, 0, out);
    if (scope == 1) scopedKernel<kvcomm::BarrierScope::Warp><<<1, 64, 0, 0>>>(h, area, b, 1, v, 0, out);
    if (scope == 2) scopedKernel<kvcomm::BarrierScope::Block><<<1, 64, 0, 0>>>(h, area, b, 2, v, 0, out);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaMemcpy(got.data(), out, 8 * n, cudaMemcpyDeviceToHost));
    for (int r = 0; r < n; ++r)
      ASSERT_EQ(got[static_cast<size_t>(r)], valueOf(seed_, step, r)) << "step " << step << " scope " << scope;
    bar.sync(nullptr, scope);  // nobody stamps this area again before everyone read it
  }
  // The relaxed order still rendezvous (arrival only): it must not hang or time out.
  scopedKernel<kvcomm::BarrierScope::Warp><<<1, 32, 0, 0>>>(h, 0, b, 1, 7, 1, out);
  CUDA_OK(cudaDeviceSynchronize());
  bar.checkErrors();
  cudaFree(out);
  world.barrier();
}

// A device wait stops when the group fails, in either order (the relaxed wait once polled only its timeout): rank 0
// of a group whose other members never signal is aborted 300 ms in; the kernel ends within 2 s of the 20 s timeout
// and checkErrors() throws Aborted.
TEST_F(GraphBarrier, DeviceWaitsOfBothOrdersStopWhenTheGroupIsAborted) {
  auto world = kvtest::tcpWorld();
  for (int relaxed : {0, 1}) {
    auto comm = world.split(0, world.rank());  // aborted on rank 0 only; world stays for the test's own sync
    auto bar = kvcomm::Barrier::create(*comm, {2, 20000, kvcomm::MemoryKind::Cuda});
    world.barrier();
    if (world.rank() == 0) {
      int* ok = nullptr;
      CUDA_OK(cudaMalloc(&ok, sizeof(int) * 32));
      CUDA_OK(cudaMemset(ok, 0x7f, sizeof(int) * 32));
      auto start = std::chrono::steady_clock::now();
      signalWaitKernel<kvcomm::BarrierScope::Warp><<<1, 32>>>(bar.deviceHandle(), 1, relaxed, ok);
      CUDA_OK(cudaGetLastError());
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      comm->abort();
      CUDA_OK(cudaDeviceSynchronize());
      double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_LT(secs, 2.3) << (relaxed ? "relaxed" : "ordered") << " wait did not stop at the abort";
      std::vector<int> got(32);
      CUDA_OK(cudaMemcpy(got.data(), ok, sizeof(int) * 32, cudaMemcpyDeviceToHost));
      EXPECT_EQ(got[1], 0) << "the wait for member 1 reported success";
      kvtest::expectError([&] { bar.checkErrors(); }, kvcomm::ErrorCode::Aborted, {"aborted"});
      cudaFree(ok);
    }
    world.barrier();
  }
}

// Device calls on a lane outside [0, lanes) record LaneOutOfRange and do nothing: a lane of 8 or more used to write
// past the flag area into the peers' epochs, so the barriers after them (on every lane) still meet.
TEST_F(GraphBarrier, DeviceCallsOnALaneOutsideTheBarrierAreRecordedAndDoNothing) {
  auto world = kvtest::tcpWorld();
  auto bar = kvcomm::Barrier::create(world, {2, 3000, kvcomm::MemoryKind::Cuda});
  int* ok = nullptr;
  CUDA_OK(cudaMalloc(&ok, sizeof(int) * 64));
  for (int lane : {2, 7, 8, 9, 40, -1}) {
    for (int scope = 0; scope < 3; ++scope) {
      CUDA_OK(cudaMemset(ok, 0x7f, sizeof(int) * 64));
      if (scope == 0) signalWaitKernel<kvcomm::BarrierScope::Thread><<<1, 64>>>(bar.deviceHandle(), lane, 0, ok);
      if (scope == 1) signalWaitKernel<kvcomm::BarrierScope::Warp><<<1, 64>>>(bar.deviceHandle(), lane, 1, ok);
      if (scope == 2) signalWaitKernel<kvcomm::BarrierScope::Block><<<1, 64>>>(bar.deviceHandle(), lane, 0, ok);
      CUDA_OK(cudaDeviceSynchronize());
      int got = 1;
      CUDA_OK(cudaMemcpy(&got, ok, sizeof(int), cudaMemcpyDeviceToHost));
      EXPECT_EQ(got, 0) << "lane " << lane << " scope " << scope << ": the wait reported success";
      kvtest::expectError([&] { bar.checkErrors(); }, kvcomm::ErrorCode::InvalidArgument,
                          {"barrier (device)", "on lane " + std::to_string(lane), "outside the barrier's lanes"});
    }
  }
  world.barrier();  // every member made its bad calls; now every lane must still meet in step
  for (int round = 0; round < 3; ++round)
    for (int lane : {0, 1}) {
      signalWaitKernel<kvcomm::BarrierScope::Thread><<<1, 32>>>(bar.deviceHandle(), lane, 0, ok);
      bar.sync(nullptr, lane);
    }
  CUDA_OK(cudaDeviceSynchronize());
  int got = 0;
  CUDA_OK(cudaMemcpy(&got, ok, sizeof(int), cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, 1);
  EXPECT_NO_THROW(bar.checkErrors());
  cudaFree(ok);
  world.barrier();
}

}  // namespace
