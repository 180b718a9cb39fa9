// What the ops layer asks of the kernels layer: plain launch descriptions, run by CUDA kernels (kernels/*.cu) or by
// the CPU (kernels/host_ops.cpp) with identical semantics.
#pragma once

#include <cstdint>

#include "kvcomm/device/barrier.hpp"
#include "kvcomm/device/error_record.hpp"
#include "kvcomm/device/symm_device.hpp"

namespace kvcomm::detail {

inline constexpr int kMaxPublishTensors = 4;

/// One cache tensor of a publish (or insert) launch; all values in bytes.
struct PublishTensorDesc {
  const char* src;  // row (source s, token i) at src + s * sourceStride + i * srcStride
  uint64_t srcStride;
  uint64_t rowBytes;
  uint64_t offset;  // destination base in the buffer
  uint64_t blockSize;
  uint64_t blockStride;
  uint64_t rowStride;
  uint64_t limit;  // a row must end at or before this offset (end of the backed range holding `offset`)
  int32_t vec;     // vector width every row start is aligned to
  int32_t reserved;
};

/// Rows of `numSources` x `numTokens` tokens for each tensor, stored at their slots in every replica of `replicas`
/// (publish) or only in this rank's (insert: replicas.mappedMask = this rank's bit). Slots: int64 or int32; a slot
/// below zero is padding; a row beyond `limit` is not written and recorded in `error`.
struct PublishLaunch {
  PublishTensorDesc t[kMaxPublishTensors];
  SymmDeviceHandle replicas;
  const void* slots;      // slot of (source s, token i) at slots + s * sourceStride + i * slotBytes
  uint64_t sourceStride;  // bytes between sources (insert: one per rank); 0 with one source
  int64_t numTokens;
  int32_t numSources;
  int32_t slot64;  // 1: int64 slots, 0: int32
  int32_t numTensors;
  int32_t reserved;
  DeviceErrorRecord* error;
};

/// Packs rows and slots into one contiguous per-rank record for the fallback's allgather:
/// [int64 slots x numTokens][tensor 0 rows x numTokens][tensor 1 rows]... (each part 16-byte aligned).
struct PackLaunch {
  const char* src[kMaxPublishTensors];
  uint64_t srcStride[kMaxPublishTensors];
  uint64_t rowBytes[kMaxPublishTensors];
  uint64_t partOffset[kMaxPublishTensors];  // where each tensor's rows start in the record
  const void* slots;
  int64_t numTokens;
  int32_t slot64;
  int32_t numTensors;
  char* out;
};

// CUDA launches; `stream` is a cudaStream_t. Not compiled without CUDA.
void launchPublish(const PublishLaunch& p, void* stream, const BarrierDeviceHandle* fusedBarrier, int lane);
void launchBarrier(const BarrierDeviceHandle& b, int lane, void* stream);
void launchPack(const PackLaunch& p, void* stream);

// CPU versions over host memory (synchronous). hostPublish validates every slot before writing any row and throws
// InvalidArgumentError naming the first bad token; hostBarrier throws a Timeout naming rank, peer and lane.
void hostPublish(const PublishLaunch& p);
void hostBarrier(const BarrierDeviceHandle& b, int lane);
void hostPack(const PackLaunch& p);

}  // namespace kvcomm::detail
