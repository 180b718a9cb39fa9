#include "arena/cuda_support.hpp"

#include <cstring>

#include "common/log.hpp"
#include "device/device_memory.hpp"
#include "platform/cuda_driver.hpp"

namespace kvcomm::detail::arena {

void* currentCudaContext() noexcept {
  const CudaDriver& d = cudaDriver();
  if (!d.usable) return nullptr;
  CUcontext ctx = nullptr;
  if (d.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS) return nullptr;
  return ctx;
}

CudaContextScope::CudaContextScope(void* ctx) {
  if (!ctx) return;
  const CudaDriver& d = requireCudaDriver("arena (CUDA context)");
  CUcontext prev = nullptr;
  KVCOMM_CHECK_CU(d.cuCtxGetCurrent(&prev));
  if (prev == static_cast<CUcontext>(ctx)) return;
  KVCOMM_CHECK_CU(d.cuCtxSetCurrent(static_cast<CUcontext>(ctx)));
  previous_ = prev;
  set_ = true;
}

CudaContextScope::~CudaContextScope() {
  if (!set_) return;
  CUresult r = cudaDriver().cuCtxSetCurrent(static_cast<CUcontext>(previous_));
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_DEINITIALIZED) KVCOMM_WARN("cuCtxSetCurrent(restore): ", cuResultText(r));
}

void copyToDevice(void* ctx, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  CudaContextScope scope(currentCudaContext() ? nullptr : ctx);
  hostToDevice(dst, src, bytes);
  // From pageable memory cuMemcpyHtoD may return before the DMA lands: wait, so "written" means written.
  KVCOMM_CHECK_CU(cudaDriver().cuCtxSynchronize());
}

void copyFromDevice(void* ctx, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  CudaContextScope scope(currentCudaContext() ? nullptr : ctx);
  deviceToHost(dst, src, bytes);
}

void* ipcAllocate(size_t bytes) {
  requireCudaDriver("Arena::create (legacyIpc)", CudaFeature::LegacyIpc);
  return deviceAlloc(bytes);
}

void ipcFree(void* ptr) noexcept {
  deviceFree(ptr);
}

void ipcGetHandle(void* ptr, uint8_t handle[64]) {
  const CudaDriver& d = requireCudaDriver("Arena::ipcHandle", CudaFeature::LegacyIpc);
  CUipcMemHandle h;
  static_assert(sizeof(h) == 64, "CUipcMemHandle is 64 bytes");
  KVCOMM_CHECK_CU(d.cuIpcGetMemHandle(&h, reinterpret_cast<CUdeviceptr>(ptr)));
  std::memcpy(handle, &h, sizeof(h));
}

void ipcAllocationOf(const void* ptr, void** base, size_t* bytes) {
  const CudaDriver& d = requireCudaDriver("legacy IPC export", CudaFeature::LegacyIpc);
  CUdeviceptr b = 0;
  size_t n = 0;
  KVCOMM_CHECK_CU(d.cuMemGetAddressRange(&b, &n, reinterpret_cast<CUdeviceptr>(ptr)));
  *base = reinterpret_cast<void*>(b);
  *bytes = n;
}

void* ipcOpen(const uint8_t handle[64]) {
  const CudaDriver& d = requireCudaDriver("ArenaImport (cuda_ipc)", CudaFeature::LegacyIpc);
  CUipcMemHandle h;
  std::memcpy(&h, handle, sizeof(h));
  CUdeviceptr p = 0;
  KVCOMM_CHECK_CU(d.cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
  return reinterpret_cast<void*>(p);
}

void ipcClose(void* ptr) noexcept {
  if (!ptr) return;
  CUresult r = cudaDriver().cuIpcCloseMemHandle(reinterpret_cast<CUdeviceptr>(ptr));
  if (r != CUDA_SUCCESS && r != CUDA_ERROR_DEINITIALIZED) KVCOMM_WARN("cuIpcCloseMemHandle: ", cuResultText(r));
}

}  // namespace kvcomm::detail::arena
