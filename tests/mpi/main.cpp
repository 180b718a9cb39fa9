// MPI test main: MPI is initialised once for the binary; only rank 0 prints GoogleTest results.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "kvcomm/capabilities.hpp"

namespace {
// Ranks other than 0 print only failures, prefixed with their rank, so that a failure on any rank is visible.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  // The test's name is taken at its start: asking GoogleTest while it records a result would deadlock.
  void OnTestStart(const ::testing::TestInfo& t) override { test_ = std::string(t.test_suite_name()) + "." + t.name(); }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] FAILED %s at %s:%d\n%s\n", rank_, test_.c_str(),
                 r.file_name() ? r.file_name() : "?", r.line_number(), r.summary());
  }

 private:
  int rank_;
  std::string test_;
};
}  // namespace

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
    listeners.Append(new RankFailurePrinter(rank));
  }
  int rc = RUN_ALL_TESTS();
  // Every rank's verdict counts: a failure on any rank fails the run.
  int worst = 0;
  MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  // Skips must not read as passes: run_mpi_test.sh turns this line into CTest's "skipped" when nothing failed.
  const auto* unit = ::testing::UnitTest::GetInstance();
  int skipped = unit->skipped_test_count(), mostSkipped = 0;
  MPI_Allreduce(&skipped, &mostSkipped, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && mostSkipped > 0)
    std::printf("kvcomm-tests: %d of %d tests skipped (their reasons are above)\n", mostSkipped,
                unit->test_to_run_count());
  MPI_Finalize();
  return worst;
}
