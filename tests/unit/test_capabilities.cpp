#include <gtest/gtest.h>

#include <map>
#include <string>

#include "common/env.hpp"
#include "kvcomm/capabilities.hpp"

namespace {

TEST(Capabilities, ReportsWhatIsAbsentAndWhy) {
  const kvcomm::Capabilities& c = kvcomm::capabilities();
  EXPECT_TRUE(c.hostBackend);
  if (!c.cudaDriver) {
    EXPECT_FALSE(c.cudaReason.empty());
  } else {
    EXPECT_GT(c.driverVersion, 0);
  }
  if (!c.rdma) {
    EXPECT_FALSE(c.rdmaReason.empty());
  }
  for (const auto& g : c.gpus) {
    EXPECT_FALSE(g.uuid.empty());
    if (!g.fabricUsable) {
      EXPECT_FALSE(g.fabricReason.empty());
    }
  }
  std::string table = c.toString();
  EXPECT_NE(table.find("CUDA driver"), std::string::npos);
  EXPECT_NE(table.find("RDMA"), std::string::npos);
}

TEST(Capabilities, MulticastIsOptInAndRefusedByAnyDisableKnob) {
  const char* knobs[] = {"NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS",
                         "KVCOMM_MULTICAST"};
  std::map<std::string, std::string> saved;
  for (const char* k : knobs)
    if (const char* v = getenv(k)) saved[k] = v;
  for (const char* k : knobs) unsetenv(k);
  EXPECT_NE(kvcomm::env::multicastRefusal().find("opt-in"), std::string::npos);
  setenv("KVCOMM_MULTICAST", "1", 1);
  EXPECT_EQ(kvcomm::env::multicastRefusal(), "");
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  EXPECT_NE(kvcomm::env::multicastRefusal().find("NCCL_NVLS_ENABLE=0"), std::string::npos);
  unsetenv("NCCL_NVLS_ENABLE");
  setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1", 1);
  EXPECT_NE(kvcomm::env::multicastRefusal().find("TORCH_SYMM_MEM_DISABLE_MULTICAST"), std::string::npos);
  unsetenv("TORCH_SYMM_MEM_DISABLE_MULTICAST");
  setenv("NVSHMEM_DISABLE_NVLS", "1", 1);
  EXPECT_NE(kvcomm::env::multicastRefusal().find("NVSHMEM_DISABLE_NVLS"), std::string::npos);
  for (const char* k : knobs) unsetenv(k);
  for (auto& [k, v] : saved) setenv(k.c_str(), v.c_str(), 1);
}

}  // namespace
