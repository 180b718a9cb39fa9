// kvcomm: bootstrap over an MPI communicator (target kvcomm::mpi; the core library does not depend on MPI).
#pragma once

#include <mpi.h>

#include "kvcomm/api.hpp"
#include "kvcomm/bootstrap.hpp"

namespace kvcomm {

/// Bootstrap whose collectives are MPI_Allgather/MPI_Barrier on a duplicate of `comm` (so kvcomm's traffic never
/// matches the application's messages). MPI must stay initialised while the bootstrap lives.
class KVCOMM_API MpiBootstrap : public Bootstrap {
 public:
  explicit MpiBootstrap(MPI_Comm comm = MPI_COMM_WORLD);
  ~MpiBootstrap() override;
  MpiBootstrap(const MpiBootstrap&) = delete;
  MpiBootstrap& operator=(const MpiBootstrap&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allgather(void* data, size_t bytesPerRank) override;
  void barrier() override;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 0;
};

}  // namespace kvcomm
