// Test helpers that work on both backends: copies in and out of buffer memory (host memcpy, or the CUDA driver for
// device memory) and an "engine" that reserves a KV-cache address range and commits chunks itself, the way
// inference engines with expandable caches do, for adopt tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "kvcomm/comm.hpp"
#include "kvcomm/symm.hpp"

namespace kvtest {

/// True when a CUDA device is usable here (tests of the CUDA backend skip otherwise, saying why).
bool haveGpu();
/// Why there is no GPU ("" when there is).
std::string noGpuReason();

/// Whether every member of `comm` drives its own GPU (NCCL, hence the CUDA fallback, needs that).
bool distinctGpus(const kvcomm::Communicator& comm);

void toMemory(kvcomm::MemoryKind kind, void* dst, const void* src, size_t n);
void fromMemory(kvcomm::MemoryKind kind, void* dst, const void* src, size_t n);
void fillMemory(kvcomm::MemoryKind kind, void* dst, uint8_t value, size_t n);

/// Deterministic pattern bytes for (seed, stream).
std::vector<uint8_t> pattern(uint64_t seed, uint64_t stream, size_t n);

/// Open file descriptors and /proc/self/maps lines of this process.
int countFds();
/// The open descriptors as "fd->target" pairs, for a message when a count is off.
std::string describeFds();
int countMappings();

/// Plain memory of a kind (host heap, or cuMemAlloc device memory), for publish sources.
class Memory {
 public:
  Memory(kvcomm::MemoryKind kind, size_t bytes);
  ~Memory();
  Memory(const Memory&) = delete;
  Memory& operator=(const Memory&) = delete;
  char* data() const { return ptr_; }

 private:
  kvcomm::MemoryKind kind_;
  char* ptr_ = nullptr;
  std::vector<char> host_;
};

/// Page-aligned host memory registered with CUDA (page-locked, mapped for the GPU) while the object lives, as an
/// engine's pinned id tensors are; plain host memory without a GPU.
class PinnedMemory {
 public:
  explicit PinnedMemory(size_t bytes);
  ~PinnedMemory();
  PinnedMemory(const PinnedMemory&) = delete;
  PinnedMemory& operator=(const PinnedMemory&) = delete;
  char* data() const { return p_; }

 private:
  char* p_ = nullptr;
  bool registered_ = false;
};

/// Waits for all work on the current device (no-op for host memory).
void synchronize(kvcomm::MemoryKind kind);

/// An engine-owned KV cache: one reservation, chunks committed and released at chosen offsets.
class EngineCache {
 public:
  /// `exportable` false makes CUDA chunks without a shareable handle type (host: private anonymous memory).
  EngineCache(kvcomm::MemoryKind kind, size_t reservedBytes);
  ~EngineCache();
  char* base() const { return base_; }
  size_t granularity() const { return gran_; }
  /// The granularity a cache of `kind` commits in (a one-granule probe reservation, released at once).
  static size_t granularityOf(kvcomm::MemoryKind kind) { return EngineCache(kind, 1u << 21).granularity(); }
  void commit(size_t offset, size_t bytes, bool exportable = true);
  void release(size_t offset);

 private:
  kvcomm::MemoryKind kind_;
  char* base_ = nullptr;
  size_t reserved_ = 0;
  size_t gran_ = 0;
  int device_ = -1;
  std::map<size_t, std::pair<size_t, uint64_t>> chunks_;  // offset -> (bytes, CUDA handle or memfd)
};

}  // namespace kvtest
