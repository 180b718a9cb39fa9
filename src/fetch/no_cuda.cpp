// The fetch layer's CUDA entry point in a build without CUDA: host buffers never reach it; say so if anything does.
#include "common/check.hpp"
#include "fetch/checked_launch.hpp"
#include "fetch/device_copy.hpp"
#include "fetch/transport/rdma/gpu_direct.hpp"

namespace kvcomm::detail {

std::unique_ptr<DeviceCopier> makeDeviceCopier() {
  KVCOMM_THROW(Unsupported, "fetch (cuda)", "libkvcomm was built without CUDA");
}

std::unique_ptr<CheckedLauncher> makeCheckedLauncher(size_t) {
  KVCOMM_THROW(Unsupported, "fetch (cuda)", "libkvcomm was built without CUDA");
}

std::unique_ptr<HostStaging> makeHostStaging(int, size_t, int) {
  KVCOMM_THROW(Unsupported, "fetch (cuda staging)", "libkvcomm was built without CUDA");
}

void bindCudaDevice(int) {
  KVCOMM_THROW(Unsupported, "fetch (cuda)", "libkvcomm was built without CUDA");
}

std::string gpuDirectRefusal(int) {
  return "libkvcomm was built without CUDA";
}

Fd exportDmabuf(void*, size_t) {
  KVCOMM_THROW(Unsupported, "fetch (rdma)", "libkvcomm was built without CUDA");
}

bool gpuDirectNeedsFlush(int) {
  return false;
}

void flushGpuDirectWrites(int) {
  KVCOMM_THROW(Unsupported, "fetch (rdma)", "libkvcomm was built without CUDA");
}

void syncStream(int, Stream) {
  KVCOMM_THROW(Unsupported, "fetch (rdma)", "libkvcomm was built without CUDA");
}

}  // namespace kvcomm::detail
