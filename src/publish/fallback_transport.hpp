// The fallback's data movement: every rank's packed record (slots + rows) gathered to every rank. NCCL AllGather on
// GPUs, kvcomm's own bootstrap allgather on host memory (MPI-free).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "device/device_memory.hpp"  // the transports' device buffers
#include "kvcomm/comm.hpp"
#include "kvcomm/publish.hpp"

namespace kvcomm::detail {

class FallbackTransport {
 public:
  virtual ~FallbackTransport() = default;
  /// Where this rank packs its record of `recordBytes` (grows the staging outside graph capture; inside capture a
  /// record larger than the staging is an InvalidArgumentError).
  virtual char* sendBuffer(size_t recordBytes, Stream stream) = 0;
  /// What every member's call must agree on: the host transport compares it across members before gathering and
  /// names a member that differs (equal record sizes alone let 1 token of 32 B pass for 2 of 16 B); NCCL does not.
  struct Shape {
    uint64_t numTokens = 0;
    uint64_t numTensors = 0;
    uint64_t rowBytes[4] = {};
    bool operator==(const Shape& o) const {
      bool same = numTokens == o.numTokens && numTensors == o.numTensors;
      for (int k = 0; k < 4; ++k) same = same && rowBytes[k] == o.rowBytes[k];
      return same;
    }
  };
  /// Gathers every rank's record (stream-ordered); returns the base of size() records of `recordBytes`.
  virtual const char* gather(size_t recordBytes, const Shape& shape, Stream stream) = 0;
  /// Every member arrived (stream-ordered).
  virtual void barrier(Stream stream) = 0;

  /// One part of a pack-free gather: `bytes` bytes at `src` (device memory, contiguous) from every member.
  struct Part {
    const void* src;
    size_t bytes;
  };
  /// Whether gatherParts() is available (NCCL: grouped AllGathers straight from the caller's buffers).
  virtual bool gathersParts() const { return false; }
  /// Gathers every part from every member in one grouped launch (stream-ordered), no packing: part p of member r
  /// lands at base + partOffset(p) + r * parts[p].bytes, partOffset(p) = sum over q < p of align16(size() * bytes_q).
  /// Returns the base; the staging grows like sendBuffer()'s.
  virtual const char* gatherParts(const std::vector<Part>& parts, Stream stream) {
    (void)parts, (void)stream;
    return nullptr;
  }
};

/// Collective. `recordBytes`: staging reserved up front.
std::unique_ptr<FallbackTransport> makeNcclTransport(Communicator& comm, size_t recordBytes);
std::unique_ptr<FallbackTransport> makeHostTransport(Communicator& comm);

}  // namespace kvcomm::detail
