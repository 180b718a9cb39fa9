// Kernel launches in a build without CUDA: host buffers never reach them; say so if anything does.
#include "common/check.hpp"
#include "kernels/launch.hpp"

namespace kvcomm::detail {

void launchPublish(const PublishLaunch&, void*, const BarrierDeviceHandle*, int, BarrierStep) {
  KVCOMM_THROW(Unsupported, "publish (cuda)", "libkvcomm was built without CUDA");
}
void launchBarrier(const BarrierDeviceHandle&, int, BarrierStep, void*) {
  KVCOMM_THROW(Unsupported, "barrier (cuda)", "libkvcomm was built without CUDA");
}
void launchPack(const PackLaunch&, void*) {
  KVCOMM_THROW(Unsupported, "publish (cuda fallback)", "libkvcomm was built without CUDA");
}

void launchFetch(const FetchLaunch&, void*) {
  KVCOMM_THROW(Unsupported, "fetch (cuda)", "libkvcomm was built without CUDA");
}
void launchCheckedFetch(const CheckLaunch&, const FetchLaunch&, bool, void*) {
  KVCOMM_THROW(Unsupported, "fetch (cuda)", "libkvcomm was built without CUDA");
}
void launchConvert(const ConvertLaunch&, void*) {
  KVCOMM_THROW(Unsupported, "converted copy (cuda)", "libkvcomm was built without CUDA");
}
void launchPieces(const PieceLaunch&, void*) {
  KVCOMM_THROW(Unsupported, "converted copy (cuda)", "libkvcomm was built without CUDA");
}

}  // namespace kvcomm::detail
