#include "fetch/transport/rdma/gpu_direct.hpp"

#include <cuda.h>
#include <cuda_runtime.h>

#include "common/check.hpp"
#include "platform/cuda_driver.hpp"

namespace kvcomm::detail {

namespace {

int attribute(int device, CUdevice_attribute a) {
  const CudaDriver& d = requireCudaDriver("GPUDirect RDMA");
  CUdevice dev = 0;
  KVCOMM_CHECK_CU(d.cuDeviceGet(&dev, device));
  int v = 0;
  KVCOMM_CHECK_CU(d.cuDeviceGetAttribute(&v, a, dev));
  return v;
}

}  // namespace

std::string gpuDirectRefusal(int device) {
  try {
    requireCudaDriver("GPUDirect RDMA", CudaFeature::GpuDirectRdma);
    if (!attribute(device, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED))
      return cat("CUDA device ", device, " does not support dma-buf export (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED)");
    if (!attribute(device, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED))
      return cat("CUDA device ", device, " does not support GPUDirect RDMA on VMM memory");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

Fd exportDmabuf(void* va, size_t bytes) {
  const CudaDriver& d = requireCudaDriver("cuMemGetHandleForAddressRange", CudaFeature::GpuDirectRdma);
  int fd = -1;
  KVCOMM_CHECK_CU(d.cuMemGetHandleForAddressRange(&fd, reinterpret_cast<CUdeviceptr>(va), bytes,
                                                  CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0));
  return Fd(fd);
}

bool gpuDirectNeedsFlush(int device) {
  return attribute(device, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING) <
         CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER;
}

void flushGpuDirectWrites(int device) {
  const CudaDriver& d = requireCudaDriver("cuFlushGPUDirectRDMAWrites");
  if (!d.cuFlushGPUDirectRDMAWrites)
    KVCOMM_THROW(Unsupported, "fetch (rdma)", "CUDA device ", device,
                 " needs its RDMA writes flushed but the driver lacks cuFlushGPUDirectRDMAWrites");
  if (cudaSetDevice(device) != cudaSuccess)
    KVCOMM_THROW(CudaError, "cudaSetDevice", "device ", device, " (before flushing RDMA writes)");
  KVCOMM_CHECK_CU(d.cuFlushGPUDirectRDMAWrites(CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX,
                                               CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER));
}

void syncStream(int device, Stream stream) {
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream));
  if (e != cudaSuccess)
    throwError(ErrorCode::CudaError, "cudaStreamSynchronize (fetch rdma)", cudaGetErrorString(e), __FILE__, __LINE__,
               static_cast<int>(e));
}

}  // namespace kvcomm::detail
