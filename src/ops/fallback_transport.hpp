// The fallback's data movement: every rank's packed record (slots + rows) gathered to every rank. NCCL AllGather on
// GPUs, kvcomm's own bootstrap allgather on host memory (MPI-free).
#pragma once

#include <cstddef>
#include <memory>

#include "kvcomm/comm.hpp"
#include "kvcomm/ops.hpp"
#include "ops/device_memory.hpp"  // the transports' device buffers

namespace kvcomm::detail {

class FallbackTransport {
 public:
  virtual ~FallbackTransport() = default;
  /// Where this rank packs its record of `recordBytes` (grows the staging outside graph capture; inside capture a
  /// record larger than the staging is an InvalidArgumentError).
  virtual char* sendBuffer(size_t recordBytes, Stream stream) = 0;
  /// Gathers every rank's record (stream-ordered); returns the base of size() records of `recordBytes`.
  virtual const char* gather(size_t recordBytes, Stream stream) = 0;
  /// Every member arrived (stream-ordered).
  virtual void barrier(Stream stream) = 0;
};

/// Collective. `recordBytes`: staging reserved up front.
std::unique_ptr<FallbackTransport> makeNcclTransport(Communicator& comm, size_t recordBytes);
std::unique_ptr<FallbackTransport> makeHostTransport(Communicator& comm);

}  // namespace kvcomm::detail
