// MPI test main: MPI is initialised once for the binary; only rank 0 prints GoogleTest results.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>

#include "kvcomm/capabilities.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // One GPU per rank where GPUs exist (the CUDA-backend tests skip themselves otherwise).
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  kvcomm::useLocalDevice(local ? std::atoi(local) : rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int rc = RUN_ALL_TESTS();
  // Every rank's verdict counts: a failure on any rank fails the run.
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst;
}
