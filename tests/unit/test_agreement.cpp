// The group agreement step (comm/agreement.hpp): every member goes on, or every member throws the same error.
// Four real processes (fork + TCP bootstrap).
#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <new>
#include <string>

#include "comm/agreement.hpp"
#include "kvcomm/bootstrap.hpp"
#include "kvcomm/comm.hpp"
#include "kvcomm/error.hpp"
#include "support/processes.hpp"

namespace {

using kvcomm::detail::allSucceed;
using kvcomm::detail::allSucceedOrUndo;

// Runs `body(comm)` on 4 forked ranks of one communicator; each returns whether its checks held.
void onFourRanks(const std::function<bool(kvcomm::Communicator&)>& body) {
  kvcomm::UniqueId id = kvcomm::TcpBootstrap::createUniqueId();
  auto codes = kvtest::runProcesses(4, [&](int rank) {
    auto comm = kvcomm::Communicator::create(std::make_shared<kvcomm::TcpBootstrap>(id, rank, 4, 20000));
    return body(comm);
  });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(codes[static_cast<size_t>(r)], 0) << "rank " << r;
}

TEST(Agreement, EveryMemberGoesOnWhenEveryMemberSucceeds) {
  onFourRanks([](kvcomm::Communicator& comm) {
    int ran = 0;
    allSucceed(comm, "test step", [&] { ++ran; });
    return ran == 1;
  });
}

// A std::bad_alloc on one rank (not a kvcomm::Error) still reaches the vote: every rank throws at once instead of
// waiting for the bootstrap timeout, with the failed rank, the cause and errno ENOMEM.
TEST(Agreement, NonKvcommExceptionOnOneRankFailsEveryRankAtOnce) {
  onFourRanks([](kvcomm::Communicator& comm) {
    const int bad = comm.size() - 1;
    auto start = std::chrono::steady_clock::now();
    try {
      allSucceed(comm, "test step", [&] {
        if (comm.rank() == bad) throw std::bad_alloc();
      });
      return false;
    } catch (const kvcomm::SystemError& e) {
      std::string what = e.what();
      if (what.find("test step") == std::string::npos) return false;
      if (what.find("rank " + std::to_string(bad) + ": out of memory") == std::string::npos) return false;
      if (e.sysErrno() != ENOMEM) return false;
    }
    return std::chrono::steady_clock::now() - start < std::chrono::seconds(5);
  });
}

// The first failed rank's code and CUresult travel to every rank; every failed rank is named; undo runs everywhere.
TEST(Agreement, FirstFailuresCodeAndDetailReachEveryRankAndUndoRuns) {
  onFourRanks([](kvcomm::Communicator& comm) {
    int undone = 0;
    try {
      allSucceedOrUndo(
          comm, "driver step",
          [&] {
            if (comm.rank() == 1) throw kvcomm::CudaError("cuMemCreate failed: out of memory", 2);
            if (comm.rank() == 2) throw std::runtime_error("boom");
          },
          [&] { ++undone; });
      return false;
    } catch (const kvcomm::CudaError& e) {
      std::string what = e.what();
      if (e.result() != 2) return false;
      if (what.find("rank 1: cuMemCreate failed") == std::string::npos) return false;
      if (what.find("rank 2: unexpected boom") == std::string::npos) return false;
    }
    return undone == 1;
  });
}

}  // namespace
