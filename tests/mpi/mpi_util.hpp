// Helpers for MPI tests: communicators built from MPI, TCP and callback bootstraps; agreement checks.
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>
#include <random>
#include <string>

#include "kvcomm/bootstrap.hpp"
#include "kvcomm/comm.hpp"
#include "kvcomm/mpi_bootstrap.hpp"
#include "kvcomm/symm.hpp"
#include "verify/memory.hpp"

namespace kvtest {

inline int worldRank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int worldSize() {
  int s = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

/// TcpBootstrap whose unique id rank 0 creates and broadcasts with MPI (the only MPI use).
inline std::shared_ptr<kvcomm::TcpBootstrap> tcpBootstrap(MPI_Comm comm = MPI_COMM_WORLD) {
  int rank = 0, size = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  kvcomm::UniqueId id;
  if (rank == 0) id = kvcomm::TcpBootstrap::createUniqueId();
  MPI_Bcast(id.bytes.data(), static_cast<int>(id.bytes.size()), MPI_BYTE, 0, comm);
  return std::make_shared<kvcomm::TcpBootstrap>(id, rank, size);
}

inline kvcomm::Communicator tcpWorld() {
  return kvcomm::Communicator::create(tcpBootstrap());
}

/// Test-name suffix of a backend parameter ("host", "cuda").
inline std::string kindName(const ::testing::TestParamInfo<kvcomm::MemoryKind>& i) {
  return kvcomm::memoryKindName(i.param);
}

/// Base of the suites run on each memory backend (INSTANTIATE with Host and Cuda, kindName): a CUDA case skips,
/// saying why, where no GPU is usable; seed_ is equal on every rank and fresh for each case.
class BackendTest : public ::testing::TestWithParam<kvcomm::MemoryKind> {
 protected:
  void SetUp() override;
  kvcomm::MemoryKind kind_ = kvcomm::MemoryKind::Host;
  uint64_t seed_ = 0;
};

/// True on every rank iff `ok` is true on every rank.
inline bool allRanks(bool ok) {
  int mine = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

/// A seed equal on every rank, fresh for each run.
inline uint64_t sharedSeed() {
  uint64_t s = 0;
  if (worldRank() == 0) s = std::random_device{}() * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(time(nullptr));
  MPI_Bcast(&s, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  return s;
}

inline void BackendTest::SetUp() {
  kind_ = GetParam();
  if (kind_ == kvcomm::MemoryKind::Cuda && !haveGpu()) GTEST_SKIP() << "CUDA backend skipped: " << noGpuReason();
  seed_ = sharedSeed();
}

}  // namespace kvtest
