#include "kvcomm/mpi_bootstrap.hpp"

#include <climits>
#include <string>

#include "common/check.hpp"
#include "common/log.hpp"

namespace kvcomm {

namespace {
[[noreturn]] void throwMpi(const char* call, int rc, int rank) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  detail::RankScope scope(rank);
  KVCOMM_THROW(NetworkError, call, "MPI error ", rc, ": ", text);
}
}  // namespace

#define KVCOMM_CHECK_MPI(call)                                             \
  do {                                                                     \
    int kvcommMpiRc_ = (call);                                             \
    if (kvcommMpiRc_ != MPI_SUCCESS) throwMpi(#call, kvcommMpiRc_, rank_); \
  } while (0)

MpiBootstrap::MpiBootstrap(MPI_Comm comm) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  KVCOMM_CHECK_ARG(initialized, "MpiBootstrap", "MPI is not initialised (call MPI_Init first)");
  KVCOMM_CHECK_MPI(MPI_Comm_dup(comm, &comm_));
  KVCOMM_CHECK_MPI(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  KVCOMM_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  KVCOMM_CHECK_MPI(MPI_Comm_size(comm_, &size_));
}

MpiBootstrap::~MpiBootstrap() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

void MpiBootstrap::allgather(void* data, size_t bytesPerRank) {
  KVCOMM_CHECK_ARG(bytesPerRank <= INT_MAX, "MpiBootstrap::allgather", bytesPerRank, " bytes per rank exceed INT_MAX");
  KVCOMM_CHECK_MPI(
      MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, static_cast<int>(bytesPerRank), MPI_BYTE, comm_));
}

void MpiBootstrap::barrier() {
  KVCOMM_CHECK_MPI(MPI_Barrier(comm_));
}

}  // namespace kvcomm
