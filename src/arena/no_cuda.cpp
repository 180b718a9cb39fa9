// The CUDA side of arenas in a build without CUDA: no context ever exists, and CUDA calls say so.
#include "arena/cuda_support.hpp"
#include "common/check.hpp"

namespace kvcomm::detail::arena {

void* currentCudaContext() noexcept {
  return nullptr;
}

CudaContextScope::CudaContextScope(void* ctx) {
  if (ctx) KVCOMM_THROW(Unsupported, "arena (CUDA context)", "libkvcomm was built without CUDA");
}

CudaContextScope::~CudaContextScope() = default;

void copyToDevice(void*, void*, const void*, size_t) {
  KVCOMM_THROW(Unsupported, "Arena::write", "libkvcomm was built without CUDA");
}

void copyFromDevice(void*, void*, const void*, size_t) {
  KVCOMM_THROW(Unsupported, "Arena::read", "libkvcomm was built without CUDA");
}

void* ipcAllocate(size_t) {
  KVCOMM_THROW(Unsupported, "Arena::create (legacyIpc)", "libkvcomm was built without CUDA");
}

void ipcFree(void*) noexcept {}

void ipcGetHandle(void*, uint8_t*) {
  KVCOMM_THROW(Unsupported, "Arena::ipcHandle", "libkvcomm was built without CUDA");
}

void ipcAllocationOf(const void*, void**, size_t*) {
  KVCOMM_THROW(Unsupported, "legacy IPC export", "libkvcomm was built without CUDA");
}

void* ipcOpen(const uint8_t*) {
  KVCOMM_THROW(Unsupported, "ArenaImport (cuda_ipc)", "libkvcomm was built without CUDA");
}

void ipcClose(void*) noexcept {}

}  // namespace kvcomm::detail::arena
