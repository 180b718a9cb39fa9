#include "kvcomm/capabilities.hpp"

#include <iomanip>
#include <sstream>

#include "common/env.hpp"
#include "platform/gpu_info.hpp"
#include "platform/ibverbs.hpp"

#ifdef KVCOMM_HAVE_CUDA
#include "platform/cuda_driver.hpp"
#endif

namespace kvcomm {

namespace {

#ifdef KVCOMM_HAVE_CUDA
int attr(CUdevice dev, CUdevice_attribute a) {
  int v = 0;
  detail::cudaDriver().cuDeviceGetAttribute(&v, a, dev);
  return v;
}

// The fabric attribute alone lies without an IMEX channel: only a real allocation proves the handle type works.
void probeFabric(CUdevice dev, GpuCapabilities& g) {
  const auto& d = detail::cudaDriver();
  if (!g.fabricAttribute) {
    g.fabricReason = "device does not report fabric handle support";
    return;
  }
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_FABRIC;
  CUmemGenericAllocationHandle h;
  CUresult r = d.cuMemCreate(&h, g.vmmGranularity ? g.vmmGranularity : (2u << 20), &prop, 0);
  if (r == CUDA_SUCCESS) {
    g.fabricUsable = true;
    d.cuMemRelease(h);
  } else {
    g.fabricReason =
        "probe cuMemCreate(CU_MEM_HANDLE_TYPE_FABRIC) failed: " + detail::cuResultText(r) + " (no IMEX channel?)";
  }
}

void probeCuda(Capabilities& c) {
  c.builtWithCuda = true;
  const auto& d = detail::cudaDriver();
  if (!d.usable) {
    c.cudaReason = d.reason;
    return;
  }
  c.cudaDriver = true;
  c.driverVersion = d.driverVersion;
  if (d.deviceCount == 0) c.cudaReason = "the driver reports no CUDA device";
  for (int i = 0; i < d.deviceCount; ++i) {
    CUdevice dev;
    if (d.cuDeviceGet(&dev, i) != CUDA_SUCCESS) continue;
    GpuCapabilities g;
    GpuInfo info = detail::describeDevice(i);
    g.ordinal = i;
    g.uuid = info.uuid;
    g.pciBusId = info.pciBusId;
    char name[256] = {0};
    d.cuDeviceGetName(name, sizeof(name), dev);
    g.name = name;
    g.ccMajor = attr(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    g.ccMinor = attr(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    d.cuDeviceTotalMem(&g.totalMemory, dev);
    g.vmm = attr(dev, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED);
    g.posixFd = attr(dev, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED);
    g.fabricAttribute = attr(dev, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED);
    g.dmaBuf = attr(dev, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED);
    g.gpuDirectRdma = attr(dev, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED);
    g.gpuDirectRdmaWithVmm = attr(dev, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED);
    g.multicastAttribute = attr(dev, CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED);
    if (g.vmm) {
      CUmemAllocationProp prop{};
      prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
      prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      prop.location.id = dev;
      size_t gran = 0;
      if (d.cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) == CUDA_SUCCESS)
        g.vmmGranularity = gran;
    }
    probeFabric(dev, g);
    c.gpus.push_back(g);
  }
}
#endif

Capabilities probe() {
  Capabilities c;
#ifdef KVCOMM_HAVE_CUDA
  probeCuda(c);
#else
  c.cudaReason = "libkvcomm was built without CUDA (KVCOMM_CUDA=OFF or nvcc not found)";
#endif
  std::string why;
  for (const auto& d : detail::listRdmaDevices(&why))
    c.rdmaDevices.push_back({d.name, d.linkLayer, d.state, d.pciBusId, d.numaNode});
  c.rdma = !c.rdmaDevices.empty();
  c.rdmaReason = c.rdma ? "" : why;
  c.multicastRefusal = env::multicastRefusal();
  return c;
}

const char* yes(bool b) {
  return b ? "yes" : "no";
}

}  // namespace

const Capabilities& capabilities() {
  static const Capabilities c = probe();
  return c;
}

int useLocalDevice(int localRank) {
#ifdef KVCOMM_HAVE_CUDA
  const auto& d = detail::cudaDriver();
  if (!d.usable || d.deviceCount == 0) return -1;
  int ordinal = (localRank < 0 ? 0 : localRank) % d.deviceCount;
  CUdevice dev;
  KVCOMM_CHECK_CU(d.cuDeviceGet(&dev, ordinal));
  CUcontext ctx = nullptr;
  KVCOMM_CHECK_CU(d.cuDevicePrimaryCtxRetain(&ctx, dev));
  KVCOMM_CHECK_CU(d.cuCtxSetCurrent(ctx));
  return ordinal;
#else
  (void)localRank;
  return -1;
#endif
}

std::string Capabilities::toString() const {
  std::ostringstream os;
  os << "kvcomm capabilities\n";
  os << "  host backend (memfd)   : yes\n";
  os << "  built with CUDA        : " << yes(builtWithCuda) << "\n";
  os << "  CUDA driver            : " << (cudaDriver ? "yes (version " + std::to_string(driverVersion) + ")" : "no")
     << (cudaReason.empty() ? "" : " - " + cudaReason) << "\n";
  os << "  RDMA                   : " << yes(rdma) << (rdmaReason.empty() ? "" : " - " + rdmaReason) << "\n";
  os << "  multicast (NVLS)       : " << (multicastRefusal.empty() ? "enabled" : "off - " + multicastRefusal) << "\n";
  if (!gpus.empty()) {
    os << "  GPUs:\n";
    os << "    " << std::left << std::setw(4) << "dev" << std::setw(22) << "name" << std::setw(6) << "cc"
       << std::setw(10) << "mem GiB" << std::setw(14) << "pci"
       << "vmm posixfd fabric(attr/usable) dmabuf gdr "
       << "gdr+vmm mcast gran\n";
    for (const auto& g : gpus) {
      os << "    " << std::setw(4) << g.ordinal << std::setw(22) << g.name.substr(0, 21) << std::setw(6)
         << (std::to_string(g.ccMajor) + "." + std::to_string(g.ccMinor)) << std::setw(10) << (g.totalMemory >> 30)
         << std::setw(14) << g.pciBusId << std::setw(4) << yes(g.vmm) << std::setw(8) << yes(g.posixFd) << std::setw(20)
         << (std::string(yes(g.fabricAttribute)) + "/" + yes(g.fabricUsable)) << std::setw(7) << yes(g.dmaBuf)
         << std::setw(4) << yes(g.gpuDirectRdma) << std::setw(8) << yes(g.gpuDirectRdmaWithVmm) << std::setw(6)
         << yes(g.multicastAttribute) << (g.vmmGranularity >> 10) << "K\n";
      os << "         uuid " << g.uuid << "\n";
      if (!g.fabricUsable) os << "         fabric: " << g.fabricReason << "\n";
    }
  }
  for (const auto& r : rdmaDevices)
    os << "  rdma " << r.name << " link " << r.linkLayer << " state " << r.state << " pci " << r.pciBusId << " numa "
       << r.numaNode << "\n";
  return os.str();
}

}  // namespace kvcomm
