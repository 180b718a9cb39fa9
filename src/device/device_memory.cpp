#include "device/device_memory.hpp"

#include <cuda_runtime.h>

#include "common/log.hpp"
#include "platform/cuda_driver.hpp"

namespace kvcomm::detail {

void* deviceAlloc(size_t bytes) {
  CUdeviceptr p = 0;
  KVCOMM_CHECK_CU(requireCudaDriver("deviceAlloc").cuMemAlloc(&p, bytes ? bytes : 1));
  return reinterpret_cast<void*>(p);
}

void deviceFree(void* p) noexcept {
  if (!p) return;
  CUresult r = cudaDriver().cuMemFree(reinterpret_cast<CUdeviceptr>(p));
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_DEINITIALIZED) KVCOMM_WARN("cuMemFree failed: ", cuResultText(r));
}

void deviceMemset(void* p, int value, size_t bytes) {
  const CudaDriver& d = requireCudaDriver("deviceMemset");
  KVCOMM_CHECK_CU(d.cuMemsetD8(reinterpret_cast<CUdeviceptr>(p), static_cast<unsigned char>(value), bytes));
  KVCOMM_CHECK_CU(d.cuCtxSynchronize());
}

void deviceToHost(void* dst, const void* src, size_t bytes) {
  KVCOMM_CHECK_CU(requireCudaDriver("deviceToHost").cuMemcpyDtoH(dst, reinterpret_cast<CUdeviceptr>(src), bytes));
}

void hostToDevice(void* dst, const void* src, size_t bytes) {
  KVCOMM_CHECK_CU(requireCudaDriver("hostToDevice").cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(dst), src, bytes));
}

bool streamCapturing(Stream stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  cudaError_t e = cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(stream), &status);
  return e == cudaSuccess && status != cudaStreamCaptureStatusNone;
}

}  // namespace kvcomm::detail
