// What arenas need of CUDA beyond the memory backends: the calling thread's context (the session thread maps and
// exports on behalf of the thread that made the arena or the import), synchronous copies, and the legacy IPC
// allocation and handles. Compiled with the CUDA backend (arena/cuda_support.cpp); without it (arena/no_cuda.cpp)
// there is no context and every CUDA call throws Unsupported.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvcomm::detail::arena {

/// The calling thread's current CUDA context (nullptr when CUDA is absent or none is current).
void* currentCudaContext() noexcept;

/// Makes `ctx` current for the scope (nothing when null), then restores the thread's previous context.
class CudaContextScope {
 public:
  explicit CudaContextScope(void* ctx);
  ~CudaContextScope();
  CudaContextScope(const CudaContextScope&) = delete;
  CudaContextScope& operator=(const CudaContextScope&) = delete;

 private:
  void* previous_ = nullptr;
  bool set_ = false;
};

/// Synchronous copies between host memory and device memory of `ctx` (made current for the copy when the thread
/// has no context); the bytes have landed when they return.
void copyToDevice(void* ctx, void* dst, const void* src, size_t bytes);
void copyFromDevice(void* ctx, void* dst, const void* src, size_t bytes);

/// Legacy CUDA IPC: a cuMemAlloc allocation of `bytes` on the current context, its 64-byte handle, and the
/// importer's side. Frees and closes log instead of throwing.
void* ipcAllocate(size_t bytes);
void ipcFree(void* ptr) noexcept;
void ipcGetHandle(void* ptr, uint8_t handle[64]);
/// The cuMemAlloc (cudaMalloc) allocation that holds `ptr`: its base and size (the handle covers the whole of it).
void ipcAllocationOf(const void* ptr, void** base, size_t* bytes);
void* ipcOpen(const uint8_t handle[64]);
void ipcClose(void* ptr) noexcept;

}  // namespace kvcomm::detail::arena
