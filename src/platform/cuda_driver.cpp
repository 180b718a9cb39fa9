#include "platform/cuda_driver.hpp"

#include <dlfcn.h>

namespace kvcomm::detail {

namespace {

CudaDriver load() {
  CudaDriver d;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    d.reason = cat("no CUDA driver: dlopen(libcuda.so.1) failed: ", e ? e : "unknown error");
    return d;
  }
  // The library stays loaded for the life of the process (entry points are cached in this table).
  using GetProc = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
  auto getProc = reinterpret_cast<GetProc>(dlsym(lib, "cuGetProcAddress_v2"));
  if (!getProc) {
    d.reason = "libcuda.so.1 has no cuGetProcAddress_v2 (driver older than CUDA 12)";
    return d;
  }
  // Entry points are requested at the CUDA 12.0 ABI, whose signatures are the ones cuda.h declares by default:
  // asking for CUDA_VERSION (13.0) returns newer variants with other parameters (cuCtxGetDevice_v2 takes a
  // context) behind the old prototype.
  constexpr int kAbi = 12000;
  auto resolve = [&](const char* name) -> void* {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult q{};
    return getProc(name, &fn, kAbi, CU_GET_PROC_ADDRESS_DEFAULT, &q) == CUDA_SUCCESS ? fn : nullptr;
  };
#define KVCOMM_CU_LOAD(name)                                                                 \
  d.name = reinterpret_cast<decltype(d.name)>(resolve(#name));                               \
  if (!d.name) {                                                                             \
    d.reason = cat("the CUDA driver lacks ", #name, " (driver older than CUDA ", kAbi, ")"); \
    return d;                                                                                \
  }
  KVCOMM_CU_FUNCS(KVCOMM_CU_LOAD)
#undef KVCOMM_CU_LOAD
#define KVCOMM_CU_LOAD_OPTIONAL(name)                          \
  d.name = reinterpret_cast<decltype(d.name)>(resolve(#name)); \
  if (!d.name) d.missingOptional += (d.missingOptional.empty() ? "" : ", ") + std::string(#name);
  KVCOMM_CU_OPTIONAL_FUNCS(KVCOMM_CU_LOAD_OPTIONAL)
#undef KVCOMM_CU_LOAD_OPTIONAL
  CUresult r = d.cuInit(0);
  if (r != CUDA_SUCCESS) {
    const char* name = nullptr;
    if (d.cuGetErrorName) d.cuGetErrorName(r, &name);
    d.reason = cat("cuInit failed: ", name ? name : "unknown", " (no GPU or driver not loaded)");
    return d;
  }
  d.cuDriverGetVersion(&d.driverVersion);
  d.cuDeviceGetCount(&d.deviceCount);
  d.usable = true;
  return d;
}

}  // namespace

const CudaDriver& cudaDriver() {
  static const CudaDriver driver = load();
  return driver;
}

const CudaDriver& requireCudaDriver(const char* call, CudaFeature feature) {
  const CudaDriver& d = cudaDriver();
  if (!d.usable) throwError(ErrorCode::Unsupported, call, d.reason, __FILE__, __LINE__);
  auto need = [&](const void* fn, const char* name, const char* what) {
    if (!fn)
      throwError(ErrorCode::Unsupported, call, cat("the CUDA driver lacks ", name, ", which ", what, " needs"),
                 __FILE__, __LINE__);
  };
  switch (feature) {
    case CudaFeature::LegacyIpc:
      need(reinterpret_cast<const void*>(d.cuIpcGetMemHandle), "cuIpcGetMemHandle", "legacy CUDA IPC");
      need(reinterpret_cast<const void*>(d.cuIpcOpenMemHandle), "cuIpcOpenMemHandle", "legacy CUDA IPC");
      need(reinterpret_cast<const void*>(d.cuIpcCloseMemHandle), "cuIpcCloseMemHandle", "legacy CUDA IPC");
      need(reinterpret_cast<const void*>(d.cuMemGetAddressRange), "cuMemGetAddressRange", "legacy CUDA IPC");
      break;
    case CudaFeature::AdoptMemory:
      need(reinterpret_cast<const void*>(d.cuMemRetainAllocationHandle), "cuMemRetainAllocationHandle",
           "adopting an engine's memory");
      need(reinterpret_cast<const void*>(d.cuMemGetAllocationPropertiesFromHandle),
           "cuMemGetAllocationPropertiesFromHandle", "adopting an engine's memory");
      break;
    case CudaFeature::HostRegister:
      need(reinterpret_cast<const void*>(d.cuMemHostRegister), "cuMemHostRegister", "device waits on the health flag");
      need(reinterpret_cast<const void*>(d.cuMemHostUnregister), "cuMemHostUnregister",
           "device waits on the health flag");
      need(reinterpret_cast<const void*>(d.cuMemHostGetDevicePointer), "cuMemHostGetDevicePointer",
           "device waits on the health flag");
      break;
    case CudaFeature::GpuDirectRdma:
      need(reinterpret_cast<const void*>(d.cuMemGetHandleForAddressRange), "cuMemGetHandleForAddressRange",
           "RDMA registration of GPU memory (dma-buf)");
      break;
    case CudaFeature::Core:
      break;
  }
  return d;
}

std::string cuResultText(CUresult r) {
  const CudaDriver& d = cudaDriver();
  const char* name = nullptr;
  const char* text = nullptr;
  if (d.cuGetErrorName) d.cuGetErrorName(r, &name);
  if (d.cuGetErrorString) d.cuGetErrorString(r, &text);
  return cat(name ? name : "CUDA error", " (", static_cast<int>(r), "): ", text ? text : "no description");
}

void throwCu(const char* expr, CUresult r, const char* file, int line) {
  throw CudaError(formatMessage(expr, cuResultText(r), file, line), static_cast<int>(r));
}

}  // namespace kvcomm::detail
