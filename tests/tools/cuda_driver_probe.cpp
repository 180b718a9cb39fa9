// Prints what kvcomm made of the CUDA driver it loaded, for tests/scripts/cuda_driver_entries.sh (run it with a
// stand-in libcuda.so.1 on the loader path): capabilities() (public), then whether each driver feature is available.
#include <cstdio>

#include "kvcomm/capabilities.hpp"
#include "kvcomm/error.hpp"
#include "platform/cuda_driver.hpp"

int main() {
  const kvcomm::Capabilities& c = kvcomm::capabilities();
  std::printf("cuda driver: %s (version %d)%s%s\n", c.cudaDriver ? "usable" : "unusable", c.driverVersion,
              c.cudaReason.empty() ? "" : " - ", c.cudaReason.c_str());
  std::printf("missing optional: %s\n", kvcomm::detail::cudaDriver().missingOptional.c_str());
  const std::pair<const char*, kvcomm::detail::CudaFeature> features[] = {
      {"core", kvcomm::detail::CudaFeature::Core},
      {"legacy-ipc", kvcomm::detail::CudaFeature::LegacyIpc},
      {"adopt", kvcomm::detail::CudaFeature::AdoptMemory},
      {"host-register", kvcomm::detail::CudaFeature::HostRegister},
      {"gpudirect-rdma", kvcomm::detail::CudaFeature::GpuDirectRdma}};
  for (auto [name, feature] : features) {
    try {
      kvcomm::detail::requireCudaDriver("probe", feature);
      std::printf("%s: available\n", name);
    } catch (const kvcomm::Error& e) {
      std::printf("%s: %s: %s\n", name, kvcomm::errorCodeName(e.code()), e.what());
    }
  }
}
