// The device runtime's memory helpers in a build without CUDA: host buffers never reach them; say so if anything
// does.
#include "common/check.hpp"
#include "device/device_memory.hpp"
#include "device/launch_limits.hpp"

namespace kvcomm::detail {

void* deviceAlloc(size_t) {
  KVCOMM_THROW(Unsupported, "deviceAlloc", "libkvcomm was built without CUDA");
}
void deviceFree(void*) noexcept {}
void deviceMemset(void*, int, size_t) {
  KVCOMM_THROW(Unsupported, "deviceMemset", "libkvcomm was built without CUDA");
}
void deviceToHost(void*, const void*, size_t) {
  KVCOMM_THROW(Unsupported, "deviceToHost", "libkvcomm was built without CUDA");
}
void hostToDevice(void*, const void*, size_t) {
  KVCOMM_THROW(Unsupported, "hostToDevice", "libkvcomm was built without CUDA");
}
bool streamCapturing(Stream) {
  return false;
}
int currentDeviceSmCount() {
  KVCOMM_THROW(Unsupported, "currentDeviceSmCount", "libkvcomm was built without CUDA");
}

}  // namespace kvcomm::detail
