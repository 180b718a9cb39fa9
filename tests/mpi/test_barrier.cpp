// kvcomm::Barrier on its own (host backend in CI; CUDA where a GPU is present): signal/wait order stores into
// peers' memory, lanes are independent, a member that never signals is a bounded, named Timeout.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "kvcomm/barrier.hpp"
#include "kvcomm/error.hpp"
#include "mpi/mpi_util.hpp"
#include "support/expect_error.hpp"
#include "verify/memory.hpp"

namespace {

using kvcomm::Barrier;
using kvcomm::MemoryKind;
using kvcomm::SymmetricBuffer;

class BarrierTest : public kvtest::BackendTest {
 protected:
  Barrier make(kvcomm::Communicator& comm, int lanes = 2, int64_t timeoutMs = -1) {
    kvcomm::BarrierOptions o;
    o.lanes = lanes;
    o.timeoutMs = timeoutMs;
    o.kind = kind_;
    return Barrier::create(comm, o);
  }
};

// Each round one rank (a different one every time) stalls before writing its stamp into every peer's slot; the
// others must still see every stamp after wait(). Without the acquire/wait they would read the old stamp.
TEST_P(BarrierTest, SignalThenWaitMakesEveryPeersStoresVisible) {
  auto comm = kvtest::tcpWorld();
  const int n = comm.size(), me = comm.rank();
  auto buf = SymmetricBuffer::create(comm, 1u << 20, 1u << 20, kind_);
  auto bar = make(comm);
  kvtest::fillMemory(kind_, buf.local(), 0, static_cast<size_t>(n) * 8);
  comm.barrier();
  const uint64_t seed = kvtest::sharedSeed();
  for (int round = 1; round <= 40; ++round) {
    const int lane = round % 2;
    const uint64_t stamp = seed ^ (static_cast<uint64_t>(round) << 32 | static_cast<uint64_t>(me));
    if (round % n == me) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (int p = 0; p < n; ++p)
      kvtest::toMemory(kind_, static_cast<char*>(buf.peer(p)) + static_cast<size_t>(me) * 8, &stamp, 8);
    bar.signal(nullptr, lane);
    // Unrelated work between the halves (the point of the split).
    volatile uint64_t x = 0;
    for (int i = 0; i < 10000; ++i) x = x + static_cast<uint64_t>(i);
    bar.wait(nullptr, lane);
    kvtest::synchronize(kind_);
    std::vector<uint64_t> got(static_cast<size_t>(n));
    kvtest::fromMemory(kind_, got.data(), buf.local(), got.size() * 8);
    for (int p = 0; p < n; ++p)
      ASSERT_EQ(got[static_cast<size_t>(p)], seed ^ (static_cast<uint64_t>(round) << 32 | static_cast<uint64_t>(p)))
          << "round " << round << ": stamp of rank " << p << " not visible after wait()";
    bar.sync(nullptr, lane);  // nobody overwrites the slots before everyone checked them
  }
  kvtest::synchronize(kind_);
  bar.checkErrors();
}

// Lanes are independent sequences: signalling lane 0 and lane 1, then waiting in the other order, works.
TEST_P(BarrierTest, LanesInterleave) {
  auto comm = kvtest::tcpWorld();
  auto bar = make(comm, 3);
  for (int i = 0; i < 50; ++i) {
    bar.signal(nullptr, 0);
    bar.signal(nullptr, 2);
    bar.wait(nullptr, 2);
    bar.sync(nullptr, 1);
    bar.wait(nullptr, 0);
  }
  kvtest::synchronize(kind_);
  bar.checkErrors();
  EXPECT_EQ(bar.lanes(), 3);
  EXPECT_THROW(bar.signal(nullptr, 3), kvcomm::InvalidArgumentError);
  EXPECT_THROW(bar.wait(nullptr, -1), kvcomm::InvalidArgumentError);
}

TEST_P(BarrierTest, MemberThatNeverSignalsIsATimeoutNamingRankPeerAndLane) {
  auto comm = kvtest::tcpWorld();
  if (comm.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  auto bar = make(comm, 2, 300);
  if (comm.rank() == 0) {
    auto t0 = std::chrono::steady_clock::now();
    std::string message;
    try {
      bar.signal(nullptr, 1);
      bar.wait(nullptr, 1);
      kvtest::synchronize(kind_);
      bar.checkErrors();
    } catch (const kvcomm::Error& e) {
      EXPECT_EQ(e.code(), kvcomm::ErrorCode::Timeout) << e.what();
      message = e.what();
    }
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_NE(message.find("rank 0 waited for peer"), std::string::npos) << message;
    EXPECT_NE(message.find("on lane 1"), std::string::npos) << message;
    EXPECT_GE(ms, 250);
    EXPECT_LT(ms, 5000);
  }
  comm.barrier();
}

// A member that leaves (destroys its world: the mesh says goodbye) while the others wait on it: each wait, on the
// host or on the GPU, stops within 5 s (not the 20 s timeout) with a NetworkError naming it as gone; the group stays
// healthy (a departure is not a death).
TEST_P(BarrierTest, AMemberThatLeavesIsNamedByEveryWaitForIt) {
  const int leaver = 1;
  std::string message;
  double ms = 0;
  bool healthy = false;
  {
    auto comm = kvtest::tcpWorld();
    if (comm.size() < 2) GTEST_SKIP() << "needs 2 ranks";
    auto bar = make(comm, 2, 20000);
    bar.sync(nullptr, 0);
    kvtest::synchronize(kind_);
    if (comm.rank() != leaver) {
      auto t0 = std::chrono::steady_clock::now();
      try {
        bar.sync(nullptr, 1);
        kvtest::synchronize(kind_);
        bar.checkErrors();
      } catch (const kvcomm::Error& e) {
        EXPECT_EQ(e.code(), kvcomm::ErrorCode::NetworkError) << e.what();
        message = e.what();
      }
      ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      healthy = comm.healthy();
    }
  }  // the leaver's world goes here, at once; the others' once their wait ended
  MPI_Barrier(MPI_COMM_WORLD);
  int me = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  if (me == leaver) return;
  EXPECT_NE(message.find("rank 1 is gone: it left the group"), std::string::npos) << message;
  EXPECT_LT(ms, 5000) << message;
  EXPECT_TRUE(healthy) << "a departure is not a death";
}

TEST_P(BarrierTest, BadOptionsAreRefused) {
  auto comm = kvtest::tcpWorld();
  kvcomm::BarrierOptions o;
  o.kind = kind_;
  o.lanes = 0;
  EXPECT_THROW(Barrier::create(comm, o), kvcomm::InvalidArgumentError);
  o.lanes = kvcomm::kMaxBarrierLanes + 1;
  EXPECT_THROW(Barrier::create(comm, o), kvcomm::InvalidArgumentError);
  EXPECT_THROW(Barrier().signal(), kvcomm::InvalidArgumentError);
  o.lanes = 2;
  o.kind = static_cast<MemoryKind>(9);  // an integer cast by the caller: refused, not taken for some kind
  try {
    Barrier::create(comm, o);
    ADD_FAILURE() << "MemoryKind 9 accepted";
  } catch (const kvcomm::InvalidArgumentError& e) {
    for (const char* part : {"Barrier::create", "options.kind 9"})
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
  comm.barrier();
}

// A bad option on one member fails create() on every member at once (a vote), naming the member and the option,
// instead of leaving the others in the signal area's exchange until the bootstrap timeout (120 s by default).
TEST_P(BarrierTest, ABadOptionOnOneMemberFailsEveryMemberAtOnce) {
  auto comm = kvtest::tcpWorld();
  if (comm.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int last = comm.size() - 1;
  auto t0 = std::chrono::steady_clock::now();
  kvtest::expectError([&] { (void)make(comm, comm.rank() == last ? 0 : 2); }, kvcomm::ErrorCode::InvalidArgument,
                      {"Barrier::create", "lanes 0 outside [1, 8]"});
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  // Valid but different lane counts: a lane only some members have would never be answered on the others.
  kvtest::expectError([&] { (void)make(comm, comm.rank() == last ? 4 : 2); }, kvcomm::ErrorCode::InvalidArgument,
                      {"Barrier::create", "lanes must be the same on every member",
                       "world rank " + std::to_string(comm.worldRank(last)) + " has 4",
                       "world rank " + std::to_string(comm.worldRank(0)) + " has 2"});
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  comm.barrier();
  Barrier ok = make(comm, 3);  // the group is still usable
  ok.sync(nullptr, 2);
  kvtest::synchronize(kind_);
  ok.checkErrors();
  comm.barrier();
}

// Timeouts beyond a day are a day: INT64_MAX ms (and values whose nanoseconds wrap 64 bits) used to become an
// instant timeout. Rank 0 arrives late, so every other member waits.
TEST_P(BarrierTest, HugeTimeoutsDoNotWrapIntoAnInstantTimeout) {
  auto comm = kvtest::tcpWorld();
  if (comm.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  for (int64_t ms : {INT64_MAX, int64_t{18446744073710}, int64_t{86400001}}) {
    Barrier bar = make(comm, 2, ms);
    for (int lane : {0, 1}) {
      if (comm.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      bar.sync(nullptr, lane);
      kvtest::synchronize(kind_);
      EXPECT_NO_THROW(bar.checkErrors()) << "timeoutMs " << ms;
    }
    comm.barrier();
  }
}

// What a kernel records reaches the host as documented: each kind written into the barrier's record (the one device
// functions write through deviceHandle().error, in the signal area's memory) is read back once by pollError() and
// thrown by checkErrors() with its code and wording.
TEST_P(BarrierTest, RecordedDeviceErrorsAreReadOnceAndThrownAsDocumented) {
  auto comm = kvtest::tcpWorld();
  Barrier bar = make(comm);
  kvcomm::DeviceErrorRecord* rec = bar.deviceHandle().error;
  auto record = [&](kvcomm::DeviceErrorKind kind, int peer, int lane) {
    const kvcomm::DeviceErrorRecord r{1, static_cast<int32_t>(kind), -1, -1, -1, comm.rank(), peer, lane};
    kvtest::toMemory(kind_, rec, &r, sizeof(r));
  };
  record(kvcomm::DeviceErrorKind::LaneOutOfRange, -1, 9);
  kvcomm::DeviceError e = bar.pollError();
  EXPECT_EQ(e.kind, kvcomm::DeviceErrorKind::LaneOutOfRange);
  EXPECT_EQ(e.lane, 9);
  EXPECT_EQ(e.rank, comm.rank());
  EXPECT_EQ(bar.pollError().kind, kvcomm::DeviceErrorKind::None) << "pollError did not clear the record";
  record(kvcomm::DeviceErrorKind::LaneOutOfRange, -1, 9);
  kvtest::expectError(
      [&] { bar.checkErrors(); }, kvcomm::ErrorCode::InvalidArgument,
      {"barrier (device)", "rank " + std::to_string(comm.rank()), "on lane 9", "outside the barrier's lanes"});
  EXPECT_NO_THROW(bar.checkErrors()) << "checkErrors did not clear the record";
  record(kvcomm::DeviceErrorKind::BarrierTimeout, 1, 1);
  kvtest::expectError([&] { bar.checkErrors(); }, kvcomm::ErrorCode::Timeout,
                      {"barrier (device)", "waited for peer 1 on lane 1"});
  comm.barrier();
}

// Every method of an empty (default-constructed or moved-from) Barrier throws InvalidArgumentError naming it
// ("empty barrier"); the accessors used to dereference null.
TEST_P(BarrierTest, EveryMethodOfAnEmptyBarrierThrows) {
  auto comm = kvtest::tcpWorld();
  Barrier made = make(comm);
  Barrier taken = std::move(made);
  EXPECT_EQ(taken.lanes(), 2);
  Barrier fresh;
  for (Barrier* b : {&fresh, &made}) {
    EXPECT_FALSE(b->valid());
    auto empty = [&](const std::function<void()>& f, const char* call) {
      kvtest::expectError(f, kvcomm::ErrorCode::InvalidArgument, {call, "empty barrier"});
    };
    empty([&] { (void)b->lanes(); }, "Barrier::lanes");
    empty([&] { (void)b->kind(); }, "Barrier::kind");
    empty([&] { (void)b->communicator(); }, "Barrier::communicator");
    empty([&] { (void)b->deviceHandle(); }, "Barrier::deviceHandle");
    empty([&] { (void)b->pollError(); }, "Barrier::pollError");
    empty([&] { b->checkErrors(); }, "Barrier::checkErrors");
    empty([&] { b->sync(); }, "Barrier::sync");
    empty([&] { b->signal(); }, "Barrier::signal");
    empty([&] { b->wait(); }, "Barrier::wait");
  }
  comm.barrier();
}

INSTANTIATE_TEST_SUITE_P(Backends, BarrierTest, ::testing::Values(MemoryKind::Host, MemoryKind::Cuda),
                         kvtest::kindName);

}  // namespace
