// The CUDA entry points of the symm layer in a build without CUDA: each says so.
#include "common/check.hpp"
#include "symm/legacy_ipc.hpp"
#include "symm/memory_backend.hpp"

namespace kvcomm::detail {

std::shared_ptr<MemoryBackend> makeCudaBackend(HandleKind) {
  KVCOMM_THROW(Unsupported, "SymmetricBuffer (cuda)", "libkvcomm was built without CUDA");
}

std::unique_ptr<LegacyIpc> LegacyIpc::create(Communicator&, size_t, size_t) {
  KVCOMM_THROW(Unsupported, "SymmetricBuffer (cuda_ipc)", "libkvcomm was built without CUDA");
}

}  // namespace kvcomm::detail
