// kvcomm: what this machine and build can do, and why something is absent.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "kvcomm/api.hpp"

namespace kvcomm {

/// The GPU a member drives (the device current when its communicator was created), if any.
struct GpuInfo {
  int device = -1;       ///< CUDA ordinal in that process; -1: no GPU bound (or CUDA absent)
  std::string uuid;      ///< "GPU-xxxxxxxx-..." as nvidia-smi prints it
  std::string pciBusId;  ///< "0000:18:00.0"
};

/// One CUDA device as the driver reports it, plus what probes proved.
struct GpuCapabilities {
  int ordinal = -1;
  std::string name;
  std::string uuid;
  std::string pciBusId;
  int ccMajor = 0, ccMinor = 0;
  size_t totalMemory = 0;
  bool vmm = false;                   ///< virtual memory management (cuMemCreate/cuMemMap)
  bool posixFd = false;               ///< POSIX-fd shareable handles
  bool fabricAttribute = false;       ///< the device claims fabric handles ...
  bool fabricUsable = false;          ///< ... and a probe cuMemCreate with the fabric handle type succeeded
  std::string fabricReason;           ///< why fabric handles are unusable
  bool dmaBuf = false;                ///< cuMemGetHandleForAddressRange(dma-buf)
  bool gpuDirectRdma = false;         ///< GPUDirect RDMA supported
  bool gpuDirectRdmaWithVmm = false;  ///< GPUDirect RDMA on VMM allocations (gpuDirectRDMACapable)
  bool multicastAttribute = false;    ///< NVLS multicast reported (kvcomm only uses it on explicit opt-in)
  size_t vmmGranularity = 0;          ///< recommended VMM granularity in bytes
};

/// One RDMA device.
struct RdmaDevice {
  std::string name;
  std::string linkLayer;
  std::string state;
  std::string pciBusId;
  int numaNode = -1;
};

/// What is present, what is not, and why.
struct KVCOMM_API Capabilities {
  bool builtWithCuda = false;  ///< libkvcomm was compiled with its CUDA backend
  bool cudaDriver = false;     ///< a CUDA driver loaded and initialised
  std::string cudaReason;      ///< why CUDA is unusable ("" when usable)
  int driverVersion = 0;
  std::vector<GpuCapabilities> gpus;
  bool rdma = false;  ///< at least one RDMA device
  std::string rdmaReason;
  std::vector<RdmaDevice> rdmaDevices;
  bool hostBackend = true;       ///< memfd host memory (always)
  std::string multicastRefusal;  ///< why NVLS multicast will not be used ("" if it would)

  /// A table for humans.
  std::string toString() const;
};

/// Probes once per process (cached); never throws.
KVCOMM_API const Capabilities& capabilities();

/// Makes CUDA device `localRank % deviceCount` current on the calling thread (its primary context, which stays
/// retained for the life of the process) and returns its ordinal; returns -1 and does nothing without a usable GPU.
/// A convenience for tools and tests; engines usually call cudaSetDevice themselves.
KVCOMM_API int useLocalDevice(int localRank);

}  // namespace kvcomm
