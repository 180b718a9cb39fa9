// The CUDA driver API, loaded at run time (dlopen libcuda.so.1 + cuGetProcAddress), so that libkvcomm loads and
// runs its host backend on machines with no GPU driver. Only compiled when kvcomm is built with CUDA.
#pragma once

#include <cuda.h>

#include <string>

#include "common/check.hpp"
#include "common/internal_api.hpp"

namespace kvcomm::detail {

// The driver entry points kvcomm calls, and no others. The stringified name is the base name cuGetProcAddress
// expects. Required ones: the CUDA backend cannot run without any of them (device queries, contexts, VMM memory and
// its POSIX-fd export, the tables, copies).
// clang-format off
#define KVCOMM_CU_FUNCS(X)                                                                                     \
  X(cuInit) X(cuDriverGetVersion) X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName) X(cuDeviceGetAttribute) \
  X(cuDeviceGetUuid) X(cuDeviceGetPCIBusId) X(cuDeviceGetByPCIBusId) X(cuDeviceTotalMem) X(cuDeviceCanAccessPeer) \
  X(cuCtxGetDevice) X(cuCtxGetCurrent) X(cuCtxSetCurrent) X(cuDevicePrimaryCtxRetain) X(cuMemCreate)             \
  X(cuMemRelease) X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess)         \
  X(cuMemGetAllocationGranularity) X(cuMemExportToShareableHandle) X(cuMemImportFromShareableHandle)             \
  X(cuMemAlloc) X(cuMemFree) X(cuMemsetD8) X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuCtxSynchronize)

// Optional ones, resolved one by one: a driver that lacks one still runs everything that does not need it, and the
// feature that needs it says so (requireCudaDriver(call, feature)). Error texts fall back to the number.
#define KVCOMM_CU_OPTIONAL_FUNCS(X)                                                                            \
  X(cuGetErrorName) X(cuGetErrorString) X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle) X(cuIpcCloseMemHandle)      \
  X(cuMemRetainAllocationHandle) X(cuMemGetAllocationPropertiesFromHandle) X(cuMemHostRegister)                 \
  X(cuMemHostUnregister) X(cuMemHostGetDevicePointer) X(cuMemGetHandleForAddressRange) X(cuFlushGPUDirectRDMAWrites) \
  X(cuMemGetAddressRange)
// clang-format on

struct CudaDriver {
#define KVCOMM_CU_DECL(name) decltype(&::name) name = nullptr;
  KVCOMM_CU_FUNCS(KVCOMM_CU_DECL)
  KVCOMM_CU_OPTIONAL_FUNCS(KVCOMM_CU_DECL)
#undef KVCOMM_CU_DECL
  /// True when libcuda loaded, every required entry point resolved and cuInit succeeded.
  bool usable = false;
  /// Why it is not usable ("" when it is).
  std::string reason;
  /// The optional entry points this driver lacks, comma separated ("" when none).
  std::string missingOptional;
  int driverVersion = 0;
  int deviceCount = 0;
};

/// What a caller needs of the driver beyond the required entry points.
enum class CudaFeature {
  Core,           ///< the required entry points only
  LegacyIpc,      ///< cuIpcGetMemHandle, cuIpcOpenMemHandle, cuIpcCloseMemHandle, cuMemGetAddressRange
  AdoptMemory,    ///< cuMemRetainAllocationHandle, cuMemGetAllocationPropertiesFromHandle (adopt/commit)
  HostRegister,   ///< cuMemHostRegister, cuMemHostUnregister, cuMemHostGetDevicePointer (the health flag on devices)
  GpuDirectRdma,  ///< cuMemGetHandleForAddressRange (dma-buf export of GPU memory for RDMA registration)
};

/// The process's driver table, loaded on first use; never throws.
KVCOMM_INTERNAL_API const CudaDriver& cudaDriver();

/// Throws Unsupported naming `call` and the reason when the driver is not usable, or lacks an entry point `feature`
/// needs (naming it).
KVCOMM_INTERNAL_API const CudaDriver& requireCudaDriver(const char* call, CudaFeature feature = CudaFeature::Core);

/// "CUDA_ERROR_X: description".
KVCOMM_INTERNAL_API std::string cuResultText(CUresult r);

[[noreturn]] KVCOMM_INTERNAL_API void throwCu(const char* expr, CUresult r, const char* file, int line);

}  // namespace kvcomm::detail

/// Calls a driver entry point; throws CudaError with the call text, rank and CUresult on failure.
#define KVCOMM_CHECK_CU(expr)                                                                       \
  do {                                                                                              \
    CUresult kvcommCu_ = (expr);                                                                    \
    if (kvcommCu_ != CUDA_SUCCESS) ::kvcomm::detail::throwCu(#expr, kvcommCu_, __FILE__, __LINE__); \
  } while (0)
