// The fetch layer's CUDA entry point in a build without CUDA: host buffers never reach it; say so if anything does.
#include "common/check.hpp"
#include "fetch/device_copy.hpp"

namespace kvcomm::detail {

std::unique_ptr<DeviceCopier> makeDeviceCopier() {
  KVCOMM_THROW(Unsupported, "fetch (cuda)", "libkvcomm was built without CUDA");
}

}  // namespace kvcomm::detail
