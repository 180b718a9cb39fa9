#include "platform/gpu_info.hpp"

#ifdef KVCOMM_HAVE_CUDA
#include <cstdio>

#include "platform/cuda_driver.hpp"
#endif

namespace kvcomm::detail {

#ifdef KVCOMM_HAVE_CUDA

std::string uuidText(const CUuuid& u) {
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0],
                b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return buf;
}

GpuInfo describeDevice(int ordinal) {
  const CudaDriver& d = cudaDriver();
  GpuInfo g;
  CUdevice dev;
  if (d.cuDeviceGet(&dev, ordinal) != CUDA_SUCCESS) return g;
  g.device = ordinal;
  CUuuid u;
  if (d.cuDeviceGetUuid(&u, dev) == CUDA_SUCCESS) g.uuid = uuidText(u);
  char pci[32] = {0};
  if (d.cuDeviceGetPCIBusId(pci, sizeof(pci), dev) == CUDA_SUCCESS) g.pciBusId = pci;
  return g;
}

GpuInfo currentGpu() {
  const CudaDriver& d = cudaDriver();
  if (!d.usable) return {};
  CUcontext ctx = nullptr;
  if (d.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx) return {};
  CUdevice dev;
  if (d.cuCtxGetDevice(&dev) != CUDA_SUCCESS) return {};
  for (int i = 0; i < d.deviceCount; ++i) {
    CUdevice x;
    if (d.cuDeviceGet(&x, i) == CUDA_SUCCESS && x == dev) return describeDevice(i);
  }
  return {};
}

bool gpuPeerAccess(const GpuInfo& mine, const GpuInfo& peer) {
  const CudaDriver& d = cudaDriver();
  if (!d.usable || mine.pciBusId.empty() || peer.pciBusId.empty()) return false;
  if (mine.uuid == peer.uuid) return true;
  CUdevice a, b;
  if (d.cuDeviceGetByPCIBusId(&a, mine.pciBusId.c_str()) != CUDA_SUCCESS) return false;
  if (d.cuDeviceGetByPCIBusId(&b, peer.pciBusId.c_str()) != CUDA_SUCCESS) return false;
  int can = 0;
  return d.cuDeviceCanAccessPeer(&can, a, b) == CUDA_SUCCESS && can == 1;
}

#else

GpuInfo describeDevice(int) {
  return {};
}
GpuInfo currentGpu() {
  return {};
}
bool gpuPeerAccess(const GpuInfo&, const GpuInfo&) {
  return false;
}

#endif

}  // namespace kvcomm::detail
