// The CUDA fallback transport and device helpers where NCCL or CUDA is not part of the build.
#include "common/check.hpp"
#include "ops/fallback_transport.hpp"

namespace kvcomm::detail {

std::unique_ptr<FallbackTransport> makeNcclTransport(Communicator&, size_t) {
  KVCOMM_THROW(Unsupported, "Publisher (fallback: NCCL)", "libkvcomm was built without CUDA/NCCL (no nccl.h found)");
}

#ifndef KVCOMM_HAVE_CUDA
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
#endif

}  // namespace kvcomm::detail
