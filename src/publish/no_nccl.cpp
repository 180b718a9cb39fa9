// The CUDA fallback transport where NCCL is not part of the build (no CUDA, no nccl.h, or KVCOMM_NCCL=OFF).
#include "common/check.hpp"
#include "publish/fallback_transport.hpp"

namespace kvcomm::detail {

std::unique_ptr<FallbackTransport> makeNcclTransport(Communicator&, size_t) {
  KVCOMM_THROW(Unsupported, "Publisher (fallback: NCCL)",
               "libkvcomm was built without NCCL (no CUDA, no nccl.h found, or KVCOMM_NCCL=OFF)");
}

}  // namespace kvcomm::detail
