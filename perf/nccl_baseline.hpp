// The baseline perf_publish measures kvcomm against, built on the public API only: NCCL AllGather of every rank's
// packed [slots | rows] record (NCCL loaded at run time, like kvcomm's own fallback does, so the binary starts on
// machines without it), then an insert kernel of the benchmark's own that stores every gathered row at its slot in
// this rank's replica, the same way kvcomm's kernels copy rows (every (row, 16-byte column) an item of a grid-stride
// loop, 4 vectors in flight per thread, each row checked against the buffer's backed-granule bitmap).
#pragma once

#include <cstddef>
#include <cstdint>

struct CUstream_st;

namespace kvbench {

/// One NCCL communicator over MPI_COMM_WORLD (one GPU per rank). Throws std::runtime_error when NCCL cannot be loaded
/// or a call fails.
class NcclBaseline {
 public:
  NcclBaseline();  // collective over MPI_COMM_WORLD
  ~NcclBaseline();
  NcclBaseline(const NcclBaseline&) = delete;
  NcclBaseline& operator=(const NcclBaseline&) = delete;
  /// ncclAllGather of `bytes` bytes per rank from `send` into `recv` (ranks' blocks in rank order), on `stream`.
  void allGather(const void* send, void* recv, size_t bytes, CUstream_st* stream);
  /// Two AllGathers in one NCCL group (what kvcomm's fallback moves: the slots and the rows, from separate buffers).
  void allGatherPair(const void* sendA, void* recvA, size_t bytesA, const void* sendB, void* recvB, size_t bytesB,
                     CUstream_st* stream);

 private:
  void* comm_ = nullptr;
};

/// Where the insert reads and writes: `sources` records of `recordBytes` at `records`, each [int64 slot x tokens,
/// padded to 16 bytes = `rowsAt`][rows of `rowBytes` x tokens]; row i of a record goes to byte slot * rowBytes of
/// `replica` (a flat cache), unless [dst, dst + rowBytes) is not wholly in backed granules (`backed`: the buffer's
/// bitmap, `granShift`: log2 of its granularity, `capacity`: its size), or the slot is negative (padding).
struct InsertArgs {
  const char* records;
  uint64_t recordBytes;
  uint64_t rowsAt;
  int64_t tokens;
  int32_t sources;
  uint64_t rowBytes;
  char* replica;
  const uint64_t* backed;
  int32_t granShift;
  uint64_t capacity;
};
void launchInsert(const InsertArgs& a, CUstream_st* stream);

}  // namespace kvbench
