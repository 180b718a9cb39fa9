// Legacy CUDA IPC (cuIpcGetMemHandle), the fallback where POSIX-fd export of VMM memory is unavailable
// (KVCOMM_HANDLE_TYPE=ipc selects it). IPC handles cover cudaMalloc-style memory only: the whole capacity is
// allocated up front (grow only raises the backed size), peers are mapped wherever the driver places them, and
// adopting an engine's VMM cache is not possible.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kvcomm/comm.hpp"
#include "symm/memory_backend.hpp"

namespace kvcomm::detail {

class LegacyIpc : public TableMemory {
 public:
  /// Capacity and sizes round up to this.
  static constexpr size_t kGranularity = 2u << 20;
  /// Collective: allocates `capacity` bytes, exchanges IPC handles, opens every same-host peer's.
  static std::unique_ptr<LegacyIpc> create(Communicator& comm, size_t capacity, size_t initialBytes);
  virtual char* local() const = 0;
  virtual size_t capacity() const = 0;
  virtual size_t granularity() const = 0;
  virtual size_t mappedBytes() const = 0;
  virtual void grow(size_t bytes) = 0;
  virtual std::vector<bool> mappedMembers() const = 0;
  virtual std::vector<uint64_t> bases() const = 0;
  virtual uint64_t* table() const = 0;
};

}  // namespace kvcomm::detail
