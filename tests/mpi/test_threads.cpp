// Communicators of one world driven from several threads at once (each communicator by one thread): no deadlock,
// exact bytes, on a TcpBootstrap world and on a world over MPI (the mesh built through another bootstrap).
#include <gtest/gtest.h>
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "kvcomm/error.hpp"
#include "mpi/mpi_util.hpp"
#include "verify/memory.hpp"

namespace {

// `steps` allgathers of growing size on `comm`, checking every byte; returns "" or what went wrong.
std::string allgatherLoop(kvcomm::Communicator& comm, int steps, uint64_t seed) {
  try {
    for (int s = 0; s < steps; ++s) {
      size_t bytes = (static_cast<size_t>(s) * 7919) % (256u << 10) + 1;  // up to 256 KiB per rank: full buffers
      std::vector<uint8_t> all(bytes * static_cast<size_t>(comm.size()));
      auto mine = kvtest::pattern(seed + static_cast<uint64_t>(s), static_cast<uint64_t>(comm.rank()), bytes);
      std::copy(mine.begin(), mine.end(), all.begin() + static_cast<ptrdiff_t>(bytes * comm.rank()));
      comm.allgather(all.data(), bytes);
      for (int r = 0; r < comm.size(); ++r)
        if (!std::equal(all.begin() + static_cast<ptrdiff_t>(bytes * r),
                        all.begin() + static_cast<ptrdiff_t>(bytes * (r + 1)),
                        kvtest::pattern(seed + static_cast<uint64_t>(s), static_cast<uint64_t>(r), bytes).begin()))
          return "step " + std::to_string(s) + ": rank " + std::to_string(r) + "'s bytes differ";
    }
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

void twoThreadsTwoGroups(kvcomm::Communicator& world) {
  uint64_t seed = kvtest::sharedSeed();
  auto sameMembers = world.split(0, world.rank());            // every member, another group
  auto halves = world.split(world.rank() % 2, world.rank());  // a third group on a third thread
  world.barrier();
  std::string errA, errB, errC;
  auto start = std::chrono::steady_clock::now();
  std::thread a([&] { errA = allgatherLoop(world, 150, seed); });
  std::thread b([&] { errB = allgatherLoop(*sameMembers, 150, seed + 1000); });
  std::thread c([&] { errC = allgatherLoop(*halves, 150, seed + 2000); });
  a.join();
  b.join();
  c.join();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(errA, "");
  EXPECT_EQ(errB, "");
  EXPECT_EQ(errC, "");
  EXPECT_LT(secs, 60.0) << "threads on different communicators of one world held each other up";
  world.barrier();
}

TEST(Threads, CommunicatorsOfOneTcpWorldRunConcurrently) {
  auto world = kvtest::tcpWorld();
  twoThreadsTwoGroups(world);
}

TEST(Threads, CommunicatorsOfOneMpiWorldRunConcurrently) {
  auto world = kvcomm::Communicator::create(std::make_shared<kvcomm::MpiBootstrap>(MPI_COMM_WORLD));
  twoThreadsTwoGroups(world);
}

}  // namespace
