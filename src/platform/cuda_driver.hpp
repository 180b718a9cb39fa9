// The CUDA driver API, loaded at run time (dlopen libcuda.so.1 + cuGetProcAddress), so that libkvcomm loads and
// runs its host backend on machines with no GPU driver. Only compiled when kvcomm is built with CUDA.
#pragma once

#include <cuda.h>

#include <string>

#include "common/check.hpp"

namespace kvcomm::detail {

// Every driver entry point kvcomm calls. The stringified name is the base name cuGetProcAddress expects.
// clang-format off
#define KVCOMM_CU_FUNCS(X)                                                                                     \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString) X(cuDeviceGetCount) X(cuDeviceGet)     \
  X(cuDeviceGetName) X(cuDeviceGetAttribute) X(cuDeviceGetUuid) X(cuDeviceGetPCIBusId) X(cuDeviceGetByPCIBusId) \
  X(cuDeviceTotalMem) X(cuDeviceCanAccessPeer) X(cuDeviceGetP2PAttribute) X(cuCtxGetDevice) X(cuCtxGetCurrent) \
  X(cuCtxSetCurrent) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuMemCreate) X(cuMemRelease)   \
  X(cuMemAddressReserve) X(cuMemAddressFree) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess)                       \
  X(cuMemGetAllocationGranularity) X(cuMemExportToShareableHandle) X(cuMemImportFromShareableHandle)           \
  X(cuMemRetainAllocationHandle) X(cuMemGetAllocationPropertiesFromHandle) X(cuMemGetAddressRange)             \
  X(cuMemGetHandleForAddressRange) X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle) X(cuIpcCloseMemHandle)           \
  X(cuMemAlloc) X(cuMemFree) X(cuPointerGetAttribute) X(cuFlushGPUDirectRDMAWrites) X(cuMemsetD8)              \
  X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuCtxSynchronize) X(cuMemHostRegister) X(cuMemHostUnregister)            \
  X(cuMemHostGetDevicePointer)
// clang-format on

struct CudaDriver {
#define KVCOMM_CU_DECL(name) decltype(&::name) name = nullptr;
  KVCOMM_CU_FUNCS(KVCOMM_CU_DECL)
#undef KVCOMM_CU_DECL
  /// True when libcuda loaded, every entry point resolved and cuInit succeeded.
  bool usable = false;
  /// Why it is not usable ("" when it is).
  std::string reason;
  int driverVersion = 0;
  int deviceCount = 0;
};

/// The process's driver table, loaded on first use; never throws.
const CudaDriver& cudaDriver();

/// Throws Unsupported naming `call` and the reason when the driver is not usable.
const CudaDriver& requireCudaDriver(const char* call);

/// "CUDA_ERROR_X: description".
std::string cuResultText(CUresult r);

[[noreturn]] void throwCu(const char* expr, CUresult r, const char* file, int line);

}  // namespace kvcomm::detail

/// Calls a driver entry point; throws CudaError with the call text, rank and CUresult on failure.
#define KVCOMM_CHECK_CU(expr)                                                                       \
  do {                                                                                              \
    CUresult kvcommCu_ = (expr);                                                                    \
    if (kvcommCu_ != CUDA_SUCCESS) ::kvcomm::detail::throwCu(#expr, kvcommCu_, __FILE__, __LINE__); \
  } while (0)
