// GPUDirect RDMA pieces of the verbs transport on CUDA buffers: dma-buf export of committed VMM chunks (one MR each),
// whether a NIC's writes must be flushed before the GPU's kernels read them, and the flush. Compiled with CUDA
// (fetch/transport/rdma/gpu_direct.cpp); without CUDA (fetch/no_cuda.cpp) they refuse, and CUDA buffers never reach
// them.
#pragma once

#include <cstddef>
#include <string>

#include "common/fd.hpp"
#include "kvcomm/stream.hpp"

namespace kvcomm::detail {

/// Why the memory of CUDA device `device` cannot be registered with a NIC as dma-buf ("" when it can): the driver
/// lacks cuMemGetHandleForAddressRange, or the device does not report dma-buf support.
std::string gpuDirectRefusal(int device);

/// A dma-buf descriptor for [va, va + bytes): one committed VMM allocation of this process (its owner, or an importer
/// of its POSIX fd). Throws CudaError when the driver refuses.
Fd exportDmabuf(void* va, size_t bytes);

/// Whether RDMA writes into `device`'s memory must be flushed before its kernels read them
/// (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING below "owner").
bool gpuDirectNeedsFlush(int device);

/// cuFlushGPUDirectRDMAWrites (current context, to the owner): every RDMA write completed so far is visible to the
/// GPU's kernels afterwards. Throws CudaError.
void flushGpuDirectWrites(int device);

/// Waits until the work enqueued on `stream` so far has finished (stream-ordered fetches whose bytes a NIC writes
/// outside the stream must not race earlier work on the destination).
void syncStream(int device, Stream stream);

}  // namespace kvcomm::detail
