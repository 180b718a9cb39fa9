// The group agreement step (comm/agreement.hpp): every member goes on, or every member throws the same error.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cerrno>
#include <chrono>
#include <new>
#include <string>

#include "comm/agreement.hpp"
#include "kvcomm/error.hpp"
#include "mpi/mpi_util.hpp"

namespace {

using kvcomm::detail::allSucceed;
using kvcomm::detail::allSucceedOrUndo;

TEST(Agreement, EveryMemberGoesOnWhenEveryMemberSucceeds) {
  auto comm = kvtest::tcpWorld();
  int ran = 0;
  allSucceed(comm, "test step", [&] { ++ran; });
  EXPECT_EQ(ran, 1);
}

// A std::bad_alloc on one rank (not a kvcomm::Error) still reaches the vote: every rank throws at once instead of
// waiting for the bootstrap timeout, with the failed rank, the cause and errno ENOMEM.
TEST(Agreement, NonKvcommExceptionOnOneRankFailsEveryRankAtOnce) {
  auto comm = kvtest::tcpWorld();
  const int bad = comm.size() - 1;
  auto start = std::chrono::steady_clock::now();
  try {
    allSucceed(comm, "test step", [&] {
      if (comm.rank() == bad) throw std::bad_alloc();
    });
    ADD_FAILURE() << "no error on rank " << comm.rank();
  } catch (const kvcomm::SystemError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("test step"), std::string::npos) << what;
    EXPECT_NE(what.find("rank " + std::to_string(bad) + ": out of memory"), std::string::npos) << what;
    EXPECT_EQ(e.sysErrno(), ENOMEM);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// The first failed rank's code and CUresult travel to every rank; every failed rank is named; undo runs everywhere.
TEST(Agreement, FirstFailuresCodeAndDetailReachEveryRankAndUndoRuns) {
  auto comm = kvtest::tcpWorld();
  int undone = 0;
  try {
    allSucceedOrUndo(
        comm, "driver step",
        [&] {
          if (comm.rank() == 1) throw kvcomm::CudaError("cuMemCreate failed: out of memory", 2);
          if (comm.rank() == 2) throw std::runtime_error("boom");
        },
        [&] { ++undone; });
    ADD_FAILURE() << "no error on rank " << comm.rank();
  } catch (const kvcomm::CudaError& e) {
    std::string what = e.what();
    EXPECT_EQ(e.result(), 2);
    EXPECT_NE(what.find("rank 1: cuMemCreate failed"), std::string::npos) << what;
    if (comm.size() > 2) {
      EXPECT_NE(what.find("rank 2: unexpected boom"), std::string::npos) << what;
    }
  }
  EXPECT_EQ(undone, 1);
}

}  // namespace
